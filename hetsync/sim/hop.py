"""Simulate Hop's iteration timing on an ideal cluster: the throughput its rules allow, and their gap bounds.

``python -m hetsync.sim.hop [--graph ring-based] [--ranks 8] [--scenario random] [--max-ig 10]``

A discrete-event model of Hop (sections 3-5) with zero communication cost: rank i's iteration k
takes T_i(k) ms of compute (``base_ms`` times the scenario's factor: ``random``, each step each rank
6x slower with probability 1/n, section 7.3.1; ``deterministic``, the last rank always 4x slower,
section 7.3.5; ``none``). With S_i(k) the time rank i enters iteration k (and sends its update) and
E_i(k) the time it leaves it:

* E_i(k) = max(S_i(k) + T_i(k), R_i(k)), the wait R for updates: standard, the last of the
  in-neighbours' S_j(k); backup workers, the (|N_in(i)| - 1 - N_buw)-th earliest of them (the own
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
"""
import argparse
import sys

import numpy as np
from tabulate import tabulate

from hetsync.protocols.hop import graph as hop_graph

__all__ = ["step_times", "simulate", "main"]


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
