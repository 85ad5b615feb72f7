"""Local SGD: every rank steps on its own gradients; the parameters are averaged every H steps.

The baseline family of the SelSync paper (section II, "FedAvg / local SGD"): between
synchronizations no byte crosses the network; a synchronization is one averaged allreduce of the
parameters w = (1/N) sum_n w_n (parameter aggregation, section III-C). Also holds the helpers the
semi-synchronous protocols share (:func:`add_sync_stats`, :func:`record_step`,
:func:`average_parameters`).
"""
import tensorflow as tf

from .. import transport
from .base import Protocol, average_at_train_end, wrap

__all__ = ["LocalSGD", "LocalSGDProtocol", "PeriodicAveragingProtocol", "add_sync_stats", "record_step",
           "average_parameters", "payload_bytes"]


def add_sync_stats(protocol):
    """Create the per-step statistics every semi-synchronous protocol reports (all float64):

    * ``sync``: 1 if this step synchronized (parameters or gradients crossed the network), else 0;
    * ``sync_steps`` / ``local_steps``: cumulative counts of synchronous / local-only steps;
    * ``lssr``: local-to-synchronous step ratio, local / (local + sync) steps (SelSync eq. 4);
    * ``bytes_sent``: cumulative payload bytes this rank handed to collectives (parameters or
      gradients, plus any flag exchange), not counting the transport's own framing.
    """
    for name in ("sync", "sync_steps", "local_steps", "lssr", "bytes_sent"):
        protocol.add_stat(name)


def record_step(protocol, synced, nbytes):
    """Update the statistics of :func:`add_sync_stats` inside the compiled step.

    Args:
        protocol: the protocol. synced: bool scalar tensor, whether this step synchronized.
        nbytes: float64 scalar tensor, payload bytes this rank sent this step.

    Returns:
        list of the assign ops (use as control dependencies).
    """
    s = protocol._stats
    one = tf.cast(synced, tf.float64)
    ops = [s["sync"].assign(one), s["sync_steps"].assign_add(one), s["local_steps"].assign_add(1.0 - one),
           s["bytes_sent"].assign_add(tf.cast(nbytes, tf.float64))]
    with tf.control_dependencies(ops):
        total = s["sync_steps"].read_value() + s["local_steps"].read_value()
        ops.append(s["lssr"].assign(s["local_steps"].read_value() / tf.maximum(total, 1.0)))
    return ops


def payload_bytes(tensors):
    """Return the total size in bytes (python int) of a list of tensors with static shapes."""
    return int(sum(t.shape.num_elements() * t.dtype.size for t in tensors))


def average_parameters(protocol, variables, weight=None, name="hetsync_param_avg"):
    """Average the parameters over ranks (parameter aggregation) and assign the result, timed.

    With ``weight`` None, w <- (1/N) sum_n w_n (one fused averaged allreduce). With a float32
    scalar ``weight`` (1 for ranks taking part, 0 for the others; FedAvg's random fraction C),
    w <- sum_n weight_n w_n / sum_n weight_n on *every* rank, by one masked fused allreduce-sum.
    Runs inside :meth:`Protocol.synchronize` (netdelay latency, ``sync_wait_ms``, ``syncs``).

    Args:
        protocol: the calling protocol. variables: list of Keras variables (float).
        weight: None or float32 scalar tensor. name: op-name prefix.

    Returns:
        list of the assign ops.
    """
    values = [tf.convert_to_tensor(v.value) for v in variables]
    if weight is None:
        avg = protocol.synchronize(lambda ts: transport.allreduce_mean(ts, name=name), values)
    else:
        masked = [v * tf.cast(weight, v.dtype) for v in values] + [tf.reshape(tf.cast(weight, tf.float32), [1])]
        summed = protocol.synchronize(lambda ts: transport.allreduce_sum(ts, name=name), masked)
        count = summed[-1][0]
        avg = [s / tf.cast(count, s.dtype) for s in summed[:-1]]
    return [v.assign(a) for v, a in zip(variables, avg)]


class PeriodicAveragingProtocol(Protocol):
    """Local steps, then parameter averaging whenever :meth:`should_sync` says so.

    Subclasses implement :meth:`should_sync` (bool scalar tensor from the 0-based global step)
    and optionally :meth:`participation` (float32 0/1 weight of this rank in the average).
    """

    name = "periodic"

    def build(self):
        add_sync_stats(self)
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
        result = local_apply(grads, variables)
        step = self._global_step.read_value()
        synced = self.should_sync(step)
        nbytes = float(payload_bytes([tf.convert_to_tensor(v.value) for v in variables]))
        weight = self.participation(step)
        if weight is not None:
            nbytes += 4.0

        def sync():
            with tf.control_dependencies(average_parameters(self, variables, weight, name=f"hetsync_{self.name}")):
                return tf.constant(nbytes, tf.float64)

        sent = tf.cond(synced, sync, lambda: tf.constant(0.0, tf.float64))
        with tf.control_dependencies(record_step(self, synced, sent)):
            self._global_step.assign_add(1)
        return result

    def summary_stats(self):
        st = self.step_stats()
        return {"syncs": int(st["syncs"]), "sync_steps": int(st["sync_steps"]), "local_steps": int(st["local_steps"]),
                "lssr": st["lssr"], "bytes_sent": int(st["bytes_sent"])}


class LocalSGDProtocol(PeriodicAveragingProtocol):
    """Average the parameters after every H-th local step (see :func:`LocalSGD`)."""

    name = "localsgd"

    def __init__(self, period=8, average_at_end=True):
        super().__init__()
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"LocalSGD: period H must be an int >= 1 (steps between averagings), got {period!r}")
        if not isinstance(average_at_end, bool):
            raise ValueError(f"LocalSGD: average_at_end must be True or False, got {average_at_end!r}")
        self.period, self.average_at_end = period, average_at_end
        self._final = {}

    def config(self):
        return {"period": self.period, "average_at_end": self.average_at_end}

    def stop(self):
        if self.average_at_end:
            self._final = average_at_train_end(self, "hetsync_localsgd")

    def summary_stats(self):
        return dict(super().summary_stats(), **self._final)

    def should_sync(self, step):
        return tf.equal((step + 1) % self.period, 0)


def LocalSGD(optimizer, period=8, average_at_end=True):
    """Wrap a Keras 3 optimizer for local SGD with periodic parameter averaging.

    Each step every rank applies its own gradients; after steps H, 2H, 3H, ... (counted from 1)
    the parameters are averaged over all N ranks, w <- (1/N) sum_n w_n, in one fused allreduce,
    so the ranks are identical right after. Optimizer slots (momentum) stay local. Statistics:
    ``sync``, ``sync_steps``, ``local_steps``, ``lssr`` (= 1 - 1/H), ``bytes_sent``, and with
    ``average_at_end`` the drift before the final average (``drift_before_final_average``).

    Args:
        optimizer: a Keras 3 optimizer instance. period: int H >= 1 (steps); H = 1 is parameter-
            averaging BSP.
        average_at_end: bool, average the parameters once when training ends
            (:func:`hetsync.protocols.base.average_at_train_end`), so every rank holds the same final model even if the
            last step was local.

    Returns:
        keras.optimizers.Optimizer.

    Raises:
        TypeError: not a Keras 3 optimizer. ValueError: bad period or average_at_end.
        RuntimeError: not initialised.
    """
    return wrap(optimizer, LocalSGDProtocol(period=period, average_at_end=average_at_end))
