"""Hop's update queue and token queue ops (HetsyncHop*) against a Python reference model.

Hop paper sections 4.1, 4.2, 6.1; spec hop.md sections 2, 3, 11. Eager, inside tf.function, and threaded.
"""
import os
import random
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from hetsync import ops

DTYPES = [tf.float32, tf.int32]
SHAPES = [[2], []]


# --- reference model (the oracle) ------------------------------------------------------------------------------


class RefFailedPrecondition(Exception):
    """The reference's counterpart of tf.errors.FailedPreconditionError (a tag > k in slot k mod Q)."""


class RefUpdateQueue:
    """Hop's update queue as one arrival-ordered list (slots are implicit: slot = iter mod num_slots)."""

    def __init__(self, num_slots):
        self.q = num_slots
        self.entries = []  # (iter, w_id, payload), arrival order
        self.c = dict(enqueued=0, dequeued=0, discarded_stale=0, discarded_superseded=0, dropped_closed=0)
        self.iter_rcv = {}
        self.closed = False

    def enqueue(self, it, wid, payload):
        if self.closed:
            self.c["dropped_closed"] += 1
            return
        self.entries.append((it, wid, payload))
        self.c["enqueued"] += 1

    def _matching(self, it, wid):
        if it is not None:
            slot = it % self.q
            stale = [e for e in self.entries if e[0] % self.q == slot and e[0] < it]
            self.entries = [e for e in self.entries if not (e[0] % self.q == slot and e[0] < it)]
            self.c["discarded_stale"] += len(stale)
            if any(e[0] % self.q == slot and e[0] > it for e in self.entries):
                raise RefFailedPrecondition
        return [e for e in self.entries if (it is None or e[0] == it) and (wid is None or e[1] == wid)]

    def dequeue(self, m, it=None, wid=None, greedy=False):
        """The entries returned, or None if the call would wait."""
        match = self._matching(it, wid)
        if len(match) < m:
            return None
        taken = match if greedy else match[:m]
        ids = {id(e) for e in taken}
        self.entries = [e for e in self.entries if id(e) not in ids]
        self.c["dequeued"] += len(taken)
        return taken

    def size(self, it=None, wid=None):
        return len(self._matching(it, wid))

    def newest(self, w_ids, min_it):
        """{w_id: entry or None}, or None if the call would wait."""
        best = {}
        for e in self.entries:  # arrival order: ">=" keeps the latest among equal tags
            if e[1] in w_ids and (e[1] not in best or e[0] >= best[e[1]][0]):
                best[e[1]] = e
        if any(max(self.iter_rcv.get(w, -1), best[w][0] if w in best else -1) < min_it for w in w_ids):
            return None
        mine = [e for e in self.entries if e[1] in w_ids]
        self.entries = [e for e in self.entries if e[1] not in w_ids]
        self.c["discarded_superseded"] += len(mine) - len(best)
        self.c["dequeued"] += len(best)
        for w, e in best.items():
            self.iter_rcv[w] = max(self.iter_rcv.get(w, -1), e[0])
        return {w: best.get(w) for w in w_ids}

    def counters(self, waiters=0):
        return dict(self.c, size=len(self.entries), waiters=waiters)


class RefTokenQueue:
    def __init__(self, n, initial):
        self.counts = [initial] * n
        self.newest = [-1] * n
        self.closed = [False] * n

    def take(self, i, count):
        """Remaining tokens, or None if the call would wait."""
        if self.closed[i]:
            return self.counts[i]
        if self.counts[i] < count:
            return None
        self.counts[i] -= count
        return self.counts[i]

    def put(self, i, count, iteration=-1):
        self.counts[i] += count
        if iteration >= 0:
            self.newest[i] = max(self.newest[i], iteration)


# --- helpers -----------------------------------------------------------------------------------------------------


def make_queue(num_slots, name="test"):
    return ops.hop_update_queue_create(DTYPES, SHAPES, num_slots, name=name)


def payload(n):
    """A distinct entry payload: float32 [n, n + 0.5] and int32 n."""
    return [np.array([n, n + 0.5], np.float32), np.int32(n)]


def enqueue(q, ref, it, wid, n):
    ops.hop_update_queue_enqueue(q, payload(n), it, wid)
    ref.enqueue(it, wid, n)


