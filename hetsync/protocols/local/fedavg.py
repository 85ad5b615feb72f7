"""FedAvg in data-parallel form: local SGD with parameter averaging among a random fraction C of ranks.

The SelSync paper's baseline (section IV, "Comparing SelSync with SOTA learning algorithms";
Table I: FedAvg (C, E)): a fraction C of the ranks takes part in each aggregation and
aggregation happens 1/E times per epoch at uniform intervals. The participants of each round are
drawn identically on every rank from a shared seed and the round number (stateless RNG), and
aggregation is a masked allreduce: w <- sum_n m_n w_n / sum_n m_n with m_n = 1 for participants.
Every rank adopts that average (the global model the server of FedAvg would send back), so all
replicas are identical after each aggregation.
"""
import dataclasses
import typing

import numpy as np
import tensorflow as tf

from hetsync import world
from hetsync.core.config import ProtocolConfig, param
from hetsync.protocols.local.periodic import PeriodicAveragingProtocol, outer_param
from hetsync.core.wrapper import protocol_wrapper

__all__ = ["FedAvg", "FedAvgProtocol", "FedAvgConfig"]


@dataclasses.dataclass(frozen=True)
class FedAvgConfig(ProtocolConfig):
    """FedAvg's parameters (see :func:`FedAvg`)."""

    owner: typing.ClassVar[str] = "FedAvg"

    fraction: float = param(1.0, "float C in (0, 1], the fraction of ranks (round(C N), at least 1) averaging "
                                 "in each aggregation.", label="fraction C", gt=0, le=1)
    syncs_per_epoch: float = param(1.0, "float 1/E > 0, aggregations per epoch at uniform intervals (may be < 1: "
                                        "once every several epochs).", gt=0, unit="1/E, aggregations per epoch")
    seed: int = param(0, "int in [0, 2**32 - 1], seeds the participant draws (the same on every rank).", ge=0,
                      le=2**32 - 1)
    average_at_end: bool = param(
        False, "bool, average the parameters of all ranks once when training ends "
               "(:meth:`hetsync.core.protocol.Protocol.average_at_train_end`). Off by default: with an integer "
               "``syncs_per_epoch`` the last step already averages and every rank adopts the average.")
    data_plan: typing.Literal["pool", "shard"] = param(
        "pool", "str, how ``fit_data`` feeds the ranks: ``\"pool\"`` (default; work conservation: each "
                "epoch is a pool of the N samples served by rank 0, faster ranks draw more batches, every sample "
                "once per epoch; the aggregations are scheduled by the pool's global progress, "
                ":mod:`hetsync.protocols.local.periodic`) or ``\"shard\"`` (a fixed equal share per rank).")
    outer_lr: float = outer_param("lr")
    outer_momentum: float = outer_param("momentum")
    outer_nesterov: bool = outer_param("nesterov")


