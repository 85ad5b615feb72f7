"""Task allocation: static and self-adaptive per-rank workloads for allreduce training.

Paper: "Task allocation for decentralized training in heterogeneous environment" (Chao, Liao,
Gao), section III: eq. (1) (the update over a global batch), Algorithm 1 and eq. (10) (the
self-adaptive allocation). The allocation arithmetic (eq. 10, rounding, plans,
efficiency) is in :mod:`hetsync.protocols.taskalloc.allocation`; this module holds the protocol, its data
plumbing (per-epoch plans read by Keras' prefetching thread) and its hooks.

Units: b = the run's per-rank batch size in samples (what BSP trains on per rank and step, the
``batch_size`` of :meth:`TaskAllocationProtocol.fit_data`); a *micro-batch* is mb samples; w_i
is rank i's number of micro-batches per synchronization round and C = sum_i w_i the round's
number of micro-batches. Rank i processes w_i micro-batches (w_i x mb samples) per round; the ranks
then allreduce the *sum* of their gradients and divide by the number of samples in the round, so
each update is the mean gradient over every sample of the round (eq. 1 with the global batch
C x mb samples). By default (``micro_batch=None``) mb = n b / C, so the global batch is BSP's,
n x b samples (n = world size), and a user switching from BSP keeps the number of updates per
epoch; if C does not divide n b, mb is n b / C rounded to the nearest integer (at least 1,
:func:`default_micro_batch`) and the global batch C x mb is close to n b. An explicit
``micro_batch`` mb gives a global batch of C x mb samples, e.g. larger than BSP's.

Each rank's data share is w_i / C of the training set. ``static``: w is given. ``adaptive``
(Algorithm 1): after each epoch the ranks exchange their compute time t_s^i and set

    w_i <- C (w_i / t_s^i) / sum_j (w_j / t_s^j)                                          (eq. 10)

rounded to integers with sum C and w_i >= 1 (largest-remainder rounding). The speeds are pooled
over every step since the allocation last changed. A new allocation is adopted only if it is
predicted to shorten a round (the slowest rank's compute) by more than a threshold; after a few
epochs below it the allocation is frozen.

How the w_i micro-batches of a round are processed (a deliberate Keras 3 design choice): Keras 3's
``model.fit`` fixes the number of steps per epoch when training begins (its ``EpochIterator``
caches it; a data set that yields a different number of batches in a later epoch is cut short or
"runs out of data"), so a rank cannot run w_i Keras steps per round when w changes between
epochs. Here **one Keras step is one synchronization round** on every rank: rank i's batch in
that step holds its w_i micro-batches (w_i x mb samples) and Keras computes their summed gradient
in one pass, which is exactly the gradient accumulation of the paper (the sum of the micro-batch
gradients), with activation memory for w_i x mb samples instead of mb. Every rank therefore runs
the same number of steps per epoch, joins the same collectives, and sees the same epoch
boundaries and callbacks, whatever its w_i.
"""
import dataclasses
import json
import logging
import threading
import time
import typing

import numpy as np
import tensorflow as tf

from hetsync import transport
from hetsync import world
from hetsync.protocols.taskalloc.allocation import (adapt_allocation, allocation_change, default_micro_batch, epoch_indices,  # noqa: F401
                         heterogeneity_efficiency, plan_rounds, predicted_gain, round_allocation)
from hetsync.core.protocol import Capabilities, Protocol, present_gradients, scatter_gradients
from hetsync.core.config import ProtocolConfig, param
from hetsync.core.wrapper import protocol_wrapper
from hetsync.protocols.taskalloc.data import ADAPTIVE_DEFAULT_UNIT, AllocatedData, AllocationDataPlan  # noqa: F401 (public names)

__all__ = ["TaskAllocation", "TaskAllocationProtocol", "TaskAllocationConfig", "AllocatedData", "MODES"]

log = logging.getLogger("hetsync")

