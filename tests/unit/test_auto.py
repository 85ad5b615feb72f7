"""hetsync.Auto in one process: BSP through the warm-up, then the switch to the chosen protocol between two steps
(the optimizer's state kept, the train step rebuilt), the choice saved with the model and restored by
load_model, bad configuration refused before training. The choice among ranks is checked by a launch
(tests/mp/test_auto_mp.py)."""
import keras
import numpy as np
import pytest

import hetsync
from hetsync.advise import auto as _auto
from hetsync.advise import predict as _predict
from hetsync.sim import network, workload


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])


def _auto_on_digits(steps_per_epoch=None, **config):
    """A model compiled with hetsync.Auto(SGD(0.05), **config) and its fit arguments on digits (b = 32)."""
    ds = hetsync.data.load("digits", seed=0)
    model = _model()
    opt = hetsync.Auto(keras.optimizers.SGD(0.05), **config)
    model.compile(opt, "sparse_categorical_crossentropy")
    fit = opt.hetsync_protocol.fit_data(ds.x_train, ds.y_train, 32)
    if steps_per_epoch is not None:
        fit["steps_per_epoch"] = steps_per_epoch
    return model, opt, fit


class _Steps(keras.callbacks.Callback):
    """Each step's protocol name and the optimizer's iteration count after it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        opt = self.model.optimizer
        self.seen.append((opt.hetsync_protocol.name, int(opt.iterations.numpy())))


@pytest.mark.parametrize("target", ["localsgd", "fedavg"])
def test_the_switch_happens_after_the_warm_up_and_the_choice_is_saved_and_restored(target, tmp_path):
    ds = hetsync.data.load("digits", seed=0)
    model = _model()
    opt = hetsync.Auto(keras.optimizers.SGD(0.05, momentum=0.9), warmup_steps=12, protocols=target)
    assert type(opt).__name__ == "Auto_SGD"
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    fit = opt.hetsync_protocol.fit_data(ds.x_train, ds.y_train, 32)
    steps = _Steps()
    hist = model.fit(**fit, epochs=2, verbose=0, callbacks=hetsync.callbacks.standard(opt) + [steps])
    per_epoch = fit["steps_per_epoch"]
    # BSP for exactly the 12 warm-up steps (the 12th ends as BSP, then the switch), the target after; no step lost
    assert [name for name, _ in steps.seen] == ["auto"] * 11 + [target] * (2 * per_epoch - 11)
    assert [it for _, it in steps.seen] == list(range(1, 2 * per_epoch + 1))
    assert type(opt).__name__ == {"localsgd": "LocalSGD_SGD", "fedavg": "FedAvg_SGD"}[target]
    proto = opt.hetsync_protocol
    assert proto.name == target and proto.cfg.data_plan == "shard" and proto.batch_size == 32
    assert proto.samples_per_epoch == fit.samples_per_epoch
    chosen = hetsync.core.wrapper.chosen_by(opt)
    assert chosen["by"] == "auto" and chosen["by_config"] == {"warmup_steps": 12, "protocols": target,
                                                              "compression": "none"}
    assert chosen["protocol"] == target and chosen["step"] == 12 and chosen["candidates"] == [target]
    assert chosen["config"] == {"data_plan": "shard"} and len(chosen["step_ms_median"]) == 1
    assert {r["protocol"] for r in chosen["predicted"]} == {"bsp", target}
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    assert hist.history["accuracy"][-1] > 0.8
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = hetsync.load_model(path)
    lopt = loaded.optimizer
    assert type(lopt) is type(opt) and lopt.hetsync_protocol.name == target
    assert lopt.hetsync_protocol.config() == proto.config()
    assert hetsync.core.wrapper.chosen_by(lopt)["protocol"] == target
    assert float(lopt.momentum) == 0.9
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_fit_shorter_than_the_warm_up_stays_bsp_and_saves_as_auto(tmp_path, capfd):
    model, opt, fit = _auto_on_digits(5, warmup_steps=12, protocols="localsgd")
    model.fit(**fit, epochs=1, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    assert opt.hetsync_protocol.name == "auto" and hetsync.core.wrapper.chosen_by(opt) is None
    assert "it ran BSP throughout" in capfd.readouterr().err
    path = str(tmp_path / "model.keras")
    model.save(path)
    lopt = hetsync.load_model(path).optimizer
    assert type(lopt).__name__ == "Auto_SGD" and lopt.hetsync_protocol.cfg.protocols == "localsgd"
    assert lopt.hetsync_protocol.cfg.warmup_steps == 12
    # the next fit goes on with the warm-up: its first step traces (not measured), 7 more BSP steps, the switch
    steps = _Steps()
    model.fit(**fit, epochs=2, verbose=0, callbacks=hetsync.callbacks.standard(opt) + [steps])
    assert [name for name, _ in steps.seen] == ["auto"] * 7 + ["localsgd"] * 3
    assert hetsync.core.wrapper.chosen_by(opt)["step"] == 13  # the optimizer's 13th step (5 + 8)


def test_a_warm_up_that_ends_on_the_fits_last_step_switches_in_the_next_fit():
    model, opt, fit = _auto_on_digits(5, warmup_steps=10, protocols="fedavg")
    model.fit(**fit, epochs=2, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    assert opt.hetsync_protocol.name == "auto"  # measured 10 steps, but none of this fit was left
    steps = _Steps()
    model.fit(**fit, epochs=1, verbose=0, callbacks=hetsync.callbacks.standard(opt) + [steps])
    assert [name for name, _ in steps.seen] == ["fedavg"] * 5  # decided after the next fit's first step
    assert hetsync.core.wrapper.chosen_by(opt)["step"] == 11
    # FedAvg continues the BSP statistics: its cumulative syncs count the 11 warm-up allreduces, then its rounds
    assert opt.hetsync_protocol.step_stats()["syncs"] >= 11


@pytest.mark.parametrize("kwargs,message", [
    ({"warmup_steps": 9}, "warmup_steps"),
    ({"protocols": "bsp,taskalloc"}, "'bsp,taskalloc'"),
    ({"protocols": "rna,rna"}, "'rna,rna'"),
    ({"protocols": ""}, "protocols"),
    ({"protocols": 3}, "3"),
])
def test_bad_configuration_is_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hetsync.Auto(keras.optimizers.SGD(0.1), **kwargs)


def test_steps_per_execution_above_one_is_refused_before_training():
    ds = hetsync.data.load("digits", seed=0)
    model = _model()
    opt = hetsync.Auto(keras.optimizers.SGD(0.05))
    model.compile(opt, "sparse_categorical_crossentropy", steps_per_execution=2)
    fit = opt.hetsync_protocol.fit_data(ds.x_train, ds.y_train, 32)
    with pytest.raises(ValueError, match="steps_per_execution=2"):
        model.fit(**fit, epochs=1, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    assert int(opt.iterations.numpy()) == 0


def test_fixed_shares_limit_a_free_running_protocol_to_its_slowest_rank():
    # rank 3 twice as slow, every step: on the pool RNA's fast ranks take more batches; on fixed shares every rank
    # runs the same steps, so its throughput is the slowest rank's: samples/s x min(steps) / mean(steps)
    times = workload.step_times("device:40+deterministic:3:2", 4, 400, seed=0)
    inputs = _predict.Inputs(times, network.Network.from_spec(4), workload.Workload(400_000, 32, 0.0))
    pool = {r["protocol"]: r for r in _predict.predict(inputs, ("rna",))}
    shares = {r["protocol"]: r for r in _predict.predict(inputs, ("rna",), fixed_shares=True)}
    assert shares["bsp"]["samples_per_s"] == pool["bsp"]["samples_per_s"]
    from hetsync.sim import registry

    r = registry.simulate("rna", times, network.Network.from_spec(4), workload.Workload(400_000, 32, 0.0))
    assert shares["rna"]["samples_per_s"] == pytest.approx(r.samples_per_s * min(r.steps) / np.mean(r.steps))
    assert shares["rna"]["samples_per_s"] < 0.8 * pool["rna"]["samples_per_s"]


def test_first_choice_breaks_ties_towards_the_simpler_protocol():
    rows = [{"protocol": "rna", "time_to_target_vs_bsp": 1.04}, {"protocol": "bsp", "time_to_target_vs_bsp": 1.0},
            {"protocol": "hop", "time_to_target_vs_bsp": 0.7}]
    assert _predict.first_choice(rows)["protocol"] == "bsp"  # within 5% of the best
    rows[0]["time_to_target_vs_bsp"] = 1.2
    assert _predict.first_choice(rows)["protocol"] == "rna"
    assert _predict.first_choice(rows[2:], _auto.CANDIDATES)["protocol"] == "hop"
    with pytest.raises(ValueError):
        _predict.first_choice([])


def test_rebind_refuses_an_attached_protocol_and_an_unwrapped_optimizer():
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    other = hetsync.LocalSGD(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="already attached"):
        hetsync.core.wrapper.rebind(opt, other.hetsync_protocol)
    with pytest.raises(TypeError, match="not a hetsync-wrapped optimizer"):
        hetsync.core.wrapper.rebind(keras.optimizers.SGD(0.1), hetsync.protocols.LocalSGDProtocol())
    assert hetsync.core.wrapper.chosen_by(opt) is None


def test_backup_and_restore_is_refused_with_auto_before_training(tmp_path):
    model, opt, fit = _auto_on_digits()
    backup = hetsync.callbacks.BackupAndRestore(str(tmp_path / "ckpt"), save_every_steps=5)
    with pytest.raises(ValueError, match="hetsync.Auto switches the protocol"):
        model.fit(**fit, epochs=1, verbose=0, callbacks=[backup] + hetsync.callbacks.standard(opt))
    assert int(opt.iterations.numpy()) == 0