def check_returned(out, expected):
    """``out`` = (values, iters, w_ids) of a dequeue; ``expected`` = reference entries (iter, w_id, n)."""
    values, iters, w_ids = out
    ns = [e[2] for e in expected]
    assert iters.numpy().tolist() == [e[0] for e in expected]
    assert w_ids.numpy().tolist() == [e[1] for e in expected]
    assert values[1].numpy().tolist() == ns
    np.testing.assert_array_equal(values[0].numpy(), np.array([[n, n + 0.5] for n in ns], np.float32).reshape(-1, 2))
    assert values[0].dtype == tf.float32 and values[1].dtype == tf.int32


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def run_in_thread(fn):
    """Start ``fn`` in a thread; returns (thread, box) with box['result'] or box['error'] once done."""
    box = {}

    def target():
        t0 = time.monotonic()
        try:
            box["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
        box["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


# --- update queue: FIFO, tags, wildcards, greedy, sizes --------------------------------------------------------


def test_fifo_among_matching_entries_and_others_keep_their_order():
    q, ref = make_queue(4), RefUpdateQueue(4)
    for n, (it, wid) in enumerate([(0, 1), (1, 2), (0, 2), (1, 1), (0, 1), (2, 0)]):
        enqueue(q, ref, it, wid, n)
    # w_id=1, any iteration: entries 0, 3 (first two in arrival order across slots)
    check_returned(ops.hop_update_queue_dequeue(q, 2, w_id=1), [(0, 1, 0), (1, 1, 3)])
    ref.dequeue(2, wid=1)
    # both wildcards: the first entry left overall (entry 1), then entry 2
    check_returned(ops.hop_update_queue_dequeue(q, 2), [(1, 2, 1), (0, 2, 2)])
    ref.dequeue(2)
    assert int(ops.hop_update_queue_size(q)) == 2
    assert int(ops.hop_update_queue_size(q, iteration=0)) == 1
    assert int(ops.hop_update_queue_size(q, w_id=0)) == 1
    assert int(ops.hop_update_queue_size(q, iteration=2, w_id=1)) == 0
    check_returned(ops.hop_update_queue_dequeue(q, 1, iteration=2, w_id=0), [(2, 0, 5)])
    check_returned(ops.hop_update_queue_dequeue(q, 1, iteration=0, w_id=1), [(0, 1, 4)])
    assert ops.hop_update_queue_counters(q) == dict(enqueued=6, dequeued=6, discarded_stale=0, discarded_superseded=0,
                                                    dropped_closed=0, size=0, waiters=0)


def test_m_zero_and_greedy():
    q = make_queue(2)
    out = ops.hop_update_queue_dequeue(q, 0, iteration=0)
    check_returned(out, [])
    assert out[0][0].shape == (0, 2) and out[0][1].shape == (0,)
    check_returned(ops.hop_update_queue_dequeue(q, 0, iteration=0, greedy=True), [])
    for n, wid in enumerate([0, 1, 2]):
        ops.hop_update_queue_enqueue(q, payload(n), 0, wid)
    ops.hop_update_queue_enqueue(q, payload(9), 1, 0)
    check_returned(ops.hop_update_queue_dequeue(q, 0, iteration=0), [])  # m == 0, not greedy: nothing
    # Fig. 8: at least 2 of iteration 0, then everything else of iteration 0 that has arrived
    check_returned(ops.hop_update_queue_dequeue(q, 2, iteration=0, greedy=True), [(0, 0, 0), (0, 1, 1), (0, 2, 2)])
    check_returned(ops.hop_update_queue_dequeue(q, 0, greedy=True), [(1, 0, 9)])
    assert int(ops.hop_update_queue_size(q)) == 0


def test_random_operations_match_the_reference():
    rng = random.Random(7)
    num_slots = 3
    q, ref = make_queue(num_slots), RefUpdateQueue(num_slots)
    n = 0
    errors = 0
    for step in range(400):
        op = rng.random()
        it = rng.choice([None, 0, 1, 2, 3, 4, 5, 6]) if op >= 0.45 else rng.randrange(7)
        wid = rng.choice([None, 0, 1, 2])
        if op < 0.45:
            enqueue(q, ref, it, rng.randrange(3), n)
            n += 1
            continue
        if op < 0.6:
            try:
                expected = ref.size(it, wid)
            except RefFailedPrecondition:
                with pytest.raises(tf.errors.FailedPreconditionError):
                    ops.hop_update_queue_size(q, iteration=it, w_id=wid)
                errors += 1
                continue
            assert int(ops.hop_update_queue_size(q, iteration=it, w_id=wid)) == expected
            continue
        greedy = rng.random() < 0.3
        try:
            available = len(ref._matching(it, wid))
        except RefFailedPrecondition:
            with pytest.raises(tf.errors.FailedPreconditionError, match=r"iter=%d\b" % it):
                ops.hop_update_queue_dequeue(q, 1, iteration=it, w_id=wid)
            errors += 1
            continue
        m = rng.randint(0, available)  # satisfiable: never waits
        expected = ref.dequeue(m, it, wid, greedy)
        check_returned(ops.hop_update_queue_dequeue(q, m, iteration=it, w_id=wid, greedy=greedy), expected)
        if step % 50 == 0:
            assert ops.hop_update_queue_counters(q) == ref.counters()
    c = ops.hop_update_queue_counters(q)
    assert c == ref.counters()
    assert c["discarded_stale"] > 0 and errors > 0 and c["dequeued"] > 50  # the sequence exercised all paths
    assert c["enqueued"] == c["dequeued"] + c["discarded_stale"] + c["discarded_superseded"] + c["size"]


def test_string_components():
    q = ops.hop_update_queue_create([tf.string, tf.float64], [[2], [1, 3]], 1)
    ops.hop_update_queue_enqueue(q, [[b"a", b"bc"], [[1.0, 2.0, 3.0]]], 0, 4)
    ops.hop_update_queue_enqueue(q, [[b"", b"long string " * 5], [[4.0, 5.0, 6.0]]], 0, 5)
    values, iters, w_ids = ops.hop_update_queue_dequeue(q, 2)
    assert values[0].numpy().tolist() == [[b"a", b"bc"], [b"", b"long string " * 5]]
    assert values[1].numpy().tolist() == [[[1.0, 2.0, 3.0]], [[4.0, 5.0, 6.0]]] and values[1].dtype == tf.float64
    assert w_ids.numpy().tolist() == [4, 5]


# --- rotating slots ---------------------------------------------------------------------------------------------


def test_slot_is_iteration_mod_num_slots_stale_discarded_and_future_tag_fails():
    q, ref = make_queue(3), RefUpdateQueue(3)  # max_ig = 2
    for n, (it, wid) in enumerate([(0, 0), (3, 1), (1, 0), (4, 2), (3, 2), (0, 1)]):
        enqueue(q, ref, it, wid, n)
    # slot 0 holds 0, 3, 3, 0: looking for 3 discards the two late iteration-0 entries (whatever their w_id)
    assert int(ops.hop_update_queue_size(q, iteration=3, w_id=2)) == 1
    assert ops.hop_update_queue_counters(q)["discarded_stale"] == 2
    check_returned(ops.hop_update_queue_dequeue(q, 2, iteration=3), [(3, 1, 1), (3, 2, 4)])
    # slot 1 holds 1 and 4; iteration 1 looks at slot 1 and finds tag 4 > 1: the token bound was violated
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"iter=4 .*iter=1") as exc:
        ops.hop_update_queue_dequeue(q, 1, iteration=1, timeout_ms=1000)
    assert "slot 1" in exc.value.message
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"iter=4 .*iter=1"):
        ops.hop_update_queue_size(q, iteration=1)
    # the same slot for iteration 4: entry 1 is stale, entry 3 matches
    check_returned(ops.hop_update_queue_dequeue(q, 1, iteration=4), [(4, 2, 3)])
    c = ops.hop_update_queue_counters(q)
    assert c == dict(enqueued=6, dequeued=3, discarded_stale=3, discarded_superseded=0, dropped_closed=0, size=0,
                     waiters=0)


