"""RNA: randomized non-blocking (partial) allreduce with cross-iteration gradient caching.

Yang, Rang and Cheng, "Mitigating Stragglers in the Decentralized Training on Heterogeneous
Clusters" (Middleware '20), sections 3.1-3.3 and 6 (flat RNA; the hierarchical groups of section 4
are :mod:`hetsync.protocols.rna.hierarchical`). This module holds the update rule; the controller's initiator choice
and the message loop are in :mod:`hetsync.protocols.rna.control`.

How one rank works
------------------
* **Compute step** (inside ``model.fit``'s compiled step, never waits for the network unless
  ``wait_for_round``): WriteOp
  caches this step's gradients g_t for the local iteration t (:func:`hetsync.ops.grad_cache_write`);
  ReadOp returns the newest reduced result if one arrived since the last read, else the local
  gradients (:func:`hetsync.ops.grad_cache_read`); the wrapped optimizer applies what ReadOp returned.
* **Communication thread** (one per rank, :meth:`RNAProtocol.start` / :meth:`RNAProtocol.stop`)
  runs :class:`hetsync.protocols.rna.control.RoundLoop`: the controller on rank 0 chooses each
  round's initiator by power-of-d choices (section 3.2), and every rank joins each announced round
  with one fused horovod allreduce (same name on every rank) of ``[w_i g'_i, w_i]`` where g'_i is
  rank i's staleness-weighted accumulation (or the null gradient with w_i = 0), and publishes
  ``sum_i w_i g'_i / sum_i w_i`` (Algorithm 2, W = 1 / sum w).
* **Learning-rate scaling** (``scale_lr=True``): gamma_k = (sum_i w_{k,i}) * gamma (linear scaling
  rule, section 3.3), implemented by multiplying the applied gradient by sum(w) (exact for SGD; for
  momentum SGD the scaled gradient enters the momentum buffer; adaptive optimizers such as Adam
  mostly cancel it). Consequence: the base learning rate is then a *per-rank* rate, i.e. about
  gamma_BSP / n if gamma_BSP is the rate that works for BSP's averaged gradient on n ranks; a local
  step (no fresh result) uses gamma itself. With ``scale_lr=False`` (default) every applied
  gradient, averaged or local, uses the optimizer's rate unchanged: a rate set as horovod's
  "lr x world size" then drives every local step too (n times a single worker's rate on b samples),
  which diverged in our measurements; use ``scale_lr=True`` with the single-worker rate instead.
* **Update rule** (``update_rule``): ``"paper"`` is the above (Algorithm 2). ``"samples"`` applies every
  gradient once on every replica, as BSP does: rank i's weight in a round is the number m_i of gradients it
  contributes (``[m_i g'_i, m_i]``), the result is scaled by sum(w) / n, so a round applies
  gamma / n x (the sum of its gradients) (BSP's step when every rank contributes one), results the step has not
  read yet are summed (:func:`hetsync.ops.grad_cache_publish` with ``accumulate``), and a step without a fresh
  result applies nothing: a rank's own gradient is never applied locally and again inside a later round.
* **Staleness-dependent rate** (``stale_lr="inverse"``, samples rule only): the step records, per local
  iteration t, the last round r(t) its parameters include; a gradient contributed to round R has staleness
  c = R - 1 - r(t) rounds (results it did not see) and is applied with gamma / max(c, 1) (Zhang, Gupta, Lian
  and Liu, "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016: alpha_0 / tau). The
  accumulation g' combines m gradients with the cache's weights a_t, so the rank scales its contribution by
  m x sum_t a_t f_t / sum_t a_t (f_t = 1 / max(c_t, 1)): exact when its pending gradients share one staleness.
* **Waiting for the round** (``wait_for_round=True``, samples rule only; not in the paper): after WriteOp the
  step waits until the round that takes its gradients is published (:func:`hetsync.ops.grad_cache_wait_published`,
  at most ``wait_timeout_s``; after a wait that timed out, no step waits until the next round is published), and
  only then reads and takes the critical section, so each gradient is applied before the rank computes its next
  one (without it every gradient is applied at least one step late). With ``wait_lag=L`` step t waits instead for
  the round holding step t - L's gradient: the rounds of the last L gradients overlap the next steps' compute, and
  no gradient is applied more than L steps late. The controller then probes every active
  rank. The communication thread releases such waits when it ends (:func:`hetsync.ops.grad_cache_set_released`).
* **Drift**: between rounds each rank applies its own local gradients, and those local steps are
  never averaged away by later rounds (every rank applies the same averaged results), so replicas
  drift apart like a random walk. The communication thread measures the drift, the largest L2
  distance ||x_r - x_mean|| of a rank's parameters from the mean of the active ranks, every
  ``drift_every`` rounds, and averages the parameters every ``average_every`` rounds (0: never):
  each rank adds ``x_mean - x_r(snapshot)`` to its parameters at its next step, keeping its local
  progress since the snapshot. ``average_at_end`` averages the final parameters. The snapshot is
  consistent: the step's update (optimizer step and parameter correction) and the snapshot's read
  of all variables run in one ``tf.CriticalSection``, so the thread never sees a half-updated model.
* **Termination**: ranks may finish different numbers of steps. A rank whose training ends
  (``stop``) reports "done" to the controller and keeps joining rounds with its leftovers (then the
  null gradient) until the controller announces the final round (see
  :mod:`hetsync.protocols.rna.control`). Every wait has a timeout (``timeout_s``) that fails with a
  message naming what was awaited. ``stop`` always gathers every rank's statistics and errors
  first, then raises the same :class:`RNAError` on every rank if any rank failed, so all ranks end
  the same way within the protocol's timeouts.
"""
import dataclasses
import logging
import sys
import threading
import typing

