"""RNA: randomized non-blocking (partial) allreduce with cross-iteration gradient caching.

Yang, Rang and Cheng, "Mitigating Stragglers in the Decentralized Training on Heterogeneous
Clusters" (Middleware '20), sections 3.1-3.3 and 6 (flat RNA; the hierarchical groups of section 4
are not implemented here).

How one rank works
------------------
* **Compute step** (inside ``model.fit``'s compiled step, never waits for the network): WriteOp
  caches this step's gradients g_t for the local iteration t (:func:`hetsync.ops.grad_cache_write`);
  ReadOp returns the newest reduced result if one arrived since the last read, else the local
  gradients (:func:`hetsync.ops.grad_cache_read`); the wrapped optimizer applies what ReadOp returned.
* **Communication thread** (one per rank, :meth:`RNAProtocol.start` / :meth:`RNAProtocol.stop`):
  rounds are numbered r = 0, 1, ... A *controller* on rank 0 chooses each round's *initiator* by
  power-of-d choices (section 3.2): it sends a probe carrying r to ``probes`` random ranks; a probed
  rank answers "ready" as soon as it has a gradient pending; the first answer wins and the other
  probes expire. The controller then announces the round to every rank and all ranks join one fused
  horovod allreduce (same name on every rank) of ``[w_i g'_i, w_i]`` where g'_i is rank i's
  staleness-weighted accumulation (or the null gradient with w_i = 0), and publish
  ``sum_i w_i g'_i / sum_i w_i`` (Algorithm 2, W = 1 / sum w).
* **Learning-rate scaling** (``scale_lr=True``): gamma_k = (sum_i w_{k,i}) * gamma (linear scaling
  rule, section 3.3), implemented by multiplying the applied gradient by sum(w) (exact for SGD; for
  momentum SGD the scaled gradient enters the momentum buffer; adaptive optimizers such as Adam
  mostly cancel it). Consequence: the base learning rate is then a *per-rank* rate, i.e. about
  gamma_BSP / n if gamma_BSP is the rate that works for BSP's averaged gradient on n ranks; a local
  step (no fresh result) uses gamma itself. With ``scale_lr=False`` (default) every applied
  gradient, averaged or local, uses the optimizer's rate unchanged, so the same rate as BSP works.
* **Drift**: between rounds each rank applies its own local gradients, and those local steps are
  never averaged away by later rounds (every rank applies the same averaged results), so replicas
  drift apart like a random walk. The communication thread measures the drift, the largest L2
  distance ||x_r - x_mean|| of a rank's parameters from the mean of the active ranks, every
  ``drift_every`` rounds, and averages the parameters every ``average_every`` rounds (0: never):
  each rank adds ``x_mean - x_r(snapshot)`` to its parameters at its next step, keeping its local
  progress since the snapshot. ``average_at_end`` averages the final parameters.
* **Termination**: ranks may finish different numbers of steps. A rank whose training ends
  (``stop``) reports "done" to the controller and keeps joining rounds with its leftovers (then the
  null gradient) until the controller announces the final round, which it does once every rank is
  done, or once ``finish_timeout_s`` seconds pass without any round while some rank is done (the
  unfinished ranks are named in a warning and their later gradients counted as unsynchronized).
  Every wait has a timeout (``timeout_s``) that fails with a message naming what was awaited.
"""
import logging
import sys
import threading
import time

import numpy as np
import tensorflow as tf

from .. import ops, runtime, transport
from .base import Protocol, average_at_train_end, wrap

__all__ = ["RNA", "RNAProtocol", "RNAError"]

log = logging.getLogger("hetsync")

_TAG_CTRL = 7301  # controller -> rank: ("probe", r) | ("round", r, initiator, average, drift) | ("final", reason, error)
_TAG_TO_CTRL = 7302  # rank -> controller: ("ready", r) | ("done", steps) | ("error", message)

#: per-rank totals gathered at :meth:`RNAProtocol.stop`, in this order (then the staleness histogram).
_RANK_TOTALS = ("steps", "written", "dropped", "taken", "contributed_rounds", "fresh_reads", "undrained_at_end",
                "unread_results", "rounds_joined", "probes_answered", "probes_expired")


