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

**The outer optimizer** (DiLoCo: Douillard et al., "DiLoCo: Distributed Low-Communication Training
of Language Models", 2023, Algorithm 1). Every rank keeps the global model of the last average,
theta^(t-1) (the *anchor*). After an average theta_avg, the outer gradient is
Delta = theta^(t-1) - theta_avg; with outer momentum mu and outer learning rate eta,
m <- mu m + Delta, u = Delta + mu m (Nesterov) or u = m, and theta^(t) = theta^(t-1) - eta u, which
every rank adopts (identically: the same anchor, the same average). ``outer_lr=1`` with
``outer_momentum=0`` (the defaults) is plain averaging and keeps no anchor; DiLoCo used eta = 0.7,
mu = 0.9 with Nesterov. The outer step applies to the trainable parameters; the non-trainable state
(BatchNormalization's statistics) is averaged plainly.
"""
import numpy as np
import tensorflow as tf

from hetsync.core.config import param
from hetsync.core.protocol import Protocol, payload_bytes

__all__ = ["PeriodicAveragingProtocol", "outer_param"]


def outer_param(name):
    """A fresh configuration field of the outer optimizer, for local SGD's and FedAvg's ``Config``.

    Args:
        name: str, ``"lr"`` (``outer_lr``, float eta > 0), ``"momentum"`` (``outer_momentum``, float mu in
            [0, 1)) or ``"nesterov"`` (``outer_nesterov``, bool).

    Returns:
        a ``dataclasses.Field`` (:func:`hetsync.core.config.param`).

    Raises:
        KeyError: another name.
    """
    return {
        "lr": lambda: param(1.0, "float eta > 0, the outer learning rate of each average (DiLoCo, Douillard et "
                                 "al. 2023, Algorithm 1): the global model moves eta times the outer update from "
                                 "the last average; 1.0 with ``outer_momentum=0`` is plain averaging.",
                            label="outer_lr", gt=0),
        "momentum": lambda: param(0.0, "float mu in [0, 1), the outer momentum over the averages' outer gradients "
                                       "(DiLoCo: 0.9); 0 keeps no momentum.", label="outer_momentum", ge=0, lt=1),
        "nesterov": lambda: param(True, "bool, the outer step is Nesterov's (u = Delta + mu m, DiLoCo's) rather "
                                        "than heavy-ball (u = m); no effect with ``outer_momentum=0``."),
    }[name]()


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
            self._outer_ready = tf.Variable(False, trainable=False, name=f"hetsync_{self.name}_outer_ready")
        self._outer_state = None  # (anchors, momenta) per trainable variable, made with the first step

    @property
    def outer_on(self):
        """bool: the configuration asks for an outer step other than plain averaging."""
        return self.cfg.outer_lr != 1.0 or self.cfg.outer_momentum != 0.0

    def _outer_vars(self, variables):
        """(anchors, momenta): lists of tf.Variables paired with ``variables`` (made on the first call, under
        ``init_scope``; later calls look each variable up, whatever the order of the list)."""
        if self._outer_state is None:
            state = {}
            with tf.init_scope():
                for i, v in enumerate(variables):
                    state[id(v)] = (tf.Variable(tf.zeros_like(v.value), trainable=False,
                                                name=f"hetsync_{self.name}_anchor_{i}"),
                                    tf.Variable(tf.zeros_like(v.value), trainable=False,
                                                name=f"hetsync_{self.name}_outer_m_{i}"))
            self._outer_state = state
        missing = [v.path for v in variables if id(v) not in self._outer_state]
        if missing:
            raise RuntimeError(f"{self.display_name}: the outer optimizer has no anchor for {', '.join(missing)}; "
                               "the trainable variables changed after the first step")
        pairs = [self._outer_state[id(v)] for v in variables]
        return [a for a, _ in pairs], [m for _, m in pairs]

    def _outer_init(self, variables):
        """Before the first local step: the anchor is the starting model (identical on every rank)."""
        anchors, _ = self._outer_vars(variables)

        def init():
            with tf.control_dependencies([a.assign(v.value) for a, v in zip(anchors, variables)]):
                with tf.control_dependencies([self._outer_ready.assign(True)]):
                    return tf.constant(True)

        return tf.cond(self._outer_ready.read_value(), lambda: tf.constant(True), init)

    def outer_step(self, variables):
        """The outer optimizer's step after an average (module docstring; DiLoCo Algorithm 1): from the anchor
        theta^(t-1) and the averaged ``variables`` (holding theta_avg), assign theta^(t) to the anchors and to
        ``variables``. Usable eagerly and inside the compiled step.

        Args:
            variables: list of the trainable Keras variables, the same list (and order) on every call.

        Returns:
            list of the assign ops (empty when the outer step is plain averaging).
        """
        if not self.outer_on:
            return []
        anchors, momenta = self._outer_vars(variables)
        lr, mu, nesterov = self.cfg.outer_lr, self.cfg.outer_momentum, self.cfg.outer_nesterov
        ops = []
        for v, a, m in zip(variables, anchors, momenta):
            delta = a.read_value() - tf.convert_to_tensor(v.value)
            m_new = m.assign(mu * m.read_value() + delta) if mu else delta
            u = delta + mu * tf.convert_to_tensor(m_new) if (mu and nesterov) else tf.convert_to_tensor(m_new)
            theta = a.assign(a.read_value() - lr * u)
            ops.append(v.assign(tf.convert_to_tensor(theta)))
        return ops

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
        self.outer_step(variables)
        self._stats["pool_rounds"].assign_add(1.0)

    def apply(self, grads, variables, local_apply):
        """The local step, then (when :meth:`should_sync`) the average of the parameters and the outer step."""
        if self.outer_on:
            with tf.control_dependencies([self._outer_init(variables)]):
                result = local_apply(grads, variables)
        else:
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
                with tf.control_dependencies(self.outer_step(variables)):
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
