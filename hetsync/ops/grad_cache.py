"""RNA's gradient cache: the ops of cross-iteration execution (ops ``HetsyncGradCache*``).

RNA paper sections 3.3 and 6. Inside the training step, WriteOp (:func:`grad_cache_write`) caches
this step's gradients and ReadOp (:func:`grad_cache_read`) returns the newest reduced result if one
arrived, else this step's own gradients; neither blocks. The communication thread takes the pending
accumulation (:func:`grad_cache_take`), allreduces it, and publishes the result
(:func:`grad_cache_publish`); it waits for work with :func:`grad_cache_wait`. With RNA's ``wait_for_round``
the step blocks after its write until the round that took it is published (:func:`grad_cache_wait_published`),
and the communication thread releases such waits when it ends (:func:`grad_cache_set_released`).

Notation used by every function below: ``t`` is a *local iteration id* of this rank (the value
passed to :func:`grad_cache_write`, strictly increasing); ``k`` is the newest pending iteration when
the accumulation is taken; ``tau = k - t_min`` is the largest iteration gap among the accumulated
gradients (t_min the oldest pending one). The locally reduced gradient is
g' = sum_t [t - (k - tau) + 1] g_t / sum_t [t - (k - tau) + 1], i.e. the oldest pending gradient has
weight 1 and the newest weight tau + 1. A write of iteration k drops every pending t with
k - t > max_staleness (so tau <= max_staleness).

Gradients are float32. The cache lives in host memory. The ops are not pinned to a device: every
cache op also has a GPU kernel whose arguments all live in host memory, so a step placed on a GPU
runs them there and TensorFlow copies a GPU gradient into the host-side cache (and the result back)
itself (registration tested; no GPU run was possible here). Kernels and op definitions:
``tf_ops/grad_cache_ops.cc`` (the resource: ``tf_ops/grad_cache.h``).

Every function raises :class:`hetsync.errors.OpLibraryError` if the op library is missing or stale
(:func:`hetsync.ops.load_library`), and ``tf.errors.NotFoundError`` for a cache already destroyed.
"""
import tensorflow as tf

from hetsync.ops.library import load_library

