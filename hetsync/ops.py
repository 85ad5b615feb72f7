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
