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

__all__ = ["load_library", "build_info", "delay", "OpLibraryError"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_REBUILD = "rebuild it with `make deps` (or `pip install --no-build-isolation -e .` in the repository)"
_lock = threading.Lock()
_library = None


class OpLibraryError(ImportError):
    """The compiled op library is missing, stale, or failed to load."""


def _library_path():
    candidates = sorted(glob.glob(os.path.join(_HERE, "_hetsync_ops*.so")))
    if not candidates:
        raise OpLibraryError(f"hetsync's op library is not built (no _hetsync_ops*.so in {_HERE}); {_REBUILD}.")
    return candidates[0]


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
        info_path = os.path.join(_HERE, "_hetsync_ops_build.json")
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
        control: float64 tensor of shape ``[3]``: ``[step_start_s, factor, extra_ms]``.
            ``step_start_s`` is wall-clock time in seconds since the epoch at which the step's
            compute began (0: unknown, compute time taken as 0); ``factor`` K >= 1 adds
            (K - 1) x the compute time measured up to this op; ``extra_ms`` >= 0 adds a constant
            number of milliseconds.
        name: optional op name.

    Returns:
        ``(outputs, delay_ms, compute_ms)``: the list of forwarded tensors, the applied delay in
        milliseconds (float64 scalar) and the measured compute time in milliseconds (float64
        scalar).

    Raises:
        tf.errors.InvalidArgumentError: ``control`` is not of shape [3], ``factor`` < 1, or
            ``extra_ms`` < 0 (raised when the op runs).
    """
    lib = load_library()
    outputs, delay_ms, compute_ms = lib.hetsync_delay(list(tensors), tf.cast(control, tf.float64), name=name)
    return list(outputs), delay_ms, compute_ms