class RNAError(RuntimeError):
    """RNA's communication failed or timed out (the message says which wait, on which rank)."""


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"RNA: {name} must be an int >= {minimum}, got {value!r}")


def _check_pos(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"RNA: {name} must be a positive number of seconds/milliseconds, got {value!r}")


class _Controller:
    """Rank 0's controller state (section 3.2): probes, initiator choice, round announcements."""

    def __init__(self, proto, world_size):
        self.p = proto
        self.n = world_size
        self.rng = np.random.default_rng(proto.seed)
        self.done = {}  # rank -> steps
        self.probed = []
        self.probe_t0 = None
        self.last_progress = time.monotonic()
        self.final_sent = False
        self.initiators = [0] * world_size
        self.response_ms = []
        self.reprobes = 0

    def active(self):
        return [r for r in range(self.n) if r not in self.done]

    def send_probes(self):
        active = self.active()
        k = min(self.p.probes, len(active))
        self.probed = sorted(int(r) for r in self.rng.choice(active, size=k, replace=False))
        self.probe_t0 = time.monotonic()
        for r in self.probed:
            self.p._send(r, _TAG_CTRL, ("probe", self.p._round))

    def announce_final(self, reason, error=None):
        for r in range(self.n):
            self.p._send(r, _TAG_CTRL, ("final", reason, error))
        self.final_sent = True
        self.p._final_reason = reason

    def on_message(self, src, msg):
        kind = msg[0]
        if kind == "ready":
            if msg[1] != self.p._round or self.final_sent:
                return  # an expired probe's late answer
            r = self.p._round
            self.response_ms.append((time.monotonic() - self.probe_t0) * 1e3)
            self.initiators[src] += 1
            k = r + 1
            average = self.p.average_every > 0 and k % self.p.average_every == 0
            drift = self.p.drift_every > 0 and k % self.p.drift_every == 0
            for dst in range(self.n):
                self.p._send(dst, _TAG_CTRL, ("round", r, src, average, drift))
            self.p._round += 1
            self.last_progress = time.monotonic()
            self.send_probes()
        elif kind == "done":
            self.done[src] = msg[1]
            self.last_progress = time.monotonic()
            if not self.active():
                self.announce_final("all ranks finished")
            elif all(r in self.done for r in self.probed):
                self.reprobes += 1
                self.send_probes()
        elif kind == "error":
            self.announce_final(f"rank {src} failed", error=f"rank {src}: {msg[1]}")

    def check_timeouts(self):
        if self.final_sent:
            return
        idle = time.monotonic() - self.last_progress
        if self.done and idle > self.p.finish_timeout_s:
            missing = self.active()
            reason = (f"ranks {missing} did not finish within finish_timeout_s={self.p.finish_timeout_s:g} s "
                      f"of the last round while ranks {sorted(self.done)} had finished; final round announced "
                      f"without them (their later gradients are counted as unsynchronized)")
            log.warning("hetsync RNA controller: %s", reason)
            self.announce_final(reason)
        elif not self.done and time.monotonic() - self.probe_t0 > self.p.timeout_s:
            error = (f"controller: no probed rank {self.probed} had a gradient ready for round {self.p._round} "
                     f"within timeout_s={self.p.timeout_s:g} s")
            self.announce_final("timeout", error=error)


