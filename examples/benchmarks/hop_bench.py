"""Hop benchmark on the emulated cluster: backup workers, bounded staleness and skipping, side by side in one run.

Runs the training job ``python -m hetsync.bench.job`` under ``horovodrun --mpi -np N`` (default 8 ranks,
MNIST when ``HETSYNC_DATA_DIR`` names its folder, else digits) on the emulated cluster (``device:MS``, default
40 ms per step of the per-rank batch), interleaving the configurations of each scenario, for each
seed (``--seeds``, default 0,1,2):

* ``random:6`` (Hop section 7.3.1: each step each rank is 6x slower with probability 1/n): Hop
  standard, Hop with one backup worker, Hop with staleness s = 5, BSP and RNA;
* ``deterministic:R:4`` (section 7.3.5: the last rank always 4x slower): Hop standard, Hop with one
  backup worker, Hop with one backup worker and skipping (J_max = ``--skip``), BSP and RNA.

Every Hop configuration uses ``--graph`` (default ring-based, |N_in| = 4) and ``--max-ig``. Per run
it reads ``summary.json`` and ``rank0.jsonl`` (:func:`hetsync.bench.matrix.analyse_run`): the
iteration throughput (rank 0's steady-state steps per second, after its first epoch; rank 0 never
skips, and every rank's iteration stays within ``max_ig`` of its neighbours', so this is the job's
iteration rate; ``iterations_per_s_job`` is the step count over the job's wall time), time to ``--target`` test
accuracy (from the end of the first step), final test accuracy, and the emulated steps that
overran. Ratios are taken within one seed (runs side by side), then the median and range over seeds.

Usage (the Hop page's measured figures)::

    .venv/bin/python examples/benchmarks/hop_bench.py --out runs/hop_bench

Writes ``OUT/results.json`` and prints a Markdown table.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from hetsync.bench import efficiency, launch, matrix  # noqa: E402
import hetsync  # noqa: E402


def variants(scenario, args):
    """The (label, protocol, protocol args) of one scenario ("random" or "deterministic")."""
    hop = [f"graph={args.graph}", f"max_ig={args.max_ig}"]
    out = [("hop standard", "hop", hop), ("hop backup", "hop", hop + ["backup_workers=1"])]
    if scenario == "random":
        out.append(("hop staleness", "hop", hop + [f"staleness={args.staleness}"]))
    else:
        out.append(("hop skip", "hop", hop + ["backup_workers=1", f"skip={args.skip}"]))
    return out + [("bsp", "bsp", []), ("rna", "rna", [])]


def scenario_spec(scenario, args):
    if scenario == "random":
        return f"device:{args.device}+random:6"
    return f"device:{args.device}+deterministic:{args.np - 1}:4"


def _job(protocol, pargs, spec, seed, args, out):
    """The job's argument list (list of str) of one run; ``args`` carries the common flags."""
    return launch.job_argv(protocol, out, pargs, extra=launch.dataset_args(args.digits), epochs=args.epochs,
                           lr=args.lr, batch_size=args.batch_size, eval_every=args.eval_every,
                           target_accuracy=args.target, slowdown=spec, seed=seed)