#: allowed values of ``mode``.
MODES = ("static", "adaptive")


# -- the protocol --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TaskAllocationConfig(ProtocolConfig):
    """Task allocation's parameters (see :func:`TaskAllocation`)."""

    owner: typing.ClassVar[str] = "TaskAllocation"

    mode: typing.Literal["static", "adaptive"] = param(
        "static", "``\"static\"`` (w fixed) or ``\"adaptive\"`` (eq. 10 after each epoch, Algorithm 1).")
    weights: typing.Optional[typing.Tuple[int, ...]] = param(
        None, "list of n positive ints w_i (micro-batches per round, n = world size), or None: equal shares of "
              "``total`` (largest-remainder rounding).", ge=1, unit="micro-batches per round, one per rank",
        none="equal shares")
    total: typing.Optional[int] = param(
        None, "int C >= n, micro-batches per round over all ranks; default sum(weights), else n (static) or "
              "n b / micro_batch (adaptive: single samples by default, set by ``fit_data``).", ge=1,
        unit="micro-batches per round over all ranks", none="from weights, mode and batch size")
    threshold: float = param(
        0.05, "float in [0, 1): smallest predicted relative shortening of a round (compute time of its slowest "
              "rank) for which a reallocation is adopted.", ge=0, lt=1,
        unit="smallest predicted relative shortening of a round")
    patience: int = param(2, "int >= 1: epochs below ``threshold`` after which the allocation is frozen.", ge=1,
                          unit="epochs")
    micro_batch: typing.Optional[int] = param(
        None, "None (default: BSP's global batch, micro-batches of n b / C samples, see above) or int >= 1, samples "
              "per micro-batch (global batch C x micro_batch samples).", ge=1, unit="samples per micro-batch",
        none="BSP's global batch, n x batch_size samples per round")
    probe_rounds: typing.Optional[int] = param(
        None, "None (default: the paper's Algorithm 1, the first reallocation at the end of the first epoch) or int "
              "K >= 2 (``adaptive`` only): the first reallocation after the first K rounds of the first epoch, from "
              "the speeds of its rounds 1 .. K-1 (round 0 traces the graph); the rest of that epoch runs under the "
              "new w, and the per-epoch rule goes on from its end.", ge=2, unit="rounds of the first epoch",
        none="the first reallocation at the end of the first epoch")

    def validate(self):
        """``total`` and ``weights`` must agree when both are given; ``probe_rounds`` needs ``adaptive``."""
        if self.weights is not None and self.total is not None and sum(self.weights) != self.total:
            raise ValueError(f"TaskAllocation: total C={self.total} but the weights {list(self.weights)} sum to "
                             f"{sum(self.weights)}; give one of them, or make them agree")
        if self.probe_rounds is not None and self.mode != "adaptive":
            raise ValueError(f"TaskAllocation: probe_rounds={self.probe_rounds} reallocates early in the first "
                             f"epoch, which only mode=\"adaptive\" does (got mode={self.mode!r}); leave it None")


