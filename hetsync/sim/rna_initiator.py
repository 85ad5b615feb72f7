"""Simulate RNA's initiator choice by power-of-d probes (RNA paper section 8.4, Figure 10).

``python -m hetsync.sim.rna_initiator [--ranks 100] [--low-ms 10] [--high-ms 50] [--probes 1 2 3 4]``

The paper's microbenchmark: 100 ranks, each iteration every rank runs a task whose duration is
drawn uniformly in [10, 50] ms ("randomized skewness"); the controller probes d random ranks and
the iteration ends when the fastest probed rank finishes; the *response time* is the time from
the probes to that first answer. The paper reports a median of 28 ms with one probe and 12 ms
with two. Two models are simulated:

* ``restart`` (the paper's description): every rank starts a fresh task when an iteration starts,
  so the response time is min over the d probed ranks of their task durations, plus
  ``probe_cost_ms`` per probe (the messaging cost that, per the paper, makes more probes useless).
* ``continuous`` (how hetsync's RNA runs): ranks compute back to back without waiting; a round
  takes every rank's pending gradients; a probed rank answers as soon as it has finished a task
  since the last round (at once if it already has). The response time is then the smallest
  *remaining* task time among the probes.

Closed form for ``restart`` without probe cost: the median of the minimum of d independent
U[a, b] draws is a + (b - a)(1 - 0.5^(1/d)): 30.0 ms for d = 1, 21.7 ms for d = 2.
"""
import argparse
import sys

import numpy as np
from tabulate import tabulate

__all__ = ["simulate_restart", "simulate_continuous", "summarize", "main"]

PAPER_MEDIAN_MS = {1: 28.0, 2: 12.0}


def _check(ranks, probes, low_ms, high_ms, iterations):
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
    if not isinstance(probes, int) or not 1 <= probes <= ranks:
        raise ValueError(f"probes must be an int in [1, ranks={ranks}], got {probes!r}")
    if not 0 <= low_ms <= high_ms:
        raise ValueError(f"need 0 <= low_ms <= high_ms, got low_ms={low_ms!r}, high_ms={high_ms!r}")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")


def simulate_restart(ranks=100, probes=2, low_ms=10.0, high_ms=50.0, iterations=100, probe_cost_ms=0.0, seed=0):
    """Response times (ms) when every rank restarts its task at each iteration (the paper's setup).

    Args:
        ranks: int >= 1, world size n. probes: int in [1, n], d. low_ms, high_ms: task durations
        are U[low_ms, high_ms] milliseconds. iterations: int >= 1. probe_cost_ms: float >= 0,
        messaging cost added per probe. seed: int.

    Returns:
        float64 array [iterations]: per-iteration response time in milliseconds.

    Raises:
        ValueError: an argument out of range.
    """
    _check(ranks, probes, low_ms, high_ms, iterations)
    rng = np.random.default_rng(seed)
    out = np.empty(iterations)
    for i in range(iterations):
        tasks = rng.uniform(low_ms, high_ms, size=ranks)
        chosen = rng.choice(ranks, size=probes, replace=False)
        out[i] = tasks[chosen].min() + probe_cost_ms * probes
    return out


def simulate_continuous(ranks=100, probes=2, low_ms=10.0, high_ms=50.0, iterations=100, probe_cost_ms=0.0,
                        round_ms=0.0, seed=0):
    """Response times (ms) when ranks compute back to back and rounds take every pending gradient.

    Each rank runs tasks of U[low_ms, high_ms] ms one after another. At a round's start the
    controller probes d random ranks; a probed rank answers when it has finished a task since the
    previous round (immediately if it already has). The round then takes ``round_ms`` (the
    allreduce), every rank's pending gradients are taken, and the next probes go out.

    Args: as :func:`simulate_restart`, plus round_ms: float >= 0, duration of a round's allreduce.

    Returns:
        float64 array [iterations]: per-round response time in milliseconds.
    """
    _check(ranks, probes, low_ms, high_ms, iterations)
    rng = np.random.default_rng(seed)
    next_done = rng.uniform(low_ms, high_ms, size=ranks) * rng.uniform(0, 1, size=ranks)  # random phases
    last_done = np.full(ranks, -np.inf)
    last_round = 0.0
    now = 0.0
    out = np.empty(iterations)
    for i in range(iterations):
        # advance every rank's task sequence up to `now`
        while True:
            late = next_done <= now
            if not late.any():
                break
            last_done[late] = next_done[late]
            next_done[late] += rng.uniform(low_ms, high_ms, size=int(late.sum()))
        chosen = rng.choice(ranks, size=probes, replace=False)
        ready = last_done[chosen] > last_round
        answer = now if ready.any() else next_done[chosen].min()
        out[i] = answer - now + probe_cost_ms * probes
        now = answer + probe_cost_ms * probes + round_ms
        last_round = answer  # everything finished up to the answer is taken by the round
        while True:
            late = next_done <= last_round
            if not late.any():
                break
            last_done[late] = next_done[late]
            next_done[late] += rng.uniform(low_ms, high_ms, size=int(late.sum()))
    return out


def summarize(times):
    """Return ``{"median", "p5", "p25", "p75", "p95", "mean"}`` (ms) of an array of response times."""
    t = np.asarray(times, dtype=float)
    return {"median": float(np.median(t)), "p5": float(np.percentile(t, 5)), "p25": float(np.percentile(t, 25)),
            "p75": float(np.percentile(t, 75)), "p95": float(np.percentile(t, 95)), "mean": float(t.mean())}


def main(argv=None):
    """Print the response-time table for each number of probes; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ranks", type=int, default=100)
    p.add_argument("--probes", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--low-ms", type=float, default=10.0)
    p.add_argument("--high-ms", type=float, default=50.0)
    p.add_argument("--iterations", type=int, default=10000,
                   help="iterations per setting (the paper ran 100; more gives stable percentiles)")
    p.add_argument("--probe-cost-ms", type=float, default=0.0, help="messaging cost per probe (ms)")
    p.add_argument("--round-ms", type=float, default=0.0, help="allreduce time per round, continuous model (ms)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = []
    try:
        for d in args.probes:
            for model, fn, extra in (("restart", simulate_restart, {}),
                                     ("continuous", simulate_continuous, {"round_ms": args.round_ms})):
                s = summarize(fn(args.ranks, d, args.low_ms, args.high_ms, args.iterations, args.probe_cost_ms,
                                 seed=args.seed, **extra))
                rows.append([d, model, f"{s['median']:.1f}", f"{s['p5']:.1f}", f"{s['p95']:.1f}", f"{s['mean']:.1f}",
                             PAPER_MEDIAN_MS.get(d, "-") if model == "restart" else ""])
    except ValueError as exc:
        p.error(str(exc))
    print(f"RNA initiator choice: {args.ranks} ranks, task times U[{args.low_ms:g}, {args.high_ms:g}] ms, "
          f"{args.iterations} iterations, probe cost {args.probe_cost_ms:g} ms")
    print(tabulate(rows, headers=["probes", "model", "median ms", "p5 ms", "p95 ms", "mean ms", "paper median ms"],
                   tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