class RNAProtocol(Protocol):
    """Randomized non-blocking partial allreduce with a host gradient cache (see :func:`RNA`)."""

    name = "rna"
    requires_mpi = True

    def __init__(self, probes=2, max_staleness=4, scale_lr=False, average_every=10, drift_every=None,
                 average_at_end=True, timeout_s=120.0, finish_timeout_s=60.0, poll_ms=1.0, seed=0):
        super().__init__()
        _check_int("probes", probes, 1)
        _check_int("max_staleness", max_staleness, 0)
        _check_int("average_every", average_every, 0)
        if drift_every is None:
            drift_every = average_every if average_every > 0 else 20
        _check_int("drift_every", drift_every, 0)
        if not isinstance(scale_lr, bool):
            raise ValueError(f"RNA: scale_lr must be True or False, got {scale_lr!r}")
        if not isinstance(average_at_end, bool):
            raise ValueError(f"RNA: average_at_end must be True or False, got {average_at_end!r}")
        _check_pos("timeout_s", timeout_s)
        _check_pos("finish_timeout_s", finish_timeout_s)
        _check_pos("poll_ms", poll_ms)
        _check_int("seed", seed, 0)
        self.probes, self.max_staleness, self.scale_lr = probes, max_staleness, scale_lr
        self.average_every, self.drift_every, self.average_at_end = average_every, drift_every, average_at_end
        self.timeout_s, self.finish_timeout_s, self.poll_ms, self.seed = (
            float(timeout_s), float(finish_timeout_s), float(poll_ms), seed)
        self._cache = self._pcache = None
        self.switch_interval_s = 0.0005
        self._vars = None
        self._round = 0
        self._thread = None
        self._summary = {}

    def config(self):
        return {"probes": self.probes, "max_staleness": self.max_staleness, "scale_lr": self.scale_lr,
                "average_every": self.average_every, "drift_every": self.drift_every,
                "average_at_end": self.average_at_end, "timeout_s": self.timeout_s,
                "finish_timeout_s": self.finish_timeout_s, "poll_ms": self.poll_ms, "seed": self.seed}

    # -- life cycle ---------------------------------------------------------------------------------
    def build(self):
        n = runtime.size()
        if self.probes > max(n, 2):  # the default 2 is accepted on a world of one rank (nothing to choose)
            raise ValueError(f"RNA: probes={self.probes} exceeds the world size {n}; use 1..{max(n, 2)}")
        for s in ("rna_fresh", "rna_round", "rna_contributors", "rna_dropped", "rna_rounds", "rna_probe_ms",
                  "rna_drift", "rna_param_corrections"):
            self.add_stat(s, -1.0 if s == "rna_drift" else 0.0)
        with tf.init_scope():
            self._iteration = tf.Variable(-1, dtype=tf.int64, trainable=False, name="hetsync_rna_iteration")

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
        self._sizes = [int(np.prod(s)) for s in self._shapes]
        self._cache = ops.grad_cache_create(self._shapes, self.max_staleness)
        if self.average_every > 0:
            self._pcache = ops.grad_cache_create(self._shapes, 0)

    def start(self):
        self._create_caches()
        # The communication thread needs the GIL for a few short moments per round; with Python's
        # default 5 ms switch interval each of them can wait 5 ms behind the training loop.
        if sys.getswitchinterval() > self.switch_interval_s:
            sys.setswitchinterval(self.switch_interval_s)
        self._comm = transport.p2p_comm()
        self._rank, self._n = runtime.rank(), runtime.size()
        self._reqs = []
        self._error = None
        self._final_reason = None
        self._done_steps = None
        self._steps_at_start = int(self._iteration.numpy())
        self._local = {"rounds_joined": 0, "contributed_rounds": 0, "probes_answered": 0, "probes_expired": 0,
                       "staleness": np.zeros(self.max_staleness + 1, np.int64), "contributors": {},
                       "drift": [], "drift_rel": [], "corrections": 0, "round_ms": []}
        self._ctl = _Controller(self, self._n) if self._rank == 0 else None
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hetsync-rna-comm-{self._rank}", daemon=True)
        self._thread.start()

    def stop(self):
        """End the communication thread cleanly (see the module notes), then gather statistics.

        Raises:
            RNAError: the communication thread failed or did not finish within its timeout.
        """
        if self._thread is None:
            return
        self._done_steps = int(self._iteration.numpy()) - self._steps_at_start
        budget = self.finish_timeout_s + self.timeout_s + 10.0
        self._thread.join(budget)
        thread, self._thread = self._thread, None
        if thread.is_alive():
            raise RNAError(f"rank {self._rank}: RNA communication thread did not end within {budget:g} s after "
                           "training ended (no final round from the controller)")
        self._gather_summary()
        if self.average_at_end:
            self._average_parameters_now()
        if self._error:
            raise RNAError(self._error)

    # -- the compute step -----------------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        if self._cache is None:
            raise RuntimeError("RNA: the step ran before train begin; pass hetsync.callbacks.standard(opt) "
                               "to model.fit")
        if [tuple(v.shape) for v in variables] != self._shapes:
            raise RuntimeError("RNA: the step's variables do not match the optimizer's trainable variables")
        grads = [tf.zeros(v.shape, tf.float32) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]
        it = self._iteration.assign_add(1)
        dropped = ops.grad_cache_write(self._cache, grads, it)
        with tf.control_dependencies([dropped]):
            outs, fresh, round_id, wsum = ops.grad_cache_read(self._cache, grads, it)
        if self.scale_lr:
            outs = [o * wsum for o in outs]
        st = self._stats
        st["rna_fresh"].assign(tf.cast(fresh, tf.float64))
        st["rna_round"].assign(tf.cast(round_id, tf.float64))
        st["rna_contributors"].assign(tf.cast(wsum, tf.float64))
        st["rna_dropped"].assign(tf.cast(dropped, tf.float64))
        result = local_apply(outs, variables)
        if self._pcache is not None:
            zeros = [tf.zeros(s, tf.float32) for s in self._shapes]
            deltas, pfresh, _, _ = ops.grad_cache_read(self._pcache, zeros, it)

            def correct():
                for v, d in zip(variables, deltas):
                    v.assign_add(d)
                st["rna_param_corrections"].assign_add(tf.constant(1.0, tf.float64))
                return tf.constant(True)

            tf.cond(pfresh, correct, lambda: tf.constant(False))
        return result

    # -- the communication thread --------------------------------------------------------------------
    def _send(self, dst, tag, msg):
        self._reqs.append(self._comm.isend(msg, dest=dst, tag=tag))
        if len(self._reqs) > 64:
            self._reqs = [r for r in self._reqs if not r.Test()]

    def _set_stat(self, name, value):
        self._stats[name].assign(float(value))

    def _run(self):
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 - reported at stop() and to the controller
            self._error = f"rank {self._rank}: RNA communication thread failed: {exc!r}"
            log.error("hetsync %s", self._error)
            try:
                if self._ctl is not None and not self._ctl.final_sent:
                    self._ctl.announce_final("error", error=self._error)
                else:
                    self._send(0, _TAG_TO_CTRL, ("error", self._error))
            except Exception:  # noqa: BLE001
                pass
        finally:
            for r in self._reqs:
                try:
                    r.wait()
                except Exception:  # noqa: BLE001
                    pass
            self._reqs = []
            self._finished.set()

    def _loop(self):
        from mpi4py import MPI

        comm, status = self._comm, MPI.Status()
        probe = None
        sent_done = False
        last_heard = time.monotonic()
        worker_timeout = self.timeout_s * 1.5 + 5.0
        if self._ctl is not None:
            self._ctl.send_probes()
        while True:
            progressed = False
            if self._ctl is not None:
                while comm.iprobe(source=MPI.ANY_SOURCE, tag=_TAG_TO_CTRL, status=status):
                    src = status.Get_source()
                    self._ctl.on_message(src, comm.recv(source=src, tag=_TAG_TO_CTRL))
                self._ctl.check_timeouts()
            while comm.iprobe(source=0, tag=_TAG_CTRL, status=status):
                msg = comm.recv(source=0, tag=_TAG_CTRL)
                last_heard = time.monotonic()
                progressed = True
                if msg[0] == "probe":
                    probe = msg[1]
                elif msg[0] == "round":
                    if probe is not None and probe <= msg[1]:
                        probe = None
                        self._local["probes_expired"] += 1
                    self._join_round(*msg[1:])
                else:  # final
                    self._final_reason = msg[1]
                    if msg[2] and not self._error:
                        self._error = msg[2]
                    return
            if probe is not None and bool(ops.grad_cache_wait(self._cache, 0.0)):
                self._send(0, _TAG_TO_CTRL, ("ready", probe))
                self._local["probes_answered"] += 1
                probe = None
            if self._done_steps is not None and not sent_done:
                self._send(0, _TAG_TO_CTRL, ("done", self._done_steps))
                sent_done = True
            if time.monotonic() - last_heard > worker_timeout:
                raise RNAError(f"rank {self._rank}: no message from the RNA controller (rank 0) for "
                               f"{worker_timeout:g} s (timeout_s={self.timeout_s:g})")
            if progressed:
                continue
            if probe is not None and self._done_steps is None:
                ops.grad_cache_wait(self._cache, self.poll_ms)  # wakes at once when the step writes
            else:
                time.sleep(self.poll_ms / 1e3)

    def _join_round(self, round_id, initiator, average, drift):
        t0 = time.monotonic()
        flat, its, _ = ops.grad_cache_take(self._cache)
        its = its.numpy()
        if its.size:
            self._local["contributed_rounds"] += 1
            np.add.at(self._local["staleness"], its[-1] - its, 1)
        reduced = transport.allreduce_sum([flat], name="hetsync_rna_round")[0]
        ops.grad_cache_publish(self._cache, reduced, round_id)
        self._local["round_ms"].append((time.monotonic() - t0) * 1e3)
        c = int(round(float(reduced[-1].numpy())))
        self._local["contributors"][c] = self._local["contributors"].get(c, 0) + 1
        self._local["rounds_joined"] += 1
        self._set_stat("rna_rounds", self._local["rounds_joined"])
        self._set_stat("syncs", self._local["rounds_joined"])
        if self._ctl is not None and self._ctl.response_ms:
            self._set_stat("rna_probe_ms", self._ctl.response_ms[-1])
        if average or drift:
            self._parameter_round(round_id, average)

    def _snapshot(self):
        return np.concatenate([np.ravel(np.asarray(v.numpy(), np.float32)) for v in self._vars])

    def _parameter_round(self, round_id, average):
        """Measure drift (max_r ||x_r - mean||_2 over active ranks) and optionally average (every K rounds)."""
        x = self._snapshot()
        active = 1.0 if self._done_steps is None else 0.0
        s = transport.allreduce_sum([tf.constant(np.append(x * active, active).astype(np.float32))],
                                    name="hetsync_rna_params")[0].numpy()
        if s[-1] <= 0:
            return
        mean = s[:-1] / s[-1]
        dist = float(np.linalg.norm(x - mean)) if active else -1.0
        dists = transport.allgather(tf.constant([dist], tf.float64), name="hetsync_rna_drift").numpy()
        drift = float(dists.max())
        self._local["drift"].append((round_id, drift))
        self._local["drift_rel"].append(drift / max(float(np.linalg.norm(mean)), 1e-12))
        self._set_stat("rna_drift", drift)
        if average and active:
            ops.grad_cache_publish(self._pcache, np.append(mean - x, 1.0).astype(np.float32), round_id)
            self._local["corrections"] += 1

    def _average_parameters_now(self):
        """End of training (main thread, all ranks): average the parameters, record the drift before."""
        final = average_at_train_end(self, "hetsync_rna")
        self._summary["drift_before_final_average"] = final["drift_before_final_average"]

    # -- statistics -----------------------------------------------------------------------------------
    def _gather_summary(self):
        st = ops.grad_cache_status(self._cache)
        loc = self._local
        undrained = st["written"] - st["taken"] - st["dropped"]
        unread = max(0, st["newest_round"] - st["last_read_round"]) if st["newest_round"] >= 0 else 0
        mine = [self._done_steps, st["written"], st["dropped"], st["taken"], loc["contributed_rounds"],
                st["fresh_reads"], undrained, unread, loc["rounds_joined"], loc["probes_answered"],
                loc["probes_expired"]] + loc["staleness"].tolist()
        rows = transport.allgather(tf.constant([mine], tf.float64), name="hetsync_rna_totals").numpy()
        per_rank = []
        for r, row in enumerate(rows):
            d = {k: int(v) for k, v in zip(_RANK_TOTALS, row)}
            d["rank"] = r
            d["staleness_histogram"] = [int(v) for v in row[len(_RANK_TOTALS):]]
            per_rank.append(d)
        hist = np.sum([d["staleness_histogram"] for d in per_rank], axis=0).astype(int).tolist()
        rounds = loc["rounds_joined"]
        contrib = loc["contributors"]
        s = {
            "syncs": rounds,
            "rounds": rounds,
            "round_allreduce_ms_median": float(np.median(loc["round_ms"])) if loc["round_ms"] else None,
            "contributors_per_round_mean": (sum(k * v for k, v in contrib.items()) / rounds) if rounds else None,
            "contributors_histogram": {str(k): v for k, v in sorted(contrib.items())},
            "staleness_histogram": hist,
            "dropped_gradients": sum(d["dropped"] for d in per_rank),
            "undrained_at_end": sum(d["undrained_at_end"] for d in per_rank),
            "unsynchronized_gradients": sum(d["written"] - d["taken"] for d in per_rank),
            "unread_results": sum(d["unread_results"] for d in per_rank),
            "fresh_fraction": (sum(d["fresh_reads"] for d in per_rank) / max(1, sum(d["steps"] for d in per_rank))),
            "drift_max": max((d for _, d in loc["drift"]), default=None),
            "drift_last": loc["drift"][-1][1] if loc["drift"] else None,
            "drift_relative_max": max(loc["drift_rel"], default=None),
            "drift_series": loc["drift"][-200:],
            "parameter_averages": loc["corrections"],
            "final_reason": self._final_reason,
            "per_rank": per_rank,
        }
        if self._ctl is not None:
            ms = np.asarray(self._ctl.response_ms)
            s.update({
                "initiator_counts": self._ctl.initiators,
                "probe_response_ms": ({"median": float(np.median(ms)), "p5": float(np.percentile(ms, 5)),
                                       "p95": float(np.percentile(ms, 95)), "mean": float(ms.mean())}
                                      if ms.size else None),
                "reprobes": self._ctl.reprobes,
                "done_steps": {str(k): v for k, v in sorted(self._ctl.done.items())},
            })
        self._summary = s

    def summary_stats(self):
        return dict(self._summary) if self._summary else super().summary_stats()


