"""The wrapped step: read the step controls, pad to the emulated device time, time it, guard, apply.

One function, :func:`run`, called by the optimizer wrapper (:mod:`hetsync.core.wrapper`) through
:meth:`hetsync.core.protocol.Protocol._step` on every training step. The control values are written
by the emulation (:mod:`hetsync.core.controls`); without a scenario they are zeros and the step is
the protocol's own.
"""
import tensorflow as tf

from hetsync import ops
from hetsync.core import controls
from hetsync.core.grads import present_gradients, scatter_gradients

__all__ = ["run"]


def run(protocol, grads, variables, local_apply):
    """Run one wrapped step of ``protocol``: controls, emulated-device padding, timing, guard, ``apply``.

    Reads the step's control values (:func:`hetsync.core.controls.step_control`: injected delay,
    emulated device time per batch, extra milliseconds, samples factor), pads the gradients' arrival
    with the compiled delay op (:func:`hetsync.ops.delay`) so that the step lasts its emulated device
    time, records ``delay_ms``, ``compute_ms``, ``emulated_ms``, ``overrun`` and ``overruns``, resets
    ``sync_wait_ms``, runs the non-finite guard (:meth:`hetsync.core.guard.NonFiniteGuard._guard_gradients`)
    and then :meth:`hetsync.core.protocol.Protocol.apply`. Traced inside the compiled train step.

    Args:
        protocol: the :class:`hetsync.core.protocol.Protocol`.
        grads: list of gradient tensors, ``tf.IndexedSlices`` or None, aligned with ``variables``.
        variables: list of the model's trainable Keras variables.
        local_apply: callable ``(grads, variables)``, the wrapped optimizer's own update.

    Returns:
        whatever ``protocol.apply`` returns.

    Raises (in the compiled step):
        tf.errors.InvalidArgumentError: a non-finite gradient (message starts with
            :data:`hetsync.errors.NONFINITE_MARK`).
    """
    grads = list(grads)
    present, dense = present_gradients(grads)
    control = tf.convert_to_tensor(controls.step_control())
    delayed, delay_ms, compute_ms = ops.delay(dense, control, name="hetsync_step_delay")
    grads = scatter_gradients(grads, present, delayed)
    emulated = control[3] > 0.0
    target_ms = tf.where(emulated, control[1] * control[3] + control[2], tf.constant(0.0, tf.float64))
    overrun = tf.cast(tf.logical_and(emulated, compute_ms > target_ms), tf.float64)
    protocol._stats["delay_ms"].assign(delay_ms)
    protocol._stats["compute_ms"].assign(compute_ms)
    protocol._stats["emulated_ms"].assign(target_ms)
    protocol._stats["overrun"].assign(overrun)
    protocol._stats["overruns"].assign_add(overrun)
    protocol._stats["sync_wait_ms"].assign(tf.constant(0.0, tf.float64))
    grads = protocol._guard_gradients(grads)
    try:
        result = protocol.apply(grads, variables, local_apply)
        if protocol.capabilities.nonfinite_in_collective and protocol._step_bad is not None:
            # a step whose collective did not carry the flag still stops on the bad rank
            with tf.control_dependencies([r for r in tf.nest.flatten(result) if r is not None]):
                tf.debugging.Assert(tf.logical_not(protocol._step_bad), [protocol._nonfinite_message()])
        return result
    finally:
        protocol._end_guarded_step()
