"""The gradient-cache ops of RNA (HetsyncGradCache*) against a numpy reference, eager, in tf.function, threaded."""
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from hetsync import ops

SHAPES = [(3,), (2, 2)]
TOTAL = 7


def grads_of(rng):
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def const(v):
    return [np.full(s, v, np.float32) for s in SHAPES]


def reference(entries):
    """numpy reference of RNA's staleness-weighted accumulation (section 3.3).

    entries: list of (t, [arrays]) oldest first. k = newest t, tau = k - oldest t,
    g' = sum_t [t - (k - tau) + 1] g_t / sum_t [t - (k - tau) + 1]. Returns flat [TOTAL + 1].
    """
    if not entries:
        return np.zeros(TOTAL + 1, np.float32)
    k = entries[-1][0]
    tau = k - entries[0][0]
    a = np.array([t - (k - tau) + 1 for t, _ in entries], np.float64)
    flat = np.stack([np.concatenate([g.ravel() for g in gs]) for _, gs in entries]).astype(np.float64)
    return np.append((a[:, None] * flat).sum(0) / a.sum(), 1.0).astype(np.float32)


def test_staleness_weights_match_numpy_reference_with_the_bound():
    rng = np.random.default_rng(0)
    cache = ops.grad_cache_create(SHAPES, max_staleness=3)
    pending = []
    dropped = 0
    for t in [0, 1, 2, 4, 5, 9, 10, 11, 12, 13]:  # gaps: the bound drops t with 13 - t > 3, etc.
        g = grads_of(rng)
        got = int(ops.grad_cache_write(cache, g, t))
        pending.append((t, g))
        keep = [(u, h) for u, h in pending if t - u <= 3]
        dropped += len(pending) - len(keep)
        pending = keep
        assert got == dropped
        if t in (2, 5, 13):  # take now and then
            flat, its, newest = ops.grad_cache_take(cache)
            np.testing.assert_allclose(flat.numpy(), reference(pending), rtol=1e-6, atol=1e-6)
            assert its.numpy().tolist() == [u for u, _ in pending]
            assert int(newest) == t
            pending = []
    st = ops.grad_cache_status(cache)
    assert st["written"] == 10 and st["dropped"] == dropped and dropped > 0
    assert st["written"] == st["taken"] + st["dropped"] + st["pending"]


def test_weights_are_linear_in_the_iteration():
    # three pending gradients 10, 20, 40 at t = 7, 8, 10: k = 10, tau = 3, weights 1, 2, 4
    cache = ops.grad_cache_create(SHAPES, max_staleness=5)
    for t, v in ((7, 10.0), (8, 20.0), (10, 40.0)):
        ops.grad_cache_write(cache, const(v), t)
    flat, its, _ = ops.grad_cache_take(cache)
    expected = (1 * 10 + 2 * 20 + 4 * 40) / 7
    np.testing.assert_allclose(flat.numpy()[:-1], expected, rtol=1e-6)
    assert flat.numpy()[-1] == 1.0 and its.numpy().tolist() == [7, 8, 10]


def test_null_gradient_has_weight_zero_and_is_replaced_by_a_write():
    cache = ops.grad_cache_create(SHAPES, max_staleness=0)
    flat, its, newest = ops.grad_cache_take(cache)
    assert flat.numpy().tolist() == [0.0] * (TOTAL + 1) and its.numpy().size == 0 and int(newest) == -1
    ops.grad_cache_write(cache, const(3.0), 0)
    flat, _, _ = ops.grad_cache_take(cache)
    assert flat.numpy().tolist() == [3.0] * TOTAL + [1.0]
    flat, its, newest = ops.grad_cache_take(cache)  # taken: the null gradient again
    assert flat.numpy().tolist() == [0.0] * (TOTAL + 1) and its.numpy().size == 0 and int(newest) == 0
    # max_staleness 0: each write replaces the previous pending one, which is counted as dropped
    ops.grad_cache_write(cache, const(1.0), 1)
    assert int(ops.grad_cache_write(cache, const(2.0), 2)) == 1
    flat, its, _ = ops.grad_cache_take(cache)
    assert flat.numpy().tolist() == [2.0] * TOTAL + [1.0] and its.numpy().tolist() == [2]


