"""The epoch's sample pool (hetsync.data.pool), in one process: exact coverage, the last
batch, "empty", confirmations, timeouts, data_plan validation and a real Keras fit on the pool."""
import keras
import numpy as np
import pytest

import hetsync
from hetsync import transport
from hetsync.data import pool as pool


def drain_epoch(state, epoch, ranks):
    """Claim round-robin over ``ranks`` until empty; return {rank: [batches]}."""
    got = {r: [] for r in ranks}
    active = list(ranks)
    while active:
        for r in list(active):
            idx = state.claim(r, epoch)
            if idx is None:
                active.remove(r)
            else:
                got[r].append(idx)
    return got


@pytest.mark.parametrize("n,b", [(100, 10), (103, 10), (109, 10), (7, 10), (10, 10), (1, 1)])
def test_every_index_exactly_once_per_epoch_and_the_remainder_joins_the_last_batch(n, b):
    state = pool.PoolState(n, b, [0, 1, 2], seed=3)
    for epoch in range(3):
        got = drain_epoch(state, epoch, [0, 1, 2])
        batches = [bt for r in got for bt in got[r]]
        allidx = np.sort(np.concatenate(batches))
        assert np.array_equal(allidx, np.arange(n))  # each index exactly once
        sizes = sorted(len(bt) for bt in batches)
        if n >= b:
            assert len(batches) == n // b
            assert sizes[:-1] == [b] * (n // b - 1) and sizes[-1] == b + n % b
        else:
            assert sizes == [n]
        assert state.claim(0, epoch) is None  # empty stays empty
        for r in got:
            state.confirm(r, epoch, np.concatenate(got[r]) if got[r] else np.zeros(0, np.int64))
    rep = state.report()
    assert [e["handed_out"] for e in rep["epochs"]] == [n] * 3
    assert rep["lost"] == rep["repeated"] == rep["missing"] == rep["mismatched"] == 0
    assert state.wait_confirmed(0.0)


def test_epochs_are_different_seeded_permutations():
    a, b = pool.epoch_order(50, 0, 1), pool.epoch_order(50, 1, 1)
    assert sorted(a) == sorted(b) == list(range(50)) and not np.array_equal(a, b)
    assert np.array_equal(pool.epoch_order(50, 1, 1), b)


def test_uneven_draws_and_lost_samples_are_counted():
    state = pool.PoolState(40, 10, [0, 1], seed=0)
    got0 = [state.claim(0, 0) for _ in range(3)]
    got1 = [state.claim(1, 0)]
    assert state.claim(1, 0) is None and state.claim(0, 0) is None
    state.confirm(0, 0, np.concatenate(got0))
    assert not state.wait_confirmed(0.01)  # rank 1 never confirmed
    rep = state.report()["epochs"][0]
    assert rep["per_rank_samples"] == {"0": 30, "1": 10} and rep["per_rank_batches"] == {"0": 3, "1": 1}
    assert rep["unconfirmed"] == 10 and rep["handed_out"] == 40
    state.confirm(1, 0, got1[0][:5])  # claims 10, trained on 5: 5 lost, mismatched
    rep = state.report()
    assert rep["lost"] == 5 and rep["mismatched"] == 5
    with pytest.raises(pool.PoolError, match="twice"):
        state.confirm(1, 0, got1[0])


def test_an_epoch_stopped_early_reports_missing_samples():
    state = pool.PoolState(30, 10, [0], seed=0)
    idx = state.claim(0, 0)
    state.confirm(0, 0, idx)
    rep = state.report()
    assert rep["missing"] == 20 and rep["lost"] == 0 and rep["epochs"][0]["handed_out"] == 10


@pytest.mark.parametrize("kwargs,match", [({"n": 0}, "n must be"), ({"batch_size": 0}, "batch_size must be"),
                                          ({"ranks": []}, "ranks"), ({"seed": -1}, "seed must be"),
                                          ({"n": 2.5}, "n must be")])
def test_bad_pool_arguments_raise_value_error(kwargs, match):
    args = dict(n=10, batch_size=2, ranks=[0], seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        pool.PoolState(**args)


def test_claims_from_unknown_ranks_fail():
    state = pool.PoolState(10, 2, [0, 1])
    with pytest.raises(pool.PoolError, match="rank 5"):
        state.claim(5, 0)


class _SilentDispatcher:
    """A dispatcher whose server never answers."""

    rank = 1

    def send(self, *a, **k):
        pass

    def recv(self, channel, source=None, tag=None, timeout_s=None):
        raise transport.TransportTimeout(f"timed out after {timeout_s} s on {channel}")


def test_a_silent_server_times_out_with_a_clear_error():
    client = pool.PoolClient(_SilentDispatcher(), server=0, timeout_s=0.05)
    with pytest.raises(pool.PoolError, match=r"rank 1: no batch from the pool server \(rank 0\) for epoch 0"):
        client.claim()
    with pytest.raises(ValueError, match="timeout_s"):
        pool.PoolClient(_SilentDispatcher(), server=0, timeout_s=0)


@pytest.mark.parametrize("bad", ["Pool", "fixed", "", None, 1])
def test_bad_data_plan_is_a_value_error_before_training(bad):
    with pytest.raises(ValueError, match="data_plan"):
        hetsync.RNA(keras.optimizers.SGD(0.1), data_plan=bad)
    with pytest.raises(ValueError, match="data_plan"):
        pool.check_data_plan("RNA", bad)


def test_keras_fit_on_the_pool_ends_each_epoch_when_it_is_empty():
    """One rank (world of 1): the rank serves itself through the dispatcher; 3 epochs of Keras fit,
    each epoch exactly N samples (102 = 10 batches of 10 + the remainder 2 in the last one)."""
    hetsync.init()
    x = np.random.default_rng(0).normal(size=(102, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    opt = hetsync.RNA(keras.optimizers.SGD(0.1), average_every=0)
    assert opt.hetsync_protocol.cfg.data_plan == "pool"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    steps = []

    class Count(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            steps.append(0)

        def on_train_batch_end(self, batch, logs=None):
            steps[-1] += 1

    fit = opt.hetsync_protocol.fit_data(x, y, 10, seed=1)
    assert "steps_per_epoch" not in fit
    # tf.data's autotuning is off: destroying each epoch's iterator with it on stalled ranks for seconds
    assert fit["x"].get_tf_dataset().options().autotune.enabled is False
    model.fit(**fit, epochs=3, verbose=0, callbacks=hetsync.callbacks.standard(opt) + [Count()])
    assert steps == [10, 10, 10]
    p = opt.hetsync_protocol.summary_stats()["pool"]
    assert [e["samples"] for e in p["rank_epochs"]] == [102] * 3
    assert [e["handed_out"] for e in p["epochs"]] == [102] * 3
    assert p["lost"] == p["repeated"] == p["missing"] == p["mismatched"] == 0
