"""The parameter-server side: sharding plans and the server loop (SHAT Algorithm 1, lines 11-23; SSP's gate).

Ko & Kim, "SHAT: A Novel Asynchronous Training Algorithm That Provides Fast Model Convergence in
Distributed Deep Learning" (Appl. Sci. 2022), section 3 and Algorithm 1; section 4.4 for the sharding;
``docs/protocols/shat.md`` and ``docs/protocols/ssp.md`` resolve the open points.

Every server owns one contiguous range [lo, hi) of the *flattened* parameter vector (the trainable
variables concatenated in the model's order, each flattened in C order):

* layer-wise sharding (``"layer"``): whole variables, contiguous blocks of ceil(L / K) or floor(L / K)
  variables per server (counts differ by at most 1), so a range starts and ends on variable boundaries;
* memory-wise sharding (``"memory"``): the flat vector cut into K contiguous chunks whose sizes differ
  by at most one element (large variables are split).

The loop (:class:`ParameterServer`) serves pushes in arrival order, one at a time: worker i's push of
its iteration t carries its gradient shard g and learning rate eta; the server adds 1 to every other
worker's counter, applies w~ <- w~ - eta g (float32, no averaging over workers), and replies with the
post-update shard and c_i (the counter before its reset), then resets C[i] = 0. With SSP's staleness
bound s the reply to the push of iteration t (the worker's clock becomes t + 1) is held back until the
slowest unfinished worker's clock is at least t + 1 - s: the worker starts iteration t + 1 only then
(the gate), with the model as it is when the reply leaves.
"""
import math
import time

import numpy as np

from hetsync import transport, world
from hetsync.errors import PSError
from hetsync.transport import channels

__all__ = ["plan_shards", "ParameterServer", "PSError", "PUSH", "PULL", "ERROR", "SHARDINGS", "STALE_LR",
           "MOMENTUM_CORRECTIONS", "explicit_momentum"]

#: worker -> server: tag = the worker's iteration t (int) or ``"done"``; obj = ``(eta, g shard, sent_at)``.
PUSH = channels.PS_PUSH
#: server -> worker: tag = t; obj = ``(w~ shard float32 [hi - lo], c_i int)``.
PULL = channels.PS_PULL
#: server -> worker: a server's failure, obj = the message (the worker raises it at once).
ERROR = channels.PS_ERROR
#: the sharding modes of section 4.4.
SHARDINGS = ("layer", "memory")
#: the servers' learning-rate rules for a push: eta as sent, or eta / c_i (staleness-aware asynchronous SGD).
STALE_LR = ("constant", "inverse")
#: how the servers' explicit momentum follows the number of asynchronous workers (:func:`explicit_momentum`).
MOMENTUM_CORRECTIONS = ("none", "asynchrony")
#: SSP lead histogram range: t + 1 - min clock at a reply, clipped to [0, LEAD_RANGE].
LEAD_RANGE = 32