def test_read_returns_local_until_a_result_is_published_then_fresh_once_by_round_id():
    cache = ops.grad_cache_create(SHAPES, max_staleness=2)
    local = const(5.0)
    outs, fresh, rid, wsum = ops.grad_cache_read(cache, local, 0)
    assert not bool(fresh) and int(rid) == -1 and float(wsum) == 1.0
    assert all(np.array_equal(o.numpy(), l) for o, l in zip(outs, local))
    # the allreduced sum over 3 contributors of [w g', w]: values 1..7 summed, weight sum 3
    reduced = np.append(np.arange(1, TOTAL + 1) * 3.0, 3.0).astype(np.float32)
    ops.grad_cache_publish(cache, reduced, 4)
    outs, fresh, rid, wsum = ops.grad_cache_read(cache, local, 1)
    assert bool(fresh) and int(rid) == 4 and float(wsum) == 3.0
    np.testing.assert_allclose(np.concatenate([o.numpy().ravel() for o in outs]), np.arange(1, TOTAL + 1))
    assert [o.shape.as_list() for o in outs] == [list(s) for s in SHAPES]
    outs, fresh, rid, wsum = ops.grad_cache_read(cache, local, 2)  # nothing new since the last read
    assert not bool(fresh) and int(rid) == 4 and float(wsum) == 1.0
    assert np.array_equal(outs[0].numpy(), local[0])
    # two publications between reads: only the newest is returned
    ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 2.0), 1.0).astype(np.float32), 5)
    ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 8.0), 2.0).astype(np.float32), 6)
    outs, fresh, rid, wsum = ops.grad_cache_read(cache, local, 3)
    assert bool(fresh) and int(rid) == 6 and float(wsum) == 2.0 and outs[1].numpy().tolist() == [[4.0, 4.0]] * 2
    st = ops.grad_cache_status(cache)
    assert (st["published"], st["fresh_reads"], st["newest_round"], st["last_read_round"]) == (3, 2, 6, 6)


def test_accumulating_publications_sum_the_rounds_no_step_has_read():
    cache = ops.grad_cache_create(SHAPES, max_staleness=2)
    local = const(5.0)
    # round 0 read at once; rounds 1, 2, 3 published before the next read: their sums S and weights W add up
    ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 3.0), 3.0).astype(np.float32), 0, accumulate=True)
    outs, fresh, rid, wsum = ops.grad_cache_read(cache, local, 0)
    assert bool(fresh) and int(rid) == 0 and float(wsum) == 3.0 and outs[0].numpy().tolist() == [1.0] * 3
    for r, (total, w) in enumerate(((2.0, 1.0), (8.0, 2.0), (6.0, 3.0)), start=1):
        ops.grad_cache_publish(cache, np.append(np.full(TOTAL, total), w).astype(np.float32), r, accumulate=True)
    outs, fresh, rid, wsum = ops.grad_cache_read(cache, local, 1)
    # (2 + 8 + 6) / (1 + 2 + 3): the mean over the three rounds' gradients, weight sum 6
    assert bool(fresh) and int(rid) == 3 and float(wsum) == 6.0
    np.testing.assert_allclose(np.concatenate([o.numpy().ravel() for o in outs]), np.full(TOTAL, 16.0 / 6.0),
                               rtol=1e-6)
    # read, then published again: a fresh start, not added to what was read
    ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 4.0), 4.0).astype(np.float32), 4, accumulate=True)
    outs, fresh, rid, wsum = ops.grad_cache_read(cache, local, 2)
    assert bool(fresh) and float(wsum) == 4.0 and outs[0].numpy().tolist() == [1.0] * 3
    # the first read's outputs were not changed by the later publications
    assert float(ops.grad_cache_status(cache)["published"]) == 5