__all__ = ["GRAD_CACHE_COUNTERS", "grad_cache_create", "grad_cache_write", "grad_cache_read", "grad_cache_take",
           "grad_cache_publish", "grad_cache_wait", "grad_cache_wait_published", "grad_cache_set_released",
           "grad_cache_status", "grad_cache_destroy"]

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
    """``tensors`` as a list of tensors; TypeError naming ``what[i]`` for one that is not float32."""
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
        t - (k - tau) + 1 (see the module notes). Never blocks.
    """
    lib = load_library()
    return lib.hetsync_grad_cache_take(cache)


def grad_cache_publish(cache, reduced, round_id, accumulate=False):
    """Communication side: publish an allreduced ``[sum_r w_r g'_r ..., sum_r w_r]`` as round ``round_id``.

    Args:
        cache: handle. reduced: float32 [total + 1] (the horovod sum of every rank's
            :func:`grad_cache_take` output; Algorithm 2 divides by the last value, W = 1/sum w).
        round_id: int >= 0, strictly larger than every earlier published round.
        accumulate: bool; False (Algorithm 2) replaces a result no ReadOp has returned yet, True combines it
            with this one as sums (the stored result becomes ``(W_old x_old + S) / (W_old + W)`` with weight sum
            ``W_old + W``), so a step that reads after several rounds gets every one of them (RNA's
            ``update_rule="samples"``).

    Raises:
        tf.errors.InvalidArgumentError: wrong length, sum of weights <= 0, or non-increasing round id.
    """
    lib = load_library()
    lib.hetsync_grad_cache_publish(cache, tf.cast(reduced, tf.float32), tf.cast(round_id, tf.int64),
                                   accumulate=bool(accumulate))


def grad_cache_wait(cache, timeout_ms):
    """Communication side: block up to ``timeout_ms`` milliseconds until a gradient is pending
    (op ``HetsyncGradCacheWait``).

    A synchronous kernel: it holds the calling thread (and, inside a graph, one of TensorFlow's
    threads) while it waits, so never call it inside a training step; the communication thread
    calls it between rounds.

    Args:
        cache: handle from :func:`grad_cache_create`.
        timeout_ms: float64 scalar >= 0, milliseconds to wait at most (0: a poll). Must be finite.

    Returns:
        bool scalar tensor: True if a gradient is pending (at once or within the timeout).

    Raises:
        tf.errors.InvalidArgumentError: ``timeout_ms`` not a scalar or < 0.
    """
    lib = load_library()
    return lib.hetsync_grad_cache_wait(cache, tf.cast(timeout_ms, tf.float64))


def grad_cache_wait_published(cache, iteration, timeout_ms):
    """Step side: block up to ``timeout_ms`` milliseconds until a published round holds the gradient of local
    iteration ``iteration`` (op ``HetsyncGradCacheWaitPublished``).

    A round holds it once a :func:`grad_cache_take` that included it was followed by a
    :func:`grad_cache_publish`. Returns at once while the cache is released (:func:`grad_cache_set_released`),
    and after a wait that timed out, until the next publish (the rounds are stalled: no step is held for them).
    A synchronous kernel: inside the training step it holds the step (RNA's ``wait_for_round``: the step then
    reads the round with :func:`grad_cache_read`, so each gradient is applied before the next one is computed).

    Args:
        cache: handle from :func:`grad_cache_create`.
        iteration: int64 scalar, a local iteration id t already written.
        timeout_ms: float64 scalar >= 0, milliseconds to wait at most (0: a poll). Must be finite.

    Returns:
        ``(published, wait_ms)``: bool scalar (whether a published round holds iteration t; False after a
        timeout or a release without it); float64 scalar, the milliseconds the op blocked.

    Raises:
        tf.errors.InvalidArgumentError: ``timeout_ms`` negative or not finite, an input not a scalar.
    """
    lib = load_library()
    return lib.hetsync_grad_cache_wait_published(cache, tf.cast(iteration, tf.int64), tf.cast(timeout_ms, tf.float64))


def grad_cache_set_released(cache, released):
    """Communication side: with ``released`` True no round follows, and every :func:`grad_cache_wait_published`,
    now and until it is set False again, returns at once; False makes the waits block again (op
    ``HetsyncGradCacheSetReleased``). RNA's communication thread releases its cache when it ends, so that no step
    waits for a round that will not come, and the next fit's thread sets it False before it starts.

    Args:
        cache: handle from :func:`grad_cache_create`. released: bool.
    """
    lib = load_library()
    lib.hetsync_grad_cache_set_released(cache, tf.constant(bool(released)))


def grad_cache_status(cache):
    """The cache's counters as a dict ``{name: int}`` (op ``HetsyncGradCacheStatus``; eager only).

    Keys, in :data:`GRAD_CACHE_COUNTERS` order: ``written`` (WriteOp calls), ``dropped`` (gradients
    dropped beyond ``max_staleness``), ``taken`` (gradients combined into taken accumulations),
    ``takes`` (non-empty takes: rounds this rank contributed to), ``published`` (results published),
    ``fresh_reads`` (ReadOp calls that returned a published result), ``newest_round`` and
    ``last_read_round`` (round ids, -1: none), ``pending`` (gradients pending now),
    ``newest_iteration`` (-1: none).

    Args:
        cache: handle from :func:`grad_cache_create`.
    """
    lib = load_library()
    values = lib.hetsync_grad_cache_status(cache).numpy().tolist()
    return dict(zip(GRAD_CACHE_COUNTERS, values))


def grad_cache_destroy(cache):
    """Delete the cache from its resource manager (op ``HetsyncGradCacheDestroy``); it is freed once the
    last op using it finishes, and later ops on the handle fail with ``tf.errors.NotFoundError``.

    Args:
        cache: handle from :func:`grad_cache_create`.
    """
    lib = load_library()
    lib.hetsync_grad_cache_destroy(cache)
