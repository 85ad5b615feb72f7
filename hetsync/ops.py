"""The compiled op library (``tf_ops/`` -> ``hetsync/_hetsync_ops*.so``) and thin Python wrappers.

The library is loaded once per process with :func:`tf.load_op_library`. Before loading, the
TensorFlow version it was built against (recorded by ``setup.py``) is compared with the running
one: a mismatched custom-op library can crash the process, so a stale build is refused with the
command that rebuilds it.
"""
import glob
import json
import os
import threading

import tensorflow as tf

__all__ = ["load_library", "build_info", "library_tag", "delay", "OpLibraryError"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_REBUILD = "rebuild it with `make build` (another venv: `make build VENV=... TF_VERSION=...`; or `pip install --no-build-isolation -e .` in the repository)"
_lock = threading.Lock()
_library = None


class OpLibraryError(ImportError):
    """The compiled op library is missing, stale, or failed to load."""


def library_tag(tf_version=None):
    """The TensorFlow part of the op library's name: ``"2.18.1"`` -> ``"tf2_18_1"`` (str).

    ``setup.py`` builds ``_hetsync_ops_<tag>*.so`` for the installed TensorFlow, so environments
    with different TensorFlow versions share one checkout. ``tf_version`` defaults to the running one.
    """
    v = tf.__version__ if tf_version is None else tf_version
    return "tf" + "".join(c if c.isalnum() else "_" for c in v)


def _library_path():
    pattern = os.path.join(_HERE, f"_hetsync_ops_{library_tag()}.*so")
    candidates = sorted(glob.glob(pattern))
    if not candidates:
        others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(_HERE, "_hetsync_ops*.so")))
        found = f" (found builds for other TensorFlow versions: {', '.join(others)})" if others else ""
        raise OpLibraryError(f"hetsync's op library is not built for TensorFlow {tf.__version__} (no "
                             f"{os.path.basename(pattern)} in {_HERE}){found}; {_REBUILD}.")
    return candidates[0]


def _info_path(library):
    """The build record beside ``library``: ``_hetsync_ops_<tag>_build.json``."""
    name = os.path.basename(library).split(".", 1)[0]
    return os.path.join(os.path.dirname(library), f"{name}_build.json")


def load_library():
    """Load the op library once and return the module object of its generated op wrappers.

    Returns:
        The module returned by ``tf.load_op_library`` (ops ``hetsync_delay``, ``hetsync_build_info``...).

    Raises:
        OpLibraryError: the library is missing, was built for another TensorFlow version than
            the running one (message names both versions and how to rebuild), or fails to load.
    """
    global _library
    with _lock:
        if _library is not None:
            return _library
        path = _library_path()
        info_path = _info_path(path)
        if os.path.exists(info_path):
            with open(info_path) as f:
                built_for = json.load(f).get("tf_version")
            if built_for != tf.__version__:
                raise OpLibraryError(
                    f"hetsync's op library {path} was built for TensorFlow {built_for}, but TensorFlow "
                    f"{tf.__version__} is running; {_REBUILD}."
                )
        try:
            lib = tf.load_op_library(path)
        except (tf.errors.NotFoundError, OSError) as exc:
            raise OpLibraryError(f"hetsync's op library {path} failed to load ({exc}); {_REBUILD}.") from exc
        with tf.init_scope():  # eager even when first loaded while a step is being traced
            built_for = lib.hetsync_build_info().numpy().decode()
        if built_for != tf.__version__:
            raise OpLibraryError(
                f"hetsync's op library {path} reports TensorFlow {built_for}, running {tf.__version__}; {_REBUILD}."
            )
        _library = lib
        return lib


def build_info():
    """Return the TensorFlow version string (str) the loaded op library was compiled against."""
    lib = load_library()
    with tf.init_scope():
        return lib.hetsync_build_info().numpy().decode()


