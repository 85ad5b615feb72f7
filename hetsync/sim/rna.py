"""RNA and hierarchical RNA: rounds chosen by an initiator while compute goes on (RNA sections 3.2, 4).

What hetsync's implementation does (:mod:`hetsync.protocols.rna.protocol`, ``control``, ``hierarchical``) and
so what is modelled:

* **Compute never waits** (except with ``wait_for_round``, below). Every rank runs its steps back to back (device
  time T_i(k) plus the host's per-step work); the step writes its gradient to the cache and reads the newest reduced
  result. Throughput is therefore the sum of the ranks' own rates, whatever the network does; the network sets how
  often rounds happen and how many fresh gradients each carries.
* **Rounds** run in each rank's communication thread, one at a time. The controller (rank 0; in
  hierarchical RNA the lowest rank of each group) probes d random ranks (power-of-d choices, section 3.2)
  as soon as it announced a round; a probed rank answers once it is out of the previous round and has a
  gradient computed since that round took the cache (the *response time*); the controller hears the
  first answer one message later, once its own thread is out of the previous round, and announces the
  round; every rank joins: one allreduce of ``[w g, w]`` (m + 4 bytes). Every ``average_every``-th round
  also averages the parameters (one more m-byte allreduce).
* **Contributors** of a round: ranks that finished a step since the previous round took the cache.
  A rank with p pending steps accumulates them with staleness weights; more than ``max_staleness + 1``
  pending steps drops the oldest (counted in ``extra["dropped"]``).
* **Waiting for the round** (``update_rule="samples"``, ``wait_for_round=True``, the main job's RNA): after
  its write a step waits until the round that takes its gradient is published, then starts the next step,
  and the controller probes every active rank. A round starts two messages (the ready answer, the
  announcement) after the later of the previous round's publication and the first gradient not yet taken,
  takes every gradient written by then, and is published one reduction later; each rank that contributed starts its
  next step at that moment. Compute waits one round's latency per step, never for a straggler's step
  (:func:`wait_loop`). With ``wait_lag=L`` a rank starts step k + 1 once the round holding step k - L's gradient
  is published, so up to L rounds of its gradients overlap its compute. Under the samples rule the parameter
  average is off unless ``average_every`` asks.
* **Hierarchical RNA** (section 4): the last ``servers`` ranks serve and do not compute; groups are the
  launch's hosts (``groups="host"``), explicit lists, or (``"auto"``) the grouping rule of section 4
  applied to the ranks' mean step times (:func:`hetsync.protocols.rna.grouping.speed_groups`). Each group
  runs the round loop above on its own, but its reduction is point to point: the m + 4 bytes of each
  member go to the round's initiator and the sum comes back (2 (g - 1) messages through the initiator's
  link, queued). Every ``sync_every``-th round the initiator also pushes its parameters to the servers,
  pulls their average (m bytes each way, sharded over the servers) and broadcasts the pulled model to
  the group (g - 1 messages of m bytes); the group's next round waits for that.

Not modelled: the communication thread's share of the host CPU (it shows in the measured ``host_ms``),
the epoch boundaries of the data plan, and the statistical effect of partial rounds (time to target goes
through the measured statistical efficiency, :mod:`hetsync.sim.target`).
"""
import numpy as np

from hetsync.protocols.rna import grouping as _grouping
from hetsync.sim.result import SimResult, throughput_until

__all__ = ["simulate", "round_loop", "wait_loop"]

_FLAT_KEYS = {"probes": 2, "max_staleness": 4, "average_every": None, "seed": 0, "update_rule": "paper",
              "wait_for_round": False, "wait_lag": 0}
_HIER_KEYS = {"probes": 2, "max_staleness": 4, "groups": "auto", "sync_every": 1, "servers": 1, "seed": 0,
              "warmup_steps": 20}


