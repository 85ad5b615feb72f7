"""RNA in one process: argument checks, the compute step (ReadOp result, lr scaling, parameter correction), a full fit."""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import hetsync
from hetsync import ops


@pytest.fixture(scope="module", autouse=True)
def init():
    hetsync.init()


@pytest.mark.parametrize("kwargs, message", [
    ({"probes": 0}, "RNA: probes must be an integer >= 1 (ranks probed per round), got 0"),
    ({"probes": 3}, "probes=3 exceeds the world size 1"),
    ({"max_staleness": -1}, "RNA: max_staleness must be an integer >= 0 (local iterations), got -1"),
    ({"average_every": 1.5}, "RNA: average_every must be None (by the update rule: 10 for the paper's, 0 for "
                             "samples) or an integer >= 0 (rounds), got 1.5"),
    ({"drift_every": -1}, "RNA: drift_every must be None (average_every, else 20 for the paper's rule and 0 for "
                          "samples) or an integer >= 0 (rounds), got -1"),
    ({"scale_lr": "yes"}, "RNA: scale_lr must be True or False, got 'yes'"),
    ({"timeout_s": 0}, "RNA: timeout_s must be a number > 0 (seconds), got 0"),
    ({"finish_timeout_s": -3}, "RNA: finish_timeout_s must be a number > 0 (seconds), got -3"),
    ({"poll_ms": float("nan")}, "RNA: poll_ms must be a number > 0 (milliseconds), got nan"),
    ({"update_rule": "sum"}, "RNA: update_rule must be one of"),
    ({"update_rule": "samples", "scale_lr": True}, "use it with scale_lr=False"),
    ({"stale_lr": "inverse"}, "RNA: stale_lr='inverse' needs update_rule='samples'"),
    ({"wait_for_round": True}, "RNA: wait_for_round=True needs update_rule='samples'"),
    ({"wait_for_round": "yes", "update_rule": "samples"}, "RNA: wait_for_round must be True or False, got 'yes'"),
    ({"wait_timeout_s": 0, "update_rule": "samples"}, "RNA: wait_timeout_s must be a number > 0 (seconds), got 0"),
    ({"stale_lr": "sqrt", "update_rule": "samples"}, "RNA: stale_lr must be one of"),
    ({"wait_lag": 1, "update_rule": "samples"}, "RNA: wait_lag=1 needs wait_for_round=True"),
    ({"wait_lag": 5, "update_rule": "samples", "wait_for_round": True}, "RNA: wait_lag=5 exceeds max_staleness=4"),
    ({"wait_lag": -1}, "RNA: wait_lag must be"),
])
def test_bad_arguments_fail_at_wrap_time(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        hetsync.RNA(keras.optimizers.SGD(0.1), **kwargs)


def test_cli_arguments_are_checked_against_the_signature():
    kw = hetsync.protocols.parse_protocol_args("rna", ["probes=1", "scale_lr=True", "average_every=0"])
    assert kw == {"probes": 1, "scale_lr": True, "average_every": 0}
    with pytest.raises(ValueError, match="takes no argument 'probe'"):
        hetsync.protocols.parse_protocol_args("rna", ["probe=1"])


def _step_setup(scale_lr, average_every=0, update_rule="paper", **kwargs):
    v = keras.Variable(np.zeros(3, np.float32))
    opt = hetsync.RNA(keras.optimizers.SGD(0.5), scale_lr=scale_lr, average_every=average_every, drift_every=0,
                      update_rule=update_rule, **kwargs)
    opt.build([v])
    proto = opt.hetsync_protocol
    proto._create_caches()  # what start() does, without the communication thread
    return v, opt, proto


@pytest.mark.parametrize("scale_lr", [False, True])
def test_step_applies_the_fresh_result_scaled_by_the_weight_sum_then_local_gradients(scale_lr):
    v, opt, proto = _step_setup(scale_lr)
    step = tf.function(lambda g: opt.apply([g], [v]))
    step(tf.constant([1.0, 1.0, 1.0]))  # no result yet: the local gradient, lr 0.5
    np.testing.assert_allclose(v.numpy(), [-0.5] * 3)
    # a round with 3 contributors whose gradients sum to [3, 6, 9]: result [1, 2, 3], sum(w) = 3
    ops.grad_cache_publish(proto._cache, np.array([3.0, 6.0, 9.0, 3.0], np.float32), 0)
    step(tf.constant([1.0, 1.0, 1.0]))
    factor = 3.0 if scale_lr else 1.0  # gamma_k = sum(w) * gamma
    np.testing.assert_allclose(v.numpy(), [-0.5 - 0.5 * factor * x for x in (1, 2, 3)], rtol=1e-6)
    step(tf.constant([2.0, 2.0, 2.0]))  # nothing new: local again, unscaled
    np.testing.assert_allclose(v.numpy(), [-1.5 - 0.5 * factor * x for x in (1, 2, 3)], rtol=1e-6)
    st = proto.step_stats()
    assert st["rna_fresh"] == 0.0 and st["rna_round"] == 0.0 and st["rna_contributors"] == 1.0
    s = ops.grad_cache_status(proto._cache)
    assert s["written"] == 3 and s["pending"] == 3 and s["fresh_reads"] == 1  # max_staleness 4: nothing dropped


def test_the_samples_rule_applies_every_gradient_once_and_takes_no_local_step():
    v, opt, proto = _step_setup(False, update_rule="samples")
    step = tf.function(lambda g: opt.apply([g], [v]))
    step(tf.constant([1.0, 1.0, 1.0]))  # no result yet: no local step
    np.testing.assert_allclose(v.numpy(), [0.0] * 3)
    assert int(opt.iterations.numpy()) == 0
    # 3 gradients summing to [3, 6, 9] (weights 3): the update is lr x sum / n with n = 1 rank here
    ops.grad_cache_publish(proto._cache, np.array([3.0, 6.0, 9.0, 3.0], np.float32), 0, accumulate=True)
    step(tf.constant([1.0, 1.0, 1.0]))
    np.testing.assert_allclose(v.numpy(), [-1.5, -3.0, -4.5], rtol=1e-6)
    # two rounds before the next step (sums [1, 1, 1] and [2, 0, 4]): both are applied, once
    ops.grad_cache_publish(proto._cache, np.array([1.0, 1.0, 1.0, 1.0], np.float32), 1, accumulate=True)
    ops.grad_cache_publish(proto._cache, np.array([2.0, 0.0, 4.0, 2.0], np.float32), 2, accumulate=True)
    step(tf.constant([7.0, 7.0, 7.0]))
    np.testing.assert_allclose(v.numpy(), [-3.0, -3.5, -7.0], rtol=1e-6)
    step(tf.constant([7.0, 7.0, 7.0]))  # nothing new: unchanged
    np.testing.assert_allclose(v.numpy(), [-3.0, -3.5, -7.0], rtol=1e-6)
    assert int(opt.iterations.numpy()) == 2  # the wrapped optimizer stepped only on the two fresh results
    assert proto.step_stats()["rna_fresh"] == 0.0


def test_the_staleness_dependent_rate_records_each_steps_round_and_scales_by_the_rounds_missed():
    v, opt, proto = _step_setup(False, update_rule="samples", stale_lr="inverse")
    step = tf.function(lambda g: opt.apply([g], [v]))
    step(tf.constant([1.0, 1.0, 1.0]))  # t = 0 on the initial parameters (no round yet)
    ops.grad_cache_publish(proto._cache, np.array([1.0, 1.0, 1.0, 1.0], np.float32), 0, accumulate=True)
    step(tf.constant([1.0, 1.0, 1.0]))  # t = 1 computed before reading round 0
    step(tf.constant([1.0, 1.0, 1.0]))  # t = 2 on parameters that include round 0
    np.testing.assert_array_equal(proto._read_rounds.numpy()[:4], [-1, -1, 0, -1])
    proto._local = {"round_staleness": np.zeros(16, np.int64), "lr_scale": []}
    # contributed to round 3: c = 3 - 1 - r(t) = 3, 3, 2 rounds; f = 1/3, 1/3, 1/2; the cache's weights 1, 2, 3
    scale = proto._contribution_scale(np.array([0, 1, 2]), 3)
    mean_f = (1 / 3 + 2 / 3 + 3 / 2) / 6
    np.testing.assert_allclose(scale, (3 * mean_f, 3.0), rtol=1e-12)
    assert proto._local["round_staleness"][2] == 1 and proto._local["round_staleness"][3] == 2
    np.testing.assert_allclose(proto._local["lr_scale"], [mean_f])
    # a gradient that missed no round, or one round, keeps the full rate (1 / max(c, 1))
    assert proto._contribution_scale(np.array([2]), 1) == (1.0, 1.0)
    assert proto._contribution_scale(np.array([2]), 2) == (1.0, 1.0)


@pytest.mark.parametrize("rule, given, average, drift", [
    ("paper", None, 10, 10), ("samples", None, 0, 0), ("samples", 3, 3, 3),
    ("paper", 0, 0, 20)])
def test_the_parameter_average_period_follows_the_update_rule_unless_given(rule, given, average, drift):
    opt = hetsync.RNA(keras.optimizers.SGD(0.1), update_rule=rule, average_every=given)
    proto = opt.hetsync_protocol
    assert (proto.average_every, proto.drift_every) == (average, drift)
    assert proto.config()["average_every"] == given  # the configuration keeps what the user gave


def test_parameter_average_correction_is_added_once():
    v, opt, proto = _step_setup(False, average_every=5)
    step = tf.function(lambda g: opt.apply([g], [v]))
    step(tf.constant([0.0, 0.0, 0.0]))
    ops.grad_cache_publish(proto._pcache, np.array([1.0, -2.0, 0.5, 1.0], np.float32), 0)  # mean - snapshot
    step(tf.constant([0.0, 0.0, 0.0]))
    np.testing.assert_allclose(v.numpy(), [1.0, -2.0, 0.5])
    step(tf.constant([0.0, 0.0, 0.0]))
    np.testing.assert_allclose(v.numpy(), [1.0, -2.0, 0.5])
    assert proto.step_stats()["rna_param_corrections"] == 1.0


def test_single_process_fit_runs_rounds_and_stops_cleanly(tmp_path):
    ds = hetsync.data.load("digits", seed=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10, activation="softmax")])
    opt = hetsync.RNA(keras.optimizers.SGD(0.1), probes=1, average_every=3)
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    metrics = hetsync.callbacks.SyncMetrics(str(tmp_path), opt)
    import sys

    before, during = sys.getswitchinterval(), []
    spy = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: during.append(sys.getswitchinterval()))
    hist = model.fit(ds.x_train, ds.y_train, batch_size=64, epochs=3, verbose=0,
                     callbacks=hetsync.callbacks.standard(opt) + [metrics, spy])
    assert before > 0.0005 and set(during) == {0.0005} and sys.getswitchinterval() == before  # restored at stop
    s = opt.hetsync_protocol.summary_stats()
    assert s["final_reason"] == "all ranks finished"
    assert s["rounds"] >= 1 and s["initiator_counts"] == [s["rounds"]]
    pr = s["per_rank"][0]
    assert pr["steps"] == pr["written"] == 3 * int(np.ceil(len(ds.x_train) / 64))
    assert pr["written"] == pr["taken"] + pr["dropped"] + pr["undrained_at_end"]
    assert pr["error"] is None and set(pr["late_messages"]) == {"rna.control", "rna.to_controller"}
    assert hist.history["accuracy"][-1] > 0.5
    assert metrics.summary["stats"]["rounds"] == s["rounds"]


