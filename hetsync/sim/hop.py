"""Simulate Hop's and NOTIFY-ACK's iteration timing: the zero-cost rule model, and the cluster model with links.

``python -m hetsync.sim.hop [--graph ring-based] [--ranks 8] [--scenario random] [--max-ig 10]``

**The rule model** (:func:`simulate`): a discrete-event model of Hop (sections 3-5) with zero communication
cost: rank i's iteration k
takes T_i(k) ms of compute (``base_ms`` times the scenario's factor: ``random``, each step each rank
6x slower with probability 1/n, section 7.3.1; ``deterministic``, the last rank always 4x slower,
section 7.3.5; ``none``). With S_i(k) the time rank i enters iteration k (and sends its update) and
E_i(k) the time it leaves it:

* E_i(k) = max(S_i(k) + T_i(k), R_i(k)), the wait R for updates: standard, the last of the
  in-neighbours' S_j(k); backup workers, the (``|N_in(i)|`` - 1 - N_buw)-th earliest of them (the own
  update is there at once); staleness s, the last of the S_j(k - s) (each neighbour's update of
  iteration k - s or newer has arrived);
* S_i(k + 1) = max(E_i(k), S_j(k + 1 - max_ig) for every out-neighbour j): the token bound
  Iter(i) - Iter(j) <= max_ig (Theorem 2);
* skipping (``skip=J_max``): when rank i leaves k0 at least ``skip_trigger`` iterations behind every
  out-neighbour, it enters k = min(k0 + J_max, min_j Iter_j) instead of k0 + 1 (section 5; the
  updates of iteration k - 1 it averages have all arrived, since its neighbours are past k - 1).

The hetsync runs on the emulated cluster (``device:MS``) come within about 10% of this model, whose
figures are the ceiling the rules allow (the Hop page's measured figures): for example backup workers on
ring-based(8) under ``random`` gain at most 1.34x iterations/s over standard Hop, at max_ig = 10.

**The cluster model** (:func:`simulate_cluster`; the registry's ``hop`` and ``notifyack``) adds links and
the host's per-step work, following :mod:`hetsync.protocols.hop.protocol` and ``notifyack``:

* **Hop** (Figure 4): entering k at S_i(k), rank i sends a token to each in-neighbour and x_{k,i} to each
  out-neighbour, computes ``host_ms + T_i(k)``, and its Recv waits for all in-neighbour updates tagged k
  (standard), the (d_i - N_buw)-th earliest (backup workers, Figure 8; d_i = ``|N_in(i)|`` - 1, the own update
  is there at once), or each in-neighbour's update of k - s or newer (staleness s, from k >= s on):
  E_i(k) = max(S_i(k) + host + T_i(k), R_i(k)). Leaving k it takes a token per out-neighbour j:
  S_i(k + 1) = max(E_i(k), arrival of j's token of its entry to k + 1 - max_ig) (Figure 7, Theorem 2).
* **NOTIFY-ACK** (section 3.3, Figure 2(a)): compute and apply (C_i(k)); wait for ACK(k - 1) of every
  out-neighbour (ACK(-1) implicit); send at W_i(k); wait for all ``|N_in(i)|`` updates of k; send ACK(k) to the
  in-neighbours at D_i(k) = S_i(k + 1).
* **Links**: an update of m = ``model_bytes`` bytes occupies its sender m / beta and arrives alpha later
  (:meth:`hetsync.sim.network.Network.p2p_path`); a rank's updates leave one after another (FIFO). A host's link
  is shared: between hosts beta = eta min(B_src / c_src, B_dst / c_dst), c its ranks sending (receiving) across hosts
  (fair share while they send together; pessimistic while the others idle), eta the ``p2p_efficiency``. Tokens and ACKs
  (:data:`TOKEN_BYTES`) do not queue. Window: until the first rank ends iteration K - 1.
* **Computation**: without skipping, a recurrence vectorized over ranks ([n, d_max] arrivals padded with
  -inf; backup: ``np.partition``), equal to :func:`simulate` at zero cost. With ``skip``, a heap-based
  :func:`event_model`, which also applies section 6.2(b)'s send rule (no update to an out-neighbour past k,
  or k + s with staleness) that the recurrence leaves out (overstating link load as ranks drift apart).

As the implementation does: ``times.sync_latency_ms`` (``netdelay``) is **not** added (hetsync delays only
collectives in the compiled step; Hop exchanges point to point: ``extra["sync_latency_ms_ignored"]``); no
self-loops in the token sets; skip needs backup workers or staleness and J_max <= max_ig. Not modelled:
the hooks' Python work (in ``host_ms``), MPI progress of large sends, parallel sends, the final average.
Graphs (``graph``, :func:`hetsync.protocols.hop.graph.build`): ``ring`` (n >= 3), ``ring-based`` (+ i <-> i+n/2,
even n >= 4), ``double-ring`` (n = 2h, h even >= 4), ``complete``, ``gateway:SIZES``, ``chain:SIZES``, ``edges:0-1,2>0``
"""
import argparse
import heapq
import math
import sys

