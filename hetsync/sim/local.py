"""Local SGD, FedAvg and SelSync: local steps with (periodic or selective) parameter averaging.

The SelSync paper's family (section II "FedAvg / local SGD", section III, Algorithm 1). What hetsync's
implementation does (:mod:`hetsync.protocols.local`) and so what is modelled:

* **An average is a blocking collective.** Every average is one fused allreduce of the parameters plus the
  non-finite guard's flag vector (m + 4 n bytes; FedAvg with C < 1 adds its 4-byte participation weight),
  run through the protocol's ``synchronize`` (so a ``netdelay`` scenario delays it). Every rank joins every
  average, so each one is a barrier: fast ranks wait for the slowest, then all pay the allreduce.
* **Local SGD, fixed shares** (``data_plan="shard"``): the average follows local steps H, 2H, 3H, ... (counted
  per rank), so a period lasts ``max_i sum_{its H steps} (T_i(k) + host) + latency + allreduce``.
* **The sample pool** (``data_plan="pool"``, the implementation's default for local SGD and FedAvg): each epoch
  is a pool of B = max(1, N // b) batches served by rank 0 (one claim round trip per step; the epoch's last
  batch carries the N mod b remainder). Epoch e has R_e rounds (local SGD: floor(B / (H n)); FedAvg:
  floor((e + 1) s) - floor(e s) for s aggregations per epoch); round j is due once j B / R_e batches of the
  epoch were handed out. After each step a rank joins every round due by the count its own claim saw, and
  when its claim finds the pool empty, the epoch's remaining rounds. A rank whose batch was claimed before
  the count crossed a round's threshold therefore runs one more step before joining it. Fast ranks take more
  batches between rounds (work is conserved), but every round is still a barrier. This is an event
  simulation (claims served in time order; ties go to the lower rank).
* **FedAvg**: the participants of a round (round(C n), at least 1) are drawn from a shared seed, but the
  average is a *masked* allreduce that every rank joins, participants or not: non-participants wait at the
  barrier like everyone else, so C changes nothing in the timing (only ``contributors_per_round``). On fixed
  shares the aggregations follow the 0-based steps g where floor((g + 1) s / S) > floor(g s / S), S =
  floor(floor(N / n) / b) steps per epoch per rank. The paper's FedAvg idles the non-participants; the
  implementation runs every rank and masks: the model follows the implementation.
* **SelSync**: every step ends with a 4 + 4 n byte allreduce that sums the ranks' flags (and carries the
  non-finite flags) to agree whether to synchronize (Algorithm 1, line 14), so *every step* is a barrier
  (BSP's pace under stragglers), not delayed by ``netdelay``. A synchronizing step adds ``latency`` and the
  average of the parameters (m + 4 n bytes, parameter aggregation) or of the gradients (m bytes, gradient
  aggregation). Which steps synchronize is a property of training (the relative gradient change against
  delta), not of timing: it is drawn per step with probability ``sync_fraction`` from a seeded generator,
  and the first step always synchronizes (it has no previous EWMA). Data injection (alpha, beta > 0) is
  not timed: it is refused.

Samples per epoch (``samples_per_epoch``, default 60000, MNIST's training set) place the pool's rounds and
FedAvg's aggregations; the end-of-training average (``average_at_end``) is outside the measured window.
Not modelled: the pool server's share of rank 0's host (its claims' queueing is negligible: 100-byte
messages), Keras' epoch-boundary work, BatchNormalization state in the average (its bytes are not in
``work.model_bytes``).
"""
import heapq
import math

import numpy as np

from hetsync.sim.result import SimResult, throughput_until

__all__ = ["simulate", "DEFAULT_SAMPLES_PER_EPOCH", "SELSYNC_MEASURED_SYNC_FRACTION", "selsync_sync_fraction"]

#: samples per epoch when the configuration does not say (MNIST's 60,000 training images).
DEFAULT_SAMPLES_PER_EPOCH = 60000

#: (delta, fraction of synchronizing steps) measured by hetsync's SelSync benchmark on MNIST, 4 ranks, the
#: example MLP, batch 32 (documentation "SelSync", section "Measured": LSSR 0.931 / 0.995 / 0.997 at delta
#: 0.1 / 0.3 / 0.5); delta 0 is BSP (every step synchronizes).
SELSYNC_MEASURED_SYNC_FRACTION = ((0.0, 1.0), (0.1, 0.069), (0.3, 0.005), (0.5, 0.003))