def delay(tensors, control, name=None):
    """Forward ``tensors`` unchanged after an injected delay (op ``HetsyncDelay``).

    The wait happens on the library's timer thread (an ``AsyncOpKernel``), so no TensorFlow
    thread is held: inside a training step it behaves like a slower device, not a sleeping
    Python callback. Used by :class:`hetsync.callbacks.Slowdown` and for ``netdelay`` latency.

    Args:
        tensors: list of tensors of any dtype and shape (may be empty); returned unchanged.
        control: float64 tensor of shape ``[3]`` ``[step_start_s, factor, extra_ms]`` or ``[4]``
            ``[step_start_s, factor, extra_ms, device_ms]``. ``step_start_s`` is wall-clock time
            in seconds since the epoch at which the step's compute began (0: unknown, compute
            time taken as 0); ``factor`` K >= 1 adds (K - 1) x the compute time measured up to
            this op; ``extra_ms`` >= 0 adds a constant number of milliseconds. ``device_ms`` > 0
            emulates a device (scenario ``device:MS``): the op then completes once the step has
            lasted K x device_ms + extra_ms milliseconds since ``step_start_s`` (delay = that
            minus the compute time, never negative: a step whose compute took longer is an
            *overrun* and is not shortened).
        name: optional op name.

    Returns:
        ``(outputs, delay_ms, compute_ms)``: the list of forwarded tensors, the applied delay in
        milliseconds (float64 scalar) and the measured compute time in milliseconds (float64
        scalar).

    Raises:
        tf.errors.InvalidArgumentError: ``control`` is not of shape [3] or [4], ``factor`` < 1,
            ``extra_ms`` < 0 or ``device_ms`` < 0 (raised when the op runs).
    """
    lib = load_library()
    # A Python list becomes float64 directly: as float32, a wall-clock step_start_s (about 1.8e9 s) would be
    # rounded to a multiple of 128 s, possibly into the future (compute time 0). Tensors of another dtype are cast.
    control = tf.cast(tf.convert_to_tensor(control, dtype_hint=tf.float64), tf.float64)
    outputs, delay_ms, compute_ms = lib.hetsync_delay(list(tensors), control, name=name)
    return list(outputs), delay_ms, compute_ms


# --- gradient cache of RNA (ops HetsyncGradCache*, kernels in tf_ops/grad_cache_kernels.cc) ------------------
#
# RNA paper sections 3.3 and 6 (cross-iteration execution). Notation used by every function below:
# ``t`` is a *local iteration id* of this rank (the value passed to :func:`grad_cache_write`, strictly
# increasing); ``k`` is the newest pending iteration when the accumulation is taken; ``tau = k - t_min``
# is the largest iteration gap among the accumulated gradients (t_min the oldest pending one). The
# locally reduced gradient is g' = sum_t [t - (k - tau) + 1] g_t / sum_t [t - (k - tau) + 1], i.e. the
# oldest pending gradient has weight 1 and the newest weight tau + 1. A write of iteration k drops every
# pending t with k - t > max_staleness (so tau <= max_staleness). The cache is host memory. The ops are not
# pinned to a device: every cache op also has a GPU kernel whose arguments all live in host memory, so a
# step placed on a GPU runs them there and TensorFlow copies a GPU gradient into the host-side cache (and
# the result back) itself (registration tested; no GPU run was possible here).

__all__ += ["GRAD_CACHE_COUNTERS", "grad_cache_create", "grad_cache_write", "grad_cache_read", "grad_cache_take",
            "grad_cache_publish", "grad_cache_wait", "grad_cache_status", "grad_cache_destroy"]

#: index of each counter in :func:`grad_cache_status`'s result.
GRAD_CACHE_COUNTERS = ("written", "dropped", "taken", "takes", "published", "fresh_reads", "newest_round",
                       "last_read_round", "pending", "newest_iteration")


def grad_cache_create(shapes, max_staleness):
    """Create a gradient cache for float32 tensors of the given shapes (op ``HetsyncGradCacheCreate``).

    Call eagerly (it is wrapped in ``tf.init_scope``); the returned handle can be captured by a
    ``tf.function``. Each call creates a new, independent cache.

    Args:
        shapes: non-empty list of fully defined shapes (lists of ints or ``tf.TensorShape``), one per
            gradient tensor, in the order later passed to write/read.
        max_staleness: int >= 0, the staleness bound (in local iterations) of pending gradients.

    Returns:
        a scalar ``tf.resource`` tensor, the cache handle.

    Raises:
        ValueError: empty ``shapes``, a shape not fully defined, or ``max_staleness`` not an int >= 0.
    """
    shapes = [tf.TensorShape(s) for s in shapes]
    if not shapes:
        raise ValueError("grad_cache_create: shapes must not be empty")
    for s in shapes:
        if not s.is_fully_defined():
            raise ValueError(f"grad_cache_create: every shape must be fully defined, got {s}")
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"grad_cache_create: max_staleness must be an int >= 0, got {max_staleness!r}")
    lib = load_library()
    with tf.init_scope():
        return lib.hetsync_grad_cache_create(shapes=shapes, max_staleness=max_staleness)