import numpy as np
from tabulate import tabulate

from hetsync.protocols.hop import graph as hop_graph
from hetsync.sim.result import SimResult, throughput_until

__all__ = ["step_times", "simulate", "simulate_cluster", "event_model", "recurrence", "link_model", "main",
           "TOKEN_BYTES"]

#: bytes of a token or ACK message (a pickled ``(count, iteration)`` pair with its envelope).
TOKEN_BYTES = 64


def step_times(scenario, n, iterations, base_ms=40.0, seed=0):
    """Per-iteration compute times T [iterations, n] in ms for a scenario.

    Args:
        scenario: ``"random"`` (6x with probability 1/n), ``"deterministic"`` (rank n-1 4x slower) or ``"none"``.
        n: int >= 1 ranks. iterations: int >= 1. base_ms: float > 0, one step on a reference device. seed: int.

    Returns:
        float64 array [iterations, n].

    Raises:
        ValueError: unknown scenario or bad sizes.
    """
    if not isinstance(n, int) or n < 1 or not isinstance(iterations, int) or iterations < 1 or not base_ms > 0:
        raise ValueError(f"need ints n >= 1, iterations >= 1 and base_ms > 0; got {n!r}, {iterations!r}, {base_ms!r}")
    t = np.full((iterations, n), float(base_ms))
    if scenario == "random":
        t *= np.where(np.random.default_rng(seed).random((iterations, n)) < 1.0 / n, 6.0, 1.0)
    elif scenario == "deterministic":
        t[:, n - 1] *= 4.0
    elif scenario != "none":
        raise ValueError(f"scenario must be random, deterministic or none, got {scenario!r}")
    return t


def simulate(graph, times, mode="standard", backup_workers=1, staleness=5, max_ig=10, skip=None, skip_trigger=2):
    """Run the model; return the entry times, the iterations run, and the gap bounds observed.

    Args:
        graph: a :class:`hetsync.protocols.hop.graph.Graph` on n ranks.
        times: float array [K, n], T_i(k) in ms (:func:`step_times`).
        mode: ``"standard"``, ``"backup"`` or ``"staleness"``.
        backup_workers: int N_buw (backup mode). staleness: int s (staleness mode). max_ig: int >= 1.
        skip: None or int J_max >= 1 (backup or staleness mode only). skip_trigger: int >= 1.

    Returns:
        dict: ``iterations_per_s`` (K / the last rank's finish time, per second), ``finish_ms`` (float),
        ``steps`` (list of n ints: iterations each rank computed, fewer for a rank that skipped),
        ``max_gap_out`` (the largest Iter(i) - Iter(j) over out-neighbours j seen at any entry; <= max_ig).

    Raises:
        ValueError: an unknown mode, skip in standard mode, or times not of shape [K, n].
    """
    times = np.asarray(times, np.float64)
    n = graph.n
    if times.ndim != 2 or times.shape[1] != n:
        raise ValueError(f"times must be [K, {n}], got shape {times.shape}")
    if mode not in ("standard", "backup", "staleness"):
        raise ValueError(f"mode must be standard, backup or staleness, got {mode!r}")
    if skip is not None and mode == "standard":
        raise ValueError("skip needs backup or staleness mode (section 5)")
    K = times.shape[0]
    inf = float("inf")
    S = np.full((K, n), inf)  # S[k, i]: when rank i entered iteration k (inf: not yet, or skipped)
    S[0, :] = 0.0
    phase = ["run"] * n  # "run": in iteration it[i] since entered[i]; "tokens": left at left_at[i], entering target[i]
    it, entered, target, left_at = [0] * n, [0.0] * n, [0] * n, [0.0] * n
    steps, finish, max_gap = [0] * n, [inf] * n, 0

    def first_entry_at_or_after(j, k):
        """When j first entered an iteration >= k (inf if not yet)."""
        col = S[max(k, 0):, j]
        col = col[np.isfinite(col)]
        return float(col.min()) if col.size else inf

    def iteration_at(j, t):
        ks = np.nonzero(S[:, j] <= t)[0]
        return int(ks.max()) if ks.size else -1

    def next_event(i):
        if phase[i] == "run":
            k = it[i]
            arrivals = [S[k, j] for j in graph.in_neighbours[i]]
            if mode == "standard":
                need = max(arrivals, default=0.0)
            elif mode == "backup":
                m = len(arrivals) - backup_workers
                known = sorted(a for a in arrivals if a < inf)
                need = 0.0 if m <= 0 else (known[m - 1] if len(known) >= m else inf)
            else:
                need = max((first_entry_at_or_after(j, k - staleness) for j in graph.in_neighbours[i]), default=0.0)
            return max(entered[i] + times[k, i], need)
        gate = max((first_entry_at_or_after(j, target[i] - max_ig) for j in graph.out_neighbours[i]
                    if target[i] - max_ig >= 0), default=0.0)
        return max(left_at[i], gate)

    active = set(range(n))
    while active:
        when = {i: next_event(i) for i in active}
        i = min(when, key=when.get)
        t = when[i]
        if t == inf:
            raise RuntimeError(f"the model deadlocked at iterations {it} (phases {phase})")
        if phase[i] == "run":
            k0 = it[i]
            steps[i] += 1
            if k0 + 1 >= K:
                finish[i] = t
                active.discard(i)
                continue
            nxt = k0 + 1
            outs = graph.out_neighbours[i]
            if skip is not None and outs:
                behind = min(iteration_at(j, t) for j in outs) - k0
                if behind >= skip_trigger:
                    nxt = min(k0 + skip, k0 + behind, K - 1)
            phase[i], target[i], left_at[i] = "tokens", nxt, t
        else:
            for j in graph.out_neighbours[i]:
                max_gap = max(max_gap, target[i] - iteration_at(j, t))
            phase[i], it[i], entered[i] = "run", target[i], t
            S[target[i], i] = t
    end = max(finish)
    return {"iterations_per_s": K / end * 1e3, "finish_ms": end, "steps": steps, "max_gap_out": int(max_gap)}


