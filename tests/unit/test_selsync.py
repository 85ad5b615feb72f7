"""SelSync, FedAvg, LocalSGD in one process: EWMA and eq. (2) against numpy, flags, validation, CLI."""
import keras
import numpy as np
import pytest

import hetsync
from hetsync import protocols
from hetsync.protocols.local.selsync import ewma_reference


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


def test_ewma_reference_matches_hand_computation():
    e, d = ewma_reference([1.0, 2.0, 4.0], window=2, smoothing=0.5)
    # E0 = 1; E1 = (2 + 0.5*1)/1.5; E2 = (4 + 0.5*2)/1.5 (window of 2 drops x0)
    assert np.allclose(e, [1.0, 5.0 / 3.0, 10.0 / 3.0])
    assert np.allclose(d, [0.0, 2.0 / 3.0, 1.0])
    e, d = ewma_reference([3.0] * 30, window=25, smoothing=0.04)
    assert np.allclose(e, 3.0) and np.allclose(d, 0.0)


class _Record(keras.callbacks.Callback):
    def __init__(self, opt):
        super().__init__()
        self.proto, self.rows = opt.hetsync_protocol, []

    def on_train_batch_end(self, batch, logs=None):
        self.rows.append(self.proto.step_stats())


@pytest.mark.parametrize("aggregation", ["parameter", "gradient"])
def test_selsync_ewma_relative_change_flags_and_lssr_against_numpy(aggregation):
    ds = hetsync.data.load("digits", seed=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
    opt = hetsync.SelSync(keras.optimizers.SGD(0.5), delta=0.05, aggregation=aggregation, ewma_window=4,
                          smoothing=0.3)
    model.compile(opt, "sparse_categorical_crossentropy")
    rec = _Record(opt)
    fit = opt.hetsync_protocol.fit_data(ds.x_train, ds.y_train, 64, seed=0)
    model.fit(**fit, epochs=2, verbose=0, callbacks=hetsync.callbacks.standard(opt) + [rec])
    sq = [r["grad_sq_norm"] for r in rec.rows]
    e, d = ewma_reference(sq, window=4, smoothing=0.3)
    assert len(rec.rows) == 2 * (len(ds.x_train) // 64)
    assert np.allclose([r["ewma"] for r in rec.rows], e, rtol=1e-12)
    assert np.allclose([r["d"] for r in rec.rows], d, rtol=1e-9, atol=1e-12)
    flags = [r["flag"] for r in rec.rows]
    assert flags == [1.0] + [float(x >= 0.05) for x in d[1:]]
    assert [r["sync"] for r in rec.rows] == flags  # one rank: syncs exactly when it flags
    assert 0 < sum(flags) < len(flags)  # both kinds of step happened
    last = rec.rows[-1]
    local = len(flags) - sum(flags)
    assert last["sync_steps"] == sum(flags) and last["local_steps"] == local
    assert last["lssr"] == pytest.approx(local / len(flags))
    assert last["syncs"] == sum(flags) and last["flag_exchanges"] == len(flags)
    s = opt.hetsync_protocol.summary_stats()
    assert s["lssr"] == pytest.approx(local / len(flags)) and s["bytes_sent"] > 4 * len(flags)


def test_bad_arguments_fail_before_training():
    sgd = keras.optimizers.SGD
    cases = [
        (dict(delta=-0.1), "SelSync: delta must be a number >= 0"),
        (dict(delta=float("nan")), "SelSync: delta must be a number >= 0 .*, got nan"),
        (dict(aggregation="mean"), "SelSync: aggregation must be one of 'parameter', 'gradient', got 'mean'"),
        (dict(ewma_window=0), r"SelSync: ewma_window must be an integer >= 1 \(steps\), got 0"),
        (dict(smoothing=1.5), r"SelSync: smoothing must be None \(N/100\) or a number in \(0, 1\], got 1.5"),
        (dict(data_order="random"), "SelSync: data_order must be one of 'seldp', 'defdp'"),
        (dict(alpha=2.0, beta=0.5), r"SelSync: alpha must be a number in \[0, 1\] .*, got 2.0"),
        (dict(inject_timeout_s=float("inf")), r"SelSync: inject_timeout_s must be a number > 0 \(seconds\), got inf"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(ValueError, match=msg):
            hetsync.SelSync(sgd(0.1), **kwargs)
    with pytest.raises(ValueError, match=r"fraction C must be a number in \(0, 1\], got 0"):
        hetsync.FedAvg(sgd(0.1), fraction=0)
    with pytest.raises(ValueError, match="syncs_per_epoch"):
        hetsync.FedAvg(sgd(0.1), syncs_per_epoch=-1)
    with pytest.raises(ValueError, match="LocalSGD: period H must be an integer >= 1 .*, got 0"):
        hetsync.LocalSGD(sgd(0.1), period=0)
    assert hetsync.SelSync(sgd(0.1), delta=float("inf")).hetsync_protocol.config()["delta"] == float("inf")
    with pytest.raises(TypeError, match="wraps a Keras 3 optimizer instance"):
        hetsync.SelSync("sgd")
    opt = hetsync.SelSync(sgd(0.1))
    with pytest.raises(ValueError, match=r"batch size must be in \[1, "):
        opt.hetsync_protocol.fit_data(np.zeros((10, 2)), np.zeros(10), 64)


def test_cli_names_and_arguments():
    assert {"selsync", "fedavg", "localsgd"} <= set(protocols.WRAPPERS)
    kw = protocols.parse_protocol_args("selsync", ["delta=0.3", "aggregation=gradient", "alpha=0.5", "beta=0.5"])
    assert kw == {"delta": 0.3, "aggregation": "gradient", "alpha": 0.5, "beta": 0.5}
    assert protocols.parse_protocol_args("fedavg", ["fraction=0.5", "syncs_per_epoch=4"]) == \
        {"fraction": 0.5, "syncs_per_epoch": 4}
    with pytest.raises(ValueError, match="protocol 'localsgd' takes no argument 'delta'; its arguments: period"):
        protocols.parse_protocol_args("localsgd", ["delta=1"])
    opt = protocols.from_cli("selsync", keras.optimizers.SGD(0.1), ["delta=0.5", "data_order=defdp"])
    assert opt.hetsync_protocol.config()["delta"] == 0.5 and opt.hetsync_protocol.cfg.data_order == "defdp"
    assert opt.hetsync_protocol.smoothing == pytest.approx(0.01)  # N/100 with N = 1