def test_bad_inputs_fail_clearly():
    cache = ops.grad_cache_create(SHAPES, max_staleness=1)
    ops.grad_cache_write(cache, const(1.0), 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="iterations must increase; got 5 after 5"):
        ops.grad_cache_write(cache, const(1.0), 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"grads\[1\] has shape \[4\], the cache expects \[2,2\]"):
        ops.grad_cache_write(cache, [np.zeros(3, np.float32), np.zeros(4, np.float32)], 6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds 2 tensors, got 1"):
        ops.grad_cache_read(cache, [np.zeros(3, np.float32)], 6)
    with pytest.raises(TypeError, match=r"grads\[0\] must be float32.*float64"):
        ops.grad_cache_write(cache, [np.zeros(3), np.zeros((2, 2))], 6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sum of weights must be > 0"):
        ops.grad_cache_publish(cache, np.zeros(TOTAL + 1, np.float32), 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="vector of length 8"):
        ops.grad_cache_publish(cache, np.ones(TOTAL, np.float32), 0)
    ops.grad_cache_publish(cache, np.ones(TOTAL + 1, np.float32), 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="round ids must increase; got 2 after 2"):
        ops.grad_cache_publish(cache, np.ones(TOTAL + 1, np.float32), 2)
    with pytest.raises(ValueError, match="max_staleness must be an int >= 0, got -1"):
        ops.grad_cache_create(SHAPES, -1)
    with pytest.raises(ValueError, match="fully defined"):
        ops.grad_cache_create([(None, 3)], 1)
    ops.grad_cache_destroy(cache)
    with pytest.raises(tf.errors.NotFoundError):
        ops.grad_cache_status(cache)


def test_write_and_read_inside_tf_function():
    cache = ops.grad_cache_create(SHAPES, max_staleness=4)
    it = tf.Variable(-1, dtype=tf.int64)

    @tf.function
    def step(a, b):
        t = it.assign_add(1)
        dropped = ops.grad_cache_write(cache, [a, b], t)
        with tf.control_dependencies([dropped]):
            outs, fresh, rid, wsum = ops.grad_cache_read(cache, [a, b], t)
        return outs, fresh, rid, wsum

    outs, fresh, rid, _ = step(tf.fill([3], 1.0), tf.fill([2, 2], 1.0))
    assert not bool(fresh) and int(rid) == -1 and outs[0].numpy().tolist() == [1.0] * 3
    step(tf.fill([3], 3.0), tf.fill([2, 2], 3.0))
    flat, its, _ = ops.grad_cache_take(cache)
    np.testing.assert_allclose(flat.numpy(), [(1 * 1 + 2 * 3) / 3] * TOTAL + [1.0], rtol=1e-6)
    ops.grad_cache_publish(cache, flat * 2, 0)  # as if two ranks had contributed the same
    outs, fresh, rid, wsum = step(tf.fill([3], 9.0), tf.fill([2, 2], 9.0))
    assert bool(fresh) and int(rid) == 0 and float(wsum) == 2.0
    np.testing.assert_allclose(outs[1].numpy(), np.full((2, 2), 7 / 3), rtol=1e-6)


def test_wait_times_out_empty_and_wakes_on_write_from_another_thread():
    cache = ops.grad_cache_create(SHAPES, max_staleness=1)
    t0 = time.perf_counter()
    assert not bool(ops.grad_cache_wait(cache, 30.0))
    assert time.perf_counter() - t0 >= 0.025
    result = {}

    def waiter():
        t = time.perf_counter()
        result["ready"] = bool(ops.grad_cache_wait(cache, 10000.0))
        result["s"] = time.perf_counter() - t

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    ops.grad_cache_write(cache, const(1.0), 0)
    th.join(10)
    assert result["ready"] and 0.15 <= result["s"] < 5.0, result


def test_wait_published_wakes_once_the_round_that_took_the_iteration_is_published():
    cache = ops.grad_cache_create(SHAPES, max_staleness=4)
    ops.grad_cache_write(cache, const(1.0), 3)
    published, _ = ops.grad_cache_wait_published(cache, 3, 0.0)  # written, not taken (a poll: no stall)
    assert not bool(published)
    ops.grad_cache_take(cache)
    published, _ = ops.grad_cache_wait_published(cache, 3, 0.0)  # taken, not yet published
    assert not bool(published)
    result = {}

    def waiter():
        result["out"] = ops.grad_cache_wait_published(cache, 3, 10000.0)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 2.0, np.float32), 1.0), 0)
    th.join(10)
    published, waited = result["out"]
    assert bool(published) and 150.0 <= float(waited) < 5000.0, result
    # a later publish of a round that took nothing keeps iteration 3 published; iteration 4 is not
    ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 2.0, np.float32), 1.0), 1)
    assert bool(ops.grad_cache_wait_published(cache, 3, 0.0)[0])
    assert not bool(ops.grad_cache_wait_published(cache, 4, 0.0)[0])
    # the read after the wait returns the accumulated rounds
    outs, fresh, round_id, wsum = ops.grad_cache_read(cache, const(0.0), 4)
    assert bool(fresh) and int(round_id) == 1


def test_released_cache_returns_every_wait_at_once_until_set_back():
    cache = ops.grad_cache_create(SHAPES, max_staleness=4)
    ops.grad_cache_write(cache, const(1.0), 0)
    result = {}

    def waiter():
        t = time.perf_counter()
        result["out"] = ops.grad_cache_wait_published(cache, 0, 10000.0)
        result["s"] = time.perf_counter() - t

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    ops.grad_cache_set_released(cache, True)
    th.join(10)
    assert not bool(result["out"][0]) and 0.15 <= result["s"] < 5.0, result
    t0 = time.perf_counter()
    assert not bool(ops.grad_cache_wait_published(cache, 0, 10000.0)[0])
    assert time.perf_counter() - t0 < 1.0
    ops.grad_cache_set_released(cache, False)
    published, waited = ops.grad_cache_wait_published(cache, 0, 30.0)
    assert not bool(published) and float(waited) >= 25.0