def _snapshots_during_slow_steps(proto, v1, v2, steps=25):
    """Run ``steps`` compiled RNA steps whose local update changes v1, waits 20 ms, then changes v2
    (both by -1), while a thread takes snapshots; return the snapshots ([v1, v2] flat)."""
    import threading

    def slow_apply(grads, variables):
        a = variables[0].assign_sub(grads[0])
        with tf.control_dependencies([a]):
            (g1,), _, _ = ops.delay([grads[1]], tf.constant([0.0, 1.0, 20.0], tf.float64))
        return variables[1].assign_sub(g1)

    ones = tf.ones([3])
    step = tf.function(lambda: proto.apply([ones, ones], [v1, v2], slow_apply))
    step()  # trace
    snaps, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            snaps.append(proto.snapshot())

    th = threading.Thread(target=reader)
    th.start()
    for _ in range(steps):
        step()
    stop.set()
    th.join(10)
    return snaps


def test_the_communication_threads_snapshot_never_sees_a_half_applied_update(monkeypatch):
    v1, v2 = keras.Variable(np.zeros(3, np.float32)), keras.Variable(np.zeros(3, np.float32))
    opt = hetsync.RNA(keras.optimizers.SGD(1.0), average_every=0, drift_every=0)
    opt.build([v1, v2])
    proto = opt.hetsync_protocol
    proto._create_caches()
    snaps = _snapshots_during_slow_steps(proto, v1, v2)
    assert len(snaps) >= 5
    torn = [s for s in snaps if not np.array_equal(s[:3], s[3:])]
    assert torn == [], torn[:3]  # every snapshot holds both variables after the same number of updates
    assert float(v1.numpy()[0]) == float(v2.numpy()[0]) == -26.0

    class NoLock:  # the defect: reading the variables while the step updates them
        def execute(self, fn):
            return fn()

    monkeypatch.setattr(proto, "_section", NoLock())
    snaps = _snapshots_during_slow_steps(proto, v1, v2)
    assert any(not np.array_equal(s[:3], s[3:]) for s in snaps)  # the test sees torn reads when they happen
