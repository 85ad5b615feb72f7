"""The delay op family: hold a step's tensors back to emulate a slower device (op ``HetsyncDelay``).

The emulated cluster's heterogeneity (``--slowdown`` scenarios such as ``device:40+random:6``, the
``netdelay`` latency) is injected inside the compiled training step by :func:`delay`: the op
forwards its tensors unchanged once the step has lasted as long as it would on the emulated device.
The wait runs on the library's timer thread (an ``AsyncOpKernel``), so no TensorFlow thread is
held: the step behaves like one on a slower device, not like a sleeping Python callback. Kernel
and op definition: ``tf_ops/delay_ops.cc``.
"""
import tensorflow as tf

from hetsync.ops.library import load_library

__all__ = ["delay"]


def delay(tensors, control, name=None):
    """Forward ``tensors`` unchanged after an injected delay (op ``HetsyncDelay``).

    The wait happens on the library's timer thread (an ``AsyncOpKernel``), so no TensorFlow
    thread is held: inside a training step it behaves like a slower device, not a sleeping
    Python callback. Called by the wrapped training step (:mod:`hetsync.core.protocol`) with the
    control values the emulation writes (:class:`hetsync.callbacks.Slowdown`), and for ``netdelay``
    latency.

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
            *overrun* and is not shortened). A Python list is converted to float64 directly;
            a tensor of another dtype is cast.
        name: optional op name.

    Returns:
        ``(outputs, delay_ms, compute_ms)``: the list of forwarded tensors, the applied delay in
        milliseconds (float64 scalar) and the measured compute time in milliseconds (float64
        scalar).

    Raises:
        tf.errors.InvalidArgumentError: ``control`` is not of shape [3] or [4], ``factor`` < 1,
            ``extra_ms`` < 0 or ``device_ms`` < 0 (raised when the op runs).
        hetsync.errors.OpLibraryError: the op library is missing or stale
            (:func:`hetsync.ops.load_library`).
    """
    lib = load_library()
    # A Python list becomes float64 directly: as float32, a wall-clock step_start_s (about 1.8e9 s) would be
    # rounded to a multiple of 128 s, possibly into the future (compute time 0). Tensors of another dtype are cast.
    control = tf.cast(tf.convert_to_tensor(control, dtype_hint=tf.float64), tf.float64)
    outputs, delay_ms, compute_ms = lib.hetsync_delay(list(tensors), control, name=name)
    return list(outputs), delay_ms, compute_ms