def round_loop(ends, members, round_ms, horizon_ms, probes=2, max_staleness=4, alpha_ms=0.0, rng=None,
               between_ms=None):
    """Rounds of one controller over ``members``, up to ``horizon_ms``.

    Args:
        ends: float64 array [K, n], the time (ms) each rank's step k ended (increasing along k).
        members: int array [g] of the ranks this controller serves.
        round_ms: callable ``(r) -> float`` milliseconds of round r's reduction once every member joined.
        horizon_ms: float, simulate rounds that start before this time (ms).
        probes: int d >= 1. max_staleness: int >= 0. alpha_ms: float >= 0, one message's latency (ms).
        rng: numpy Generator for the probe choices.
        between_ms: callable ``(r) -> float`` or None, milliseconds of work after round r before the next
            round may start (hierarchical RNA's push, pull and broadcast).

    Returns:
        dict: ``rounds`` (int), ``contributors`` (float array [rounds]), ``response_ms`` (float array [rounds],
        probe to answer), ``dropped`` (int), ``pending_mean`` (float, mean pending steps of a contributor).

    Raises:
        ValueError: ``probes`` < 1 or no member.
    """
    members = np.asarray(members, dtype=int)
    if members.size == 0 or probes < 1:
        raise ValueError(f"need at least one member and probes >= 1, got {members.size} members, probes={probes}")
    rng = rng or np.random.default_rng(0)
    E = ends[:, members]  # [K, g]
    d = min(int(probes), members.size)
    took = 0.0  # when the previous round took the caches
    free = 0.0  # when every member's communication thread is out of the previous round
    taken = np.zeros(members.size, dtype=int)  # steps of each member already taken by a round
    contributors, response, pending_all = [], [], []
    dropped = 0
    r = 0
    while True:
        probed = rng.choice(members.size, size=d, replace=False)
        # a probed member answers once out of the last round and with a step ended after the last take
        nxt = np.array([_next_end(E[:, j], took) for j in probed])
        answer = np.maximum(free, nxt)
        first = float(answer.min())
        if not np.isfinite(first):
            break
        announce = max(first + alpha_ms, free)
        start = announce + alpha_ms
        if start > horizon_ms:
            break
        done = (E <= start).sum(axis=0)
        pending = done - taken
        taken = done
        contributing = pending > 0
        contributors.append(int(contributing.sum()))
        response.append(first - free)
        pending_all.extend(pending[contributing].tolist())
        dropped += int(np.maximum(pending - (max_staleness + 1), 0).sum())
        took = start
        free = start + round_ms(r) + (between_ms(r) if between_ms else 0.0)
        r += 1
    return {"rounds": r, "contributors": np.asarray(contributors, dtype=float),
            "response_ms": np.asarray(response, dtype=float), "dropped": dropped,
            "pending_mean": float(np.mean(pending_all)) if pending_all else 0.0}


