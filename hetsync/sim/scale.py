"""Throughput against rank count, 4 to 1024 ranks, per protocol: the simulator where the emulation cannot go.

``python -m hetsync.sim.scale [--out runs/scale] [--ranks 4 8 ... 1024] [--protocols a,b] [--steps 200]``

Two scenarios: random slowdowns (``device:40+random:6``: each step of each rank 6x slower with
probability 1/n, Hop section 7.3.1) and a speed mix (``device:40+speeds:...``: every fourth rank at half
speed, every eighth at a quarter). Ranks sit 8 to a host on 25 Gbit/s links (the ResNet-50 cell's
network); the model is the cluster cells' 1.86M-parameter MLP (7.45 MB of gradients), batch 32, and an
epoch is ImageNet's 1,281,167 samples. For each
rank count, scenario and protocol it prints samples/s, the speed-up over BSP and the time to target
relative to BSP through the measured statistical efficiency (:mod:`hetsync.sim.target`), which was
measured at 2 to 8 ranks: beyond 8 ranks that column is an *extrapolation* and is labelled so.
Writes ``scale.json`` and one plot per scenario (``scale-<scenario>.png``: samples/s against ranks,
log-log, one line per protocol); ``python -m hetsync.bench.scale_study --update-docs`` runs it and writes the
table and the plots into the documentation. Each simulation's wall time is recorded (the target: under 60 s per
protocol and scenario at 1024 ranks on a 2-core machine).
"""
import argparse
import json
import os
import sys
import time

from tabulate import tabulate

from hetsync.sim import network, registry, target, workload

__all__ = ["SCENARIOS", "scenario_spec", "hosts_for", "run", "plot", "pivot", "main", "MODEL_BYTES", "RANKS_PER_HOST",
           "SAMPLES_PER_EPOCH", "PROTOCOLS", "CONFIGS", "parser", "parse"]

#: the scenarios of the study: name -> (function of n giving the spec, description).
SCENARIOS = {
    "random": (lambda n: "device:40+random:6", "random slowdowns: each step 6x slower with probability 1/n"),
    "speedmix": (lambda n: "device:40+speeds:" + ",".join("0.25" if i % 8 == 7 else "0.5" if i % 4 == 3 else "1"
                                                           for i in range(n)),
                 "speed mix: every 4th rank at half speed, every 8th at a quarter"),
}
#: the cluster cells' wide MLP: 1,863,690 float32 parameters.
MODEL_BYTES = 1_863_690 * 4
#: ranks per host of the simulated cluster.
RANKS_PER_HOST = 8
#: the protocols of the study (no server ranks: the rank count is the computing ranks).
PROTOCOLS = ("bsp", "rna", "hop", "localsgd", "fedavg", "taskalloc")
#: samples per epoch of the study: ImageNet's 1,281,167 training images (a cluster of 1024 ranks trains on a
#: data set of that size; MNIST's 60,000 would end an epoch before local SGD's first average at 1024 ranks).
SAMPLES_PER_EPOCH = 1_281_167
#: configurations (task allocation follows the measured speeds).
CONFIGS = {"taskalloc": {"mode": "adaptive", "samples_per_epoch": SAMPLES_PER_EPOCH}, "hop": {"graph": "ring"},
           "localsgd": {"samples_per_epoch": SAMPLES_PER_EPOCH}, "fedavg": {"samples_per_epoch": SAMPLES_PER_EPOCH}}


def scenario_spec(name, n):
    """The slowdown spec (str) of study scenario ``name`` at ``n`` ranks.

    Raises:
        ValueError: an unknown scenario (names the known ones).
    """
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name][0](n)


def hosts_for(n):
    """The hosts (str, cluster tool syntax) of ``n`` ranks, :data:`RANKS_PER_HOST` to a host (the last one fuller
    or emptier as n demands)."""
    if n <= RANKS_PER_HOST:
        return None
    full, rest = divmod(n, RANKS_PER_HOST)
    slots = [RANKS_PER_HOST] * full + ([rest] if rest else [])
    return ",".join(f"h{i}:{s}" for i, s in enumerate(slots))


