"""Checkpoint and resume, one process: argument checks, the atomic write, refusal of a
foreign checkpoint, protocol state round trips, and an interrupted fit resumed mid-epoch that ends
with exactly the uninterrupted fit's weights."""
import json
import os

import keras
import numpy as np
import pytest

import hetsync
from hetsync.callbacks.checkpoint import BackupAndRestore, atomic_save, complete_checkpoints, load_checkpoint


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


@pytest.mark.parametrize("kwargs,word", [
    ({}, "neither"), ({"save_every_steps": 0}, "save_every_steps"), ({"save_every_steps": -3}, "-3"),
    ({"save_every_steps": 2.5}, "2.5"), ({"save_every_steps": True}, "True"), ({"save_every_s": 0}, "save_every_s"),
    ({"save_every_s": -1.0}, "-1.0"), ({"save_every_steps": 5, "keep": 1}, "keep"),
    ({"save_every_steps": 5, "dataset": np.zeros(3)}, "ndarray"),
])
def test_bad_arguments_raise_value_error_naming_the_value(tmp_path, kwargs, word):
    with pytest.raises(ValueError, match=word):
        BackupAndRestore(str(tmp_path), **kwargs)
    with pytest.raises(ValueError, match="backup_dir"):
        BackupAndRestore("", save_every_steps=1)


def test_atomic_save_complete_or_absent(tmp_path):
    d = str(tmp_path / "rank0")
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(7, np.int64)]
    atomic_save(d, 10, arrays, {"a": 1})
    # an interrupted write (a temporary folder) and a folder without meta.json are not checkpoints
    os.makedirs(os.path.join(d, ".tmp-step-000000000020-123"))
    os.makedirs(os.path.join(d, "step-000000000030"))
    assert complete_checkpoints(d) == [10]
    got, meta = load_checkpoint(d, 10)
    assert meta == {"a": 1} and len(got) == 2
    np.testing.assert_array_equal(got[0], arrays[0])
    assert got[1].dtype == np.int64 and int(got[1]) == 7
    atomic_save(d, 10, [np.ones(2)], {"a": 2})  # the same step again replaces it
    assert load_checkpoint(d, 10)[1] == {"a": 2} and complete_checkpoints(d) == [10]
    assert not [n for n in os.listdir(d) if n.startswith(".tmp") and n.endswith(str(os.getpid()))]
    with pytest.raises(ValueError, match="-1"):
        atomic_save(d, -1, [], {})
    assert complete_checkpoints(str(tmp_path / "missing")) == []


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return x, y


def _fit(wrapper, backup_dir, epochs=3, stop_at=None, **proto):
    """A fresh model (as a relaunched process builds it) fit with BackupAndRestore; ``stop_at``:
    raise after that global step (an interruption). Returns (model, callback, metrics)."""
    keras.utils.set_random_seed(3)
    x, y = _data()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2, activation="softmax")])
    if wrapper is hetsync.LocalSGD:  # fixed shares: the sample pool has no resumable data position
        proto.setdefault("data_plan", "shard")
    opt = wrapper(keras.optimizers.SGD(0.1, momentum=0.9), **proto)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    fit = opt.hetsync_protocol.fit_data(x, y, 16, seed=1)  # 12 steps per epoch
    metrics = hetsync.callbacks.SyncMetrics(os.path.join(backup_dir + "-log"), opt)
    cb = BackupAndRestore(backup_dir, save_every_steps=5, dataset=fit["x"], metrics=metrics, delete_checkpoint=False)

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if stop_at is not None and self.model._hetsync_epoch * 12 + batch + 1 == stop_at:
                raise KeyboardInterrupt("interrupted")

        def on_epoch_begin(self, epoch, logs=None):
            self.model._hetsync_epoch = epoch

    try:
        model.fit(**fit, epochs=epochs, verbose=0, callbacks=[cb] + hetsync.callbacks.standard(opt) + [metrics, Stop()])
    except KeyboardInterrupt:
        pass
    return model, cb, metrics