def test_a_timed_out_wait_marks_the_rounds_stalled_until_the_next_publish():
    cache = ops.grad_cache_create(SHAPES, max_staleness=4)
    ops.grad_cache_write(cache, const(1.0), 0)
    published, waited = ops.grad_cache_wait_published(cache, 0, 30.0)  # no round comes: times out
    assert not bool(published) and float(waited) >= 25.0
    t0 = time.perf_counter()
    published, _ = ops.grad_cache_wait_published(cache, 0, 10000.0)  # stalled: at once
    assert not bool(published) and time.perf_counter() - t0 < 1.0
    ops.grad_cache_take(cache)
    ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 1.0, np.float32), 1.0), 0)  # clears the stall
    assert bool(ops.grad_cache_wait_published(cache, 0, 0.0)[0])
    ops.grad_cache_write(cache, const(1.0), 1)
    published, waited = ops.grad_cache_wait_published(cache, 1, 30.0)  # waits again
    assert not bool(published) and float(waited) >= 25.0


def test_wait_published_inside_tf_function_and_bad_timeout():
    cache = ops.grad_cache_create(SHAPES, max_staleness=4)

    @tf.function
    def step(g, it):
        ops.grad_cache_write(cache, g, it)
        published, _ = ops.grad_cache_wait_published(cache, it, 5000.0)
        with tf.control_dependencies([published]):
            outs, fresh, _, _ = ops.grad_cache_read(cache, g, it)
        return published, fresh, outs

    def comm():
        while not bool(ops.grad_cache_wait(cache, 5000.0)):
            pass
        ops.grad_cache_take(cache)
        ops.grad_cache_publish(cache, np.append(np.full(TOTAL, 6.0, np.float32), 2.0), 0)

    th = threading.Thread(target=comm)
    th.start()
    published, fresh, outs = step(const(1.0), tf.constant(0, tf.int64))
    th.join(10)
    assert bool(published) and bool(fresh)
    np.testing.assert_allclose(outs[0].numpy(), np.full(3, 3.0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="timeout_ms"):
        ops.grad_cache_wait_published(cache, 0, -1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="timeout_ms"):
        ops.grad_cache_wait_published(cache, 0, float("inf"))


def test_concurrent_writer_readers_and_communication_thread():
    """One compute thread writes and reads, two extra readers, one communication thread takes and publishes."""
    cache = ops.grad_cache_create(SHAPES, max_staleness=2)
    n_writes, errors, stop = 3000, [], threading.Event()
    fresh_rounds = {"compute": [], "reader0": [], "reader1": []}
    takes = []

    def compute():
        try:
            for t in range(n_writes):
                ops.grad_cache_write(cache, const(float(t)), t)
                outs, fresh, rid, _ = ops.grad_cache_read(cache, const(-1.0), t)
                if bool(fresh):
                    # a published result is round r's constant vector r: never torn, never mixed
                    assert np.all(outs[0].numpy() == float(rid)) and np.all(outs[1].numpy() == float(rid))
                    fresh_rounds["compute"].append(int(rid))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            stop.set()

    def reader(name):
        try:
            while not stop.is_set():
                outs, fresh, rid, _ = ops.grad_cache_read(cache, const(-1.0), 0)
                if bool(fresh):
                    assert np.all(outs[1].numpy() == float(rid))
                    fresh_rounds[name].append(int(rid))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    def communication():
        r = 0
        try:
            while not stop.is_set() or ops.grad_cache_status(cache)["pending"]:
                flat, its, _ = ops.grad_cache_take(cache)
                flat, its = flat.numpy(), its.numpy()
                if its.size:
                    # a constant gradient t per iteration: g' is the weighted mean of the iterations
                    a = its - its[0] + 1
                    np.testing.assert_allclose(flat[:-1], (a * its).sum() / a.sum(), rtol=1e-5)
                    assert flat[-1] == 1.0 and its[-1] - its[0] <= 2 and np.all(np.diff(its) > 0)
                    takes.append(its.size)
                ops.grad_cache_publish(cache, np.append(np.full(TOTAL, float(r)), 1.0).astype(np.float32), r)
                r += 1
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=compute), threading.Thread(target=communication)] + [
        threading.Thread(target=reader, args=(f"reader{i}",)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    st = ops.grad_cache_status(cache)
    assert st["written"] == n_writes and st["pending"] == 0
    assert st["written"] == st["taken"] + st["dropped"] == sum(takes) + st["dropped"]
    all_fresh = sum(fresh_rounds.values(), [])
    assert len(all_fresh) == len(set(all_fresh)) == st["fresh_reads"]  # every round read at most once
    for rounds in fresh_rounds.values():
        assert rounds == sorted(rounds)
    assert len(takes) > 10 and st["published"] > 10