def run(ranks, protocols, steps=200, link="25gbit", seed=0, log=print):
    """Simulate every (rank count, scenario, protocol).

    Args:
        ranks: iterable of ints >= 2. protocols: iterable of names. steps: int draws per rank.
        link: str rate of every host link. seed: int. log: callable for progress lines.

    Returns:
        list of dicts: ``np``, ``scenario``, ``protocol``, ``samples_per_s``, ``vs_bsp``, ``time_to_target_vs_bsp``,
        ``extrapolated`` (bool: np > 8), ``sim_s`` (float wall seconds of the simulation).
    """
    rows = []
    for sname in SCENARIOS:
        for n in ranks:
            times = workload.step_times(scenario_spec(sname, n), n, steps, seed=seed)
            net = network.Network.from_spec(n, hosts=hosts_for(n), link=link)
            work = workload.Workload(model_bytes=MODEL_BYTES, batch_size=32)
            bsp = None
            for p in ["bsp", *[q for q in protocols if q != "bsp"]]:
                t0 = time.perf_counter()
                r = registry.simulate(p, times, net, work, **CONFIGS.get(p, {}))
                sim_s = time.perf_counter() - t0
                bsp = bsp or r.samples_per_s
                speed, _, _ = target.speedup_vs_bsp(p, r.samples_per_s, bsp)
                rows.append({"np": n, "scenario": sname, "protocol": p, "samples_per_s": r.samples_per_s,
                             "vs_bsp": r.samples_per_s / bsp, "time_to_target_vs_bsp": speed,
                             "extrapolated": n > 8, "sim_s": sim_s})
            log(f"{sname} np{n}: " + ", ".join(f"{row['protocol']} {row['vs_bsp']:.2f}x"
                                               for row in rows if row["np"] == n and row["scenario"] == sname))
    return rows


def plot(rows, out_dir):
    """One PNG per scenario (``scale-<scenario>.png``): samples/s against ranks, log-log; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for sname, (_, desc) in SCENARIOS.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for p in dict.fromkeys(r["protocol"] for r in rows):
            pts = sorted((r["np"], r["samples_per_s"]) for r in rows if r["scenario"] == sname and r["protocol"] == p)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_ylabel("samples/s (simulated)")
        ax.set_title(desc, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        path = os.path.join(out_dir, f"scale-{sname}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def pivot(rows, scenario):
    """The study's rows of one scenario as a Markdown table (str): one row per rank count, one column per
    protocol, the samples/s over BSP's (``*`` marks a time-to-target figure beyond 8 ranks: extrapolated)."""
    protos = list(dict.fromkeys(r["protocol"] for r in rows if r["scenario"] == scenario))
    body = []
    for n in sorted({r["np"] for r in rows if r["scenario"] == scenario}):
        by = {r["protocol"]: r for r in rows if r["scenario"] == scenario and r["np"] == n}
        body.append([n] + [f"{by[p]['vs_bsp']:.2f}x / {by[p]['time_to_target_vs_bsp']:.2f}x"
                           + ("*" if by[p]["extrapolated"] else "") if p in by else "" for p in protos])
    return tabulate(body, headers=["ranks"] + protos, tablefmt="github")


def parser(description):
    """The study's command line (``argparse.ArgumentParser``): ``--out``, ``--ranks``, ``--protocols``, ``--steps``,
    ``--link``, ``--seed``; :mod:`hetsync.bench.scale_study` adds its documentation options."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default="runs/scale", help="output folder")
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated protocols")
    p.add_argument("--steps", type=int, default=200, help="simulated steps per rank")
    p.add_argument("--link", default="25gbit", help="host link rate (tc units)")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse(p, argv=None):
    """Parse and check the study's arguments.

    Returns:
        ``(args, protocols)``: the namespace and the list of protocol names.

    Raises:
        SystemExit: an unknown protocol or a rank count below 2 (``p.error`` names it).
    """
    args = p.parse_args(argv)
    protocols = [s.strip() for s in args.protocols.split(",") if s.strip()]
    for q in protocols:
        if q not in registry.MODELS:
            p.error(f"no timing model for {q!r}; known: {', '.join(registry.names())}")
    if min(args.ranks) < 2:
        p.error(f"--ranks must be >= 2, got {args.ranks}")
    return args, protocols


def main(argv=None):
    """``python -m hetsync.sim.scale``: run the study, print its table, write ``scale.json`` and the plots.

    Args:
        argv: list of str (default ``sys.argv[1:]``).

    Returns:
        int exit status (0).

    Raises:
        SystemExit: bad arguments (argparse names the value).
    """
    args, protocols = parse(parser(__doc__.splitlines()[0]), argv)
    os.makedirs(args.out, exist_ok=True)
    rows = run(args.ranks, protocols, args.steps, args.link, args.seed)
    with open(os.path.join(args.out, "scale.json"), "w") as f:
        json.dump({"rows": rows, "model_bytes": MODEL_BYTES, "link": args.link, "steps": args.steps}, f, indent=1)
    plot(rows, args.out)
    body = [[r["scenario"], r["np"], r["protocol"], f"{r['samples_per_s']:.0f}", f"{r['vs_bsp']:.2f}x",
             f"{r['time_to_target_vs_bsp']:.2f}x" + (" (extrapolated)" if r["extrapolated"] else ""),
             f"{r['sim_s']:.2f}"] for r in rows]
    print(tabulate(body, headers=["scenario", "ranks", "protocol", "samples/s", "vs BSP", "time to target vs BSP",
                                  "simulation s"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