_KEYS = {
    "localsgd": {"period": 8, "average_at_end": True, "data_plan": "pool",
                 "samples_per_epoch": DEFAULT_SAMPLES_PER_EPOCH},
    "fedavg": {"fraction": 1.0, "syncs_per_epoch": 1.0, "seed": 0, "average_at_end": False, "data_plan": "pool",
               "samples_per_epoch": DEFAULT_SAMPLES_PER_EPOCH},
    "selsync": {"delta": 0.3, "aggregation": "parameter", "ewma_window": 25, "smoothing": None,
                "data_order": "seldp", "alpha": 0.0, "beta": 0.0, "inject_timeout_s": 120.0,
                "average_at_end": True, "sync_fraction": None, "seed": 0},
}

#: bytes of a pool claim request (a pickled ``("claim", epoch, seq)``) and of a reply's header.
_CLAIM_BYTES = 64
_REPLY_HEADER_BYTES = 100


def selsync_sync_fraction(delta):
    """The typical fraction of SelSync steps that synchronize at threshold ``delta``.

    Piecewise-linear in :data:`SELSYNC_MEASURED_SYNC_FRACTION` (hetsync's measured LSSR, SelSync paper eq. 4:
    fraction = 1 - LSSR), constant beyond its last point; 1 at delta 0 (BSP) and 0 at an infinite delta
    (local SGD after the first step).

    Args:
        delta: float >= 0 (or ``math.inf``), the threshold on the relative gradient change (eq. 2).

    Returns:
        float in [0, 1].

    Raises:
        ValueError: a negative or NaN delta.
    """
    d = float(delta)
    if not d >= 0:
        raise ValueError(f"selsync: delta must be >= 0, got {delta!r}")
    if d == 0:
        return 1.0
    if math.isinf(d):
        return 0.0
    xs, ys = zip(*SELSYNC_MEASURED_SYNC_FRACTION)
    return float(np.interp(d, xs, ys))


def _config(protocol, config):
    """The full configuration: defaults of ``protocol`` updated by ``config`` (unknown keys refused)."""
    if protocol not in _KEYS:
        raise ValueError(f"hetsync.sim.local models protocols {', '.join(sorted(_KEYS))}, got {protocol!r}")
    allowed = _KEYS[protocol]
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"{protocol}: unknown timing parameter(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(sorted(allowed))}")
    cfg = dict(allowed, **config)
    if "data_plan" in cfg and cfg["data_plan"] not in ("pool", "shard"):
        raise ValueError(f"{protocol}: data_plan must be 'pool' or 'shard', got {cfg['data_plan']!r}")
    if "samples_per_epoch" in cfg:
        N = cfg["samples_per_epoch"]
        if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
            raise ValueError(f"{protocol}: samples_per_epoch must be an int >= 1 (training samples), got {N!r}")
    return cfg


def _step_durations(times, net, work):
    """Device plus host milliseconds of every step ([K, n] float64), after checking the sizes."""
    T = np.asarray(times.ms, dtype=np.float64)
    if T.ndim != 2 or T.shape[1] != net.size:
        raise ValueError(f"step times are for {T.shape[-1] if T.ndim else 0} ranks but the network has "
                         f"{net.size}; every rank of these protocols is a worker")
    return T, T + work.host_ms


def _segments(d, sync, comm_ms):
    """Fixed shares: ranks step independently and meet at every step that ends with an average.

    Args:
        d: float64 [K, n], milliseconds of each local step (device + host).
        sync: bool [K], step k ends with an average (the same step index on every rank).
        comm_ms: float, milliseconds of one average (latency + allreduce), paid after the barrier.

    Returns:
        ``(ends, barrier_wait, release)``: float64 [K, n] end time (ms) of each step (a synchronizing step ends
        when the average does), float64 [S, n] milliseconds each rank spent at each average (waiting plus
        the allreduce), float64 [S] the end time of each average (ms).
    """
    K, n = d.shape
    c0 = np.vstack([np.zeros((1, n)), np.cumsum(d, axis=0)])  # c0[k]: time of the first k steps
    idx = np.flatnonzero(sync)
    starts = np.concatenate([[0], idx + 1])
    starts = starts[starts < K]
    last = np.concatenate([starts[1:] - 1, [K - 1]])
    seg = np.zeros(K, dtype=np.int64)
    seg[starts[1:]] = 1
    seg = np.cumsum(seg)
    local = c0[last + 1] - c0[starts]  # [S, n] compute of each rank in each segment
    ends_sync = sync[last]
    slowest = local.max(axis=1)
    length = np.where(ends_sync, slowest + comm_ms, 0.0)
    t0 = np.concatenate([[0.0], np.cumsum(length)[:-1]])
    ends = t0[seg][:, None] + (c0[1:] - c0[starts[seg]])
    release = t0 + length
    ends[last[ends_sync]] = release[ends_sync][:, None]
    wait = np.where(ends_sync[:, None], slowest[:, None] - local + comm_ms, 0.0)
    return ends, wait[ends_sync], release[ends_sync]