@pytest.mark.parametrize("wrapper,proto", [(hetsync.BSP, {}), (hetsync.LocalSGD, {"period": 4})])
def test_interrupted_fit_resumes_mid_epoch_to_the_same_weights(tmp_path, wrapper, proto):
    ref, _, ref_metrics = _fit(wrapper, str(tmp_path / "ref"), **proto)
    backup = str(tmp_path / "b")
    _, cb, _ = _fit(wrapper, backup, stop_at=23, **proto)  # saves after 5, 10, 15, 20; stops after 23
    assert cb.restored_step is None and complete_checkpoints(os.path.join(backup, "rank0")) == [15, 20]
    model, cb, metrics = _fit(wrapper, backup, **proto)
    assert cb.restored_step == 20  # epoch 1, step 8 of 12
    for a, b in zip(ref.variables, model.variables):  # BatchNormalization's statistics included
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    for a, b in zip(ref.optimizer.variables, model.optimizer.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert metrics.per_rank[0]["steps"] == ref_metrics.per_rank[0]["steps"] == 36
    assert metrics.per_rank[0]["samples"] == ref_metrics.per_rank[0]["samples"] == 36 * 16
    got, want = model.optimizer.hetsync_protocol.state(), ref.optimizer.hetsync_protocol.state()
    assert got["variables"] == want["variables"]  # local SGD's step counter
    assert {k: v for k, v in got["stats"].items() if not k.endswith("_ms")} == \
        {k: v for k, v in want["stats"].items() if not k.endswith("_ms")}  # counters (not timings)


def test_a_foreign_checkpoint_is_refused(tmp_path):
    backup = str(tmp_path / "b")
    _fit(hetsync.BSP, backup, stop_at=7)
    with pytest.raises(ValueError, match="protocol='bsp' but this run has protocol='localsgd'"):
        _fit(hetsync.LocalSGD, backup)
    meta_path = os.path.join(backup, "rank0", "step-000000000005", "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["world_size"] = 4
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(ValueError, match="world_size=4 but this run has world_size=1"):
        _fit(hetsync.BSP, backup)


def test_step_stats_reads_every_statistic_after_each_change():
    """The one compiled read of all statistics returns each variable's current value, and a statistic added
    later (a new name) appears in the next read."""
    p = hetsync.LocalSGD(keras.optimizers.SGD(0.1), period=3).hetsync_protocol
    p._stats["syncs"].assign(5.0)
    first = p.step_stats()
    assert first == {k: float(v.numpy()) for k, v in p._stats.items()} and first["syncs"] == 5.0
    p._stats["syncs"].assign_add(2.0)
    p.add_stat("extra_probe", initial=0.25)
    second = p.step_stats()
    assert second["syncs"] == 7.0 and second["extra_probe"] == 0.25 and set(second) == set(p._stats)


def test_protocol_state_round_trip_and_bad_state():
    opt = hetsync.LocalSGD(keras.optimizers.SGD(0.1), period=3)
    p = opt.hetsync_protocol
    p._global_step.assign(17)
    p._stats["syncs"].assign(5.0)
    state = json.loads(json.dumps(p.state()))  # JSON-able
    q = hetsync.LocalSGD(keras.optimizers.SGD(0.1), period=3).hetsync_protocol
    q.load_state(state)
    assert int(q._global_step.numpy()) == 17 and q.step_stats()["syncs"] == 5.0
    with pytest.raises(ValueError, match="'nope'"):
        q.load_state({"stats": {"nope": 1.0}})
    with pytest.raises(ValueError, match="_global_step"):
        q.load_state({"variables": {"_global_step": {"dtype": "int64", "value": [1, 2]}}})


def test_a_rank_ahead_keeps_the_step_the_slowest_rank_reached(tmp_path, monkeypatch):
    """Asynchronous protocols: rank 0 at step 60, rank 1 at 30; rank 0 must keep step 30."""
    from hetsync import world as runtime
    for r, steps in ((0, range(10, 61, 10)), (1, (20, 30))):
        for k in steps:
            atomic_save(str(tmp_path / f"rank{r}"), k, [], {})
    cb = BackupAndRestore(str(tmp_path), save_every_steps=10)
    monkeypatch.setattr(runtime, "size", lambda: 2)
    monkeypatch.setattr(runtime, "rank", lambda: 0)
    assert cb._prunable() == [10, 20]  # keeps 30 (rank 1's latest) .. 60
    monkeypatch.setattr(runtime, "rank", lambda: 1)
    assert cb._prunable() == []  # rank 1 keeps its newest two
    import shutil
    shutil.rmtree(tmp_path / "rank1")  # another host's folder is not visible: the newest `keep` only
    monkeypatch.setattr(runtime, "rank", lambda: 0)
    assert cb._prunable() == [10, 20, 30, 40]


def test_time_triggered_saves(tmp_path):
    """save_every_s: a save at every step boundary once the time has passed (here: always); the
    newest two are kept; the position is (epoch, step in epoch, global step)."""
    backup = str(tmp_path / "t")
    keras.utils.set_random_seed(3)
    x, y = _data()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    fit = opt.hetsync_protocol.fit_data(x, y, 16, seed=1)
    cb = BackupAndRestore(backup, save_every_s=1e-9, dataset=fit["x"], delete_checkpoint=False)
    model.fit(**fit, epochs=2, verbose=0, callbacks=[cb] + hetsync.callbacks.standard(opt))
    # a save due after the last step (24) is not written: the newest is before step 24
    assert cb.saves == 23 and complete_checkpoints(os.path.join(backup, "rank0")) == [22, 23]
    _, meta = load_checkpoint(os.path.join(backup, "rank0"), 23)
    assert (meta["epoch"], meta["step_in_epoch"], meta["global_step"]) == (1, 11, 23)


def test_placed_after_standard_is_refused_and_the_next_fit_is_not_affected(tmp_path):
    x, y = _data()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    fit = opt.hetsync_protocol.fit_data(x, y, 16)
    d = str(tmp_path / "b")
    with pytest.raises(ValueError, match="before hetsync.callbacks.standard"):
        model.fit(**fit, epochs=1, verbose=0,
                  callbacks=hetsync.callbacks.standard(opt) + [BackupAndRestore(d, save_every_steps=2, dataset=fit["x"])])
    cb = BackupAndRestore(d, save_every_steps=2, dataset=fit["x"])
    model.fit(**fit, epochs=1, verbose=0, callbacks=[cb] + hetsync.callbacks.standard(opt))
    assert cb.saves == 5 and not os.path.exists(d)  # 12 steps: saves before steps 3, 5, ..., 11; deleted at the end