import numpy as np
import tensorflow as tf

from hetsync import ops, transport
from hetsync import world
from hetsync.core.protocol import Capabilities, Protocol
from hetsync.core.config import ProtocolConfig, param
from hetsync.protocols.rna import summary
from hetsync.protocols.rna.control import CONTROL, TO_CONTROLLER, Controller, RoundLoop
from hetsync.core.wrapper import protocol_wrapper
from hetsync.errors import RNAError

__all__ = ["RNA", "RNAProtocol", "RNAConfig", "RNAError"]

log = logging.getLogger("hetsync")

#: Python's thread switch interval (seconds) while an RNA communication thread runs (restored at stop).
SWITCH_INTERVAL_S = 0.0005
#: entries of the ring recording, per local iteration, the last round a step's parameters included
#: (``stale_lr="inverse"``); far more than the iterations a rank can have pending (max_staleness + 1).
STALE_RING = 4096
#: bins of the round-staleness histogram (the last bin counts that staleness and more).
STALE_BINS = 16


@dataclasses.dataclass(frozen=True)
class RNAConfig(ProtocolConfig):
    """RNA's parameters (see :func:`RNA`)."""

    owner: typing.ClassVar[str] = "RNA"

    probes: int = param(2, "int in [1, max(world size, 2)], ranks probed per round (2: power of two choices; "
                           "1: a purely random initiator; section 3.2).", ge=1, unit="ranks probed per round")
    max_staleness: int = param(4, "int >= 0, bound (in local iterations) on the gap between pending gradients; "
                                  "older ones are dropped and counted. Accumulated gradients get the staleness "
                                  "weights t - (k - tau) + 1 (section 3.3, :mod:`hetsync.ops` notes).", ge=0,
                               unit="local iterations")
    scale_lr: bool = param(False, "bool; True applies gamma_k = sum(w) * gamma (the base learning rate is then a "
                                  "per-rank rate, about gamma_BSP / n); False applies every gradient with gamma.")
    update_rule: typing.Literal["paper", "samples"] = param(
        "paper", "str, what a step applies. ``\"paper\"`` (Algorithm 2): the newest round's average "
                 "sum_r w_r g'_r / sum_r w_r with w_r = 1 per contributing rank, else the step's own gradients. "
                 "``\"samples\"``: every gradient once on every replica at the learning rate over the world size, "
                 "as BSP applies it: w_r is the number of gradients rank r contributes, the applied result is "
                 "scaled by sum(w) / n, the rounds a step has not read yet are summed, and a step without a "
                 "fresh result leaves the parameters alone (no local step, so no gradient is applied twice). "
                 "Use it with the learning rate BSP uses; not with ``scale_lr``.")
    stale_lr: typing.Literal["constant", "inverse"] = param(
        "constant", "str, with the samples rule: ``\"constant\"`` applies every gradient with the same rate; "
                    "``\"inverse\"`` scales a rank's contribution to round R by 1 / max(c, 1), where c, the "
                    "gradient's staleness, is the number of rounds published after the last round its parameters "
                    "included and before R (staleness-aware asynchronous SGD, Zhang, Gupta, Lian and Liu, IJCAI "
                    "2016: alpha_0 / tau). Not with the paper's rule.")
    wait_for_round: bool = param(
        False, "bool, with the samples rule: after its write a step waits (``wait_timeout_s`` at most) until the "
               "round that takes its gradients is published, then reads, so each gradient is applied before the rank "
               "computes its next one, as a parameter-server worker pulls after its push. The wait is one round's "
               "latency, never a straggler's step (a round takes whoever is ready); the controller then probes "
               "every active rank (``probes`` is not used), so a waiting rank initiates the next round at once. "
               "Not with the paper's rule.")
    wait_lag: int = param(
        0, "int in [0, max_staleness], with ``wait_for_round``: the steps a gradient may trail the step that waits "
           "for it. 0: a step waits for the round holding its own gradient (each gradient applied before the next is "
           "computed); L: step t waits for the round holding the gradient of step t - L, so the rounds of the last L "
           "gradients overlap the compute of the next steps, and each gradient is applied at most L steps late "
           "(a pipeline of L stale steps, as Pipe-SGD's: Li, Ben-Nun, Girija, Poston and Li, NeurIPS 2018). Not "
           "without ``wait_for_round``.", ge=0, unit="local iterations")
    wait_timeout_s: float = param(
        1.0, "float seconds (> 0), with ``wait_for_round``: the longest a step waits for its round. A wait that "
             "times out is counted (``rna_wait_unpublished``) and the steps after it do not wait until the next "
             "round is published, so a stalled round holds no step longer than this.", gt=0, unit="seconds")
    average_every: typing.Optional[int] = param(
        None, "int >= 0; average the parameters (with the model's float32 non-trainable state, e.g. "
              "BatchNormalization statistics) over the active ranks every that many rounds (0: never). None: 10 with "
              "the paper's rule, where every 10 rounds keeps the drift of the local steps small at the cost of one "
              "parameter-sized allreduce per 10 rounds, off the compute path; 0 with the samples rule, where every "
              "replica applies every result once (no drift with plain SGD) and an average of snapshots taken at "
              "different rounds only adds noise (set it with momentum or an adaptive optimizer: ranks group "
              "results differently).", ge=0, unit="rounds",
        none="by the update rule: 10 for the paper's, 0 for samples")
    drift_every: typing.Optional[int] = param(
        None, "int >= 0, measure the drift every that many rounds (0: never). None: ``average_every`` when "
              "averaging is on, else 20 with the paper's rule and 0 with the samples rule, where every replica applies "
              "every result once (the drift is only the ranks' timing) and each measurement's two collectives hold "
              "the next round back (5-8% of its samples/s at 4 ranks with ``wait_for_round``).", ge=0,
        unit="rounds", none="average_every, else 20 for the paper's rule and 0 for samples")
    average_at_end: bool = param(True, "bool, average the parameters once when training ends so every rank holds "
                                       "the same final model (the drift before it is reported).")
    timeout_s: float = param(120.0, "float seconds (> 0): longest wait for a ready initiator or a controller "
                                    "message.", gt=0, unit="seconds")
    finish_timeout_s: float = param(60.0, "float seconds (> 0): after some ranks finished, how long the controller "
                                          "waits without any round before it ends without the unfinished ranks.",
                                    gt=0, unit="seconds")
    poll_ms: float = param(1.0, "float milliseconds (> 0): the communication thread's idle wait.", gt=0,
                           unit="milliseconds")
    seed: int = param(0, "int in [0, 2**32 - 1], seed of the controller's probe choices.", ge=0, le=2**32 - 1)
    data_plan: typing.Literal["pool", "shard"] = param(
        "pool", "str, how ``fit_data`` feeds the ranks: ``\"pool\"`` (default; work conservation: each "
                "epoch is a pool of the N samples served by rank 0, faster ranks draw more batches, every sample "
                "once per epoch, :mod:`hetsync.data.pool`) or ``\"shard\"`` (a fixed equal share per rank).")