def test_waiting_dequeue_discards_a_late_entry_and_fails_on_a_future_one():
    q = make_queue(2)
    t, box = run_in_thread(lambda: ops.hop_update_queue_dequeue(q, 1, iteration=2, timeout_ms=5000))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 1)
    ops.hop_update_queue_enqueue(q, payload(0), 0, 1)  # late (slot 0, tag 0 < 2): discarded while it waits
    assert ops.hop_update_queue_counters(q)["discarded_stale"] == 1
    ops.hop_update_queue_enqueue(q, payload(1), 4, 1)  # tag 4 > 2 in slot 0: the waiter fails
    t.join(10)
    assert isinstance(box.get("error"), tf.errors.FailedPreconditionError)
    assert "iter=4" in box["error"].message and "iter=2" in box["error"].message


# --- dequeue_newest (bounded staleness) -------------------------------------------------------------------------


def check_newest(out, expected, w_ids):
    """expected: {w_id: (iter, w_id, n) or None}."""
    values, iters, found = out
    rows = [expected[w] for w in w_ids]
    assert found.numpy().tolist() == [r is not None for r in rows]
    assert iters.numpy().tolist() == [r[0] if r else -1 for r in rows]
    assert values[1].numpy().tolist() == [r[2] if r else 0 for r in rows]
    np.testing.assert_array_equal(values[0].numpy(), [[r[2], r[2] + 0.5] if r else [0, 0] for r in rows])


def test_dequeue_newest_keeps_the_newest_and_counts_the_superseded():
    q, ref = make_queue(3), RefUpdateQueue(3)
    for n, (it, wid) in enumerate([(4, 1), (6, 1), (5, 1), (6, 1), (2, 2), (3, 0), (1, 3)]):
        enqueue(q, ref, it, wid, n)
    w_ids = [1, 2, 5]
    expected = ref.newest(w_ids, -1)
    assert expected[1] == (6, 1, 3)  # tie between entries 1 and 3: the latest arrived wins
    check_newest(ops.hop_update_queue_dequeue_newest(q, w_ids, -1), expected, w_ids)
    assert ops.hop_update_queue_counters(q) == ref.counters()
    assert ref.counters()["discarded_superseded"] == 3 and ref.counters()["size"] == 2
    # iter_rcv remembers 6 for w_id 1: no wait although nothing new is present
    check_newest(ops.hop_update_queue_dequeue_newest(q, [1], 6, timeout_ms=200), ref.newest([1], 6), [1])
    # a newer entry of w_id 0 is present (3), w_id 3 has only 1: wait for w_id 3, then take both
    t, box = run_in_thread(lambda: ops.hop_update_queue_dequeue_newest(q, [0, 3], 2, timeout_ms=10000))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 1)
    assert ref.newest([0, 3], 2) is None
    enqueue(q, ref, 0, 0, 20)  # older than what is present: superseded when taken
    assert t.is_alive()
    enqueue(q, ref, 2, 3, 21)
    t.join(10)
    assert "error" not in box, box.get("error")
    check_newest(box["result"], ref.newest([0, 3], 2), [0, 3])
    assert ops.hop_update_queue_counters(q) == ref.counters()
    assert ref.counters() == dict(enqueued=9, dequeued=4, discarded_superseded=5, discarded_stale=0,
                                  dropped_closed=0, size=0, waiters=0)


