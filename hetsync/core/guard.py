"""The non-finite guard: no NaN or inf gradient or parameter ever leaves a rank.

Every step's gradients are checked before the protocol sends anything
(:meth:`NonFiniteGuard._guard_gradients`); protocols whose step runs one collective fold a per-rank
flag into it (:meth:`NonFiniteGuard.nonfinite_flags`, :meth:`NonFiniteGuard.check_nonfinite_flags`)
so every rank stops in the same synchronization; eager senders check their arrays
(:meth:`NonFiniteGuard.check_finite_arrays`). A mixin of :class:`hetsync.core.protocol.Protocol`:
it reads the protocol's ``optimizer``, ``display_name`` and statistics (``nonfinite_dropped``).
"""
import numpy as np
import tensorflow as tf

from hetsync import world
from hetsync.core.grads import all_finite, loss_scaling, present_gradients, scatter_gradients
from hetsync.errors import NONFINITE_MARK, NonFiniteError


class NonFiniteGuard:
    """The non-finite guard of :class:`hetsync.core.protocol.Protocol` (a mixin; see the module docstring)."""

    # the compiled step's non-finite flag and step index while a step is being traced (else None)
    _step_bad = _step_it = None

    @staticmethod
    def _zeros_if(bad, tensors):
        """``tensors`` (list of dense tensors), or zeros of the same shapes where ``bad`` (bool scalar) holds."""
        if not tensors:
            return []
        return list(tf.cond(bad, lambda: [tf.zeros_like(t) for t in tensors], lambda: [tf.identity(t) for t in tensors]))

    def nonfinite_flags(self, bad):
        """Return this rank's non-finite flag vector: float32 [N] (N = world size), 1 at this rank's
        index if ``bad`` (bool scalar tensor) holds, else zeros. Summed or averaged by a collective, a
        positive entry names a rank that held back non-finite values (:meth:`check_nonfinite_flags`).
        ``bad`` None (outside a guarded step) means False."""
        if bad is None:
            bad = tf.constant(False)
        return tf.one_hot(world.rank(), world.size(), dtype=tf.float32) * tf.cast(bad, tf.float32)

    def _step_index(self):
        """The optimizer's ``iterations`` (int64 scalar tensor): the 0-based index of the current step."""
        if getattr(self, "_step_it", None) is not None:
            return self._step_it  # read at the start of the step, before the optimizer's increment
        it = getattr(self.optimizer, "iterations", None)
        return tf.constant(-1, tf.int64) if it is None else tf.cast(tf.convert_to_tensor(it), tf.int64)

    def check_nonfinite_flags(self, flags, where):
        """Return an assert op that raises on this rank if any rank's flag is set (compiled step).

        Args:
            flags: float32 [N], the sum or mean over ranks of :meth:`nonfinite_flags`.
            where: str, the collective that carried them (for the message).

        Raises (when the op runs):
            tf.errors.InvalidArgumentError: some flag > 0; the message starts with
                :data:`NONFINITE_MARK` and names the rank(s), the step and the protocol.
        """
        bad = flags > 0
        msg = tf.strings.format(
            NONFINITE_MARK + ": non-finite values on rank(s) {} at step {} (protocol " + self.display_name
            + "), reported in " + where + "; none was sent, training stops on every rank",
            (tf.reshape(tf.where(bad), [-1]), self._step_index()))
        return tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [msg])

    def check_finite_arrays(self, arrays, what, step):
        """Raise before sending if any of ``arrays`` holds a NaN or inf (eager, point-to-point senders).

        Counts the held-back set in ``nonfinite_dropped`` first. Used by the protocols that send
        parameters or gradients between steps (Hop, NOTIFY-ACK, the parameter-server workers).

        Args:
            arrays: list of NumPy float arrays about to be sent. what: str, what they are (message).
            step: int, the step or iteration they belong to (message).

        Raises:
            NonFiniteError: some element is not finite (the message names the rank, the step, the
                protocol and what was not sent).
        """
        if all(np.isfinite(a).all() for a in arrays):
            return
        self._stats["nonfinite_dropped"].assign_add(1.0)
        raise NonFiniteError(f"{NONFINITE_MARK}: non-finite {what} on rank {world.rank()} at step {step} "
                             f"(protocol {self.display_name}); not sent (nonfinite_dropped="
                             f"{int(self._stats['nonfinite_dropped'].numpy())}), training stops")

    def _nonfinite_message(self):
        return tf.strings.format(
            NONFINITE_MARK + ": non-finite gradient on rank " + str(world.rank()) + " at step {} (protocol "
            + self.display_name + "); this step's gradients were not sent (nonfinite_dropped={}), training stops",
            (self._step_index(), tf.cast(self._stats["nonfinite_dropped"].read_value(), tf.int64)))

    def _guard_gradients(self, grads):
        """The non-finite guard of the compiled step, before :meth:`apply` sends anything.

        Not under dynamic loss scaling (the wrapped optimizer is a ``keras.optimizers.LossScaleOptimizer``):
        there an overflowing step is expected, skipped and the scale halved, so the gradients go on
        unchecked. Otherwise it checks every present gradient (one reduce per tensor). If any element is NaN or inf, the
        step's gradients are held back and counted (``nonfinite_dropped`` += 1), then:

        * protocols with ``capabilities.nonfinite_in_collective``: the gradients are replaced by zeros, the
          step runs and its collective carries this rank's flag (:meth:`nonfinite_flags`); every
          rank then raises (:meth:`check_nonfinite_flags`), naming this rank and the step;
        * the others: the step raises here, before the protocol writes, queues or sends anything.

        Args:
            grads: list of gradient tensors (or None), one per trainable variable.

        Returns:
            the gradients to hand to :meth:`apply` (list, same structure).

        Raises (in the compiled step):
            tf.errors.InvalidArgumentError: a non-finite gradient (the message starts with
                :data:`NONFINITE_MARK` and names the rank, the step and the protocol).
        """
        self._step_bad = self._step_it = None
        if loss_scaling(self.optimizer):
            # dynamic loss scaling expects overflowing steps: LossScaleOptimizer skips them and halves
            # its scale (under BSP on every rank alike, the average carries the inf); no guard then
            return grads
        self._step_it = tf.identity(self._step_index())
        bad = tf.logical_not(all_finite(grads))
        counted = self._stats["nonfinite_dropped"].assign_add(tf.cast(bad, tf.float64))
        self._step_bad = bad
        present, dense = present_gradients(grads)
        if self.capabilities.nonfinite_in_collective:
            with tf.control_dependencies([counted]):
                return scatter_gradients(grads, present, self._zeros_if(bad, dense))
        with tf.control_dependencies([counted]):
            check = tf.debugging.Assert(tf.logical_not(bad), [self._nonfinite_message()])
        with tf.control_dependencies([check]):
            return scatter_gradients(grads, present, [tf.identity(g) for g in dense])

    def _end_guarded_step(self):
        """Forget the traced step's non-finite flag and step index (end of :func:`hetsync.core.step.run`)."""
        self._step_bad = self._step_it = None