def plan_shards(sizes, servers, mode):
    """Split the flattened parameter vector over ``servers`` servers (SHAT section 4.4).

    Args:
        sizes: list of int >= 0, the element count of every trainable variable, in the model's order.
        servers: int K >= 1.
        mode: ``"layer"`` (whole variables, contiguous blocks, variable counts differing by at most 1) or
            ``"memory"`` (contiguous chunks of the flat vector whose sizes differ by at most 1 element).

    Returns:
        list of K ``(lo, hi)`` int pairs: server k owns flat elements [lo, hi); the ranges are disjoint,
        contiguous, in order and cover [0, sum(sizes)).

    Raises:
        ValueError: an unknown mode, K < 1, or more servers than parameters (K > number of variables
            for ``"layer"``, K > number of elements for ``"memory"``).
    """
    sizes = [int(s) for s in sizes]
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"servers must be an int >= 1, got {servers!r}")
    if mode not in SHARDINGS:
        raise ValueError(f"sharding must be one of {SHARDINGS}, got {mode!r}")
    total = sum(sizes)
    if mode == "layer":
        if servers > len(sizes):
            raise ValueError(f"more servers than parameters: layer-wise sharding gives whole variables to servers, "
                             f"and the model has {len(sizes)} trainable variable(s) for servers={servers}; use "
                             f"servers <= {len(sizes)} or sharding='memory'")
        q, r = divmod(len(sizes), servers)
        counts = [q + 1] * r + [q] * (servers - r)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        out, first = [], 0
        for c in counts:
            out.append((int(offsets[first]), int(offsets[first + c])))
            first += c
        return out
    if servers > total:
        raise ValueError(f"more servers than parameters: the model has {total} parameter(s) for servers={servers}")
    q, r = divmod(total, servers)
    out, lo = [], 0
    for k in range(servers):
        hi = lo + q + (1 if k < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def explicit_momentum(mu, workers, correction="none"):
    """The servers' explicit heavy-ball momentum mu_L for a target momentum mu and n asynchronous workers.

    Mitliagkas, Zhang, Hadjis and Re, "Asynchrony begets momentum, with an application to deep learning"
    (Allerton 2016), main theorem: under a queueing model of n workers updating one model asynchronously
    (staleness geometric), the expected update is that of momentum SGD with an implicit momentum
    mu_S = 1 - 1/n, so the explicit momentum should be lowered as n grows for the total to stay at the tuned
    mu. ``"asynchrony"`` returns mu_L = max(0, mu - (1 - 1/n)) (the paper's negative explicit momentum under
    high asynchrony is not offered); ``"none"`` returns mu.

    Args:
        mu: float in [0, 1), the momentum the servers should apply in total (``server_momentum``).
        workers: int n >= 1, the number of workers pushing asynchronously.
        correction: ``"none"`` or ``"asynchrony"``.

    Returns:
        float mu_L in [0, mu].

    Raises:
        ValueError: mu outside [0, 1), n < 1 or an unknown correction.
    """
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"server momentum must be in [0, 1), got {mu!r}")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"the number of workers must be an int >= 1, got {workers!r}")
    if correction not in MOMENTUM_CORRECTIONS:
        raise ValueError(f"momentum_correction must be one of {', '.join(MOMENTUM_CORRECTIONS)}, got {correction!r}")
    if correction == "none":
        return float(mu)
    return max(0.0, float(mu) - (1.0 - 1.0 / int(workers)))