def wait_loop(T, host_ms, round_ms, alpha_ms=0.0, lag=0):
    """Rounds of RNA with ``wait_for_round``: each step waits for the round that takes the gradient of ``lag`` steps
    before it (``wait_lag``; 0: its own).

    Every rank writes its gradient at the end of its step (device time plus host work) and starts its next step once
    the round holding the gradient of step k - ``lag`` is published (at once for k < ``lag``); the controller, probing
    every rank, hears the first write not yet taken after the previous round was published one message later and
    announces the round one message after that; the round takes every gradient written by then (up to ``lag`` + 1 of
    a rank) and is published ``round_ms(r)`` later.

    Args:
        T: float64 array [K, n], device milliseconds of each rank's step k. host_ms: float >= 0, host
            milliseconds per step outside the device time.
        round_ms: callable ``(r) -> float`` milliseconds of round r's reduction. alpha_ms: float >= 0, one
            message's latency (ms). lag: int >= 0, the protocol's ``wait_lag`` (local iterations).

    Returns:
        dict: ``ends`` (float64 array [K, n], when each step's gradient was written, ``inf`` for steps not
        reached), ``horizon_ms`` (float, the first rank's last write: the window), ``rounds`` (int, rounds
        started before the window's end), ``contributors`` (float array [rounds], the gradients each round took),
        ``contributing_ranks`` (float array [rounds]), ``wait_ms`` (float array [n], each rank's milliseconds held
        between a write and the start of its next step, over the steps started; a publication after the window's
        end counts whole).

    Raises:
        ValueError: ``T`` is not a non-empty 2-D array of finite milliseconds >= 0, ``host_ms`` is not a finite
            number >= 0, ``lag`` is not an int >= 0, or ``round_ms`` returned a negative or non-finite time.
    """
    T = np.asarray(T, dtype=np.float64)
    if T.ndim != 2 or T.size == 0 or not np.isfinite(T).all() or (T < 0).any():
        raise ValueError(f"step times must be a non-empty [K, n] array of finite milliseconds >= 0, got shape "
                         f"{T.shape}")
    if not (np.isfinite(host_ms) and host_ms >= 0):
        raise ValueError(f"host_ms must be a finite number of milliseconds >= 0, got {host_ms!r}")
    if isinstance(lag, (bool, np.bool_)) or not isinstance(lag, (int, np.integer)) or lag < 0:
        raise ValueError(f"lag must be an int >= 0 (local iterations), got {lag!r}")
    K, n = T.shape
    cols = np.arange(n)
    W = np.full((K, n), np.inf)  # write times
    P = np.full((K, n), np.inf)  # publication of the round that took each step
    W[0] = T[0] + host_ms
    nw = np.ones(n, dtype=int)  # writes known per rank
    taken = np.zeros(n, dtype=int)  # steps taken by rounds per rank
    wait = np.zeros(n)

    def extend(until):
        # start the next step of every rank whose wait is over and whose last write is <= until (or all taken)
        while True:
            j = nw - 1 - lag
            prev = W[np.minimum(nw - 1, K - 1), cols]
            can = (nw < K) & (j < taken) & ((prev <= until) | (taken >= nw))
            if not can.any():
                return
            idx = cols[can]
            ji = j[idx]
            start = np.where(ji >= 0, np.maximum(prev[idx], P[np.maximum(ji, 0), idx]), prev[idx])
            W[nw[idx], idx] = start + T[nw[idx], idx] + host_ms
            wait[idx] += start - prev[idx]
            nw[idx] += 1

    free, r = 0.0, 0
    contributors, ranks = [], []
    while True:
        extend(-np.inf)  # a rank with every write taken has its next write known
        pending = taken < nw
        start = max(free, float(W[np.minimum(taken, K - 1), cols][pending].min())) + 2.0 * alpha_ms
        extend(start)
        new = taken.copy()
        while True:  # every write up to the round's start
            more = (new < nw) & (W[np.minimum(new, K - 1), cols] <= start)
            if not more.any():
                break
            new[more] += 1
        if (new >= K).any():  # a rank's last write: the window ends there, before this round starts
            break
        publish = start + round_ms(r)
        if not publish >= start:  # a NaN or negative reduction time would stall the loop
            raise ValueError(f"round_ms({r}) must be a finite number >= 0, got {publish - start!r}")
        for d in range(int((new - taken).max())):
            sel = taken + d < new
            P[taken[sel] + d, cols[sel]] = publish
        contributors.append(int((new - taken).sum()))
        ranks.append(int((new > taken).sum()))
        taken = new
        free = publish
        r += 1
    horizon = float(np.min(W[K - 1][np.isfinite(W[K - 1])]))
    return {"ends": W, "horizon_ms": horizon, "rounds": r, "contributors": np.asarray(contributors, dtype=float),
            "contributing_ranks": np.asarray(ranks, dtype=float), "wait_ms": wait}


def _next_end(col, t):
    """The first entry of the increasing array ``col`` greater than ``t`` (inf if none)."""
    i = int(np.searchsorted(col, t, side="right"))
    return float(col[i]) if i < col.size else float("inf")


