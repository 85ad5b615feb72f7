"""Hop's update queue and token queue (ops ``HetsyncHopUpdateQueue*`` and ``HetsyncHopToken*``).

Hop paper sections 4.1 (the update queue: ``enqueue``, ``dequeue(m, iter, w_id)``, ``size``), 4.2
(the token queue bounding the iteration gap, Fig. 7), 4.4 and 6.1 (bounded staleness, rotating
slots); design notes: docs/protocols/hop.md. Both queues are host-side resources (CPU kernels
only); kernels and op definitions in ``tf_ops/hop_queue_ops.cc``, the resources and the completion
protocol of their blocking ops in ``tf_ops/hop_queues.h``.

Each ``*_create`` call makes a new, uniquely named resource (it runs eagerly, in ``tf.init_scope``;
the handle can be captured by or passed to a ``tf.function``); ``*_destroy`` deletes it. Blocking
ops (dequeue, dequeue_newest, token take) are ``AsyncOpKernel``s: while they wait they hold no
TensorFlow thread, and they fail after ``timeout_ms`` milliseconds with
``tf.errors.DeadlineExceededError`` (``timeout_ms`` must be > 0; ``float('inf')`` waits forever).
They also fail with ``tf.errors.CancelledError`` if the queue is closed (update queue) or cancelled
(token queue), or if TensorFlow cancels the step.

Tags: ``iteration`` (the iteration the update was generated in) and ``w_id`` (the sender) are int64
>= 0; ``None`` means "any" (passed to the op as -1). An argument given as a tensor is cast to int64 /
float64 and checked by the op (``InvalidArgumentError``) instead of here (``ValueError``). Inside one
``tf.function`` TensorFlow's automatic control dependencies run the ops on the same handle in program
order (ops on different handles may run concurrently), so e.g. an enqueue written before a dequeue of
the same queue runs first.

Every function raises :class:`hetsync.errors.OpLibraryError` if the op library is missing or stale
(:func:`hetsync.ops.load_library`), and ``tf.errors.NotFoundError`` for a queue already destroyed.
"""
import operator

import tensorflow as tf

from hetsync.ops.library import load_library

__all__ = ["HOP_UPDATE_QUEUE_COUNTERS", "hop_update_queue_create", "hop_update_queue_enqueue",
           "hop_update_queue_dequeue", "hop_update_queue_size", "hop_update_queue_dequeue_newest",
           "hop_update_queue_status", "hop_update_queue_counters", "hop_update_queue_close",
           "hop_update_queue_destroy", "hop_token_queue_create", "hop_token_take", "hop_token_put",
           "hop_token_size", "hop_token_close", "hop_token_cancel", "hop_token_queue_destroy"]

#: index of each field in :func:`hop_update_queue_status`'s result (keys of :func:`hop_update_queue_counters`).
HOP_UPDATE_QUEUE_COUNTERS = ("enqueued", "dequeued", "discarded_stale", "discarded_superseded", "dropped_closed",
                             "size", "waiters")


def _is_tensor(x):
    """True for a tensor or variable: its value is checked by the op, not here."""
    return isinstance(x, (tf.Tensor, tf.Variable))