def link_model(graph, net, model_bytes, token_bytes=TOKEN_BYTES):
    """Per-message times (ms) of every edge of a Hop graph on a cluster: the alpha-beta links with each host's
    link shared fairly by its ranks that send (receive) across hosts (module docstring, "Links"; Hop section 6).

    Args:
        graph: :class:`hetsync.protocols.hop.graph.Graph`, n ranks. net: :class:`hetsync.sim.network.Network` of
            size n. model_bytes: int > 0 bytes per update. token_bytes: int >= 0 bytes per token or ACK.

    Returns:
        dict: ``out_idx`` int64 / ``out_ok`` bool [n, do] (out-neighbours in send order, padded), float64 ms
        [n, do] ``svc_ms`` (sender occupancy), ``alpha_ms``, ``cum_ms`` (cumulative occupancy), ``tok_ms`` (token
        from that out-neighbour back); ``total_ms`` [n]; ``in_flat`` int64 / ``in_ok`` bool [n, di] (index of each
        in-neighbour's message in a flattened [n, do] array); ``deg_in`` int64 [n]; ``do``, ``di`` (ints >= 1).

    Raises:
        ValueError: a network whose size is not the graph's.
    """
    n = graph.n
    if net.size != n:
        raise ValueError(f"the Hop graph has {n} ranks but the network has {net.size}")
    host = np.array([net.host_of(r) for r in range(n)], np.int64)
    link = np.array(net.link_bytes_per_s, np.float64) * net.p2p_efficiency  # the rate p2p messages reach
    outdeg = np.array([len(o) for o in graph.out_neighbours], np.int64)
    do = max(1, int(outdeg.max()))
    di = max(1, max(len(o) for o in graph.in_neighbours))
    src = np.repeat(np.arange(n), outdeg)
    dst = np.array([j for o in graph.out_neighbours for j in o], np.int64)
    slot = np.arange(src.size) - np.repeat(np.cumsum(outdeg) - outdeg, outdeg)
    hs, hd = host[src], host[dst]
    same = hs == hd
    remote_out = np.bincount(src[~same], minlength=n) > 0
    remote_in = np.bincount(dst[~same], minlength=n) > 0
    up = np.maximum(np.bincount(host[remote_out], minlength=net.hosts), 1)
    down = np.maximum(np.bincount(host[remote_in], minlength=net.hosts), 1)
    beta = np.where(same, net.local_bytes_per_s, np.minimum(link[hs] / up[hs], link[hd] / down[hd]))
    path_beta = np.where(same, net.local_bytes_per_s, np.minimum(link[hs], link[hd]))  # a token alone on the path
    alpha_s = np.where(same, net.local_alpha_s, net.alpha_s)
    out_idx, out_ok = np.zeros((n, do), np.int64), np.zeros((n, do), bool)
    svc, alpha, tok = np.zeros((n, do)), np.zeros((n, do)), np.zeros((n, do))
    out_idx[src, slot], out_ok[src, slot] = dst, True
    svc[src, slot] = model_bytes / beta * 1e3
    alpha[src, slot] = alpha_s * 1e3
    tok[src, slot] = (alpha_s + token_bytes / path_beta) * 1e3  # hosts' links are symmetric: j -> i as i -> j
    order = np.lexsort((src, dst))  # by receiver, then sender: the in-neighbour lists are sorted
    indeg = np.bincount(dst, minlength=n)
    u = np.arange(order.size) - np.repeat(np.cumsum(indeg) - indeg, indeg)
    in_flat, in_ok = np.zeros((n, di), np.int64), np.zeros((n, di), bool)
    in_flat[dst[order], u] = src[order] * do + slot[order]
    in_ok[dst[order], u] = True
    return {"out_idx": out_idx, "out_ok": out_ok, "svc_ms": svc, "alpha_ms": alpha, "cum_ms": np.cumsum(svc, axis=1),
            "total_ms": svc.sum(axis=1), "tok_ms": tok, "in_flat": in_flat, "in_ok": in_ok,
            "deg_in": in_ok.sum(axis=1), "do": do, "di": di}


