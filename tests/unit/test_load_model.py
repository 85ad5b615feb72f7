"""hetsync.load_model: a model saved with every wrapped protocol comes back with the same protocol,
configuration, optimizer state and weights (single process); a model saved before the package's layout moved
(a pinned fixture) loads."""
import json
import os
import zipfile

import keras
import numpy as np
import pytest

import hetsync

# every protocol with arguments away from their defaults, so a reload that forgets them fails
CONFIGS = {
    "bsp": {"compression": "fp16"},
    "rna": {"probes": 1, "max_staleness": 2, "average_every": 3, "drift_every": 0, "timeout_s": 30.0, "seed": 5},
    "selsync": {"delta": 0.2, "aggregation": "gradient", "ewma_window": 7, "smoothing": 0.5, "data_order": "defdp"},
    "fedavg": {"fraction": 1.0, "syncs_per_epoch": 2.0, "seed": 3, "average_at_end": True},
    "localsgd": {"period": 3, "average_at_end": False, "outer_lr": 0.7, "outer_momentum": 0.9},
    "taskalloc": {"mode": "adaptive", "weights": [4], "threshold": 0.1, "patience": 3, "micro_batch": 8},
    "hop": {"graph": "complete", "staleness": 2, "max_ig": 3, "skip": 2, "skip_trigger": 1, "average_at_end": False,
            "timeout_s": 30.0},
    "notifyack": {"graph": "complete", "average_at_end": False, "timeout_s": 30.0},
}
# parameter-server protocols: a single process has no server rank to train with (servers >= ranks is
# refused), so these are saved after building the optimizer, not after a training step
PS_CONFIGS = {
    "asp": {"servers": 2, "sharding": "layer", "timeout_s": 30.0},
    "shat": {"servers": 2, "sharding": "layer", "timeout_s": 30.0, "log_base": 2.0},
    "shatroot": {"servers": 3, "sharding": "layer", "timeout_s": 40.0},
    "ensemble": {"servers": 2, "sharding": "layer", "timeout_s": 50.0},
    "ssp": {"servers": 2, "sharding": "layer", "timeout_s": 30.0, "staleness": 5},
    "rnah": {"groups": [[0, 1], [2]], "sync_every": 3, "warmup_steps": 7, "servers": 2, "sharding": "layer",
             "probes": 1, "max_staleness": 2, "average_every": 4, "timeout_s": 30.0, "seed": 5},
}


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


def test_every_registered_protocol_is_covered():
    assert sorted({**CONFIGS, **PS_CONFIGS}) == sorted(hetsync.protocols.WRAPPERS)
    assert not set(CONFIGS) & set(PS_CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("base", [keras.optimizers.SGD, keras.optimizers.Adam])
def test_save_and_load_restores_protocol_config_and_weights(name, base, tmp_path):
    ds = hetsync.data.load("digits", seed=0)
    x, y = ds.x_train[:256], ds.y_train[:256]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])
    kwargs = {"momentum": 0.9} if base is keras.optimizers.SGD else {}
    opt = hetsync.protocols.get_wrapper(name)(base(learning_rate=0.05, **kwargs), **CONFIGS[name])
    model.compile(opt, "sparse_categorical_crossentropy")
    fit = opt.hetsync_protocol.fit_data(x, y, 32)
    fit["steps_per_epoch"] = 1
    model.fit(**fit, epochs=1, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    assert int(opt.iterations.numpy()) == 1
    display = hetsync.protocols.get_wrapper(name).__name__
    assert type(opt).__name__ == f"{display}_{base.__name__}" and isinstance(opt, base)
    path = str(tmp_path / "model.keras")
    model.save(path)

    loaded = hetsync.load_model(path)
    lopt = loaded.optimizer
    assert type(lopt).__name__ == f"{display}_{base.__name__}" and type(lopt) is type(opt)
    proto = lopt.hetsync_protocol
    assert proto is not opt.hetsync_protocol and proto.optimizer is lopt
    assert proto.name == name and type(proto) is type(opt.hetsync_protocol)
    assert proto.config() == opt.hetsync_protocol.config()
    assert proto.cfg == opt.hetsync_protocol.cfg
    assert float(lopt.learning_rate.numpy()) == pytest.approx(0.05)
    assert lopt.get_config()["name"] == opt.get_config()["name"]
    if base is keras.optimizers.SGD:
        assert lopt.momentum == 0.9
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        assert np.array_equal(a, b)
    # the optimizer state (iterations, Adam's moments) came back too
    # iteration, learning rate, and per weight (kernel, bias) one momentum (SGD) or two moments (Adam)
    assert len(opt.variables) == len(lopt.variables) == (6 if base is keras.optimizers.Adam else 4)
    for a, b in zip(opt.variables, lopt.variables):
        assert np.array_equal(np.asarray(a), np.asarray(b)), a.path
    # and the reloaded model trains on through its protocol
    fit = proto.fit_data(x, y, 32)
    fit["steps_per_epoch"] = 1
    loaded.fit(**fit, epochs=1, verbose=0, callbacks=hetsync.callbacks.standard(lopt))
    assert int(lopt.iterations.numpy()) == 2


@pytest.mark.parametrize("name", sorted(PS_CONFIGS))
@pytest.mark.parametrize("base", [keras.optimizers.SGD, keras.optimizers.Adam])
def test_parameter_server_protocols_come_back_with_their_config(name, base, tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])
    opt = hetsync.protocols.get_wrapper(name)(base(learning_rate=0.05), **PS_CONFIGS[name])
    model.compile(opt, "sparse_categorical_crossentropy")
    opt.build(model.trainable_variables)
    display = hetsync.protocols.get_wrapper(name).__name__
    assert type(opt).__name__ == f"{display}_{base.__name__}"
    path = str(tmp_path / "model.keras")
    model.save(path)

    loaded = hetsync.load_model(path)
    lopt = loaded.optimizer
    assert type(lopt) is type(opt) and isinstance(lopt, base)
    proto = lopt.hetsync_protocol
    assert proto is not opt.hetsync_protocol and proto.optimizer is lopt and proto.name == name
    assert proto.cfg == opt.hetsync_protocol.cfg and proto.config() == opt.hetsync_protocol.config()
    for key, value in PS_CONFIGS[name].items():  # the non-default values survived the round trip
        got = getattr(proto.cfg, key)
        assert (list(map(list, got)) if key == "groups" else got) == value, key
    assert float(lopt.learning_rate.numpy()) == pytest.approx(0.05)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        assert np.array_equal(a, b)