def RNA(optimizer, probes=2, max_staleness=4, scale_lr=False, average_every=10, drift_every=None,
        average_at_end=True, timeout_s=120.0, finish_timeout_s=60.0, poll_ms=1.0, seed=0):
    """Wrap a Keras 3 optimizer for RNA: randomized non-blocking partial allreduce (RNA sections 3, 6).

    The compute step never waits for the network: it caches its gradients (WriteOp) and applies the
    newest averaged result if one arrived since the last step, else its own gradients (ReadOp). A
    communication thread per rank runs the rounds: power-of-``probes`` choices of the initiator by
    the controller on rank 0, then one fused allreduce of ``[w_i g'_i, w_i]`` over all ranks,
    divided by sum(w) (Algorithm 2). Needs an MPI launch (``horovodrun --mpi`` / ``mpirun``) and
    :func:`hetsync.callbacks.standard` (which starts and stops the thread). Gradients must be float32.

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)``.
        probes: int in [1, max(world size, 2)], ranks probed per round (2: power of two choices; 1: a purely
            random initiator).
        max_staleness: int >= 0, bound (in local iterations) on the gap between pending gradients;
            older ones are dropped and counted. Accumulated gradients get the staleness weights
            t - (k - tau) + 1 (:mod:`hetsync.ops` notes).
        scale_lr: bool; True applies gamma_k = sum(w) * gamma (the base learning rate is then a
            per-rank rate, about gamma_BSP / n); False (default) applies every gradient with gamma.
        average_every: int >= 0; average the parameters over the active ranks every that many rounds
            (0: never). Default 10: see the README (drift grows without it; every 10 rounds keeps it
            small at the cost of one parameter-sized allreduce per 10 rounds, off the compute path).
        drift_every: int >= 0, measure the drift every that many rounds (default: ``average_every``,
            or 20 if averaging is off; 0: never).
        average_at_end: bool, average the parameters once when training ends so every rank holds
            the same final model (the drift before it is reported).
        timeout_s: float seconds (> 0): longest wait for a ready initiator or a controller message.
        finish_timeout_s: float seconds (> 0): after some ranks finished, how long the controller
            waits without any round before it ends without the unfinished ranks.
        poll_ms: float milliseconds (> 0): polling period of the communication thread.
        seed: int >= 0, seed of the controller's probe choices.

    Returns:
        keras.optimizers.Optimizer (a subclass of the given optimizer's class).

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance.
        ValueError: an argument out of range (the message names it and what is allowed), or
            ``probes`` larger than the world size.
        RuntimeError: hetsync not initialised, or launched under Gloo (RNA needs MPI).
    """
    return wrap(optimizer, RNAProtocol(probes=probes, max_staleness=max_staleness, scale_lr=scale_lr,
                                       average_every=average_every, drift_every=drift_every,
                                       average_at_end=average_at_end, timeout_s=timeout_s,
                                       finish_timeout_s=finish_timeout_s, poll_ms=poll_ms, seed=seed))
