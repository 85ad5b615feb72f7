"""Local steps with periodic parameter averaging: the skeleton local SGD and FedAvg share.

The baseline family of the SelSync paper (section II, "FedAvg / local SGD"; section IV, Table I):
every rank applies its own gradients; whenever the protocol's schedule says so, the parameters
are averaged over the ranks (parameter aggregation, section III-C) with
:meth:`hetsync.core.protocol.Protocol.average_parameters`. Between averages no byte crosses the
network. Subclasses give the schedule (:meth:`PeriodicAveragingProtocol.should_sync`) and, for a
random subset of ranks, the participation weight (:meth:`PeriodicAveragingProtocol.participation`).

On the sample pool (``data_plan="pool"``) ranks run different numbers of steps, but the
average is a horovod collective that every rank must join equally often. The rounds are then
scheduled by the pool's *global* progress instead of the local step count: epoch e has
R_e = :meth:`PeriodicAveragingProtocol.pool_rounds` rounds; round k (1..R_e) is due once k B / R_e
of the epoch's B batches were handed out (over all ranks; every pool reply carries that count). A
rank joins the rounds that became due right after its step (the protocol's ``on_train_batch_end`` hook, one eager
averaged allreduce each, the same name on every rank, in order) and, when its epoch ends (pool
empty), the epoch's remaining rounds. So every rank joins exactly sum_e R_e rounds. A round is a
barrier: a paused or slow rank delays the next round for everyone (work is still conserved
between rounds: fast ranks take more batches).
"""
import numpy as np
import tensorflow as tf

from hetsync.core.protocol import Protocol, payload_bytes

__all__ = ["PeriodicAveragingProtocol"]


class PeriodicAveragingProtocol(Protocol):
    """Local steps, then parameter averaging whenever :meth:`should_sync` says so.

    Subclasses implement :meth:`should_sync` (bool scalar tensor from the 0-based global step)
    and optionally :meth:`participation` (float32 0/1 weight of this rank in the average).
    Statistics: :meth:`hetsync.core.protocol.Protocol.add_sync_stats`.
    """

    name = "periodic"

    def build(self):
        """Create the sync statistics and the global step counter."""
        self.add_sync_stats()
        self.add_stat("pool_rounds")
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

    def round_participation(self, round_id):
        """This rank's weight in pool round ``round_id`` (int, 1-based over the run): None (all) here."""
        return None

    def pool_rounds(self, epoch, batches, ranks):
        """Averaging rounds R_e in pool epoch ``epoch`` (int >= 0) of ``batches`` batches over ``ranks``
        ranks; subclasses define it (local SGD: floor(B / (H n)); FedAvg: its syncs per epoch).

        Raises:
            NotImplementedError: the subclass has no pool schedule.
        """
        raise NotImplementedError

    # -- the pool's rounds (hook set): joined between steps, by the pool's global progress ------------
    def on_train_begin(self, model, params):
        """On the sample pool: track the progress of every batch handed out, and start counting rounds. A
        protocol that takes over a fit already ``params["start_step"]`` steps in (:func:`hetsync.Auto`'s switch)
        starts its global step there, so its schedule (every H steps; FedAvg's aggregations at their places in
        the epoch) stays where a run of it from the start would have it."""
        if "start_step" in params:
            self._global_step.assign(int(params["start_step"]))
        if self.pool is not None:
            self.pool.track_batches()
        self._rounds_joined = 0
        self._epoch_base = {0: 0}  # epoch -> rounds of the epochs before it

    def _rounds_before(self, epoch):
        client = self.pool
        while epoch not in self._epoch_base:
            last = max(self._epoch_base)
            self._epoch_base[last + 1] = self._epoch_base[last] + self.pool_rounds(
                last, client.batches_per_epoch, self.roles.num_workers)
        return self._epoch_base[epoch]

    def _join_until(self, target):
        while self._rounds_joined < target:
            self._rounds_joined += 1
            self.join_pool_round(self._rounds_joined)

    def on_train_batch_end(self, batch, logs):
        """On the sample pool: join every round due by the progress when this step's batch was claimed."""
        client = self.pool
        if client is None or not client.batch_progress:
            return
        # the progress when *this step's* batch was claimed (Keras may have pulled the next one already)
        epoch, handed = client.batch_progress.popleft()
        b = client.batches_per_epoch
        r = self.pool_rounds(epoch, b, self.roles.num_workers)
        due = int(np.floor(handed * r / b + 1e-9)) if r else 0
        self._join_until(self._rounds_before(epoch) + due)

    def on_epoch_end(self, epoch, logs):
        """On the sample pool: join the rest of the epoch's rounds (every batch handed out was trained on)."""
        client = self.pool
        if client is None:
            return
        client.batch_progress.clear()
        self._join_until(self._rounds_before(len(client.epochs)))

    def join_pool_round(self, round_id):
        """Join pool round ``round_id`` (eagerly, after a step or at epoch end): the (masked) average
        of the trainable parameters over every rank (:meth:`hetsync.core.protocol.Protocol.average_parameters`)."""
        variables = list(self.optimizer._trainable_variables)
        weight = self.round_participation(round_id)
        self.average_parameters(variables, weight, name=f"hetsync_{self.name}_pool_round")
        self._stats["pool_rounds"].assign_add(1.0)

    def apply(self, grads, variables, local_apply):
        """The local step, then (when :meth:`should_sync`) the average of the parameters."""
        result = local_apply(grads, variables)
        step = self._global_step.read_value()
        # on the pool, on_train_batch_end averages between steps instead
        synced = tf.constant(False) if self.pool is not None else self.should_sync(step)
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
        """End-of-run statistics: :meth:`hetsync.core.protocol.Protocol.sync_summary` plus the
        end-of-training average's figures if it ran."""
        out = dict(self.sync_summary(), **self._final)
        if self.pool is not None:
            from hetsync.data import pool as pool

            out["pool_rounds"] = int(self._stats["pool_rounds"].numpy())
            out["pool"] = pool.summary(self)
        return out