class TaskAllocationProtocol(AllocationDataPlan, Protocol):
    """Per-rank workloads w_i with a weighted allreduce each round (see :func:`TaskAllocation`).

    Args: a :class:`TaskAllocationConfig` (or its fields); validated before training.

    Raises:
        ValueError: as :func:`TaskAllocation` (the world-size checks run in :meth:`build`).
    """

    #: the weighted allreduce carries every rank's non-finite flag: all ranks stop together.
    capabilities = Capabilities(nonfinite_in_collective=True, max_steps_per_execution=1)

    name = "taskalloc"
    display_name = "TaskAllocation"
    Config = TaskAllocationConfig
    #: the on_train_batch_begin hook feeds each step's sample count m_i before the step (see :meth:`step_samples`).
    #: float seconds a data request for the next epoch waits for that epoch's allocation.
    data_timeout_s = 600.0

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self.weights = None  # numpy int64 [n], current allocation
        self.total = None
        self.history = []  # one dict per finished epoch
        self.stable = False
        self._pending = None
        self._stable_count = 0
        self._data = None
        self._stream = None  # fit_dataset: {"rounds": R, "yielded": [samples of each batch made]}
        #: int samples per micro-batch, set by :meth:`fit_data` (the argument, or
        #: :func:`hetsync.protocols.taskalloc.allocation.default_micro_batch`); None before.
        self.micro_batch = None
        self.counts = None  # int64 [R, n]: samples of each rank in each round of the current epoch
        self.rounds = 0
        self._plans = {}  # epoch -> per-round, per-rank index arrays (the current and the next epoch)
        self._plan_cv = threading.Condition()
        self._closed = False  # set when a fit ends: requests for unplanned epochs get None
        self._ready = {}  # epoch -> first round not published yet (the first epoch's probe rounds)
        #: the first epoch's probe (``probe_rounds``): None before it ran, else its record (see :meth:`summary_stats`)
        self._probe = None
        self._probe_off = False  # a run resumed before its probe: the per-epoch rule only
        self._probe_skip_logged = False

    # -- set-up ----------------------------------------------------------------------------------
    def build(self):
        """Check the allocation against the world size; set C and the initial w; create the statistics."""
        n = world.size()
        w = None if self.cfg.weights is None else list(self.cfg.weights)
        total = self.cfg.total
        if w is not None and len(w) != n:
            raise ValueError(f"TaskAllocation: {len(w)} weights {w} given, but the world size is {n} "
                             "(one weight per rank)")
        # adaptive without weights or total: C is set from b in fit_data (n b / unit micro-batches)
        self._auto_total = self.cfg.mode == "adaptive" and w is None and total is None
        if total is None:
            total = sum(w) if w is not None else n
        if total < n:
            raise ValueError(f"TaskAllocation: total C={total} is smaller than the world size {n}; every rank "
                             "needs at least one micro-batch per round")
        self.total = int(total)
        self.weights = np.asarray(w, np.int64) if w is not None else round_allocation([total / n] * n, total)
        self._mb = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="hetsync_taskalloc_samples")
        for stat in ("w", "samples", "round_samples", "sync_wait_total_ms"):
            self.add_stat(stat)
        self._stats["w"].assign(float(self.weights[world.rank()]))

    @property
    def global_batch(self):
        """Samples per full synchronization round over all ranks, C x :attr:`micro_batch` (int), or
        None before :meth:`fit_data`."""
        return None if self.micro_batch is None else int(self.total) * int(self.micro_batch)

    # -- per-epoch plan ----------------------------------------------------------------------------

    def begin_epoch(self, epoch):
        """Apply a pending reallocation and reshard for ``epoch`` (called by the on_epoch_begin hook)."""
        if self._data is None and self._stream is None:
            raise RuntimeError("TaskAllocation: train on the data returned by opt.hetsync_protocol.fit_data(x, y, "
                               "batch_size) or opt.hetsync_protocol.fit_dataset(per_rank_unbatched_dataset, "
                               "batch_size): the protocol sets each rank's batch to its share w_i")
        if self._pending is not None:
            self.weights, self._pending = self._pending, None
        self._plan(epoch)
        self._stats["w"].assign(float(self.weights[world.rank()]))

    def end_epoch(self, epoch, compute_s, wait_s, wall_s, speed, steady=(0, 0.0, 0.0)):
        """Exchange this epoch's measurements, record them, and (adaptive) compute the next w.

        One :func:`hetsync.transport.allgather_object` of a dict per rank (every rank calls it once
        per epoch). ``speed`` v_i
        is rank i's samples per second of compute: the median, over every step since the
        allocation last changed (the first step of each epoch excluded), of m_i / t_s, t_s the
        step's time up to its gradients (:meth:`_gradient_time_s`; without it, the step time minus
        the time inside the allreduce). The median is robust to a step that lost its core to another
        process, and pooling the epochs of one allocation gives it more than one epoch of steps.
        Eq. (10) is applied with t_s^i = w_i mb / v_i (mb = :attr:`micro_batch` samples), the
        compute time of one full round, i.e. w_i <- C v_i / sum_j v_j, and adopted if
        :func:`predicted_gain` exceeds ``threshold``.

        Args:
            epoch: int. compute_s: float seconds of compute in the epoch (all steps, waiting
                excluded). wait_s: float seconds inside synchronization. wall_s: float seconds
                from the epoch's start to its end on this rank. speed: float samples/s (0: none).
            steady: ``(samples, compute_s, wall_s)`` of the epoch without its first step (which
                carries graph tracing and waits for rank 0's end-of-epoch evaluation); the
                heterogeneity efficiency of the epoch is computed from these.

        Returns:
            dict, the epoch's record (also appended to :attr:`history`).
        """
        me = world.rank()
        mine = {"w": int(self.weights[me]), "samples": int(self.samples_per_epoch), "compute_s": float(compute_s),
                "wait_s": float(wait_s), "wall_s": float(wall_s), "speed": float(speed), "total": int(self.total),
                "n_samples": int(self.n_samples), "steady_samples": float(steady[0]),
                "steady_compute_s": float(steady[1]), "steady_wall_s": float(steady[2])}
        table = transport.allgather_object(mine, name="hetsync_taskalloc_epoch")

        def col(key, dtype=np.float64):
            return np.asarray([r[key] for r in table], dtype)

        w_all, totals, n_all = col("w", np.int64), col("total", np.int64), col("n_samples", np.int64)
        if not (np.all(w_all == self.weights) and np.all(totals == self.total) and np.all(n_all == n_all[0])):
            raise RuntimeError(f"TaskAllocation: ranks disagree on the allocation (w {list(w_all)}, C "
                               f"{list(totals)}, N {list(n_all)}); give every rank the same "
                               "arguments and training set")
        samples, compute, wait, wall = col("samples"), col("compute_s"), col("wait_s"), col("wall_s")
        rate = col("speed")
        per_round = np.where(rate > 0, self.weights * self.micro_batch / np.maximum(rate, 1e-12), 0.0)
        d_steady, t_steady = col("steady_samples"), col("steady_compute_s")
        wall_steady = float(col("steady_wall_s").max())
        eff = heterogeneity_efficiency(d_steady, t_steady, wall_steady)
        rec = {"epoch": int(epoch), "w": [int(v) for v in self.weights], "samples": [int(v) for v in samples],
               "t_s_s": [float(v) for v in compute], "t_s_round_s": [float(v) for v in per_round],
               "wait_s": [float(v) for v in wait], "epoch_wall_s": float(wall.max()),
               "speed_samples_per_s": [float(v) for v in rate],
               "steady_samples": [float(v) for v in d_steady], "steady_t_s_s": [float(v) for v in t_steady],
               "steady_wall_s": wall_steady, "efficiency": eff, "next_w": None,
               "change": None, "gain": None, "stable": self.stable}
        if self.cfg.mode == "adaptive" and not self.stable:
            if np.all(rate > 0):
                new = adapt_allocation(self.weights, per_round, self.total)
                gain = predicted_gain(self.weights, new, rate)
                rec["change"], rec["gain"] = allocation_change(self.weights, new), gain
                if gain > self.cfg.threshold:
                    self._pending, self._stable_count = new, 0
                else:
                    self._stable_count += 1
                    self.stable = self._stable_count >= self.cfg.patience
            rec["stable"] = self.stable
        rec["next_w"] = [int(v) for v in (self._pending if self._pending is not None else self.weights)]
        self.history.append(rec)
        if me == 0:
            log.info("taskalloc epoch %d: w=%s t_s=%s s wait=%s s E=%.3f change=%s gain=%s -> next w=%s%s", epoch,
                     rec["w"], [round(v, 3) for v in rec["t_s_s"]], [round(v, 3) for v in rec["wait_s"]], eff,
                     "-" if rec["change"] is None else f"{rec['change']:.3f}",
                     "-" if rec["gain"] is None else f"{rec['gain']:.3f}", rec["next_w"],
                     " (stable)" if self.stable else "")
        return rec

    # -- the hook set: feed each step's m_i, time the compute, run the epoch exchange -------------------
    def on_train_begin(self, model, params):
        """Check that the run trains on the protocol's data, then :meth:`begin_fit`.

        Raises:
            RuntimeError: ``model.fit`` was not given the data of :meth:`fit_data` or :meth:`fit_dataset`.
        """
        if self._data is None and self._stream is None:
            raise RuntimeError("TaskAllocation: train on the data returned by opt.hetsync_protocol.fit_data(x, y, "
                               "batch_size) or opt.hetsync_protocol.fit_dataset(per_rank_unbatched_dataset, "
                               "batch_size): the protocol sets each rank's batch to its share w_i")
        self.begin_fit()

    def on_train_end(self, model):
        """:meth:`end_fit`."""
        self.end_fit()

    def on_epoch_begin(self, epoch):
        """:meth:`begin_epoch`, then start the epoch's clocks (seconds, ``time.perf_counter``)."""
        self.begin_epoch(epoch)
        self._t0 = self._steady_t0 = time.perf_counter()
        self._wait0 = float(self._stats["sync_wait_total_ms"].numpy())
        self._busy = 0.0
        w = tuple(int(v) for v in self.weights)
        if w != getattr(self, "_rates_w", None):  # speeds are pooled while the allocation stays the same
            self._rates, self._rates_w = [], w
        self._steady_samples, self._steady_compute = 0, 0.0

    def on_train_batch_begin(self, batch):
        """Feed the step's sample count m_i (:meth:`step_samples`) to the compiled step."""
        self._m = self.step_samples(batch)
        self._mb.assign(float(self._m))
        self._wait_b = float(self._stats["sync_wait_total_ms"].numpy())
        self._tb = time.perf_counter()

    def on_train_batch_end(self, batch, logs):
        """Record the step's speed sample m_i / t_s: t_s the time up to the gradients where the step's
        delay op timed it (:meth:`_gradient_time_s`), else the step time minus the time inside the
        allreduce; at the end of the first epoch's probe rounds, run the probe."""
        dt = time.perf_counter() - self._tb
        wait = (float(self._stats["sync_wait_total_ms"].numpy()) - self._wait_b) / 1e3
        self._busy += dt
        # the first step of every epoch (graph tracing, data pipeline start, waiting for rank 0's
        # evaluation of the previous epoch) is not used as a speed sample
        if batch > 0 or self.rounds == 1:
            grad_s = self._gradient_time_s()
            t_s = grad_s if grad_s > 0 else dt - wait
            if t_s > 0:
                self._rates.append(self._m / t_s)
            self._steady_samples += self._m
            self._steady_compute += max(dt - wait, 0.0)
        else:
            self._steady_t0 = time.perf_counter()
        if self._ready.get(self.epoch) == batch + 1:  # the first epoch's probe rounds are done
            self._run_probe(self.epoch)

    def _gradient_time_s(self):
        """Seconds from the step's start to its gradients (the paper's t_s of one round), as the step's
        delay op timed them: ``compute_ms + delay_ms``; 0.0 when the step's start is unknown (no
        :class:`hetsync.callbacks.Slowdown` in the run), and the caller falls back to the step time
        minus the time inside the allreduce."""
        compute = float(self._stats["compute_ms"].numpy())
        return (compute + float(self._stats["delay_ms"].numpy())) / 1e3 if compute > 0 else 0.0

    def _probe_due(self, epoch, rounds):
        """True if ``epoch`` (of ``rounds`` rounds) is the first epoch of the first fit and ``probe_rounds``
        K leaves at least two of its rounds to the probe's allocation."""
        k = self.cfg.probe_rounds
        if k is None or self._probe_off or self._probe is not None or self.history or epoch != 0:
            return False
        if k > rounds - 2:
            if world.rank() == 0 and not self._probe_skip_logged:
                self._probe_skip_logged = True
                log.info("taskalloc: probe_rounds=%d leaves fewer than 2 of the first epoch's %d rounds to a new "
                         "allocation; the first reallocation is at the epoch's end", k, rounds)
            return False
        return True

    def _run_probe(self, epoch):
        """The first epoch's probe: exchange the speeds of its rounds 1 .. K-1, apply eq. (10) and the
        ``threshold`` rule, and publish the rest of the epoch under the result (always, also when the
        exchange fails, so that no data request is left waiting)."""
        before = np.asarray(self.weights, np.int64).copy()
        rec = {"epoch": int(epoch), "rounds": int(self.cfg.probe_rounds), "w": [int(v) for v in before],
               "speed_samples_per_s": None, "change": None, "gain": None, "next_w": [int(v) for v in before]}
        try:
            rate = float(np.median(self._rates)) if self._rates else 0.0
            table = transport.allgather_object({"speed": rate}, name="hetsync_taskalloc_probe")
            rates = np.asarray([t["speed"] for t in table], np.float64)
            rec["speed_samples_per_s"] = [float(v) for v in rates]
            if np.all(rates > 0):
                new = adapt_allocation(before, before * self.micro_batch / rates, self.total)
                rec["change"], rec["gain"] = allocation_change(before, new), predicted_gain(before, new, rates)
                if rec["gain"] > self.cfg.threshold:
                    self.weights = np.asarray(new, np.int64)
                    rec["next_w"] = [int(v) for v in self.weights]
        finally:
            self._probe = rec
            self._plan_rest(epoch, before)
        if rec["next_w"] != rec["w"]:
            self._stats["w"].assign(float(self.weights[world.rank()]))
            self._rates, self._rates_w = [], tuple(int(v) for v in self.weights)
        if world.rank() == 0:
            log.info("taskalloc probe after %d rounds of epoch %d: speeds %s samples/s, gain %s -> w=%s",
                     rec["rounds"], epoch, [round(v, 1) for v in rec["speed_samples_per_s"] or []],
                     "-" if rec["gain"] is None else f"{rec['gain']:.3f}", rec["next_w"])

    def on_epoch_end(self, epoch, logs):
        """:meth:`end_epoch` with the epoch's compute, waiting, wall time, speed v_i and steady figures."""
        if self.rounds == 1:
            self._steady_t0 = self._t0
        wall = time.perf_counter() - self._t0
        wait = (float(self._stats["sync_wait_total_ms"].numpy()) - self._wait0) / 1e3
        compute = max(self._busy - wait, 1e-9)
        rate = float(np.median(self._rates)) if self._rates else 0.0
        steady = (self._steady_samples, self._steady_compute, time.perf_counter() - self._steady_t0)
        self.end_epoch(epoch, compute, wait, wall, rate, steady)

    def summary_stats(self):
        """End-of-run statistics (JSON-serialisable dict): ``syncs``, ``mode``, ``total`` (C,
        micro-batches per round), ``micro_batch`` (samples per micro-batch in use), ``batch_size``
        (the run's per-rank b, samples), ``global_batch`` (C x micro_batch, samples per full round),
        ``rounds_per_epoch``, ``final_w``, ``stable``, ``stable_epoch``, ``epochs`` (one record per
        epoch, see :meth:`end_epoch`) and ``probe`` (None, or the first epoch's probe with
        ``probe_rounds``: ``epoch``, ``rounds``, ``w`` before it, ``speed_samples_per_s``, ``change``,
        ``gain``, ``next_w``)."""
        out = super().summary_stats()
        out.update({"mode": self.cfg.mode, "total": self.total, "micro_batch": self.micro_batch,
                    "batch_size": self.batch_size, "global_batch": self.global_batch,
                    "rounds_per_epoch": self.rounds, "final_w": [int(v) for v in self.weights],
                    "stable": self.stable, "epochs": self.history, "probe": self._probe})
        stable_at = [h["epoch"] for h in self.history if h["stable"]]
        out["stable_epoch"] = stable_at[0] if stable_at else None
        return out

    # -- the step ------------------------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        """Weighted allreduce: sum_i m_i g_i / sum_i m_i over the ranks, then the local update.

        ``g_i`` is rank i's mean gradient over its m_i samples of this round (Keras' default
        ``sum_over_batch_size`` loss reduction), so the result is the mean gradient over every
        sample of the round, whatever the split. One grouped horovod allreduce per step carries the
        scaled gradients, m_i and the [n] non-finite flags (a set flag stops every rank).
        """
        present, dense = present_gradients(grads)
        m = tf.identity(self._mb)
        scaled = [g * tf.cast(m, g.dtype) for g in dense] + [tf.reshape(m, [1]), self.nonfinite_flags(self._step_bad)]
        out = self.synchronize(lambda ts: transport.allreduce_sum(ts, name="hetsync_taskalloc"), scaled)
        with tf.control_dependencies([self.check_nonfinite_flags(out[-1], "the gradient allreduce")]):
            reduced = [tf.identity(t) for t in out[:-1]]
        total = reduced[-1][0]
        check = tf.debugging.assert_positive(
            total, message="TaskAllocation: no samples in this round; train on opt.hetsync_protocol.fit_data(...) "
                           "with hetsync.callbacks.standard(opt)")
        with tf.control_dependencies([check] if check is not None else []):
            total = tf.identity(total)
        out = scatter_gradients(grads, present, [g / tf.cast(total, g.dtype) for g in reduced[:-1]])
        self._stats["samples"].assign(tf.cast(m, tf.float64))
        self._stats["round_samples"].assign(tf.cast(total, tf.float64))
        self._stats["sync_wait_total_ms"].assign_add(self._stats["sync_wait_ms"])
        return local_apply(out, variables)

    def state(self):
        """The base state plus the allocation: ``weights`` w_i (ints), ``total``, the
        per-epoch ``history``, ``stable``, the pending allocation and the stability count."""
        out = super().state()
        out["allocation"] = {
            "weights": None if self.weights is None else [int(w) for w in self.weights], "total": self.total,
            "history": json.loads(json.dumps(self.history, default=float)), "stable": bool(self.stable),
            "pending": None if self._pending is None else [int(w) for w in self._pending],
            "stable_count": int(self._stable_count), "probe": self._probe}
        return out

    def load_state(self, state):
        """Restore :meth:`state` (the allocation included). Raises ValueError as the base does."""
        super().load_state(state)
        a = state.get("allocation")
        if a is not None:
            self.weights = None if a["weights"] is None else np.asarray(a["weights"], np.int64)
            self.total, self.history, self.stable = a["total"], list(a["history"]), bool(a["stable"])
            self._pending = None if a["pending"] is None else np.asarray(a["pending"], np.int64)
            self._stable_count = int(a["stable_count"])
            self._probe = a.get("probe")
            # resumed inside the first epoch before its probe: that epoch keeps one allocation
            self._probe_off = self._probe is None and not self.history

TaskAllocation = protocol_wrapper(TaskAllocationProtocol, """Wrap a Keras 3 optimizer for task-allocated allreduce training (static or self-adaptive).

    Paper section III. Rank i processes w_i micro-batches of ``micro_batch`` samples per
    synchronization round; the ranks allreduce the sum of their gradients (weighted by samples)
    and divide by the round's sample count, so every update is the mean gradient of a global
    batch of C x micro_batch samples, C = sum_i w_i micro-batches (eq. 1). Each rank's data share
    is w_i / C of the training set, resharded every epoch so every sample is used exactly once per
    epoch. One Keras step is one round on every rank (see the module docstring), so all ranks run
    the same steps per epoch.

    Global batch: b is the run's per-rank batch size in samples, the ``batch_size`` given to
    ``opt.hetsync_protocol.fit_data`` exactly as for BSP (``--batch-size`` of
    ``python -m hetsync.bench.job``). By default (``micro_batch=None``) a round holds BSP's global
    batch, n x b samples (n = world size), split into C micro-batches of n b / C samples, so a
    run switched from BSP makes as many updates per epoch as BSP. If C does not divide n b, the
    micro-batch is n b / C rounded to the nearest integer, at least 1
    (:func:`default_micro_batch`), and the global batch is C x micro_batch, close to n x b. With
    the static default C = n and b = 32: micro-batches of 32 samples. The adaptive default
    (neither ``weights`` nor ``total``) allocates single samples: C = n b micro-batches of one
    sample (of ``micro_batch`` samples if given: C = n b / micro_batch), so eq. (10) can express
    any speed ratio (with C = 8 n, ``speeds:1,1,1,0.5`` rounds to [9, 9, 9, 5] and the slow
    rank's extra micro-batch caps E at 0.91). Each rank's w_i micro-batches are one Keras batch
    (one forward/backward pass), so a small micro-batch costs nothing per step. Either way the
    global batch is 32 n for b = 32. An int ``micro_batch`` with an explicit C sets the micro-batch
    size and hence a global batch of C x micro_batch samples (e.g. larger than BSP's).

    ``adaptive`` (paper section III-B, Algorithm 1): after each epoch all ranks allgather their
    compute time t_s^i (seconds computing, waiting inside the allreduce excluded, first step of the
    epoch excluded; as a per-step median pooled over the epochs of the current allocation) and set
    w_i <- C (w_i / t_s^i) / sum_j (w_j / t_s^j) (eq. 10), rounded with
    :func:`round_allocation` (largest remainder, sum C, w_i >= 1). A new allocation is adopted only
    if it is predicted to shorten a round by more than ``threshold`` (:func:`predicted_gain`: the
    slowest rank's compute time max_i w_i micro_batch / v_i, before against after); after
    ``patience`` consecutive epochs below it the allocation is frozen ("stable"). Statistics per
    epoch (w, t_s, waiting time, heterogeneity efficiency, see :func:`heterogeneity_efficiency`)
    are exchanged by one allgather per epoch in both modes, logged on rank 0 and reported in
    ``summary_stats()["epochs"]`` (``summary.json`` ``stats`` through SyncMetrics, with
    ``micro_batch`` and ``global_batch``). ``probe_rounds`` K (an addition to the paper) moves the
    first reallocation to the end of round K-1 of the first epoch: the rest of that epoch runs
    under the allocation from the speeds of its rounds 1 .. K-1 (``summary_stats()["probe"]``).

    Train with ``model.fit(**opt.hetsync_protocol.fit_data(x, y, b), callbacks=
    hetsync.callbacks.standard(opt))`` (its hooks run through ``ProtocolHooks``, part of ``standard``).

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)``.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``TaskAllocation_<optimizer class>``, a subclass of the given one).

    Raises:
        ValueError: unknown mode; weights that are not positive integers, or not one per rank;
            total smaller than the world size or different from sum(weights); bad threshold,
            patience, micro_batch or probe_rounds (not None and not an integer >= 1, resp. >= 2; the
            message names the value); probe_rounds without mode="adaptive" (all before training starts).
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance, or an unknown argument.
        RuntimeError: :func:`hetsync.init` was not called.
    """)