def test_dequeue_newest_times_out_and_takes_nothing():
    q = make_queue(2, name="stale")
    ops.hop_update_queue_enqueue(q, payload(0), 1, 7)
    ops.hop_update_queue_enqueue(q, payload(1), 0, 8)
    t0 = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError) as exc:
        ops.hop_update_queue_dequeue_newest(q, [7, 8], 1, timeout_ms=200)
    elapsed = time.monotonic() - t0
    assert 0.2 <= elapsed < 5.2
    msg = exc.value.message
    assert "'stale'" in msg and "iter >= 1" in msg and "w_id 8 (newest taken -1, newest present 0)" in msg
    assert "w_id 7" not in msg.split("lacking:")[1].split(";")[0]
    c = ops.hop_update_queue_counters(q)
    assert c["size"] == 2 and c["dequeued"] == 0 and c["waiters"] == 0


# --- blocking, timeouts, close ----------------------------------------------------------------------------------


def test_blocking_dequeue_is_completed_by_an_enqueue_from_another_thread():
    q = make_queue(2)
    t, box = run_in_thread(lambda: ops.hop_update_queue_dequeue(q, 2, iteration=1, timeout_ms=10000))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 1)
    ops.hop_update_queue_enqueue(q, payload(1), 1, 0)
    ops.hop_update_queue_enqueue(q, payload(2), 0, 0)  # other slot: no match
    time.sleep(0.05)
    assert t.is_alive()
    ops.hop_update_queue_enqueue(q, payload(3), 1, 5)
    t.join(10)
    assert not t.is_alive() and "error" not in box, box.get("error")
    check_returned(box["result"], [(1, 0, 1), (1, 5, 3)])
    assert ops.hop_update_queue_counters(q)["waiters"] == 0 and int(ops.hop_update_queue_size(q)) == 1


def test_waiters_are_served_in_fifo_order():
    q = make_queue(1)
    t1, box1 = run_in_thread(lambda: ops.hop_update_queue_dequeue(q, 1, timeout_ms=10000))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 1)
    t2, box2 = run_in_thread(lambda: ops.hop_update_queue_dequeue(q, 1, timeout_ms=10000))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 2)
    ops.hop_update_queue_enqueue(q, payload(1), 0, 0)
    t1.join(10)
    assert box1["result"][1].numpy().tolist() == [0] and t2.is_alive()
    ops.hop_update_queue_enqueue(q, payload(2), 0, 1)
    t2.join(10)
    assert box2["result"][2].numpy().tolist() == [1]


def test_dequeue_timeout_message_and_bounds():
    q = make_queue(3, name="recv")
    ops.hop_update_queue_enqueue(q, payload(0), 2, 1)
    ops.hop_update_queue_enqueue(q, payload(1), 2, 4)
    ops.hop_update_queue_enqueue(q, payload(2), 0, 3)
    t0 = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError) as exc:
        ops.hop_update_queue_dequeue(q, 3, iteration=2, timeout_ms=200)
    elapsed = time.monotonic() - t0
    assert 0.2 <= elapsed < 5.2
    msg = exc.value.message
    assert "'recv'" in msg and "for 3 entries with iter=2 w_id=*" in msg
    assert "2 matching present, queue size 3" in msg and "[(2,1) (2,4) (0,3)]" in msg
    waited = float(msg.split("waited ")[1].split(" ms")[0])
    assert 200 <= waited < 5200
    with pytest.raises(tf.errors.DeadlineExceededError, match="w_id=9"):
        ops.hop_update_queue_dequeue(q, 1, w_id=9, timeout_ms=50)
    assert ops.hop_update_queue_counters(q) == dict(enqueued=3, dequeued=0, discarded_stale=0,
                                                    discarded_superseded=0, dropped_closed=0, size=3, waiters=0)