def recurrence(graph, times, links, protocol="hop", mode="standard", host_ms=0.0, backup_workers=0, staleness=0,
               max_ig=5):
    """Hop's (or NOTIFY-ACK's) timing without skipping, iteration by iteration, vectorized over ranks: the
    recurrences of the module docstring (Hop sections 3.3-4.4, Figures 4, 7, 8, eq. 2's blocking rule).

    Args:
        graph: :class:`hetsync.protocols.hop.graph.Graph`, n ranks. times: float64 [K, n] device ms T_i(k).
        links: :func:`link_model`'s dict. protocol: ``"hop"`` or ``"notifyack"``. mode: ``"standard"``,
        ``"backup"`` or ``"staleness"``. host_ms: float >= 0 ms per step. backup_workers: int N_buw.
        staleness: int s >= 0. max_ig: int >= 1.

    Returns:
        dict: float64 ms ``S`` [K + 1, n] (entries), ``C``, ``E`` [K, n] (compute done, step end),
        ``update_wait_ms``, ``token_wait_ms`` [K, n] (tokens or ACKs); ``reduced`` [K, n] (updates reduced, own
        included); ``age`` [K, n] (their mean age in iterations); ``max_gap`` (int, largest Iter(i) - Iter(j)
        over out-neighbours at an entry).

    Raises:
        ValueError: an unknown protocol or mode, times not [K, n], backup_workers >= ``|N_in(i)|`` on some rank.
    """
    T = np.asarray(times, np.float64)
    n = graph.n
    if T.ndim != 2 or T.shape[1] != n or T.shape[0] < 1:
        raise ValueError(f"times must be [K >= 1, {n}] milliseconds, got shape {T.shape}")
    if protocol not in ("hop", "notifyack") or mode not in ("standard", "backup", "staleness"):
        raise ValueError(f"protocol must be hop or notifyack and mode standard, backup or staleness; got "
                         f"{protocol!r}, {mode!r}")
    K, lk, ninf = T.shape[0], links, -np.inf
    deg = lk["deg_in"]
    if mode == "backup" and np.any(backup_workers > deg):
        raise ValueError(f"backup_workers={backup_workers} must be < |N_in(i)| (self-loop included) on every rank")
    off = lk["cum_ms"] + lk["alpha_ms"]  # [n, do] arrival offset of each send from the sender's start
    in_flat, in_ok, out_idx, out_ok = lk["in_flat"], lk["in_ok"], lk["out_idx"], lk["out_ok"]
    tok = np.where(out_ok, lk["tok_ms"], ninf)
    # backup: pad the missing in-neighbours with -inf at the front, so one kth serves every row
    kth = lk["di"] - backup_workers - 1
    S, (C, E, uw, tw, reduced, age) = np.zeros((K + 1, n)), (np.zeros((K, n)) for _ in range(6))
    L = np.full(n, ninf)  # each rank's sender is free from L on
    buf = [None] * (staleness + 1)
    D_prev = np.full(n, ninf)  # NOTIFY-ACK: ACK(-1) is there from the start
    G, none = 0, np.full(n, ninf)
    for k in range(K):
        Ck = S[k] + host_ms + T[k]
        # NOTIFY-ACK sends after its compute and the ACKs of k - 1; Hop at its entry
        send = np.maximum(Ck, (D_prev[out_idx] + tok).max(axis=1)) if protocol == "notifyack" else S[k]
        start = np.maximum(send, L)
        L = start + lk["total_ms"]
        arr = np.where(in_ok, (start[:, None] + off).ravel()[in_flat], ninf)  # [n, di] arrivals of k's updates
        reduced[k] = deg + 1
        if protocol == "notifyack":
            Ek = D_prev = S[k + 1] = np.maximum(send, arr.max(axis=1))
            uw[k], tw[k] = Ek - send, send - Ck
        else:
            if mode == "standard":
                R = arr.max(axis=1)
            elif mode == "backup":
                R = np.partition(arr, kth, axis=1)[:, kth] if kth >= 0 else none
            else:
                buf[k % (staleness + 1)] = arr
                R = buf[(k - staleness) % (staleness + 1)].max(axis=1) if k >= staleness else none
            Ek = np.maximum(Ck, R)
            if mode == "backup":
                reduced[k] = 1 + np.sum(arr <= Ek[:, None], axis=1)  # greedy: every update already there
            elif mode == "staleness":
                # newest iteration of each in-neighbour there at Ek (within k - s .. k; one ahead counts as k)
                lo = max(0, k - staleness)
                got = sum((buf[q % (staleness + 1)] <= Ek[:, None]).astype(np.int64) for q in range(lo, k + 1))
                have = in_ok & (got > 0)
                reduced[k] = 1 + have.sum(axis=1)
                age[k] = np.where(have, (k - lo + 1) - got, 0).sum(axis=1) / reduced[k]
            gate = (S[k + 1 - max_ig][out_idx] + tok).max(axis=1) if k + 1 >= max_ig else none
            S[k + 1] = np.maximum(Ek, gate)
            uw[k], tw[k] = Ek - Ck, S[k + 1] - Ek
        C[k], E[k] = Ck, Ek
        # the iteration gap at entry k + 1: gap >= G + 1 iff out-neighbour j had not entered k + 1 - G yet
        if k + 1 < K:
            while G + 1 <= k + 1 and np.any(out_ok & (S[k + 1 - G][out_idx] > S[k + 1][:, None])):
                G += 1
    return {"S": S, "C": C, "E": E, "update_wait_ms": uw, "token_wait_ms": tw, "reduced": reduced, "age": age,
            "max_gap": int(G)}