def _as_bool(value, name):
    """``value`` as the protocols' configuration reads a bool (``true/1/yes``, ``false/0/no``, or a bool)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    low = str(value).strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError(f"rna timing model: {name} must be true or false, got {value!r}")


def _check_keys(config, allowed, protocol):
    bad = sorted(set(config) - set(allowed))
    if bad:
        raise ValueError(f"{protocol} timing model: unknown parameter(s) {', '.join(bad)}; "
                         f"allowed: {', '.join(sorted(allowed))}")
    return {**allowed, **config}


def _groups(spec, workers, net, mean_ms):
    if spec == "host":
        by = {}
        for r in range(workers):
            by.setdefault(net.host_of(r), []).append(r)
        return [by[h] for h in sorted(by)]
    if spec == "auto":
        return _grouping.speed_groups(mean_ms.tolist())
    groups = [sorted(int(r) for r in g) for g in spec]
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(workers)):
        raise ValueError(f"groups {spec!r} must hold every worker 0..{workers - 1} exactly once (no server rank)")
    return groups


def simulate(times, net, work, protocol="rna", **config):
    """Simulate flat RNA (``protocol="rna"``) or hierarchical RNA (``"rnah"``).

    Args:
        times: :class:`hetsync.sim.workload.StepTimes` [K, workers] device milliseconds (workers = n for RNA,
            n - servers for hierarchical RNA).
        net: :class:`hetsync.sim.network.Network` over the whole launch (servers are its last ranks).
        work: :class:`hetsync.sim.workload.Workload`.
        protocol: ``"rna"`` or ``"rnah"``.
        **config: RNA's ``probes``, ``max_staleness``, ``average_every`` (None: 10 under the paper's rule, 0
            under the samples rule), ``seed``, ``update_rule`` (``"paper"`` or ``"samples"``), ``wait_for_round``
            (bool, samples rule only: :func:`wait_loop`), ``wait_lag`` (int in [0, max_staleness], with the wait);
            hierarchical RNA's
            ``probes``, ``max_staleness``, ``groups`` (``"host"``, ``"auto"`` or a list of lists of worker ranks),
            ``sync_every``, ``servers``, ``warmup_steps`` (accepted, unused: the rule sees the mean step times), ``seed``.

    Returns:
        :class:`hetsync.sim.result.SimResult`: ``rounds`` (all groups), ``contributors_per_round``,
        ``staleness_mean`` (mean pending steps of a contributor, minus one: 0 when every contributor
        brings one fresh gradient), ``extra``: ``dropped``, ``response_ms_median``, ``rounds_per_s``, ``groups``.

    Raises:
        ValueError: an unknown protocol or parameter, sizes that do not match the network, bad groups, an
            ``update_rule`` other than ``"paper"``/``"samples"``, ``wait_for_round`` under the paper's rule,
            ``wait_lag`` without the wait or above ``max_staleness``.
    """
    if protocol not in ("rna", "rnah"):
        raise ValueError(f"protocol must be 'rna' or 'rnah', got {protocol!r}")
    cfg = _check_keys(config, _FLAT_KEYS if protocol == "rna" else _HIER_KEYS, protocol)
    if protocol == "rna":
        if cfg["update_rule"] not in ("paper", "samples"):
            raise ValueError(f"rna timing model: update_rule must be 'paper' or 'samples', got {cfg['update_rule']!r}")
        wait = _as_bool(cfg["wait_for_round"], "wait_for_round")
        if wait and cfg["update_rule"] != "samples":
            raise ValueError("rna timing model: wait_for_round needs update_rule='samples' (as the protocol does)")
        cfg["wait_for_round"] = wait
        lag = cfg["wait_lag"]  # an int, or its text as a --protocol-arg gives it
        if isinstance(lag, str) and lag.strip().isdigit():
            lag = int(lag)
        if isinstance(lag, (bool, np.bool_)) or not isinstance(lag, (int, np.integer)) or lag < 0:
            raise ValueError(f"rna timing model: wait_lag must be an int >= 0 (local iterations), got "
                             f"{cfg['wait_lag']!r}")
        cfg["wait_lag"] = int(lag)
        if cfg["wait_lag"] and not wait:
            raise ValueError(f"rna timing model: wait_lag={cfg['wait_lag']} needs wait_for_round=true (as the "
                             "protocol does)")
        if cfg["wait_lag"] > int(cfg["max_staleness"]):
            raise ValueError(f"rna timing model: wait_lag={cfg['wait_lag']} exceeds max_staleness="
                             f"{cfg['max_staleness']} (as the protocol refuses)")
        if cfg["average_every"] is None:
            cfg["average_every"] = 10 if cfg["update_rule"] == "paper" else 0
    servers = int(cfg.get("servers", 0)) if protocol == "rnah" else 0
    T = times.ms
    K, w = T.shape
    if w + servers != net.size:
        raise ValueError(f"step times are for {w} workers; with {servers} server(s) the network needs "
                         f"{w + servers} ranks, it has {net.size}")
    ends = np.cumsum(T + work.host_ms, axis=0)
    horizon = float(ends[-1].min())
    rng = np.random.default_rng(int(cfg["seed"]))
    lat = times.sync_latency_ms
    m = work.model_bytes
    if protocol == "rna":
        alpha_ms = net.alpha_s * 1e3 + lat
        red = net.allreduce_s(m + 4) * 1e3 + lat
        avg = net.allreduce_s(m) * 1e3
        every = int(cfg["average_every"])

        def round_ms(r):
            return red + (avg if every and (r + 1) % every == 0 else 0.0)

        if cfg["wait_for_round"]:
            return _waiting(T, work, net, round_ms, alpha_ms, cfg["wait_lag"])
        loops = [round_loop(ends, np.arange(w), round_ms, horizon, cfg["probes"], cfg["max_staleness"], alpha_ms,
                            rng)]
        groups = [list(range(w))]
    else:
        groups = _groups(cfg["groups"], w, net, T.mean(axis=0))
        server_ranks = list(range(w, w + servers))
        loops = []
        for g in groups:
            init = g[0]
            a_ms = max(net.path(r, g[0])[0] for r in g) * 1e3 + lat
            # p2p reduction through the initiator: g - 1 messages in, g - 1 out, queued on its link
            red = 2 * sum(net.p2p_s(m + 4, r, init) for r in g if r != init) * 1e3 + lat if len(g) > 1 else 0.0
            shard = m / servers
            ps = sum(2 * net.p2p_s(shard, init, s) for s in server_ranks) * 1e3 + 2 * lat
            bcast = sum(net.p2p_s(m, init, r) for r in g if r != init) * 1e3
            every = int(cfg["sync_every"])
            between = (lambda r, ps=ps, bcast=bcast, every=every: ps + bcast if len(groups) > 1 and (r + 1) % every == 0
                       else 0.0)
            loops.append(round_loop(ends, np.asarray(g), lambda r, red=red: red, horizon, cfg["probes"],
                                    cfg["max_staleness"], a_ms, rng, between))
    sps, steps = throughput_until(ends, work.batch_size, horizon)
    rounds = sum(lp["rounds"] for lp in loops)
    contrib = np.concatenate([lp["contributors"] for lp in loops]) if rounds else np.zeros(0)
    resp = np.concatenate([lp["response_ms"] for lp in loops]) if rounds else np.zeros(0)
    pend = [lp["pending_mean"] for lp in loops if lp["rounds"]]
    return SimResult(protocol, net.size, w, sps, horizon / 1e3, steps.tolist(), [0.0] * w, rounds=rounds,
                     contributors_per_round=float(contrib.mean()) if contrib.size else 0.0,
                     staleness_mean=float(np.mean(pend)) - 1.0 if pend else None,
                     extra={"dropped": sum(lp["dropped"] for lp in loops),
                            "response_ms_median": float(np.median(resp)) if resp.size else None,
                            "rounds_per_s": rounds / (horizon / 1e3), "groups": groups})


def _waiting(T, work, net, round_ms, alpha_ms, lag=0):
    """Flat RNA with ``wait_for_round`` (and ``wait_lag``) as a :class:`SimResult` (:func:`wait_loop`)."""
    loop = wait_loop(T, work.host_ms, round_ms, alpha_ms, lag)
    horizon = loop["horizon_ms"]
    sps, steps = throughput_until(loop["ends"], work.batch_size, horizon)
    contrib = loop["contributors"]
    return SimResult("rna", net.size, T.shape[1], sps, horizon / 1e3, steps.tolist(),
                     (loop["wait_ms"] / 1e3).tolist(), rounds=loop["rounds"],
                     contributors_per_round=float(contrib.mean()) if contrib.size else 0.0,
                     staleness_mean=float(np.mean(contrib / loop["contributing_ranks"])) - 1.0 if contrib.size else 0.0,
                     extra={"dropped": 0, "response_ms_median": None,
                            "rounds_per_s": loop["rounds"] / (horizon / 1e3), "groups": [list(range(T.shape[1]))]})