class ParameterServer:
    """One server's shard and loop (SHAT Algorithm 1, lines 11-23), with SSP's optional gate.

    Args:
        p2p: the process's :class:`hetsync.transport.p2p.Dispatcher`.
        index: int k, this server's index in [0, K) (for messages).
        w0: float32 array [hi - lo], the shard of the initial global model (rank 0's weights).
        workers: list of the n worker ranks (ints).
        staleness: None (reply at once: SHAT, ASP, ENSEMBLE, SHAT-root) or int s >= 0 (SSP: hold the
            reply to the push of iteration t until min over unfinished workers of their clocks >= t + 1 - s).
        timeout_s: float seconds > 0: the server fails when an unfinished worker that is not waiting
            for a held-back reply has sent nothing for this long.
        stale_lr: ``"constant"`` (Algorithm 1 line 21: w~ <- w~ - eta g) or ``"inverse"``: a push whose
            counter c_i (the updates by other workers since this worker's previous push: the gradient's
            staleness tau) is >= 1 is applied with eta / c_i (the staleness-dependent learning rate alpha_0 /
            tau of Zhang, Gupta, Lian and Liu, "Staleness-aware Async-SGD for Distributed Deep Learning",
            IJCAI 2016).
        momentum: float mu_L in [0, 1), the server's heavy-ball momentum: per shard a velocity
            u <- mu_L u + s g (s the ``stale_lr`` factor) and w~ <- w~ - eta u; 0 (default) is Algorithm 1's
            plain w~ <- w~ - eta g. :func:`explicit_momentum` gives mu_L corrected for asynchrony.

    Raises:
        ValueError: bad arguments.
    """

    def __init__(self, p2p, index, w0, workers, staleness=None, timeout_s=120.0, stale_lr="constant", momentum=0.0):
        if not workers:
            raise ValueError("a parameter server needs at least one worker")
        if staleness is not None and (isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0):
            raise ValueError(f"staleness must be None or an int >= 0, got {staleness!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        if stale_lr not in STALE_LR:
            raise ValueError(f"stale_lr must be one of {', '.join(STALE_LR)}, got {stale_lr!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"server momentum must be in [0, 1), got {momentum!r}")
        self.stale_lr = stale_lr
        self.momentum = float(momentum)
        #: sum over applied pushes of the learning-rate factor (1, or 1 / c_i under ``stale_lr="inverse"``).
        self.lr_scale_sum = 0.0
        self.p2p, self.index = p2p, int(index)
        self.w = np.array(w0, dtype=np.float32, copy=True)
        #: the heavy-ball velocity u, float32 [hi - lo] (None without momentum).
        self.velocity = np.zeros_like(self.w) if self.momentum > 0.0 else None
        self.workers = [int(r) for r in workers]
        self._slot = {r: j for j, r in enumerate(self.workers)}
        # wall seconds of this run: the emulated cluster's timeout times the dilation D
        self.staleness, self.timeout_s = staleness, world.dilated(float(timeout_s))
        n = len(self.workers)
        #: C: one counter per worker (Algorithm 1 line 11), int64 [n].
        self.counters = np.zeros(n, np.int64)
        #: SSP clocks: completed (pushed and applied) iterations per worker, int64 [n].
        self.clocks = np.zeros(n, np.int64)
        self.done = np.zeros(n, bool)
        self.pushes = np.zeros(n, np.int64)
        self.pulls = np.zeros(n, np.int64)
        self.returned_c = np.zeros(n, np.int64)
        self.order = []  # (worker rank, iteration) in the order the pushes were applied
        self.queue_wait_ms = []
        self.idle_s = 0.0
        self.busy_s = 0.0
        self.held = 0
        self.lead_hist = np.zeros(LEAD_RANGE + 1, np.int64)
        self.max_lead = 0
        self._pending = []  # held-back replies: (slot, iteration, c)
        self._new = None

    # -- the loop ------------------------------------------------------------------------------------
    def serve(self):
        """Serve pushes until every worker said it is done.

        Returns:
            dict of statistics (see :meth:`stats`).

        Raises:
            PSError: an unfinished worker (not waiting on a held-back reply) silent for ``timeout_s``,
                a push out of order or of the wrong shape. Before raising, every unfinished worker is
                told on channel :data:`ERROR`, so it fails at once instead of waiting out its own timeout.
            hetsync.transport.TransportError: the dispatcher failed.
        """
        try:
            self._loop()
        except PSError as exc:
            self.p2p.tell([r for j, r in enumerate(self.workers) if not self.done[j]], ERROR, str(exc))
            raise
        return self.stats()

    def _loop(self):
        heard = np.full(len(self.workers), time.monotonic())
        while not self.done.all():
            t0 = time.monotonic()
            message = self.p2p.poll(PUSH)
            if message is None:
                waiting = {s for s, _, _ in self._pending}
                silent = [j for j in range(len(self.workers)) if not self.done[j] and j not in waiting]
                deadline = min(heard[j] for j in silent) + self.timeout_s if silent else t0 + self.timeout_s
                try:
                    message = self.p2p.recv(PUSH, timeout_s=max(0.0, min(deadline - t0, 1.0)))
                except transport.TransportTimeout:
                    now = time.monotonic()
                    self.idle_s += now - t0
                    late = [self.workers[j] for j in silent if now - heard[j] >= self.timeout_s]
                    if late:
                        raise PSError(
                            f"parameter server {self.index} (rank {self.p2p.rank}): no message from worker rank(s) "
                            f"{late} within {self.timeout_s:g} s (they have not finished; dead or stalled). "
                            f"Pushes so far per worker: {dict(zip(self.workers, self.pushes.tolist()))}") from None
                    if not silent and now - t0 >= self.timeout_s:
                        raise PSError(f"parameter server {self.index}: every unfinished worker waits on a held-back "
                                      f"reply and none pushed for {self.timeout_s:g} s (clocks {self.clocks.tolist()})")
                    continue
                self.idle_s += time.monotonic() - t0
            t1 = time.monotonic()
            slot = self._slot.get(message.source)
            if slot is None:
                raise PSError(f"parameter server {self.index}: a push from rank {message.source}, which is not a "
                              f"worker (workers: {self.workers})")
            heard[slot] = t1
            if message.tag == "done":
                self.done[slot] = True
            else:
                self._apply(slot, message)
            self._release()
            self.busy_s += time.monotonic() - t1

    def _apply(self, slot, message):
        t = message.tag
        eta, g, sent_at = message.obj
        if not isinstance(t, int) or t != self.clocks[slot]:
            raise PSError(f"parameter server {self.index}: worker rank {message.source} pushed iteration {t!r}, "
                          f"expected {int(self.clocks[slot])} (pushes arrive in order)")
        g = np.asarray(g)
        if g.shape != self.w.shape or g.dtype != np.float32:
            raise PSError(f"parameter server {self.index}: worker rank {message.source} pushed a {g.dtype} shard of "
                          f"shape {g.shape}; this server holds float32 {self.w.shape}")
        self.queue_wait_ms.append(max(0.0, (time.time() - float(sent_at)) * 1e3))
        # Algorithm 1 lines 16-23: every other worker's counter + 1, the update, the reply with c_i, then C[i] = 0
        c = int(self.counters[slot])
        self.counters += 1
        self.counters[slot] = 0
        scale = 1.0 / c if self.stale_lr == "inverse" and c > 1 else 1.0
        self.lr_scale_sum += scale
        if self.velocity is None:
            self.w -= np.float32(eta * scale) * g
        else:
            self.velocity *= np.float32(self.momentum)
            self.velocity += np.float32(scale) * g
            self.w -= np.float32(eta) * self.velocity
        self.clocks[slot] = t + 1
        self.pushes[slot] += 1
        self.order.append((self.workers[slot], t))
        self._pending.append((slot, t, c))
        self._new = (slot, t, c)

    def _release(self):
        if not self._pending:
            return
        active = ~self.done
        low = int(self.clocks[active].min()) if active.any() else math.inf
        keep = []
        for slot, t, c in self._pending:
            if self.staleness is None or low >= t + 1 - self.staleness:
                if self.staleness is not None:
                    lead = 0 if low == math.inf else max(0, t + 1 - int(low))
                    self.max_lead = max(self.max_lead, lead)
                    self.lead_hist[min(lead, LEAD_RANGE)] += 1
                self.p2p.send(self.workers[slot], PULL, (self.w, c), tag=t)  # isend pickles w now
                self.pulls[slot] += 1
                self.returned_c[slot] += c
            else:
                keep.append((slot, t, c))
        if self._new is not None and self._new in keep:
            self.held += 1  # the reply to the push just applied waits for the slowest worker
        self._new = None
        self._pending = keep

    # -- results ---------------------------------------------------------------------------------------
    def stats(self):
        """Return this server's statistics (JSON-serialisable dict): ``pushes`` and ``pulls`` (total and
        per worker rank), ``final_counters`` (C at the end, per worker), ``returned_c_sum`` (per worker),
        ``queue_wait_ms`` (send-to-service latency of the pushes: mean, p50, p95, max, in ms; includes the
        transfer and assumes the hosts' clocks agree), ``idle_s`` / ``busy_s`` (seconds waiting for a push /
        serving), ``updates`` (= pushes), ``stale_lr`` and ``lr_scale_mean`` (the mean factor on eta over the
        applied pushes; None before any), ``momentum`` (mu_L, the explicit momentum applied), and with SSP
        ``gate_max_lead`` (largest t + 1 - min clock at a reply, <= s), ``gate_held_replies`` (replies held
        back by the gate) and ``gate_lead_histogram``."""
        q = np.asarray(self.queue_wait_ms, np.float64)
        out = {
            "server": self.index, "rank": self.p2p.rank, "updates": int(self.pushes.sum()),
            "pushes": int(self.pushes.sum()), "pulls": int(self.pulls.sum()),
            "pushes_per_worker": {str(r): int(v) for r, v in zip(self.workers, self.pushes)},
            "pulls_per_worker": {str(r): int(v) for r, v in zip(self.workers, self.pulls)},
            "final_counters": {str(r): int(v) for r, v in zip(self.workers, self.counters)},
            "returned_c_sum": {str(r): int(v) for r, v in zip(self.workers, self.returned_c)},
            "queue_wait_ms": ({"mean": float(q.mean()), "p50": float(np.percentile(q, 50)),
                               "p95": float(np.percentile(q, 95)), "max": float(q.max())} if q.size else None),
            "idle_s": self.idle_s, "busy_s": self.busy_s, "shard_elements": int(self.w.size),
            "stale_lr": self.stale_lr, "momentum": self.momentum,
            "lr_scale_mean": self.lr_scale_sum / int(self.pushes.sum()) if self.pushes.sum() else None,
        }
        if self.staleness is not None:
            out["gate_max_lead"] = int(self.max_lead)
            out["gate_held_replies"] = int(self.held)
            out["gate_lead_histogram"] = {str(k): int(v) for k, v in enumerate(self.lead_hist) if v}
        return out