_COMPUTE, _UPDATE, _TOKEN = 0, 1, 2
_RUN, _RECV, _JUMP, _TOKENS, _DONE = range(5)


def event_model(graph, times, links, mode="standard", host_ms=0.0, backup_workers=0, staleness=0, max_ig=5,
                skip=None, skip_trigger=2, suppress=True):
    """Hop's timing as a heap-based discrete-event model with per-rank state (compute ends, update and token
    arrivals), following ``HopProtocol.enter_iteration``, ``apply``, ``leave_iteration`` and ``_jump``: section
    5's skipping and, with ``suppress``, section 6.2(b)'s send rule. About 6 s for 1024 ranks x 200 iterations.

    Args:
        graph: :class:`hetsync.protocols.hop.graph.Graph`, n ranks. times: float64 [K, n] device ms of iteration
        k. links: :func:`link_model`'s dict. mode: ``"standard"``, ``"backup"`` or ``"staleness"``. host_ms:
        float ms per step. backup_workers, staleness, max_ig: ints. skip: None or int J_max. skip_trigger: int.

    Returns:
        dict as :func:`recurrence`'s (inf where an iteration was skipped; ``age`` zeros), plus ``jumps``,
        ``skipped`` and ``sends_suppressed`` (ints).

    Raises:
        ValueError: skip in standard mode; RuntimeError: the model deadlocked (a bug).
    """
    T = np.asarray(times, np.float64)
    K, n = T.shape
    if skip is not None and mode == "standard":
        raise ValueError("skip needs backup or staleness mode (section 5)")
    inf = math.inf
    outs = [list(o) for o in graph.out_neighbours]
    ins = [list(o) for o in graph.in_neighbours]
    svc, alp, toklat = ([row[:len(outs[i])].tolist() for i, row in enumerate(links[key])]
                        for key in ("svc_ms", "alpha_ms", "tok_ms"))
    out_pos = [{j: t for t, j in enumerate(o)} for o in outs]
    in_pos = [{j: u for u, j in enumerate(o)} for o in ins]
    # token from i (entering) to in-neighbour j lands in j's out-slot of i, after j's token latency of that slot
    tok_dest = [[(j, out_pos[j][i], toklat[j][out_pos[j][i]]) for j in ins[i]] for i in range(n)]
    upd_dest = [[(j, in_pos[j][i]) for j in outs[i]] for i in range(n)]
    S = np.full((K + 1, n), inf)
    C, E = np.full((K, n), inf), np.full((K, n), inf)
    uw, tw, reduced = np.zeros((K, n)), np.zeros((K, n)), np.zeros((K, n))
    it, phase, target, entered = [0] * n, [_RUN] * n, [0] * n, [0] * n
    c_at, left_at, L = [0.0] * n, [0.0] * n, [-inf] * n
    counts = [dict() for _ in range(n)]  # iteration -> in-neighbour updates arrived
    newest_upd = [[-1] * len(ins[i]) for i in range(n)]
    tok_new = [[-1] * len(outs[i]) for i in range(n)]
    deg = [len(x) for x in ins]
    s = staleness or 0
    heap, seq = [], 0
    stats = {"max_gap": 0, "jumps": 0, "skipped": 0, "suppressed": 0}

    def enter(i, t, kk):
        nonlocal seq
        S[kk, i] = t
        entered[i] = kk
        for j in outs[i]:
            stats["max_gap"] = max(stats["max_gap"], kk - entered[j])
        for j, slot, lat in tok_dest[i]:
            seq += 1
            heapq.heappush(heap, (t + lat, seq, _TOKEN, j, slot, kk))
        free = L[i]
        newest = tok_new[i]
        useful = kk + (s if mode == "staleness" else 0)
        for q, (j, u) in enumerate(upd_dest[i]):
            if suppress and newest[q] > useful:
                stats["suppressed"] += 1
                continue
            free = (t if t > free else free) + svc[i][q]
            seq += 1
            heapq.heappush(heap, (free + alp[i][q], seq, _UPDATE, j, u, kk))
        L[i] = free
        it[i], phase[i] = kk, _RUN
        seq += 1
        heapq.heappush(heap, (t + host_ms + T[kk, i], seq, _COMPUTE, i, 0, 0))

    def ready(i, k):  # the in-neighbours' updates of iteration k satisfy the Recv (or jump) rule
        if mode == "staleness":
            return all(v >= k - s for v in newest_upd[i])
        return counts[i].get(k, 0) >= deg[i] - backup_workers

    def advance(i, now):
        while True:
            ph, k = phase[i], it[i]
            if ph == _RECV:
                if not ready(i, k):
                    return
                E[k, i] = now
                uw[k, i] = now - c_at[i]
                reduced[k, i] = 1 + (counts[i].get(k, 0) if mode != "staleness" else
                                     sum(v >= k - s for v in newest_upd[i]))
                for key in [q for q in counts[i] if q <= k]:
                    del counts[i][key]
                left_at[i] = now
                if k + 1 >= K:
                    phase[i] = _DONE
                    return
                nxt = k + 1
                if skip is not None and outs[i]:
                    behind = min(tok_new[i]) - k
                    if behind >= skip_trigger:
                        nxt = min(k + skip, k + behind, K - 1)
                target[i] = nxt
                phase[i] = _JUMP if nxt > k + 1 else _TOKENS
            elif ph == _JUMP:
                if not ready(i, target[i] - 1):
                    return
                stats["jumps"] += 1
                stats["skipped"] += target[i] - k - 1
                phase[i] = _TOKENS
            else:  # _TOKENS (advance runs only in _RECV, _JUMP and _TOKENS)
                gate = target[i] - max_ig
                if gate < 0 or all(v >= gate for v in tok_new[i]):
                    tw[k, i] = now - left_at[i]
                    enter(i, now, target[i])
                return

    for i in range(n):
        enter(i, 0.0, 0)
    while heap:
        t, _, kind, i, a, kk = heapq.heappop(heap)
        if kind == _COMPUTE:
            c_at[i] = t
            C[it[i], i] = t
            phase[i] = _RECV
            advance(i, t)
        elif kind == _UPDATE:
            if mode == "staleness":
                newest_upd[i][a] = max(newest_upd[i][a], kk)
            elif kk >= it[i]:
                counts[i][kk] = counts[i].get(kk, 0) + 1
            if phase[i] in (_RECV, _JUMP):
                advance(i, t)
        else:
            tok_new[i][a] = max(tok_new[i][a], kk)
            if phase[i] == _TOKENS:
                advance(i, t)
    if any(p != _DONE for p in phase):
        raise RuntimeError(f"the Hop event model deadlocked at iterations {it} (phases {phase})")
    return {"S": S, "C": C, "E": E, "update_wait_ms": uw, "token_wait_ms": tw, "reduced": reduced,
            "age": np.zeros((K, n)), "max_gap": stats["max_gap"], "jumps": stats["jumps"],
            "skipped": stats["skipped"], "sends_suppressed": stats["suppressed"]}