def test_close_fails_pending_and_future_dequeues_and_counts_late_enqueues():
    q = make_queue(2)
    ops.hop_update_queue_enqueue(q, payload(0), 0, 0)
    t1, box1 = run_in_thread(lambda: ops.hop_update_queue_dequeue(q, 2, iteration=0, timeout_ms=20000))
    t2, box2 = run_in_thread(lambda: ops.hop_update_queue_dequeue_newest(q, [3], 0, timeout_ms=20000))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 2)
    ops.hop_update_queue_close(q, "rank 3 failed: boom")
    for t, box in ((t1, box1), (t2, box2)):
        t.join(10)
        assert isinstance(box.get("error"), tf.errors.CancelledError)
        assert "rank 3 failed: boom" in box["error"].message and box["elapsed"] < 10
    with pytest.raises(tf.errors.CancelledError, match="rank 3 failed: boom"):
        ops.hop_update_queue_dequeue(q, 0)
    with pytest.raises(tf.errors.CancelledError, match="rank 3 failed"):
        ops.hop_update_queue_dequeue_newest(q, [0], -1)
    ops.hop_update_queue_enqueue(q, payload(1), 1, 0)  # after shutdown: counted, no error
    ops.hop_update_queue_close(q, "again")
    assert int(ops.hop_update_queue_size(q)) == 1
    assert ops.hop_update_queue_counters(q) == dict(enqueued=1, dequeued=0, discarded_stale=0,
                                                    discarded_superseded=0, dropped_closed=1, size=1, waiters=0)


def test_destroy_cancels_waiters_and_later_ops_fail_with_not_found():
    q = make_queue(1)
    t, box = run_in_thread(lambda: ops.hop_update_queue_dequeue(q, 1, timeout_ms=20000))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 1)
    ops.hop_update_queue_destroy(q)
    t.join(10)
    assert isinstance(box.get("error"), tf.errors.CancelledError) and "destroyed" in box["error"].message
    with pytest.raises(tf.errors.NotFoundError):
        ops.hop_update_queue_size(q)
    tq = ops.hop_token_queue_create(2, 0)
    ops.hop_token_queue_destroy(tq)
    with pytest.raises(tf.errors.NotFoundError):
        ops.hop_token_size(tq)


def test_close_and_cancel_refuse_a_message_that_is_not_a_scalar_and_change_nothing():
    q, tq = make_queue(1), ops.hop_token_queue_create(2, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="hop_update_queue_close: message must be a scalar"):
        ops.hop_update_queue_close(q, ["a", "b"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="hop_token_cancel: message must be a scalar"):
        ops.hop_token_cancel(tq, ["a", "b"])
    ops.hop_update_queue_enqueue(q, payload(0), 0, 0)  # still open: counted as enqueued, not dropped
    assert ops.hop_update_queue_counters(q)["enqueued"] == 1 and ops.hop_update_queue_counters(q)["dropped_closed"] == 0
    assert int(ops.hop_token_take(tq, 0, timeout_ms=1000)) == 0  # not cancelled: took the 1 token, 0 left


def test_each_create_makes_a_fresh_queue():
    a, b = make_queue(2, name="same"), make_queue(2, name="same")
    ops.hop_update_queue_enqueue(a, payload(0), 0, 0)
    assert int(ops.hop_update_queue_size(a)) == 1 and int(ops.hop_update_queue_size(b)) == 0


def test_tensorflow_cancellation_releases_a_waiting_dequeue():
    q = make_queue(1)

    @tf.function
    def step():
        values, _, _ = ops.hop_update_queue_dequeue(q, 1, timeout_ms=30000)
        late, _, _ = ops.delay([tf.constant(1.0)], [0.0, 1.0, 300.0])  # fails 300 ms later: the step aborts
        tf.debugging.assert_equal(late[0], 2.0, message="the other op failed")
        return values[0]

    t0 = time.monotonic()
    with pytest.raises(tf.errors.InvalidArgumentError, match="the other op failed"):
        step()
    assert time.monotonic() - t0 < 10
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 0)


# --- validation --------------------------------------------------------------------------------------------------


def test_python_argument_validation():
    with pytest.raises(ValueError, match="num_slots"):
        ops.hop_update_queue_create(DTYPES, SHAPES, 0)
    with pytest.raises(ValueError, match="one shape per dtype"):
        ops.hop_update_queue_create(DTYPES, [[2]], 1)
    with pytest.raises(ValueError, match="fully defined"):
        ops.hop_update_queue_create([tf.float32], [[None]], 1)
    q = make_queue(2)
    with pytest.raises(ValueError, match="m must be >= 0"):
        ops.hop_update_queue_dequeue(q, -1)
    with pytest.raises(ValueError, match="timeout_ms must be > 0"):
        ops.hop_update_queue_dequeue(q, 1, timeout_ms=0)
    with pytest.raises(ValueError, match="iteration must be >= 0"):
        ops.hop_update_queue_enqueue(q, payload(0), -1, 0)
    with pytest.raises(ValueError, match="w_id must be >= 0"):
        ops.hop_update_queue_size(q, w_id=-2)
    with pytest.raises(ValueError, match="distinct"):
        ops.hop_update_queue_dequeue_newest(q, [1, 1], 0)
    with pytest.raises(ValueError, match="update-queue handle"):
        ops.hop_update_queue_dequeue(ops.hop_token_queue_create(1, 0), 1)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        ops.hop_token_queue_create(0, 1)
    with pytest.raises(ValueError, match="initial must be an int >= 0"):
        ops.hop_token_queue_create(1, -1)
    with pytest.raises(ValueError, match="count must be >= 0"):
        ops.hop_token_take(ops.hop_token_queue_create(1, 0), 0, count=-1)