def _pool(T, work, rtt_ms, comm_ms, samples_per_epoch, rounds_in_epoch):
    """The sample pool: an event simulation of claims, steps and the rounds' barriers.

    Args:
        T: float64 [K, n] device milliseconds per b samples. work: the workload (b, host milliseconds).
        rtt_ms: float64 [n], milliseconds of one claim round trip to the pool server (rank 0).
        comm_ms: float, milliseconds of one average after its barrier.
        samples_per_epoch: int N. rounds_in_epoch: callable ``(epoch) -> int`` R_e.

    Returns:
        ``(ends, samples, waits, releases)``: float64 [K, n] step end times (ms, ``inf`` for steps never run),
        float64 [K, n] samples of each step, list of ``(rank, arrival_ms, release_ms)`` barrier waits, sorted
        list of the rounds' release times (ms).
    """
    K, n = T.shape
    b, host = work.batch_size, work.host_ms
    N = int(samples_per_epoch)
    B = max(1, N // b)
    last_samples = N - (B - 1) * b  # b + N mod b (N itself when N < b)
    ends = np.full((K, n), np.inf)
    samples = np.zeros((K, n))
    k = [0] * n
    epoch = [0] * n
    joined = [0] * n
    target = [0] * n
    handed = {}
    base = [0]  # rounds before epoch e

    def rounds_before(e):
        while len(base) <= e:
            base.append(base[-1] + rounds_in_epoch(len(base) - 1))
        return base[e]

    heap = [(0.0, i) for i in range(n)]
    heapq.heapify(heap)
    arrived = {}  # round -> list of (rank, time)
    waits, releases = [], []
    horizon = math.inf

    def proceed(i, t):
        # rank i is free at t: join its next due round, or go claim a batch
        pending = [(i, t)]
        while pending:
            j, tj = pending.pop()
            if joined[j] < target[j]:
                r = joined[j] + 1
                group = arrived.setdefault(r, [])
                group.append((j, tj))
                if len(group) == n:
                    del arrived[r]
                    rel = max(a for _, a in group) + comm_ms
                    releases.append(rel)
                    for q, a in group:
                        joined[q] = r
                        waits.append((q, a, rel))
                        pending.append((q, rel))
            else:
                heapq.heappush(heap, (tj, j))

    while heap:
        t, i = heapq.heappop(heap)
        if t >= horizon:
            break
        e = epoch[i]
        h = handed.get(e, 0)
        if h < B:
            h += 1
            handed[e] = h
            s = b if h < B else last_samples
            end = t + rtt_ms[i] + host + T[k[i], i] * s / b
            ends[k[i], i] = end
            samples[k[i], i] = s
            k[i] += 1
            if k[i] == K:  # out of draws: the measured window ends with this step
                horizon = min(horizon, end)
                continue
            R = rounds_in_epoch(e)
            due = int(math.floor(h * R / B + 1e-9)) if R else 0
            target[i] = rounds_before(e) + due
            proceed(i, end)
        else:  # the pool is empty: the epoch ends, join its remaining rounds
            epoch[i] = e + 1
            target[i] = rounds_before(e + 1)
            proceed(i, t + rtt_ms[i])
    return ends, samples, waits, sorted(releases)


def _window(ends, samples, protocol):
    """Horizon (ms: the first rank's last draw ends), samples/s and steps of the measured window."""
    finished = np.where(np.isfinite(ends[-1]), ends[-1], np.inf)
    horizon = float(finished.min())
    if not np.isfinite(horizon):
        raise ValueError(f"{protocol}: no rank completed its draws (deadlock in the model)")
    sps, steps = throughput_until(ends, samples, horizon)
    return horizon, sps, steps


def simulate(times, net, work, protocol="localsgd", **config):
    """Simulate local SGD, FedAvg or SelSync (SelSync paper sections II-III, Algorithm 1; Table I's baselines).

    Args:
        times: :class:`hetsync.sim.workload.StepTimes`, float64 [K, n] device milliseconds per step of b samples
            (n = ``net.size``; every rank is a worker).
        net: :class:`hetsync.sim.network.Network`. work: :class:`hetsync.sim.workload.Workload` (m bytes, b
            samples, host milliseconds per step).
        protocol: str, ``"localsgd"``, ``"fedavg"`` or ``"selsync"``.
        **config: the protocol's configuration fields. localsgd: ``period`` (int H >= 1), ``data_plan``
            (``"pool"`` default, ``"shard"``), ``average_at_end``, ``samples_per_epoch`` (int N samples, default
            60000). fedavg: ``fraction`` (C in (0, 1]), ``syncs_per_epoch`` (s > 0), ``seed``, ``data_plan``,
            ``average_at_end``, ``samples_per_epoch``. selsync: ``delta`` (>= 0), ``aggregation``
            (``"parameter"``/``"gradient"``), ``alpha``, ``beta`` (0: no data injection), the timing-neutral
            ``ewma_window``, ``smoothing``, ``data_order``, ``inject_timeout_s``, ``average_at_end``, and the
            model's ``sync_fraction`` (float in [0, 1], fraction of steps that synchronize; default
            :func:`selsync_sync_fraction` of delta) and ``seed`` (int, the per-step draw).

    Returns:
        :class:`hetsync.sim.result.SimResult`; ``rounds`` = averages completed in the window, ``extra`` with
        ``allreduce_ms`` (one average, milliseconds), the data plan, rounds per epoch, ``sync_fraction``.

    Raises:
        ValueError: an unknown protocol or configuration key (names the allowed ones), a value out of range,
            step times for a world size other than ``net.size``, SelSync data injection, fixed shares smaller
            than one batch.
    """
    cfg = _config(protocol, config)
    T, d = _step_durations(times, net, work)
    K, n = T.shape
    m, b, lat = int(work.model_bytes), int(work.batch_size), float(times.sync_latency_ms)
    flags = 4 * n
    if protocol == "selsync":
        return _selsync(T, d, net, work, lat, cfg)
    if protocol == "localsgd":
        H = cfg["period"]
        if isinstance(H, bool) or not isinstance(H, (int, np.integer)) or H < 1:
            raise ValueError(f"localsgd: period must be an int H >= 1 (local steps between averages), got {H!r}")
        payload, participants = m + flags, n
    else:
        C, s = cfg["fraction"], cfg["syncs_per_epoch"]
        if not (isinstance(C, (int, float, np.floating)) and 0 < C <= 1):
            raise ValueError(f"fedavg: fraction must be a float C in (0, 1], got {C!r}")
        if not (isinstance(s, (int, float, np.floating)) and s > 0 and math.isfinite(s)):
            raise ValueError(f"fedavg: syncs_per_epoch must be a float > 0 (aggregations per epoch), got {s!r}")
        participants = max(1, int(round(C * n)))
        payload = m + flags + (4 if participants < n else 0)
    comm_ms = net.allreduce_s(payload) * 1e3 + lat
    N = int(cfg["samples_per_epoch"])
    extra = {"allreduce_ms": comm_ms, "data_plan": cfg["data_plan"], "payload_bytes": payload}
    if cfg["data_plan"] == "shard":
        if protocol == "localsgd":
            sync = (np.arange(K) + 1) % H == 0
            extra["period"] = H
        else:
            S = (N // n) // b
            if S < 1:
                raise ValueError(f"fedavg: fixed shares of {N // n} samples per rank hold no full batch of {b}; "
                                 f"give more samples_per_epoch or the pool")
            g = np.arange(K, dtype=np.float64)
            sync = np.floor((g + 1) * s / S + 1e-9) > np.floor(g * s / S + 1e-9)
            extra["steps_per_epoch"] = S
        ends, bw, release = _segments(d, sync, comm_ms)
        samples = float(b)
        horizon, sps, steps = _window(ends, samples, protocol)
        inside = release <= horizon + 1e-9
        wait = bw[inside].sum(axis=0) / 1e3
        rounds = int(inside.sum())
    else:
        B = max(1, N // b)
        if protocol == "localsgd":
            per = B // (H * n)
            extra.update(period=H, rounds_per_epoch=per)

            def rounds_in_epoch(e):
                return per
        else:
            def rounds_in_epoch(e):
                return int(math.floor((e + 1) * s + 1e-9) - math.floor(e * s + 1e-9))
        rtt = np.array([(net.p2p_s(_CLAIM_BYTES, i, 0) + net.p2p_s(_REPLY_HEADER_BYTES + 8 * b, 0, i)) * 1e3
                        for i in range(n)]) if n > 1 else np.zeros(1)
        ends, samp, waits, releases = _pool(T, work, rtt, comm_ms, N, rounds_in_epoch)
        horizon, sps, steps = _window(ends, samp, protocol)
        wait = rtt * steps
        for q, a, rel in waits:
            if a < horizon:
                wait[q] += min(rel, horizon) - a
        wait = wait / 1e3
        rounds = int(np.searchsorted(np.asarray(releases), horizon + 1e-9))
        extra.update(batches_per_epoch=B, claim_rtt_ms=float(rtt.mean()),
                     batches_per_rank=[int(v) for v in steps])
    total_steps = int(steps.sum())
    extra["sync_fraction"] = rounds * n / total_steps if total_steps else 0.0
    if protocol == "fedavg":
        extra["participants"] = participants
    return SimResult(protocol, n, n, sps, horizon / 1e3, [int(v) for v in steps], [float(w) for w in wait],
                     rounds=rounds, contributors_per_round=float(participants), staleness_mean=None, extra=extra)


def _selsync(T, d, net, work, lat, cfg):
    """SelSync: a flag allreduce (a barrier) every step, an average on the drawn synchronizing steps."""
    K, n = T.shape
    delta, f = cfg["delta"], cfg["sync_fraction"]
    if not (isinstance(delta, (int, float, np.floating)) and delta >= 0):
        raise ValueError(f"selsync: delta must be a float >= 0, got {delta!r}")
    if cfg["aggregation"] not in ("parameter", "gradient"):
        raise ValueError(f"selsync: aggregation must be 'parameter' or 'gradient', got {cfg['aggregation']!r}")
    if cfg["alpha"] > 0 and cfg["beta"] > 0:
        raise ValueError("selsync: the timing model does not cover data injection (alpha, beta > 0: per-step "
                         "point-to-point sample exchange); predict with alpha=0 or beta=0")
    typical = selsync_sync_fraction(delta)
    if f is None:
        f, source = typical, "measured LSSR at this delta (SELSYNC_MEASURED_SYNC_FRACTION)"
    else:
        if isinstance(f, bool) or not isinstance(f, (int, float, np.floating)) or not 0 <= f <= 1:
            raise ValueError(f"selsync: sync_fraction must be a float in [0, 1], got {f!r}")
        if (delta == 0 and f != 1) or (math.isinf(delta) and f != 0):
            raise ValueError(f"selsync: delta={delta} fixes the sync fraction at {typical}, got sync_fraction={f}")
        source = "given"
    seed = cfg["seed"]
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"selsync: seed must be an int >= 0, got {seed!r}")
    sync = np.random.default_rng(int(seed)).random(K) < f
    sync[0] = True  # the first step always flags: there is no previous EWMA
    flag_ms = net.allreduce_s(4 + 4 * n) * 1e3
    payload = int(work.model_bytes) + (4 * n if cfg["aggregation"] == "parameter" else 0)
    avg_ms = net.allreduce_s(payload) * 1e3 + lat
    slowest = d.max(axis=1)
    step = slowest + flag_ms + sync * avg_ms
    end = np.cumsum(step)
    ends = np.broadcast_to(end[:, None], (K, n))
    horizon = float(end[-1])
    sps, steps = throughput_until(ends, float(work.batch_size), horizon)
    wait = ((slowest[:, None] - d).sum(axis=0) + K * flag_ms + sync.sum() * avg_ms) / 1e3
    rounds = int(sync.sum())
    return SimResult("selsync", n, n, sps, horizon / 1e3, [int(v) for v in steps], [float(w) for w in wait],
                     rounds=rounds, contributors_per_round=float(n), staleness_mean=None,
                     extra={"sync_fraction": rounds / K, "sync_fraction_given": float(f),
                            "sync_fraction_source": source, "flag_exchanges": K, "flag_allreduce_ms": flag_ms,
                            "allreduce_ms": avg_ms, "aggregation": cfg["aggregation"]})
