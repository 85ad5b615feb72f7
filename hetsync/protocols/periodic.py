"""Local steps with periodic parameter averaging: the skeleton local SGD and FedAvg share.

The baseline family of the SelSync paper (section II, "FedAvg / local SGD"; section IV, Table I):
every rank applies its own gradients; whenever the protocol's schedule says so, the parameters
are averaged over the ranks (parameter aggregation, section III-C) with
:meth:`hetsync.protocols.base.Protocol.average_parameters`. Between averages no byte crosses the
network. Subclasses give the schedule (:meth:`PeriodicAveragingProtocol.should_sync`) and, for a
random subset of ranks, the participation weight (:meth:`PeriodicAveragingProtocol.participation`).
"""
import tensorflow as tf

from .base import Protocol, payload_bytes

__all__ = ["PeriodicAveragingProtocol"]


class PeriodicAveragingProtocol(Protocol):
    """Local steps, then parameter averaging whenever :meth:`should_sync` says so.

    Subclasses implement :meth:`should_sync` (bool scalar tensor from the 0-based global step)
    and optionally :meth:`participation` (float32 0/1 weight of this rank in the average).
    Statistics: :meth:`hetsync.protocols.base.Protocol.add_sync_stats`.
    """

    name = "periodic"

    def build(self):
        """Create the sync statistics and the global step counter."""
        self.add_sync_stats()
        with tf.init_scope():
            self._global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"hetsync_{self.name}_step")

    def should_sync(self, step):
        """Return a bool scalar tensor: does global step ``step`` (int64 scalar, 0-based) end with an average?

        Raises:
            NotImplementedError: subclasses (LocalSGD, FedAvg) define the schedule.
        """
        raise NotImplementedError

    def participation(self, step):
        """Return None (all ranks average) or a float32 scalar weight of this rank."""
        return None

    def apply(self, grads, variables, local_apply):
        """The local step, then (when :meth:`should_sync`) the average of the parameters."""
        result = local_apply(grads, variables)
        step = self._global_step.read_value()
        synced = self.should_sync(step)
        nbytes = float(payload_bytes([tf.convert_to_tensor(v.value) for v in variables]))
        weight = self.participation(step)
        if weight is not None:
            nbytes += 4.0

        def sync():
            with tf.control_dependencies(self.average_parameters(variables, weight, name=f"hetsync_{self.name}")):
                return tf.constant(nbytes, tf.float64)

        sent = tf.cond(synced, sync, lambda: tf.constant(0.0, tf.float64))
        with tf.control_dependencies(self.record_step(synced, sent)):
            self._global_step.assign_add(1)
        return result

    def summary_stats(self):
        """End-of-run statistics: :meth:`hetsync.protocols.base.Protocol.sync_summary` plus the
        end-of-training average's figures if it ran."""
        return dict(self.sync_summary(), **self._final)
