"""The step's control values: what the emulation writes and the compiled step reads.

Two process-wide float64 variables are read inside every wrapped optimizer's compiled step, so the
delay op is always part of it (with factor 1 and 0 ms it completes at once): :func:`step_control`
before the gradients leave the step, :func:`sync_control` before each synchronization. The
emulation (:mod:`hetsync.emulation`) assigns them between steps; nothing else writes them. This
module is the one point of contact between a protocol's step and the emulation, so that no
protocol imports the emulation.
"""
import threading

__all__ = ["step_control", "sync_control", "OVERRUN_WARN_FRACTION"]


_lock = threading.Lock()


_controls = {}


def _control(name, initial):
    import tensorflow as tf

    with _lock:
        if name not in _controls:
            with tf.init_scope():  # created eagerly even if first asked for while tracing
                _controls[name] = tf.Variable(initial, dtype=tf.float64, trainable=False,
                                              name=f"hetsync_{name}")
        return _controls[name]


def step_control():
    """The float64 variable of shape [4] ``[step_start_s, factor, extra_ms, device_ms]`` fed to the step's
    delay op (``device_ms`` 0: no emulated device; see :func:`hetsync.ops.delay`)."""
    return _control("step_control", [0.0, 1.0, 0.0, 0.0])


def sync_control():
    """The float64 variable of shape [3] ``[0, 1, latency_ms]`` fed to the delay op before each synchronization."""
    return _control("sync_control", [0.0, 1.0, 0.0])


#: fraction of overrun steps above which an emulated run is invalid (warned on rank 0, marked by the bench).
OVERRUN_WARN_FRACTION = 0.01