def run_one(label, protocol, pargs, spec, seed, args, out):
    """Launch one run; return its figures (dict from :func:`analyse`; ``error`` when the launch or the
    analysis failed, so the other runs go on)."""
    t0 = time.time()
    proc = launch.run(launch.horovodrun(args.np, _job(protocol, pargs, spec, seed, args, out)), args.timeout)
    if proc.returncode != 0:
        return {"label": label, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    try:
        rec = analyse(out)
    except ValueError as exc:  # e.g. too few steps to measure a speed: this run fails, the benchmark goes on
        return {"label": label, "error": f"analysis: {exc}"}
    rec.update(label=label, protocol=protocol, args=pargs, seed=seed, launch_s=time.time() - t0)
    return rec


def analyse(out):
    """The figures of one finished run folder (dict; see the module docstring)."""
    a = matrix.analyse_run(out, {})
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    stats = s.get("stats", {})
    rank0 = efficiency.read_jsonl(os.path.join(out, "rank0.jsonl"))
    row0 = s["per_rank"][0]
    steady0 = efficiency.steady_rate(rank0, row0["samples"] / row0["steps"])[0]
    return {"out": out,
            "iterations": s["steps"], "wall_s": s["wall_s"], "iterations_per_s": steady0,
            "steps_per_s_mean_over_ranks": a["steps_per_s"], "iterations_per_s_job": s["steps"] / s["wall_s"],
            "time_to_target_s": a["time_to_target_s"], "final_test_accuracy": a["final_test_accuracy"],
            "overrun_steps": a["overrun_steps"], "emulated_steps": a["emulated_steps"],
            "overrun_fraction": a["overrun_fraction"], "weights_in_sync": s.get("weights_in_sync"),
            "jumps": stats.get("jumps"), "iterations_skipped": stats.get("iterations_skipped"),
            "late_updates_dropped": stats.get("late_updates_dropped"), "gap_histogram": stats.get("gap_histogram"),
            "steps_per_rank": [r["steps"] for r in s["per_rank"]]}


def _med(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(runs, scenario, baseline):
    """Per label: medians over seeds of the ratios against ``baseline`` within each seed."""
    rows = []
    labels = list(dict.fromkeys(r["label"] for r in runs if r["scenario"] == scenario))
    for label in labels:
        tput, ttt, dacc, acc, over = [], [], [], [], []
        for seed in sorted({r["seed"] for r in runs}):
            mine = [r for r in runs if r["scenario"] == scenario and r["seed"] == seed and r["label"] == label
                    and "error" not in r]
            base = [r for r in runs if r["scenario"] == scenario and r["seed"] == seed and r["label"] == baseline
                    and "error" not in r]
            if not mine or not base:
                continue
            m, b = mine[0], base[0]
            tput.append(m["iterations_per_s"] / b["iterations_per_s"])
            if m["time_to_target_s"] and b["time_to_target_s"]:
                ttt.append(b["time_to_target_s"] / m["time_to_target_s"])  # > 1: reaches the target sooner
            dacc.append(100.0 * (m["final_test_accuracy"] - b["final_test_accuracy"]))
            acc.append(m["final_test_accuracy"])
            over.append(m["overrun_fraction"])
        rows.append({"label": label, "throughput_ratio": _med(tput), "time_to_target_speedup": _med(ttt),
                     "accuracy_delta_pt": _med(dacc), "final_accuracy": _med(acc), "overrun_fraction": _med(over)})
    return rows


def _fmt(m, fmt="{:.2f}"):
    if m is None:
        return "-"
    return f"{fmt.format(m['median'])} ({fmt.format(m['min'])}-{fmt.format(m['max'])})" if m["n"] > 1 else \
        fmt.format(m["median"])


def table(rows, baseline):
    lines = [f"| configuration | iterations/s vs {baseline} | time-to-target speed-up vs {baseline} | "
             f"accuracy vs {baseline} (pt) | final accuracy | overrun steps |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {_fmt(r['throughput_ratio'])}x | {_fmt(r['time_to_target_speedup'])}x | "
                     f"{_fmt(r['accuracy_delta_pt'], '{:+.2f}')} | {_fmt(r['final_accuracy'], '{:.3f}')} | "
                     f"{_fmt(r['overrun_fraction'], '{:.1%}')} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/hop_bench")
    p.add_argument("--verbose", action="store_true",
                   help="the jobs keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    p.add_argument("--np", type=int, default=8, help="ranks")
    p.add_argument("--device", type=float, default=40.0, help="emulated device time per step (ms)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--scenarios", default="random,deterministic")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=10, help="steps between test evaluations")
    p.add_argument("--target", type=float, default=0.85, help="test accuracy of the time-to-target figure")
    p.add_argument("--graph", default="ring-based")
    p.add_argument("--max-ig", type=int, default=10)
    p.add_argument("--staleness", type=int, default=5)
    p.add_argument("--skip", type=int, default=10, help="J_max of the skipping configuration")
    p.add_argument("--digits", action="store_true", help="digits instead of MNIST")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch")
    p.add_argument("--reanalyse", action="store_true", help="no runs: recompute the figures of OUT/results.json")
    args = p.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
        args.scenario_list = [s.strip() for s in args.scenarios.split(",")]
    except ValueError:
        p.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    bad = [s for s in args.scenario_list if s not in ("random", "deterministic")]
    if bad:
        p.error(f"--scenarios must name random and/or deterministic, got {bad}")
    if args.np < 3 or args.device <= 0 or args.skip > args.max_ig:
        p.error(f"need --np >= 3, --device > 0 and --skip <= --max-ig; got {args.np}, {args.device}, "
                f"{args.skip} > {args.max_ig}")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    runs = []
    if args.reanalyse:  # recompute every run's figures from its folder (after a change to the analysis)
        with open(os.path.join(args.out, "results.json")) as f:
            old = json.load(f)["runs"]
        for r in old:
            if "error" not in r:
                out = r.get("out") or os.path.join(args.out, f"s{r['seed']}-{r['scenario']}-{r['label'].replace(' ', '_')}")
                r.update(analyse(out))
            runs.append(r)
        args.seed_list = sorted({r["seed"] for r in runs})
        args.scenario_list = list(dict.fromkeys(r["scenario"] for r in runs))
    for seed in ([] if args.reanalyse else args.seed_list):
        for scenario in args.scenario_list:
            spec = scenario_spec(scenario, args)
            vs = variants(scenario, args)
            vs = vs[seed % len(vs):] + vs[:seed % len(vs)]  # rotate the order per seed (the machine drifts)
            for label, protocol, pargs in vs:
                out = os.path.join(args.out, f"s{seed}-{scenario}-{label.replace(' ', '_')}")
                print(f"[hop_bench] seed {seed} {spec} {label} ...", flush=True)
                rec = run_one(label, protocol, pargs, spec, seed, args, out)
                rec.update(scenario=scenario, spec=spec, seed=seed)
                runs.append(rec)
                print(f"[hop_bench]   {json.dumps({k: rec.get(k) for k in ('iterations_per_s', 'time_to_target_s', 'final_test_accuracy', 'overrun_fraction', 'error')})}",
                      flush=True)
                with open(os.path.join(args.out, "results.json"), "w") as f:
                    json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    report = {}
    for scenario in args.scenario_list:
        report[scenario] = {base: summarise(runs, scenario, base) for base in ("hop standard", "bsp")}
        print(f"\n### {scenario_spec(scenario, args)}, {args.np} ranks, graph {args.graph}, max_ig {args.max_ig}, "
              f"seeds {args.seeds}\n")
        for base in ("hop standard", "bsp"):
            print(table(report[scenario][base], base) + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "runs": runs, "report": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])  # the launched jobs inherit it
    sys.exit(main())