_HOP_KEYS = {"graph": "ring", "backup_workers": 0, "staleness": None, "max_ig": 5, "skip": None, "skip_trigger": 2}
_IGNORED_KEYS = {"average_at_end": True, "timeout_s": 120.0}  # configuration fields with no timing effect


def _int_param(name, v, lo):
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo):
        raise ValueError(f"Hop timing model: {name} must be an int >= {lo}, got {v!r}")
    return None if v is None else int(v)


def simulate_cluster(times, net, work, protocol="hop", **config):
    """Simulate Hop or NOTIFY-ACK on a cluster (module docstring): Hop sections 3-6 (Figures 4, 7, 8, 10, eq. 2,
    Theorem 2) by :func:`recurrence`, or :func:`event_model` with ``skip``; NOTIFY-ACK (section 3.3) by the recurrence.

    Args:
        times: :class:`hetsync.sim.workload.StepTimes`, ``ms`` float64 [K, n] device ms (n = ``net.size``).
        net: :class:`hetsync.sim.network.Network`. work: :class:`hetsync.sim.workload.Workload` (``model_bytes``
            per update, b = ``batch_size`` samples per step, ``host_ms`` per step). protocol: ``"hop"`` or
            ``"notifyack"``.
        **config: Hop's :class:`HopConfig <hetsync.protocols.hop.protocol>` fields: ``graph`` (str, default
            ``"ring"``), ``backup_workers`` (int N_buw, 0), ``staleness`` (int s or None), ``max_ig`` (int >= 1,
            5), ``skip`` (int J_max <= max_ig or None), ``skip_trigger`` (int >= 1, 2); NOTIFY-ACK's: ``graph``.
            ``average_at_end`` and ``timeout_s`` are accepted and ignored.

    Returns:
        :class:`hetsync.sim.result.SimResult` over the window (until the first rank ends iteration K - 1):
        ``wait_s`` seconds blocked on updates, tokens or ACKs; ``rounds`` the iterations the slowest rank passed;
        ``contributors_per_round`` mean updates reduced (own included); ``staleness_mean`` their mean age in
        iterations (None with skip and staleness); ``extra``: ``mode``, ``graph``, ``max_gap`` (<= max_ig),
        ``finish_ms``, ``iterations_per_s``, ``update_wait_s``, ``token_wait_s``, ``send_ms_per_iteration``,
        ``engine``, ``sync_latency_ms_ignored``, with skip ``jumps``, ``iterations_skipped``, ``sends_suppressed``.

    Raises:
        ValueError: an unknown protocol or config key (names the allowed ones), a value out of range, skip without
            backup workers or staleness or above max_ig, backup workers with staleness, a graph that does not
            exist for n, backup_workers >= ``|N_in(i)|`` on some rank, times for a size other than ``net.size``.
    """
    if protocol not in ("hop", "notifyack"):
        raise ValueError(f"protocol must be 'hop' or 'notifyack', got {protocol!r}")
    allowed = _HOP_KEYS if protocol == "hop" else {"graph": "ring"}
    bad = sorted(set(config) - set(allowed) - set(_IGNORED_KEYS))
    if bad:
        raise ValueError(f"{protocol} timing model: unknown parameter(s) {', '.join(bad)}; allowed: "
                         f"{', '.join(list(allowed) + list(_IGNORED_KEYS))}")
    cfg = {**_HOP_KEYS, **{k: v for k, v in config.items() if k in allowed}}
    T = np.asarray(times.ms, np.float64)
    if T.ndim != 2 or T.shape[0] < 1 or T.shape[1] != net.size:
        raise ValueError(f"step times {T.shape} must be [K >= 1, n] ms with n = {net.size}, the network's size")
    K, n = T.shape
    g = hop_graph.build(cfg["graph"], n)
    nb, mig, trig = (_int_param(k, cfg[k], lo) for k, lo in (("backup_workers", 0), ("max_ig", 1), ("skip_trigger", 1)))
    st, sk = _int_param("staleness", cfg["staleness"], 0), _int_param("skip", cfg["skip"], 1)
    if st is not None and nb:
        raise ValueError(f"Hop: give either backup_workers (={nb}) or staleness (={st}), not both")
    if sk is not None and (nb == 0 and st is None or sk > mig):
        raise ValueError(f"Hop: skip={sk} needs backup_workers >= 1 or a staleness bound (section 5) and skip "
                         f"<= max_ig={mig} (a jump of J takes J tokens)")
    low = [i for i in range(n) if nb and nb >= g.n_in(i)]
    if low:
        raise ValueError(f"Hop: backup_workers={nb} must be < |N_in(i)| (self-loop included) on every rank; graph "
                         f"{g.name!r} on {n} ranks has |N_in| = {g.n_in(low[0])} at rank {low[0]}")
    mode = "staleness" if st is not None else "backup" if nb else "standard"
    kw = {"mode": mode, "host_ms": float(work.host_ms), "backup_workers": nb, "staleness": st or 0, "max_ig": mig}
    links = link_model(g, net, int(work.model_bytes))
    engine = "event" if sk is not None else "recurrence"
    r = event_model(g, T, links, skip=sk, skip_trigger=trig, **kw) if sk is not None else \
        recurrence(g, T, links, protocol=protocol, **kw)
    C, E, tw = r["C"], r["E"], r["token_wait_ms"].copy()
    tw[K - 1] = 0.0  # the last iteration takes no tokens
    h = float(E[K - 1].min())
    sps, steps = throughput_until(E, work.batch_size, h)
    upd = np.clip(np.minimum(E, h) - np.minimum(C, h), 0, None)
    if protocol == "hop":  # tokens after the step
        tok = np.clip(np.minimum(np.where(np.isfinite(E), E + tw, np.inf), h) - np.minimum(E, h), 0, None)
    else:  # NOTIFY-ACK: the ACK wait lies between C and E
        tok = np.clip(np.minimum(C + tw, h) - np.minimum(C, h), 0, None)
        upd = upd - tok
    done = E <= h + 1e-9
    passed = np.where(done.any(axis=0), K - np.argmax(done[::-1], axis=0), 0)
    finish = float(np.max(E[K - 1]))
    extra = {"mode": mode if protocol == "hop" else "notifyack", "graph": g.name, "max_gap": int(r["max_gap"]),
             "finish_ms": finish, "iterations_per_s": K / finish * 1e3, "update_wait_s": float(upd.sum() / 1e3),
             "token_wait_s": float(tok.sum() / 1e3), "send_ms_per_iteration": float(links["total_ms"].max()),
             "engine": engine, "sync_latency_ms_ignored": float(times.sync_latency_ms)}
    if engine == "event":
        extra.update(jumps=r["jumps"], iterations_skipped=r["skipped"], sends_suppressed=r["sends_suppressed"])
    age = None if mode == "staleness" and engine == "event" else float(r["age"][done].mean())
    wait = [float(w) for w in (upd + tok).sum(axis=0) / 1e3]
    return SimResult(protocol, n, n, sps, h / 1e3, [int(x) for x in steps], wait,
                     rounds=int(passed.min()), contributors_per_round=float(r["reduced"][done].mean()),
                     staleness_mean=age, extra=extra)