def test_plain_keras_load_model_also_rewraps_once_hetsync_is_imported(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    opt = hetsync.LocalSGD(keras.optimizers.SGD(0.1), period=5)
    model.compile(opt, "mse")
    model.fit(np.ones((8, 3)), np.ones(8), batch_size=8, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer).__name__ == "LocalSGD_SGD"
    assert loaded.optimizer.hetsync_protocol.config() == {"period": 5, "average_at_end": True, "data_plan": "pool",
                                                          "outer_lr": 1.0, "outer_momentum": 0.0,
                                                          "outer_nesterov": True}


def test_a_saved_unknown_protocol_is_refused_clearly():
    from hetsync.core.wrapper import wrapped_class

    cls = wrapped_class(hetsync.protocols.BSPProtocol, keras.optimizers.SGD)
    config = keras.optimizers.SGD(0.1).get_config()
    config["hetsync"] = {"protocol": "nosuchprotocol", "config": {}, "optimizer": {"class_name": "SGD", "module": "x"}}
    with pytest.raises(ValueError, match="wrapped by protocol 'nosuchprotocol', which this hetsync does not have"):
        cls.from_config(config)
    config["hetsync"] = {"protocol": "bsp", "config": {"compression": "zip"},
                         "optimizer": {"class_name": "SGD", "module": "keras.src.optimizers.sgd"}}
    with pytest.raises(ValueError, match="BSP: compression must be one of 'none', 'fp16', got 'zip'"):
        cls.from_config(config)
    config["hetsync"] = {"protocol": "bsp", "config": {}, "optimizer": {"class_name": "NoSuchOpt", "module": "nowhere"}}
    with pytest.raises(ValueError, match="cannot find the optimizer class 'NoSuchOpt'"):
        cls.from_config(config)


SAVED = os.path.join(os.path.dirname(__file__), "fixtures", "saved_models")


def _build_keras_zip(fixture, path):
    """Write ``path`` (a .keras zip) from a pinned text fixture: its config.json and metadata.json as saved, and
    a model.weights.h5 holding the saved datasets. Nothing of the zip comes from today's code."""
    import h5py

    with h5py.File(os.path.join(os.path.dirname(path), "model.weights.h5"), "w") as f:
        for key, d in fixture["weights"].items():
            f.create_dataset(key, data=np.asarray(d["values"], dtype=d["dtype"]).reshape(d["shape"]))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", json.dumps(fixture["config"]))
        z.writestr("metadata.json", json.dumps(fixture["metadata"]))
        z.write(os.path.join(os.path.dirname(path), "model.weights.h5"), "model.weights.h5")


@pytest.mark.parametrize("name, wrapper, base", [("rna", "RNA", keras.optimizers.SGD),
                                                 ("hop", "Hop", keras.optimizers.Adam),
                                                 ("shat", "SHAT", keras.optimizers.SGD)])
def test_a_model_saved_before_the_package_layout_moved_loads(name, wrapper, base, tmp_path):
    # the fixture names the old module path (hetsync.protocols.wrapper) and the registered names hetsync>RNA, ...
    with open(os.path.join(SAVED, f"{name}.json")) as f:
        fixture = json.load(f)
    saved_opt = fixture["config"]["compile_config"]["optimizer"]
    assert saved_opt["module"] == "hetsync.protocols.wrapper" and saved_opt["registered_name"] == f"hetsync>{wrapper}"
    path = str(tmp_path / "old.keras")
    _build_keras_zip(fixture, path)

    loaded = hetsync.load_model(path)
    opt = loaded.optimizer
    assert type(opt).__name__ == f"{wrapper}_{base.__name__}" and isinstance(opt, base)
    proto = opt.hetsync_protocol
    assert proto.name == name and proto.optimizer is opt
    saved = saved_opt["config"]["hetsync"]["config"]
    config = proto.config()
    assert {k: config[k] for k in saved} == saved  # every saved setting, non-defaults included, came back
    assert float(opt.learning_rate.numpy()) == pytest.approx(saved_opt["config"]["learning_rate"])
    # the layer's and the optimizer's variables hold exactly the saved values
    weights = fixture["weights"]
    for i, w in enumerate(loaded.get_layer("dense").get_weights()):
        assert np.array_equal(w, np.asarray(weights[f"layers/dense/vars/{i}"]["values"], "float32").reshape(w.shape))
    for i, v in enumerate(opt.variables):
        saved_v = weights[f"optimizer/vars/{i}"]
        assert np.array_equal(v.numpy(), np.asarray(saved_v["values"], saved_v["dtype"]).reshape(saved_v["shape"]))
    assert len(opt.variables) == sum(k.startswith("optimizer/vars/") for k in weights)