class RNAProtocol(Protocol):
    """Randomized non-blocking partial allreduce with a host gradient cache (see :func:`RNA`)."""

    #: the communication thread runs horovod collectives (rounds, drift, parameter averages).
    capabilities = Capabilities(requires_mpi=True, collectives_in_thread=True)
    #: the periodic parameter average (``average_every``) also averages the model's float32
    #: non-trainable state (BatchNormalization statistics). Hierarchical RNA: False.
    average_state_in_rounds = True

    name = "rna"
    display_name = "RNA"
    Config = RNAConfig

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.cfg
        #: the parameter-average period in use (rounds; 0 never): ``average_every``, else 10 with the paper's rule
        #: and 0 with the samples rule.
        self.average_every = c.average_every if c.average_every is not None else \
            (0 if self.update_rule == "samples" else 10)
        #: the drift period in use (rounds): ``drift_every``, else the average period, else 20 with the paper's rule
        #: and 0 (never during training) with the samples rule.
        self.drift_every = c.drift_every if c.drift_every is not None else \
            (self.average_every or (0 if self.update_rule == "samples" else 20))
        self._cache = self._pcache = None
        self._vars = None
        self._round = 0
        self._thread = None
        self._summary = {}
        #: steps this rank ran in the current fit, set when training ends (None while training).
        self.done_steps = None

    @property
    def update_rule(self):
        """The update rule in use (str): the config's ``update_rule``; ``"paper"`` for a configuration without one
        (hierarchical RNA, whose groups reduce as Algorithm 2)."""
        return getattr(self.cfg, "update_rule", "paper")

    @property
    def stale_lr(self):
        """The learning-rate rule for stale gradients (str): the config's ``stale_lr``; ``"constant"`` for a
        configuration without one (hierarchical RNA)."""
        return getattr(self.cfg, "stale_lr", "constant")

    @property
    def wait_for_round(self):
        """Whether a step waits for the round that takes its gradients (bool): the config's ``wait_for_round``;
        False for a configuration without one (hierarchical RNA)."""
        return bool(getattr(self.cfg, "wait_for_round", False))

    @property
    def wait_lag(self):
        """Steps a waited-for gradient may trail the waiting step (int): the config's ``wait_lag``; 0 for a
        configuration without one (hierarchical RNA)."""
        return int(getattr(self.cfg, "wait_lag", 0))

    @property
    def _done_steps(self):
        return self.done_steps

    # -- life cycle ---------------------------------------------------------------------------------
    def build(self):
        """Check ``probes`` against the world size; create the statistics, the iteration counter and the
        critical section shared by the step's update and the communication thread's snapshot."""
        n = world.size()
        if self.update_rule == "samples" and self.cfg.scale_lr:
            raise ValueError("RNA: update_rule='samples' scales each result by sum(w) / n itself; use it with "
                             "scale_lr=False (the default) and the learning rate BSP uses")
        if self.cfg.probes > max(n, 2):  # the default 2 is accepted on a world of one rank (nothing to choose)
            raise ValueError(f"RNA: probes={self.cfg.probes} exceeds the world size {n}; use 1..{max(n, 2)}")
        if self.wait_lag and not self.wait_for_round:
            raise ValueError(f"RNA: wait_lag={self.wait_lag} needs wait_for_round=True (without the wait a step never "
                             "waits for a round); use wait_lag=0")
        if self.wait_lag > self.cfg.max_staleness:
            raise ValueError(f"RNA: wait_lag={self.wait_lag} exceeds max_staleness={self.cfg.max_staleness}: the "
                             "gradients a step may leave pending would be dropped; use wait_lag <= max_staleness")
        if self.wait_for_round and self.update_rule != "samples":
            raise ValueError("RNA: wait_for_round=True needs update_rule='samples' (under the paper's rule a step "
                             "already applies its own gradient locally)")
        if self.stale_lr != "constant" and self.update_rule != "samples":
            raise ValueError(f"RNA: stale_lr={self.stale_lr!r} needs update_rule='samples' (the paper's rule applies "
                             "local steps between rounds); use stale_lr='constant' with update_rule='paper'")
        for s in ("rna_fresh", "rna_round", "rna_contributors", "rna_dropped", "rna_rounds", "rna_probe_ms",
                  "rna_drift", "rna_param_corrections", "rna_round_wait_ms", "rna_wait_unpublished"):
            self.add_stat(s, -1.0 if s == "rna_drift" else 0.0)
        with tf.init_scope():
            self._iteration = tf.Variable(-1, dtype=tf.int64, trainable=False, name="hetsync_rna_iteration")
            self._section = tf.CriticalSection(name="hetsync_rna_update")
            if self.stale_lr == "inverse":
                # r(t) per local iteration t (ring of STALE_RING entries) and the last round the parameters include
                self._read_rounds = tf.Variable(tf.fill([STALE_RING], tf.constant(-1, tf.int64)), trainable=False,
                                                name="hetsync_rna_read_rounds")
                self._params_round = tf.Variable(-1, dtype=tf.int64, trainable=False, name="hetsync_rna_params_round")

    def _create_caches(self):
        variables = list(getattr(self.optimizer, "_trainable_variables", None) or [])
        if not variables:
            raise RuntimeError("RNA: the optimizer is not built (no trainable variables) at train begin; "
                               "use it through model.compile + model.fit")
        for v in variables:
            if v.dtype != "float32":
                raise TypeError(f"RNA: the gradient cache holds float32; variable {v.path} is {v.dtype}")
        if self._vars is not None:
            if [tuple(v.shape) for v in variables] != [tuple(v.shape) for v in self._vars]:
                raise RuntimeError("RNA: the optimizer's variables changed between fits; wrap a new optimizer")
            return
        self._vars = variables
        self._shapes = [tuple(v.shape) for v in variables]
        # the periodic parameter average also averages the model's float32 non-trainable state
        self._state = [v for v in self.state_variables if v.dtype == "float32"] if self.average_state_in_rounds else []
        self._pshapes = self._shapes + [tuple(v.shape) for v in self._state]
        self._cache = ops.grad_cache_create(self._shapes, self.cfg.max_staleness)
        if self.average_every > 0:
            self._pcache = ops.grad_cache_create(self._pshapes, 0)

    def start(self):
        """Create the caches, lower the thread switch interval and start the communication thread."""
        self._create_caches()
        ops.grad_cache_set_released(self._cache, False)  # this fit's rounds follow
        # The communication thread needs the GIL for a few short moments per round; with Python's
        # default 5 ms switch interval each of them can wait 5 ms behind the training loop.
        self._saved_switch_interval = None
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._p2p = transport.dispatcher()
        self._rank, self._n = world.rank(), world.size()
        self._error = None
        self._final_reason = None
        self.done_steps = None
        self._steps_at_start = int(self._iteration.numpy())
        self._local = {"rounds_joined": 0, "contributed_rounds": 0,
                       "staleness": np.zeros(self.cfg.max_staleness + 1, np.int64), "contributors": {},
                       "drift": [], "drift_rel": [], "corrections": 0, "round_ms": [],
                       "round_staleness": np.zeros(STALE_BINS, np.int64), "lr_scale": []}
        self._ctl = Controller(self.cfg, self.drift_every, self._n,
                               lambda dst, msg: self._p2p.send(dst, CONTROL, msg), self._round,
                               average_every=self.average_every) if self._rank == 0 else None
        self._loop = RoundLoop(self._p2p, self._rank, self._ctl, self, self.cfg.timeout_s, self.cfg.poll_ms)
        self._thread = threading.Thread(target=self._run, name=f"hetsync-rna-comm-{self._rank}", daemon=True)
        self._thread.start()

    def stop(self):
        """End the communication thread, gather every rank's statistics and errors, then raise or average.

        Order, the same on every rank: the thread is joined (at most finish_timeout_s + timeout_s +
        10 seconds; a thread still alive is this rank's error); the two control channels are
        drained (late messages counted; the other ranks' end markers are awaited 10 s longer than
        that join); every rank's statistics and error are gathered
        (:func:`hetsync.transport.allgather_object`); if any rank failed, every rank raises the
        same :class:`RNAError`; else, with ``average_at_end``, the parameters are averaged. The
        thread switch interval is restored.

        Raises:
            RNAError: the communication thread failed or did not end on some rank (the message
                names the ranks and their errors); raised on every rank.
        """
        if self._thread is None:
            return
        self.done_steps = int(self._iteration.numpy()) - self._steps_at_start
        budget = world.dilated(self.cfg.finish_timeout_s + self.cfg.timeout_s) + 10.0
        self._thread.join(budget)
        thread, self._thread = self._thread, None
        if thread.is_alive() and self._error is None:
            self._error = (f"rank {self._rank}: RNA communication thread did not end within {budget:g} s after "
                           "training ended (no final round from the controller)")
        if self._saved_switch_interval is not None and sys.getswitchinterval() == SWITCH_INTERVAL_S:
            sys.setswitchinterval(self._saved_switch_interval)
        if self._ctl is not None:
            self._round = self._ctl.round
        late = {}
        for channel in (CONTROL, TO_CONTROLLER):  # every rank drains once its own join is over
            try:
                late[channel] = self._p2p.drain(channel, timeout_s=budget + 10.0)
            except transport.TransportTimeout as exc:
                late[channel] = None
                self._error = self._error or f"rank {self._rank}: {exc}"
        self._gather_summary(late)
        errors = [(d["rank"], d["error"]) for d in self._summary["per_rank"] if d["error"]]
        if errors:
            raise RNAError("RNA failed on rank(s) " + ", ".join(str(r) for r, _ in errors) + ": "
                           + "; ".join(sorted({e for _, e in errors})))
        super().stop()
        self._summary.update(self._final)

    # -- the compute step -----------------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        """WriteOp, ReadOp, then the update (the wrapped optimizer's step with the read gradients, and
        a pending parameter correction) inside the critical section shared with the snapshot."""
        if self._cache is None:
            raise RuntimeError("RNA: the step ran before train begin; pass hetsync.callbacks.standard(opt) "
                               "to model.fit")
        if [tuple(v.shape) for v in variables] != self._shapes:
            raise RuntimeError("RNA: the step's variables do not match the optimizer's trainable variables")
        grads = [tf.zeros(v.shape, tf.float32) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        it = self._iteration.assign_add(1)
        recorded = []
        if self.stale_lr == "inverse":  # r(t): the last round this step's gradients were computed with
            recorded = [self._read_rounds[it % STALE_RING].assign(self._params_round)]
        with tf.control_dependencies(recorded):
            dropped = ops.grad_cache_write(self._cache, grads, it)
        deps = [dropped]
        if self.wait_for_round:  # the round that takes the gradients of step it - wait_lag, then read it
            with tf.control_dependencies([dropped]):
                published, wait_ms = ops.grad_cache_wait_published(self._cache, it - self.wait_lag,
                                                                   world.dilated(self.cfg.wait_timeout_s) * 1e3)
            self._stats["rna_round_wait_ms"].assign(wait_ms)
            self._stats["rna_wait_unpublished"].assign_add(1.0 - tf.cast(published, tf.float64))
            deps.append(published)
        with tf.control_dependencies(deps):
            outs, fresh, round_id, wsum = ops.grad_cache_read(self._cache, grads, it)
        if self.stale_lr == "inverse":
            with tf.control_dependencies(recorded):
                self._params_round.assign(round_id)  # the next step's gradients include every round read so far
        samples = self.update_rule == "samples"
        if self.cfg.scale_lr:
            outs = [o * wsum for o in outs]
        elif samples:  # sum over the round's gradients of g / n, as BSP applies each gradient
            outs = [o * (wsum / float(world.size())) for o in outs]
        st = self._stats
        st["rna_fresh"].assign(tf.cast(fresh, tf.float64))
        st["rna_round"].assign(tf.cast(round_id, tf.float64))
        st["rna_contributors"].assign(tf.cast(wsum, tf.float64))
        st["rna_dropped"].assign(tf.cast(dropped, tf.float64))
        if self._pcache is not None:
            zeros = [tf.zeros(s, tf.float32) for s in self._pshapes]
            deltas, pfresh, _, _ = ops.grad_cache_read(self._pcache, zeros, it)
        result = []

        def step():
            local_apply(outs, variables)
            return tf.constant(True)

        def update():
            if samples:  # no local step: a step without a fresh result leaves the parameters alone
                result.append(tf.cond(fresh, step, lambda: tf.constant(False)))
            else:
                result.append(local_apply(outs, variables))
            if self._pcache is not None:
                def correct():
                    for v, d in zip(list(variables) + self._state, deltas):
                        v.assign_add(d)
                    st["rna_param_corrections"].assign_add(tf.constant(1.0, tf.float64))
                    return tf.constant(True)

                tf.cond(pfresh, correct, lambda: tf.constant(False))
            # Reading every variable last makes the critical section's release wait for their updates.
            return [tf.identity(v.value) for v in variables]

        # The critical section's lock is taken only after the wait: a step holding it while it waits would block
        # the communication thread's snapshot (drift, parameter average), and with it the round the step awaits.
        with tf.control_dependencies(deps):
            self._section.execute(update)
        return result[0]

    def snapshot(self):
        """Return this rank's parameters as one flat float32 array, read consistently (never during a
        step's update: inside the critical section the step's update also runs in)."""
        values = self._section.execute(lambda: [tf.identity(v.value) for v in self._vars])
        return np.concatenate([np.ravel(np.asarray(v, np.float32)) for v in values])

    # -- the communication thread (the participant side of rna_control.RoundLoop) ---------------------
    def gradient_pending(self, timeout_ms):
        """Block up to ``timeout_ms`` milliseconds until a gradient is cached; return bool."""
        return bool(ops.grad_cache_wait(self._cache, timeout_ms))

    def _set_stat(self, name, value):
        self._stats[name].assign(float(value))

    def _run(self):
        try:
            self._loop.run()
            self._final_reason = self._loop.final_reason
            if self._loop.error and not self._error:
                self._error = self._loop.error
        except Exception as exc:  # noqa: BLE001 - reported at stop() and to the controller
            self._error = f"rank {self._rank}: RNA communication thread failed: {exc!r}"
            self._final_reason = "error"
            log.error("hetsync %s", self._error)
            try:
                if self._ctl is not None and not self._ctl.final_sent:
                    self._ctl.announce_final("error", error=self._error)
                else:
                    self._loop.send_to_controller(("error", self._error))
            except Exception:  # noqa: BLE001 - the error is reported at stop() in any case
                pass
        finally:
            ops.grad_cache_set_released(self._cache, True)  # no round follows: no step waits for one
            try:
                self._p2p.flush(self.cfg.timeout_s)
            except Exception as exc:  # noqa: BLE001 - counted by the dispatcher, reported here
                log.warning("hetsync rank %d: RNA messages not delivered at the end: %s", self._rank, exc)

    def join_round(self, round_id, initiator, average, drift):
        """Join round ``round_id``: take the pending accumulation (or the null gradient), allreduce
        ``[w g', w]`` with every rank, publish the result (Algorithm 2); then the parameter round if
        the controller asked for it (``average``/``drift``: bools)."""
        import time

        t0 = time.monotonic()
        flat, its, _ = ops.grad_cache_take(self._cache)
        its = its.numpy()
        samples = self.update_rule == "samples"
        if its.size:
            self._local["contributed_rounds"] += 1
            np.add.at(self._local["staleness"], its[-1] - its, 1)
            if samples:  # w_r = the gradients this rank contributes: [m g', m]
                g_factor, w_factor = self._contribution_scale(its, round_id)
                flat = flat * w_factor if g_factor == w_factor else \
                    tf.concat([flat[:-1] * g_factor, flat[-1:] * w_factor], 0)
        reduced = transport.allreduce_sum([flat], name="hetsync_rna_round")[0]
        ops.grad_cache_publish(self._cache, reduced, round_id, accumulate=samples)
        self._local["round_ms"].append((time.monotonic() - t0) * 1e3)
        c = int(round(float(reduced[-1].numpy())))  # contributors ("samples": gradients) of the round
        self._local["contributors"][c] = self._local["contributors"].get(c, 0) + 1
        self._local["rounds_joined"] += 1
        self._set_stat("rna_rounds", self._local["rounds_joined"])
        self._set_stat("syncs", self._local["rounds_joined"])
        if self._ctl is not None and self._ctl.response_ms:
            self._set_stat("rna_probe_ms", self._ctl.response_ms[-1])
        if average or drift:
            self._parameter_round(round_id, average)

    def _contribution_scale(self, its, round_id):
        """The factors (g_factor, w_factor), floats, on ``g'`` and ``w`` of this rank's contribution under the
        samples rule: (m, m) for m taken gradients, or with ``stale_lr="inverse"`` (m x the cache-weighted mean of
        1 / max(c_t, 1), m) with c_t = round_id - 1 - r(t) rounds (counted in the statistics)."""
        m = float(its.size)
        if self.stale_lr != "inverse":
            return m, m
        read = self._read_rounds.numpy()[its % STALE_RING]
        stale = np.maximum(round_id - 1 - read, 0)
        hist = self._local["round_staleness"]
        np.add.at(hist, np.minimum(stale, hist.size - 1), 1)
        f = 1.0 / np.maximum(stale, 1)
        a = (its - its[0] + 1).astype(np.float64)  # the cache's weights t - (k - tau) + 1
        mean_f = float(np.sum(a * f) / np.sum(a))
        self._local["lr_scale"].append(mean_f)
        return m * mean_f, m

    def _parameter_round(self, round_id, average):
        """Measure drift (max_r ||x_r - mean||_2 over active ranks) and optionally average (every K rounds)."""
        x = self.snapshot()
        n_params = x.size  # the drift is measured over the trainable parameters only
        if self._state:
            x = np.concatenate([x] + [np.ravel(np.asarray(v.numpy(), np.float32)) for v in self._state])
        active = 1.0 if self.done_steps is None else 0.0
        finite = bool(np.isfinite(x).all())
        raw = x
        if not finite:  # never sent; this rank joins the round as inactive, then fails
            x, active = np.zeros_like(x), 0.0
        s = transport.allreduce_sum([tf.constant(np.append(x * active, active).astype(np.float32))],
                                    name="hetsync_rna_params")[0].numpy()
        if s[-1] > 0:
            mean = s[:-1] / s[-1]
            drift = self.parameter_drift(x[:n_params], mean[:n_params], name="hetsync_rna_drift", active=bool(active))
        if not finite:
            self.check_finite_arrays([raw], "parameters (communication thread's snapshot)",
                                     int(self._iteration.numpy()))
        if s[-1] <= 0:
            return
        self._local["drift"].append((round_id, drift))
        self._local["drift_rel"].append(drift / max(float(np.linalg.norm(mean[:n_params])), 1e-12))
        self._set_stat("rna_drift", drift)
        if average and active:
            ops.grad_cache_publish(self._pcache, np.append(mean - x, 1.0).astype(np.float32), round_id)
            self._local["corrections"] += 1

    # -- statistics -----------------------------------------------------------------------------------
    def _gather_summary(self, late):
        self._summary = summary.gather(self, late)

    def summary_stats(self):
        """End-of-run statistics (see the RNA page of the documentation): rounds, contributors, initiators,
        probe response times, staleness histogram, dropped/undrained gradients, drift, per-rank totals."""
        if not self._summary:
            return super().summary_stats()
        return self.with_pool_stats(dict(self._summary))


RNA = protocol_wrapper(RNAProtocol, """Wrap a Keras 3 optimizer for RNA: randomized non-blocking partial allreduce (RNA sections 3, 6).

    The compute step never waits for the network: it caches its gradients (WriteOp) and applies the
    newest averaged result if one arrived since the last step, else its own gradients (ReadOp). A
    communication thread per rank runs the rounds: power-of-``probes`` choices of the initiator by
    the controller on rank 0, then one fused allreduce of ``[w_i g'_i, w_i]`` over all ranks,
    divided by sum(w) (Algorithm 2). Needs an MPI launch (``horovodrun --mpi`` / ``mpirun``) and
    :func:`hetsync.callbacks.standard` (which starts and stops the thread). Gradients must be float32.

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)``.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``RNA_<optimizer class>``, a subclass of the given one).

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance, or an unknown argument.
        ValueError: an argument out of range (the message names it and what is allowed), or
            ``probes`` larger than the world size.
        RuntimeError: hetsync not initialised, or launched under Gloo (RNA needs MPI).
    """)