def main(argv=None):
    """``python -m hetsync.sim.hop``: print the modelled iterations/s of standard Hop, one backup worker,
    staleness 5 and backup + skipping for one graph and scenario (an ideal cluster: no communication cost).

    Args:
        argv: list of str, the command-line arguments (default ``sys.argv[1:]``); see ``--help``.

    Returns:
        int, the exit status (0).

    Raises:
        SystemExit: bad arguments (argparse names the value); ValueError: a graph the world size
            does not allow (:func:`hetsync.protocols.hop.graph.build`).
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graph", default="ring-based", help="a Hop graph name (hetsync.protocols.hop.graph.build)")
    p.add_argument("--ranks", type=int, default=8, help="world size n")
    p.add_argument("--scenario", default="random", choices=("random", "deterministic", "none"),
                   help="random: each step 6x slower with probability 1/n; deterministic: the last rank 4x slower")
    p.add_argument("--iterations", type=int, default=1000, help="iterations per rank")
    p.add_argument("--max-ig", type=int, default=10, help="the token bound max_ig (iterations)")
    p.add_argument("--skip", type=int, default=10, help="J_max of the skipping configuration (iterations)")
    p.add_argument("--base-ms", type=float, default=40.0, help="a step's time without slowdown (ms)")
    p.add_argument("--seed", type=int, default=0, help="seed of the slowdown draws")
    args = p.parse_args(argv)
    g = hop_graph.build(args.graph, args.ranks)
    t = step_times(args.scenario, args.ranks, args.iterations, args.base_ms, args.seed)
    rows = []
    configs = [("standard", {}), ("backup workers 1", {"mode": "backup"}), ("staleness 5", {"mode": "staleness"}),
               (f"backup 1 + skip {args.skip}", {"mode": "backup", "skip": args.skip})]
    base = None
    for label, kw in configs:
        r = simulate(g, t.copy(), max_ig=args.max_ig, **kw)
        base = base or r["iterations_per_s"]
        rows.append([label, f"{r['iterations_per_s']:.2f}", f"{r['iterations_per_s'] / base:.2f}x", r["max_gap_out"],
                     min(r["steps"])])
    print(tabulate(rows, headers=["configuration", "iterations/s", "vs standard", "max gap", "fewest steps"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