def _py_int(x):
    """``x`` as a Python int if it is a Python / numpy integer, else None (a tensor)."""
    if _is_tensor(x):
        return None
    if isinstance(x, bool):
        raise ValueError(f"expected an integer, got {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"expected an integer, got {x!r}") from None


def _int64_arg(x, fn, what, minimum, none_ok=False):
    """int64 scalar tensor of ``x`` (None -> -1 if ``none_ok``); Python values are checked against ``minimum``."""
    if x is None:
        if not none_ok:
            raise ValueError(f"{fn}: {what} must not be None")
        return tf.constant(-1, tf.int64)
    try:
        v = _py_int(x)
    except ValueError as exc:
        raise ValueError(f"{fn}: {what}: {exc}") from None
    if v is None:
        return tf.cast(x, tf.int64)
    if v < minimum:
        raise ValueError(f"{fn}: {what} must be >= {minimum}{' or None (any)' if none_ok else ''}, got {v}")
    return tf.constant(v, tf.int64)


def _timeout_arg(timeout_ms, fn):
    """float64 scalar tensor of ``timeout_ms`` (milliseconds); a Python value must be > 0 (inf: no deadline)."""
    if _is_tensor(timeout_ms):
        return tf.cast(timeout_ms, tf.float64)
    t = float(timeout_ms)
    if not t > 0:
        raise ValueError(f"{fn}: timeout_ms must be > 0 (milliseconds; inf: no deadline), got {timeout_ms!r}")
    return tf.constant(t, tf.float64)


def _queue_components(handle, fn):
    """(dtypes, shapes) of an update queue, from the handle data set by :func:`hop_update_queue_create`."""
    from tensorflow.python.ops import handle_data_util  # pylint: disable=import-outside-toplevel
    data = handle_data_util.get_handle_data(handle) if getattr(handle, "dtype", None) == tf.resource else None
    if data is None or not data.is_set or not data.shape_and_type:
        raise ValueError(f"{fn}: handle must be an update-queue handle from hop_update_queue_create (or a "
                         f"tf.function argument / capture of one); got {handle!r} without component handle data")
    dtypes = [tf.as_dtype(st.dtype) for st in data.shape_and_type]
    shapes = [tf.TensorShape(st.shape) for st in data.shape_and_type]
    return dtypes, shapes


def hop_update_queue_create(dtypes, shapes, num_slots, name=None):
    """Create a Hop update queue (op ``HetsyncHopUpdateQueueCreate``; Hop sections 4.1 and 6.1).

    Each entry is a list of tensors with fixed dtypes and shapes (a model update) tagged with int64
    ``iter`` (the iteration it was generated in) and ``w_id`` (the sender). Entries are kept in
    ``num_slots = max_ig + 1`` rotating FIFO slots: an entry tagged ``iter`` goes to slot
    ``iter mod num_slots``. Every entry also gets a global arrival number, so operations with a wildcard
    iteration see all slots in overall FIFO order. Runs eagerly (``tf.init_scope``); each call creates a new
    queue, deleted by :func:`hop_update_queue_destroy`.

    Args:
        dtypes: non-empty list of component dtypes (``tf.DType`` or names): numeric, bool or string.
        shapes: list of fully defined component shapes (lists of ints or ``tf.TensorShape``), one per dtype.
        num_slots: int >= 1, max_ig + 1 (max_ig: the token bound on the iteration gap).
        name: optional str, a label used in the resource name and in error messages.

    Returns:
        a scalar ``tf.resource`` tensor, the queue handle; it carries the component dtypes and shapes (handle
        data), which the dequeue wrappers read.

    Raises:
        ValueError: empty or mismatched ``dtypes`` / ``shapes``, a shape not fully defined, an unsupported
            dtype, or ``num_slots`` not an int >= 1.
    """
    fn = "hop_update_queue_create"
    dtypes = [tf.as_dtype(d) for d in dtypes]
    shapes = [tf.TensorShape(s) for s in shapes]
    if not dtypes or len(dtypes) != len(shapes):
        raise ValueError(f"{fn}: need one shape per dtype and at least one component, got {len(dtypes)} dtypes "
                         f"and {len(shapes)} shapes")
    for s in shapes:
        if not s.is_fully_defined():
            raise ValueError(f"{fn}: every shape must be fully defined, got {s}")
    for d in dtypes:
        if d in (tf.resource, tf.variant):
            raise ValueError(f"{fn}: unsupported component dtype {d.name} (numeric, bool and string only)")
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
        raise ValueError(f"{fn}: num_slots (max_ig + 1) must be an int >= 1, got {num_slots!r}")
    # TensorFlow's private modules are imported where they are used, so importing hetsync.ops does not
    # depend on them.
    from tensorflow.python.framework import cpp_shape_inference_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow.python.ops import handle_data_util  # pylint: disable=import-outside-toplevel
    lib = load_library()
    with tf.init_scope():
        handle = lib.hetsync_hop_update_queue_create(component_types=dtypes, shapes=shapes, num_slots=num_slots,
                                                     label=str(name or ""))
    data = cpp_shape_inference_pb2.CppShapeInferenceResult.HandleData(is_set=True)
    for d, s in zip(dtypes, shapes):
        data.shape_and_type.append(cpp_shape_inference_pb2.CppShapeInferenceResult.HandleShapeAndType(
            shape=s.as_proto(), dtype=d.as_datatype_enum))
    handle_data_util.set_handle_data(handle, data)
    return handle


def hop_update_queue_enqueue(handle, tensors, iteration, w_id):
    """Append one entry tagged ``(iteration, w_id)`` (op ``HetsyncHopUpdateQueueEnqueue``; Hop section 4.1).

    The entry goes to slot ``iteration mod num_slots``; parked dequeues it satisfies complete (FIFO among
    them). The tensors are held by reference (no copy). On a closed queue the entry is dropped and counted
    as ``dropped_closed``, without an error (a message arriving after shutdown must not crash the receiver).

    Args:
        handle: update-queue handle from :func:`hop_update_queue_create`.
        tensors: list of tensors with the queue's component dtypes and shapes (Python values and numpy arrays
            are converted to the component dtype; tensors must already have it).
        iteration: int64 scalar >= 0, the iteration the update was generated in.
        w_id: int64 scalar >= 0, the sender's id.

    Raises:
        ValueError: a Python ``iteration`` or ``w_id`` < 0.
        tf.errors.InvalidArgumentError: wrong number, dtype or shape of tensors, or a negative tag tensor.
        tf.errors.NotFoundError: the queue was destroyed.
    """
    fn = "hop_update_queue_enqueue"
    lib = load_library()
    it = _int64_arg(iteration, fn, "iteration", 0)
    wid = _int64_arg(w_id, fn, "w_id", 0)
    tensors = list(tensors)
    try:
        dtypes, _ = _queue_components(handle, fn)
    except ValueError:
        dtypes = [None] * len(tensors)  # the op checks the components
    if len(dtypes) != len(tensors):
        dtypes = [None] * len(tensors)
    # Python values / arrays take the queue's dtype (a float list for a float64 component); tensors are checked.
    tensors = [t if _is_tensor(t) else tf.convert_to_tensor(t, dtype=d) for t, d in zip(tensors, dtypes)]
    lib.hetsync_hop_update_queue_enqueue(handle, tensors, it, wid)


def hop_update_queue_dequeue(handle, m, iteration=None, w_id=None, timeout_ms=60000.0, greedy=False):
    """Remove and return the first ``m`` matching entries in FIFO order (op ``HetsyncHopUpdateQueueDequeue``).

    Hop section 4.1 ``dequeue(m, iter, w_id)``; with ``greedy`` it is Fig. 8 lines 2-5 in one atomic call.
    Entries whose tags match (``None``: any) are taken in arrival order; the others keep their order. The op
    waits (without holding a thread) while fewer than ``m`` match; ``m == 0`` returns at once (empty, or
    with ``greedy`` whatever matches now). With ``greedy=True``, once at least ``m`` match, every matching
    entry present is returned. With ``iteration=k`` only slot ``k mod num_slots`` is searched: entries
    tagged < k there are late updates and are discarded (counted as ``discarded_stale``; Hop 6.1, 6.2a),
    whether or not their ``w_id`` matches; an entry tagged > k there means the token bound was violated.
    Without ``iteration`` all slots are searched in arrival order.

    Args:
        handle: update-queue handle from :func:`hop_update_queue_create`.
        m: int64 scalar >= 0, the number of entries to wait for.
        iteration: None or int64 scalar >= 0, the iteration tag to match.
        w_id: None or int64 scalar >= 0, the sender tag to match.
        timeout_ms: float64 scalar > 0, milliseconds to wait at most (inf: no deadline).
        greedy: Python bool, see above.

    Returns:
        ``(values, iters, w_ids)``: ``values`` a list with one tensor per component, of shape
        ``[m', *component_shape]`` (the m' returned entries stacked in FIFO order); ``iters`` and ``w_ids``
        int64 ``[m']``, their tags.

    Raises:
        ValueError: Python ``m`` < 0, a Python tag < 0, ``timeout_ms`` <= 0, or not an update-queue handle.
        tf.errors.DeadlineExceededError: fewer than ``m`` matched after ``timeout_ms``; the message gives the
            wait, ``m``, the tags, the number matching, the queue size and the (iter, w_id) present.
        tf.errors.FailedPreconditionError: an entry tagged > k in slot ``k mod num_slots`` (names both tags).
        tf.errors.CancelledError: the queue is or gets closed (the close message), or the step is cancelled.
        tf.errors.InvalidArgumentError: an invalid tensor argument.
    """
    fn = "hop_update_queue_dequeue"
    dtypes, shapes = _queue_components(handle, fn)
    lib = load_library()
    out = lib.hetsync_hop_update_queue_dequeue(
        handle, _int64_arg(m, fn, "m", 0), _int64_arg(iteration, fn, "iteration", 0, none_ok=True),
        _int64_arg(w_id, fn, "w_id", 0, none_ok=True), _timeout_arg(timeout_ms, fn),
        component_types=dtypes, shapes=shapes, greedy=bool(greedy))
    return list(out.values), out.iters, out.w_ids


def hop_update_queue_size(handle, iteration=None, w_id=None):
    """Number of entries whose tags match (op ``HetsyncHopUpdateQueueSize``; Hop section 4.1 ``size``).

    With no tags, the total size. With ``iteration=k``, entries tagged < k in slot ``k mod num_slots`` are
    first discarded and counted as ``discarded_stale``, exactly as in :func:`hop_update_queue_dequeue`.

    Args:
        handle: update-queue handle. iteration, w_id: None (any) or int64 scalars >= 0.

    Returns:
        int64 scalar tensor.

    Raises:
        ValueError: a Python tag < 0.
        tf.errors.FailedPreconditionError: an entry tagged > k in slot ``k mod num_slots``.
    """
    fn = "hop_update_queue_size"
    lib = load_library()
    return lib.hetsync_hop_update_queue_size(handle, _int64_arg(iteration, fn, "iteration", 0, none_ok=True),
                                             _int64_arg(w_id, fn, "w_id", 0, none_ok=True))


def hop_update_queue_dequeue_newest(handle, w_ids, min_iteration, timeout_ms=60000.0):
    """Bounded staleness: take the newest entry of each sender (op ``HetsyncHopUpdateQueueDequeueNewest``).

    Hop sections 4.4 and 6.1 (design notes: docs/protocols/hop.md, the update queue's semantics). The queue remembers per w_id the
    newest tag ever taken by this op (``iter_rcv``, initially -1). The call waits (without holding a thread)
    while for some w_id in ``w_ids`` max(iter_rcv, newest tag present) < ``min_iteration``; then, atomically,
    it removes all entries of those w_ids (any slot), keeps the newest of each (largest iter; ties: the latest
    arrived), counts the others as ``discarded_superseded`` and updates iter_rcv. Entries that arrive while it
    waits are included. A call that fails (timeout, close) takes nothing.

    Args:
        handle: update-queue handle from :func:`hop_update_queue_create`.
        w_ids: int64 ``[n]``, distinct sender ids >= 0.
        min_iteration: int64 scalar, k - s (any value; <= -1 never waits).
        timeout_ms: float64 scalar > 0, milliseconds to wait at most (inf: no deadline).

    Returns:
        ``(values, iters, found)``: ``values`` a list with one tensor per component of shape
        ``[n, *component_shape]`` (row i: the newest entry of ``w_ids[i]`` taken in this call, zeros if none);
        ``iters`` int64 ``[n]`` (its tag, -1 if none); ``found`` bool ``[n]`` (an entry of ``w_ids[i]`` was
        taken in this call).

    Raises:
        ValueError: Python ``w_ids`` not distinct or < 0, ``timeout_ms`` <= 0, or not an update-queue handle.
        tf.errors.DeadlineExceededError: still lacking after ``timeout_ms`` (the message lists the lacking
            w_ids with their newest taken / present tags).
        tf.errors.CancelledError: the queue is or gets closed, or the step is cancelled.
        tf.errors.InvalidArgumentError: ``w_ids`` not a vector, negative or repeated (as a tensor).
    """
    fn = "hop_update_queue_dequeue_newest"
    dtypes, shapes = _queue_components(handle, fn)
    if not _is_tensor(w_ids):
        ids = [_py_int(w) for w in w_ids]
        if any(w < 0 for w in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"{fn}: w_ids must be distinct ints >= 0, got {ids}")
        w_ids = tf.constant(ids, tf.int64, shape=[len(ids)])
    lib = load_library()
    out = lib.hetsync_hop_update_queue_dequeue_newest(
        handle, tf.cast(w_ids, tf.int64), _int64_arg(min_iteration, fn, "min_iteration", -(2 ** 63)),
        _timeout_arg(timeout_ms, fn), component_types=dtypes, shapes=shapes)
    return list(out.values), out.iters, out.found


def hop_update_queue_status(handle):
    """The queue's counters as an int64 ``[7]`` tensor (op ``HetsyncHopUpdateQueueStatus``).

    Fields, in order (:data:`HOP_UPDATE_QUEUE_COUNTERS`): enqueued, dequeued, discarded_stale,
    discarded_superseded, dropped_closed, size (entries present, also after close), waiters (parked
    ops). Always enqueued == dequeued + discarded_stale + discarded_superseded + size.
    """
    lib = load_library()
    return lib.hetsync_hop_update_queue_status(handle)


def hop_update_queue_counters(handle):
    """:func:`hop_update_queue_status` as a dict ``{name: value}`` with the keys of
    :data:`HOP_UPDATE_QUEUE_COUNTERS` (Python ints when eager, int64 scalar tensors inside a ``tf.function``)."""
    status = hop_update_queue_status(handle)
    if tf.executing_eagerly():
        return dict(zip(HOP_UPDATE_QUEUE_COUNTERS, status.numpy().tolist()))
    return {k: status[i] for i, k in enumerate(HOP_UPDATE_QUEUE_COUNTERS)}


def hop_update_queue_close(handle, message):
    """Close the queue (op ``HetsyncHopUpdateQueueClose``), e.g. when a rank errors out, so nobody hangs.

    Every parked and future dequeue / dequeue_newest fails at once with ``tf.errors.CancelledError`` whose
    message contains ``message``; later enqueues are counted as ``dropped_closed``. Entries left stay counted
    in ``size``. Closing twice keeps the first message.

    Args:
        handle: update-queue handle. message: str (string scalar), the reason.
    """
    lib = load_library()
    lib.hetsync_hop_update_queue_close(handle, tf.convert_to_tensor(message, tf.string))


def hop_update_queue_destroy(handle):
    """Close the queue (parked ops fail with ``CancelledError``) and delete it from its resource manager
    (op ``HetsyncHopUpdateQueueDestroy``); later ops on the handle fail with ``tf.errors.NotFoundError``."""
    lib = load_library()
    lib.hetsync_hop_update_queue_destroy(handle)


def hop_token_queue_create(n, initial, name=None):
    """Create a Hop token queue set of one worker (op ``HetsyncHopTokenQueueCreate``; Hop section 4.2, Fig. 7).

    Worker i keeps one token counter per neighbour index 0..n-1 (the tokens granted to i by that neighbour)
    and the newest iteration value received per index (which tells i that neighbour's iteration;
    docs/protocols/hop.md, derived). Runs eagerly (``tf.init_scope``); each call creates a new resource, deleted by
    :func:`hop_token_queue_destroy`.

    Args:
        n: int >= 1, the number of counters. initial: int >= 0, tokens each counter starts with.
        name: optional str, a label used in the resource name and in error messages.

    Returns:
        a scalar ``tf.resource`` tensor, the token-queue handle.

    Raises:
        ValueError: ``n`` not an int >= 1 or ``initial`` not an int >= 0.
    """
    for what, v, lo in (("n", n, 1), ("initial", initial, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"hop_token_queue_create: {what} must be an int >= {lo}, got {v!r}")
    lib = load_library()
    with tf.init_scope():
        return lib.hetsync_hop_token_queue_create(n=n, initial=initial, label=str(name or ""))


def hop_token_take(handle, index, count=1, timeout_ms=60000.0):
    """Take ``count`` tokens from counter ``index`` (op ``HetsyncHopTokenTake``; Hop Fig. 7 lines 16-19).

    Waits (without holding a thread) until counter[index] >= count, then subtracts. ``count == 0`` returns at
    once. A closed index (:func:`hop_token_close`) never blocks: the call returns the current count at once
    without subtracting.

    Args:
        handle: token-queue handle. index: int64 scalar in [0, n). count: int64 scalar >= 0.
        timeout_ms: float64 scalar > 0, milliseconds to wait at most (inf: no deadline).

    Returns:
        int64 scalar tensor: the tokens remaining on ``index`` after the take.

    Raises:
        ValueError: Python ``index`` < 0, ``count`` < 0 or ``timeout_ms`` <= 0.
        tf.errors.InvalidArgumentError: ``index`` not in [0, n) (or a bad tensor argument).
        tf.errors.DeadlineExceededError: not enough tokens after ``timeout_ms`` (the message names the index,
            the count wanted and the count present).
        tf.errors.CancelledError: the token queue is or gets cancelled (the cancel message), or the step is
            cancelled.
    """
    fn = "hop_token_take"
    lib = load_library()
    return lib.hetsync_hop_token_take(handle, _int64_arg(index, fn, "index", 0), _int64_arg(count, fn, "count", 0),
                                      _timeout_arg(timeout_ms, fn))


def hop_token_put(handle, index, count=1, iteration=-1):
    """Add ``count`` tokens to counter ``index`` (op ``HetsyncHopTokenPut``; Hop Fig. 7 lines 8-10).

    ``iteration`` >= 0 (the token value [k]) sets newest[index] = max(newest[index], iteration); -1 leaves it.
    Parked takes that become satisfiable complete (FIFO among them). Puts after a cancel are still counted.

    Args:
        handle: token-queue handle. index: int64 scalar in [0, n). count: int64 scalar >= 0.
        iteration: int64 scalar >= -1.

    Raises:
        ValueError: Python ``index`` < 0, ``count`` < 0 or ``iteration`` < -1.
        tf.errors.InvalidArgumentError: ``index`` not in [0, n), or the count would overflow int64.
    """
    fn = "hop_token_put"
    lib = load_library()
    lib.hetsync_hop_token_put(handle, _int64_arg(index, fn, "index", 0), _int64_arg(count, fn, "count", 0),
                              _int64_arg(iteration, fn, "iteration", -1))


def hop_token_size(handle):
    """Token counts and newest iterations (op ``HetsyncHopTokenSize``).

    Returns:
        ``(counts, newest)``: int64 ``[n]`` each; ``newest[j]`` is the largest iteration value put on index
        j, -1 if none.
    """
    lib = load_library()
    out = lib.hetsync_hop_token_size(handle)
    return out.counts, out.newest


def hop_token_close(handle, index):
    """Mark neighbour ``index`` finished (op ``HetsyncHopTokenClose``): parked and future takes on it complete
    at once, taking nothing. Raises ValueError / ``tf.errors.InvalidArgumentError`` for an index not in [0, n)."""
    lib = load_library()
    lib.hetsync_hop_token_close(handle, _int64_arg(index, "hop_token_close", "index", 0))


def hop_token_cancel(handle, message):
    """Cancel the token queue (op ``HetsyncHopTokenCancel``): parked and future takes fail with
    ``tf.errors.CancelledError`` whose message contains ``message`` (str). Puts and size keep working."""
    lib = load_library()
    lib.hetsync_hop_token_cancel(handle, tf.convert_to_tensor(message, tf.string))


def hop_token_queue_destroy(handle):
    """Cancel the token queue (parked takes fail with ``CancelledError``) and delete it from its resource
    manager (op ``HetsyncHopTokenQueueDestroy``); later ops on the handle fail with ``tf.errors.NotFoundError``."""
    lib = load_library()
    lib.hetsync_hop_token_queue_destroy(handle)