def _float32_list(tensors, what):
    out = [tf.convert_to_tensor(t) for t in tensors]
    for i, t in enumerate(out):
        if t.dtype != tf.float32:
            raise TypeError(f"{what}[{i}] must be float32 (the gradient cache holds float32), got {t.dtype.name}")
    return out


def grad_cache_write(cache, grads, iteration):
    """WriteOp: cache this step's gradients as pending for local iteration ``iteration``. Never blocks.

    The tensors are held by reference (no copy; TensorFlow never mutates a buffer with more than one
    reference). An empty accumulation (the null gradient) is simply replaced; pending gradients of
    earlier iterations stay and are combined with the staleness weights when taken
    (:func:`grad_cache_take`); pending gradients with ``iteration - t > max_staleness`` are dropped
    and counted.

    Args:
        cache: handle from :func:`grad_cache_create`.
        grads: list of float32 tensors with the cache's shapes.
        iteration: int64 scalar, this rank's local iteration id t; must exceed every earlier one.

    Returns:
        int64 scalar tensor: cumulative number of dropped gradients.

    Raises:
        TypeError: a gradient is not float32.
        tf.errors.InvalidArgumentError: wrong number or shapes of tensors, or a non-increasing iteration.
    """
    lib = load_library()
    grads = _float32_list(grads, "grads")
    return lib.hetsync_grad_cache_write(cache, grads, tf.cast(iteration, tf.int64))


def grad_cache_read(cache, local_grads, iteration):
    """ReadOp: the newest reduced result if one arrived since the last read, else ``local_grads``. Never blocks.

    Args:
        cache: handle from :func:`grad_cache_create`.
        local_grads: list of float32 tensors with the cache's shapes (this step's local gradients).
        iteration: int64 scalar, this rank's local iteration id (recorded for statistics).

    Returns:
        ``(grads, fresh, round_id, weight_sum)``: list of float32 tensors (the published result
        (1/sum_r w_r) sum_r w_r g'_r of round ``round_id`` if fresh, else ``local_grads``); bool scalar;
        int64 scalar (the last round read, -1 if none yet); float32 scalar sum_r w_r of that round
        (the number of contributors; 1 when not fresh).

    Raises:
        TypeError: a tensor is not float32.
        tf.errors.InvalidArgumentError: wrong number or shapes of tensors.
    """
    lib = load_library()
    local_grads = _float32_list(local_grads, "local_grads")
    outs, fresh, round_id, weight_sum = lib.hetsync_grad_cache_read(cache, local_grads,
                                                                     tf.cast(iteration, tf.int64))
    return list(outs), fresh, round_id, weight_sum


def grad_cache_take(cache):
    """Communication side: take the pending accumulation, leaving the null gradient (RNA section 3.3).

    Args:
        cache: handle from :func:`grad_cache_create`.

    Returns:
        ``(weighted, iterations, newest_iteration)``: float32 [total + 1], ``w * g'`` flattened (tensor
        order, row-major) followed by ``w`` (w = 1 if anything was pending, else everything is 0:
        the null gradient with weight 0); int64 [m], the m combined iterations t, oldest first;
        int64 scalar, the newest iteration ever written (-1 if none). g' uses the staleness weights
        t - (k - tau) + 1 (see the notes above).
    """
    lib = load_library()
    return lib.hetsync_grad_cache_take(cache)


def grad_cache_publish(cache, reduced, round_id):
    """Communication side: publish an allreduced ``[sum_r w_r g'_r ..., sum_r w_r]`` as round ``round_id``.

    Args:
        cache: handle. reduced: float32 [total + 1] (the horovod sum of every rank's
            :func:`grad_cache_take` output; Algorithm 2 divides by the last value, W = 1/sum w).
        round_id: int >= 0, strictly larger than every earlier published round.

    Raises:
        tf.errors.InvalidArgumentError: wrong length, sum of weights <= 0, or non-increasing round id.
    """
    lib = load_library()
    lib.hetsync_grad_cache_publish(cache, tf.cast(reduced, tf.float32), tf.cast(round_id, tf.int64))