class FedAvgProtocol(PeriodicAveragingProtocol):
    """Periodic masked parameter averaging over a random fraction of ranks (see :func:`FedAvg`)."""

    name = "fedavg"
    display_name = "FedAvg"
    Config = FedAvgConfig

    def build(self):
        """Sync statistics, the participant count round(C N) (at least 1) and the steps-per-epoch variable."""
        super().build()
        #: ranks averaging in each aggregation, round(C N) (at least 1).
        self.participants = max(1, int(round(self.cfg.fraction * world.size())))
        with tf.init_scope():
            self._steps_per_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_fedavg_spe")

    def on_train_begin(self, model, params):
        """Read the steps per epoch S (Keras' ``params['steps']``) that place the aggregations, on
        fixed shares; on the sample pool the rounds follow the pool's progress (the base class).

        Raises:
            ValueError: the number of steps per epoch is unknown (fixed shares).
        """
        super().on_train_begin(model, params)
        if self.pool is not None:
            return
        steps = params.get("steps")
        if not steps:
            raise ValueError("FedAvg needs a known number of steps per epoch (model.fit with sized data or "
                             "steps_per_epoch) to place syncs_per_epoch aggregations at uniform intervals")
        self._steps_per_epoch.assign(int(steps))

    def pool_rounds(self, epoch, batches, ranks):
        """Aggregations in pool epoch e: floor((e + 1) s) - floor(e s) (s = syncs_per_epoch)."""
        s = self.cfg.syncs_per_epoch
        return int(np.floor((epoch + 1) * s + 1e-9) - np.floor(epoch * s + 1e-9))

    def round_participation(self, round_id):
        """This rank's weight (float32 0/1 tensor) in pool round ``round_id`` (1-based), drawn as in
        :meth:`participation` (same seed, same draw on every rank), or None if all take part."""
        if self.participants >= world.size():
            return None
        keys = tf.random.stateless_uniform([world.size()], seed=tf.constant([self.cfg.seed, int(round_id)], tf.int64))
        chosen = tf.argsort(keys)[: self.participants]
        return tf.cast(tf.reduce_any(tf.equal(chosen, world.rank())), tf.float32)

    def summary_stats(self):
        """:meth:`hetsync.protocols.local.periodic.PeriodicAveragingProtocol.summary_stats` and ``participants``."""
        return dict(super().summary_stats(), participants=self.participants)

    def should_sync(self, step):
        """True after the steps where floor(step s / S) increases (s = syncs_per_epoch, S = steps per epoch)."""
        check = tf.debugging.assert_positive(
            self._steps_per_epoch, message="FedAvg: steps per epoch unknown; pass hetsync.callbacks.standard(opt) "
                                           "to model.fit so FedAvg's callback can read them")
        with tf.control_dependencies([check]):
            spe = tf.cast(self._steps_per_epoch, tf.float64)
        g = tf.cast(step, tf.float64)
        before = tf.floor(g * self.cfg.syncs_per_epoch / spe + 1e-9)
        after = tf.floor((g + 1.0) * self.cfg.syncs_per_epoch / spe + 1e-9)
        return after > before

    def round_index(self, step):
        """Aggregation round number (int64 tensor) of the round that closes at 0-based ``step``."""
        spe = tf.cast(self._steps_per_epoch, tf.float64)
        return tf.cast(tf.floor((tf.cast(step, tf.float64) + 1.0) * self.cfg.syncs_per_epoch / spe + 1e-9), tf.int64)

    def participation(self, step):
        """This rank's weight (float32 0 or 1) in the round closing at ``step``, or None if all take part."""
        if self.participants >= world.size():
            return None
        r = self.round_index(step)
        keys = tf.random.stateless_uniform([world.size()], seed=tf.stack([tf.constant(self.cfg.seed, tf.int64), r]))
        order = tf.argsort(keys)  # identical on every rank: same seed, same op
        chosen = order[: self.participants]
        return tf.cast(tf.reduce_any(tf.equal(chosen, world.rank())), tf.float32)


FedAvg = protocol_wrapper(FedAvgProtocol, """Wrap a Keras 3 optimizer for FedAvg (C, E): local SGD, averaging among a random fraction C.

    Every rank trains locally; ``syncs_per_epoch`` (= 1/E in the paper's notation; E = 0.25 is 4
    aggregations per epoch) times per epoch, at uniform intervals (after the steps where
    floor(step * s / S) increases, S = steps per epoch), ``round(C N)`` ranks (at least 1) drawn
    identically on every rank average their parameters and every rank adopts the average (or, with
    ``outer_lr`` or ``outer_momentum`` set, the outer optimizer's step from it: DiLoCo,
    :mod:`hetsync.protocols.local.periodic`). Optimizer slots stay local. Statistics: ``sync``,
    ``sync_steps``, ``local_steps``, ``lssr``, ``bytes_sent`` (every rank joins the masked allreduce,
    so every rank sends the payload), ``participants``.

    Args:
        optimizer: a Keras 3 optimizer instance.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``FedAvg_<optimizer class>``).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument. ValueError: C outside (0, 1] or
        syncs_per_epoch <= 0; at train begin, unknown steps per epoch. RuntimeError: not initialised.
    """)