def test_op_level_validation_errors():
    q = make_queue(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="component 0 has shape"):
        ops.hop_update_queue_enqueue(q, [np.zeros(3, np.float32), np.int32(0)], 0, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="component 1 has dtype int64"):
        ops.hop_update_queue_enqueue(q, [np.zeros(2, np.float32), tf.constant(0, tf.int64)], 0, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds 2 components"):
        ops.hop_update_queue_enqueue(q, [np.zeros(2, np.float32)], 0, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="m must be >= 0"):
        ops.hop_update_queue_dequeue(q, tf.constant(-3, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="timeout_ms must be > 0"):
        ops.hop_update_queue_dequeue(q, 1, timeout_ms=tf.constant(-1.0, tf.float64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="distinct"):
        ops.hop_update_queue_dequeue_newest(q, tf.constant([2, 2], tf.int64), 0)
    assert ops.hop_update_queue_counters(q)["enqueued"] == 0


# --- tf.function --------------------------------------------------------------------------------------------------


def test_update_queue_inside_tf_function():
    q = make_queue(2)

    @tf.function
    def produce(k, base):
        for wid in range(3):
            ops.hop_update_queue_enqueue(q, [tf.stack([base + wid, base + wid + 0.5]), tf.cast(base, tf.int32) + wid],
                                         k, wid)
        return ops.hop_update_queue_size(q, iteration=k)

    @tf.function
    def consume(handle, k):  # the handle as an argument: its component spec travels with it
        values, iters, w_ids = ops.hop_update_queue_dequeue(handle, 2, iteration=k, greedy=True)
        return values, iters, w_ids, ops.hop_update_queue_counters(handle)["size"]

    assert int(produce(tf.constant(0, tf.int64), 10.0)) == 3
    assert int(produce(tf.constant(1, tf.int64), 20.0)) == 3
    values, iters, w_ids, size = consume(q, tf.constant(1, tf.int64))
    check_returned((values, iters, w_ids), [(1, 0, 20), (1, 1, 21), (1, 2, 22)])
    assert int(size) == 3
    assert consume.get_concrete_function(q, tf.constant(1, tf.int64)).structured_outputs[0][0].shape.as_list() == [None, 2]

    # blocking inside a tf.function, completed by an eager enqueue from another thread
    t, box = run_in_thread(lambda: consume(q, tf.constant(2, tf.int64)))
    wait_for(lambda: ops.hop_update_queue_counters(q)["waiters"] == 1)
    ops.hop_update_queue_enqueue(q, payload(5), 2, 0)
    ops.hop_update_queue_enqueue(q, payload(6), 2, 1)
    t.join(10)
    assert "error" not in box, box.get("error")
    check_returned(box["result"][:3], [(2, 0, 5), (2, 1, 6)])
    assert ops.hop_update_queue_counters(q)["discarded_stale"] == 3  # iteration 0's entries, late in slot 0

    @tf.function
    def newest(min_iteration):
        return ops.hop_update_queue_dequeue_newest(q, tf.constant([0, 1, 2], tf.int64), min_iteration,
                                                   timeout_ms=5000)

    ops.hop_update_queue_enqueue(q, payload(30), 3, 2)
    ops.hop_update_queue_enqueue(q, payload(31), 1, 2)
    values, iters, found = newest(tf.constant(-1, tf.int64))
    assert iters.numpy().tolist() == [-1, -1, 3] and found.numpy().tolist() == [False, False, True]
    assert values[1].numpy().tolist() == [0, 0, 30] and values[0].numpy().tolist() == [[0, 0], [0, 0], [30, 30.5]]
    assert ops.hop_update_queue_counters(q)["discarded_superseded"] == 1


def test_async_dequeues_do_not_hold_tensorflow_threads():
    # More parked dequeues inside one tf.function than TensorFlow has inter-op threads, completed by a
    # tf.function run on the same thread pool: with blocking (synchronous) kernels this would deadlock.
    # One queue per dequeue: tf.function runs the ops of one resource in program order (automatic control
    # dependencies), ops of different resources concurrently.
    configured = tf.config.threading.get_inter_op_parallelism_threads()
    env = int(os.environ.get("TF_NUM_INTEROP_THREADS", "0") or 0)
    n = max(8, 2 + max(configured, env, os.cpu_count() or 1))
    queues = [make_queue(1) for _ in range(n)]

    def waiting():
        return sum(ops.hop_update_queue_counters(q)["waiters"] for q in queues)

    @tf.function
    def consume_all():
        return [ops.hop_update_queue_dequeue(q, 1, timeout_ms=30000)[2][0] for q in queues]

    @tf.function
    def produce_all():
        for w, q in enumerate(queues):
            ops.hop_update_queue_enqueue(q, [tf.constant([1.0, 2.0]), tf.constant(w)], 0, w)

    t, box = run_in_thread(consume_all)
    # generous: the first call traces consume_all, which on 2 shared cores under load took > 20 s once
    deadline = time.monotonic() + 90
    while waiting() < n and "error" not in box and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiting() == n, f"{waiting()} of {n} dequeues parked after 90 s; thread done: {not t.is_alive()}, {box}"
    produce_all()
    t.join(60)
    assert "error" not in box, box.get("error")
    assert [int(v) for v in box["result"]] == list(range(n))
    assert waiting() == 0 and sum(ops.hop_update_queue_counters(q)["dequeued"] for q in queues) == n


# --- many threads -------------------------------------------------------------------------------------------------


def test_many_producers_and_consumers_lose_nothing():
    num_slots, producers, per_producer = 4, 4, 50
    rng = random.Random(3)
    q = make_queue(num_slots)
    # pre-drawn tags: iteration in 0..3 (one per slot: no stale / future entries), w_id = producer
    plans = [[(rng.randrange(num_slots), p, p * 1000 + i) for i in range(per_producer)] for p in range(producers)]
    expected = {}  # (iter, w_id) -> payload numbers in order (each producer enqueues in its order)
    for plan in plans:
        for it, wid, n in plan:
            expected.setdefault((it, wid), []).append(n)
    keys = sorted(expected)
    got = {}

    def produce(plan):
        for it, wid, n in plan:
            ops.hop_update_queue_enqueue(q, payload(n), it, wid)
            if rng.random() < 0.1:
                time.sleep(0.001)

    def consume(my_keys):
        for key in my_keys:
            taken = []
            while len(taken) < len(expected[key]):  # in random chunks
                m = min(len(expected[key]) - len(taken), 1 + (len(taken) % 3))
                values, iters, w_ids = ops.hop_update_queue_dequeue(q, m, iteration=key[0], w_id=key[1],
                                                                    timeout_ms=20000)
                assert iters.numpy().tolist() == [key[0]] * m and w_ids.numpy().tolist() == [key[1]] * m
                taken += values[1].numpy().tolist()
            got[key] = taken

    consumers = [threading.Thread(target=consume, args=(keys[i::3],), daemon=True) for i in range(3)]
    workers = [threading.Thread(target=produce, args=(p,), daemon=True) for p in plans]
    for th in consumers + workers:
        th.start()
    for th in consumers + workers:
        th.join(30)
        assert not th.is_alive()
    assert got == expected
    assert ops.hop_update_queue_counters(q) == dict(enqueued=200, dequeued=200, discarded_stale=0,
                                                    discarded_superseded=0, dropped_closed=0, size=0, waiters=0)


def test_concurrent_wildcard_consumers_take_every_entry_once():
    q = make_queue(3)
    n = 120

    def produce(p):
        for i in range(n // 4):
            ops.hop_update_queue_enqueue(q, payload(p * 100 + i), i % 3, p)

    got = [[] for _ in range(4)]

    def consume(c):
        for _ in range(n // 8):
            got[c] += ops.hop_update_queue_dequeue(q, 2, timeout_ms=20000)[0][1].numpy().tolist()

    threads = [threading.Thread(target=consume, args=(c,), daemon=True) for c in range(4)]
    threads += [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
        assert not th.is_alive()
    assert sorted(sum(got, [])) == sorted(p * 100 + i for p in range(4) for i in range(n // 4))
    for c in range(4):  # each consumer sees each producer's entries in that producer's order
        for p in range(4):
            mine = [v for v in got[c] if v // 100 == p]
            assert mine == sorted(mine)
    assert ops.hop_update_queue_counters(q)["size"] == 0


# --- token queue -------------------------------------------------------------------------------------------------


def test_tokens_initial_take_put_newest():
    tq = ops.hop_token_queue_create(3, 2, name="tok")
    counts, newest = ops.hop_token_size(tq)
    assert counts.numpy().tolist() == [2, 2, 2] and newest.numpy().tolist() == [-1, -1, -1]
    assert int(ops.hop_token_take(tq, 1)) == 1
    assert int(ops.hop_token_take(tq, 1, count=0)) == 1
    assert int(ops.hop_token_take(tq, 0, count=2)) == 0
    ops.hop_token_put(tq, 2, count=3, iteration=5)
    ops.hop_token_put(tq, 2, iteration=4)  # older value: newest stays 5
    ops.hop_token_put(tq, 0)
    counts, newest = ops.hop_token_size(tq)
    assert counts.numpy().tolist() == [1, 1, 6] and newest.numpy().tolist() == [-1, -1, 5]


def test_token_take_blocks_until_put_from_another_thread_and_times_out():
    tq = ops.hop_token_queue_create(2, 0, name="gate")
    t, box = run_in_thread(lambda: ops.hop_token_take(tq, 1, count=2, timeout_ms=10000))
    time.sleep(0.1)
    ops.hop_token_put(tq, 1, iteration=0)
    ops.hop_token_put(tq, 0, count=5)
    time.sleep(0.05)
    assert t.is_alive()
    ops.hop_token_put(tq, 1, count=2, iteration=1)
    t.join(10)
    assert "error" not in box, box.get("error")
    assert int(box["result"]) == 1
    t0 = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError) as exc:
        ops.hop_token_take(tq, 1, count=3, timeout_ms=200)
    assert 0.2 <= time.monotonic() - t0 < 5.2
    msg = exc.value.message
    assert "'gate'" in msg and "for 3 tokens on index 1, 1 present" in msg and "received on that index: 1" in msg
    assert ops.hop_token_size(tq)[0].numpy().tolist() == [5, 1]


def test_token_close_makes_take_non_blocking_and_cancel_fails_takes():
    tq = ops.hop_token_queue_create(3, 0)
    t, box = run_in_thread(lambda: ops.hop_token_take(tq, 2, timeout_ms=10000))
    time.sleep(0.1)
    ops.hop_token_close(tq, 2)
    t.join(10)
    assert int(box["result"]) == 0
    ops.hop_token_put(tq, 2, count=4)
    assert int(ops.hop_token_take(tq, 2, count=10, timeout_ms=100)) == 4  # closed: returns at once, takes nothing
    assert ops.hop_token_size(tq)[0].numpy().tolist() == [0, 0, 4]
    t, box = run_in_thread(lambda: ops.hop_token_take(tq, 0, timeout_ms=10000))
    time.sleep(0.1)
    ops.hop_token_cancel(tq, "neighbour 0 crashed")
    t.join(10)
    assert isinstance(box.get("error"), tf.errors.CancelledError) and "neighbour 0 crashed" in box["error"].message
    with pytest.raises(tf.errors.CancelledError, match="neighbour 0 crashed"):
        ops.hop_token_take(tq, 2, count=0)
    ops.hop_token_put(tq, 1, iteration=3)  # still counted after cancel
    assert ops.hop_token_size(tq)[1].numpy().tolist() == [-1, 3, -1]


def test_token_index_validation():
    tq = ops.hop_token_queue_create(2, 1)
    for fn in (lambda: ops.hop_token_take(tq, 2), lambda: ops.hop_token_put(tq, 5),
               lambda: ops.hop_token_close(tq, 2), lambda: ops.hop_token_take(tq, tf.constant(-1, tf.int64))):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"out of range \[0, 2\)"):
            fn()
    with pytest.raises(ValueError, match="index must be >= 0"):
        ops.hop_token_put(tq, -1)
    with pytest.raises(ValueError, match="iteration must be >= -1"):
        ops.hop_token_put(tq, 0, iteration=-2)


def test_token_random_sequence_matches_the_reference():
    rng = random.Random(11)
    n = 4
    tq, ref = ops.hop_token_queue_create(n, 2), RefTokenQueue(n, 2)
    for step in range(300):
        i = rng.randrange(n)
        r = rng.random()
        if r < 0.45:
            count, it = rng.randrange(3), rng.choice([-1, step])
            ops.hop_token_put(tq, i, count=count, iteration=it)
            ref.put(i, count, it)
        elif r < 0.97:
            count = rng.randrange(4)
            expected = ref.take(i, count)
            if expected is None:
                continue  # would wait (the blocking path is tested above)
            assert int(ops.hop_token_take(tq, i, count=count)) == expected
        else:
            ops.hop_token_close(tq, i)
            ref.closed[i] = True
        if step % 25 == 0:
            counts, newest = ops.hop_token_size(tq)
            assert counts.numpy().tolist() == ref.counts and newest.numpy().tolist() == ref.newest
    counts, newest = ops.hop_token_size(tq)
    assert counts.numpy().tolist() == ref.counts and newest.numpy().tolist() == ref.newest


def test_tokens_inside_tf_function():
    tq = ops.hop_token_queue_create(2, 1)

    @tf.function
    def start_iteration(k):  # Fig. 7: insert one token [k] per in-neighbour, then take one per out-neighbour
        ops.hop_token_put(tq, 0, iteration=k)
        ops.hop_token_put(tq, 1, iteration=k)
        return ops.hop_token_take(tq, 0, count=2, timeout_ms=5000)

    assert int(start_iteration(tf.constant(0, tf.int64))) == 0
    counts, newest = ops.hop_token_size(tq)
    assert counts.numpy().tolist() == [0, 2] and newest.numpy().tolist() == [0, 0]

    @tf.function
    def take(h):
        return ops.hop_token_take(h, 0, timeout_ms=10000)

    t, box = run_in_thread(lambda: take(tq))
    time.sleep(0.1)
    assert t.is_alive()
    ops.hop_token_put(tq, 0, iteration=7)
    t.join(10)
    assert int(box["result"]) == 0 and ops.hop_token_size(tq)[1].numpy().tolist() == [7, 0]