def grad_cache_wait(cache, timeout_ms):
    """Communication side: block up to ``timeout_ms`` milliseconds until a gradient is pending.

    Never call it inside a training step. Returns a bool scalar tensor (True: a gradient is pending).
    """
    lib = load_library()
    return lib.hetsync_grad_cache_wait(cache, tf.cast(timeout_ms, tf.float64))


def grad_cache_status(cache):
    """Return the cache's counters as a dict ``{name: int}`` (names in :data:`GRAD_CACHE_COUNTERS`). Eager."""
    lib = load_library()
    values = lib.hetsync_grad_cache_status(cache).numpy().tolist()
    return dict(zip(GRAD_CACHE_COUNTERS, values))


def grad_cache_destroy(cache):
    """Delete the cache from its resource manager; later ops on the handle fail with NotFoundError."""
    lib = load_library()
    lib.hetsync_grad_cache_destroy(cache)


# --- Hop update queue and token queue (ops HetsyncHop*, kernels in tf_ops/hop_queue_kernels.cc) ----------------
#
# Hop paper sections 4.1, 4.2, 6.1 (design notes: docs/protocols/hop.md). Both queues are host-side
# resources (CPU kernels only). Each ``*_create`` call makes a new, uniquely named resource (it runs eagerly, in
# ``tf.init_scope``; the handle can be captured by or passed to a ``tf.function``); ``*_destroy`` deletes it.
# Blocking ops (dequeue, dequeue_newest, token take) are ``AsyncOpKernel``s: while they wait they hold no
# TensorFlow thread, and they fail after ``timeout_ms`` milliseconds with ``tf.errors.DeadlineExceededError``
# (``timeout_ms`` must be > 0; ``float('inf')`` waits forever). They also fail with ``tf.errors.CancelledError``
# if the queue is closed (update queue) or cancelled (token queue), or if TensorFlow cancels the step.
# Tags: ``iteration`` (the iteration the update was generated in) and ``w_id`` (the sender) are int64 >= 0;
# ``None`` means "any" (passed to the op as -1). An argument given as a tensor is cast to int64 / float64 and
# checked by the op (InvalidArgumentError) instead of here (ValueError). Inside one ``tf.function`` TensorFlow's
# automatic control dependencies run the ops on the same handle in program order (ops on different handles may
# run concurrently), so e.g. an enqueue written before a dequeue of the same queue runs first.

__all__ += ["HOP_UPDATE_QUEUE_COUNTERS", "hop_update_queue_create", "hop_update_queue_enqueue",
            "hop_update_queue_dequeue", "hop_update_queue_size", "hop_update_queue_dequeue_newest",
            "hop_update_queue_status", "hop_update_queue_counters", "hop_update_queue_close",
            "hop_update_queue_destroy", "hop_token_queue_create", "hop_token_take", "hop_token_put",
            "hop_token_size", "hop_token_close", "hop_token_cancel", "hop_token_queue_destroy"]

#: index of each field in :func:`hop_update_queue_status`'s result (keys of :func:`hop_update_queue_counters`).
HOP_UPDATE_QUEUE_COUNTERS = ("enqueued", "dequeued", "discarded_stale", "discarded_superseded", "dropped_closed",
                             "size", "waiters")


def _is_tensor(x):
    return isinstance(x, (tf.Tensor, tf.Variable))


def _py_int(x):
    """``x`` as a Python int if it is a Python / numpy integer, else None (a tensor)."""
    if _is_tensor(x):
        return None
    if isinstance(x, bool):
        raise ValueError(f"expected an integer, got {x!r}")
    try:
        import operator
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
    from tensorflow.python.ops import handle_data_util  # pylint: disable=import-outside-toplevel
    from tensorflow.python.framework import cpp_shape_inference_pb2  # pylint: disable=import-outside-toplevel
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

    Hop sections 4.4 and 6.1 (spec section 5, "recommended semantics"). The queue remembers per w_id the
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
    and the newest iteration value received per index (which tells i that neighbour's iteration; spec
    section 3, [derived]). Runs eagerly (``tf.init_scope``); each call creates a new resource, deleted by
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
