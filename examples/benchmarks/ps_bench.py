"""Parameter-server benchmark on the emulated cluster: SHAT, ASP, ENSEMBLE, SHAT-root, SSP against BSP, hierarchical RNA against flat RNA.

Runs the training job ``python -m hetsync.bench.job`` under ``horovodrun --mpi`` on the emulated cluster
(``device:MS``, default 40 ms per step of the per-rank batch; MNIST when ``HETSYNC_DATA_DIR`` names its
folder, else digits), side by side within each seed (``--seeds``, default 0,1,2). A parameter-server run of W
workers launches W + K ranks (``servers=K``, the last K serve); BSP runs on the W workers alone, so
every comparison is at the same number of training ranks. Suites (``--suites``):

* ``accuracy``: W = 4 and W = ``--workers`` (default 8), one server, ``device:MS``: SHAT, SHAT-root, ASP and
  ENSEMBLE. Targets: at W = 8 SHAT's final accuracy >= ASP's; ENSEMBLE's falls from W = 4 to W = 8
  (SHAT section 4.2, Table 2). ENSEMBLE's summary also holds the mean local accuracy and the
  averaged-prediction accuracy.
* ``straggler``: W workers, the last one 10x slower (``deterministic:W-1:10``): SHAT against BSP.
  Target: SHAT's time to ``--target`` accuracy at least 3x shorter.
* ``sharding``: W workers, 2 servers, ASP with layer-wise against memory-wise sharding (the example MLP's
  first kernel holds most of the bytes, so layer-wise sharding is unbalanced). Target: memory-wise at
  least as fast (steps per second).
* ``ssp``: W workers, ``random:6``: SSP (staleness ``--staleness``, default 3) against BSP. Target: faster
  to the target accuracy, final accuracy within 1 point.
* ``mixed``: RNA's mixed heterogeneity (section 8.1): W workers, the first half ``uniform:0:50``, the second
  half ``uniform:50:100`` (``uniform:0:50@0-3+uniform:50:100@4-7`` for W = 8, on top of ``device:MS``):
  hierarchical RNA (``rnah``, one server, the two halves as explicit groups, ``sync_every``
  ``--sync-every``, default 1) against flat RNA on the W workers. Target: hierarchical RNA at least 1.1x
  faster to the target accuracy. Explicit groups, as the paper formed them by hand: on mean step times
  the automatic rule does not split this setting (max - min = 50 ms <= the mean, spec 2.1 caveat).

Per run it reads ``summary.json`` and ``rank0.jsonl`` (:func:`hetsync.bench.matrix.analyse_run`):
steady-state steps per second of rank 0 (a worker), time to target from the end of the first step,
final test accuracy, overrun steps, and the protocol's statistics (alpha per worker, pushes and pulls
per server, server queue wait, SSP's gate). Ratios are taken within one seed, then the median and the
range over seeds.

Usage (the full benchmark; about an hour on 2 shared cores)::

    .venv/bin/python examples/benchmarks/ps_bench.py --out runs/ps_bench

and a smoke run (a minute or two)::

    .venv/bin/python examples/benchmarks/ps_bench.py --out runs/ps_smoke --suites ssp --workers 2 \\
        --seeds 0 --epochs 1 --digits --device 10

Writes ``OUT/results.json`` and prints one Markdown table per suite.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from hetsync.bench import launch, matrix  # noqa: E402
import hetsync  # noqa: E402
SUITES = ("accuracy", "straggler", "sharding", "ssp", "mixed")


def configurations(suite, args):
    """The runs of one suite: list of ``(label, protocol, protocol args, workers W, servers K, slowdown spec)``."""
    dev = f"device:{args.device:g}"
    w = args.workers
    if suite == "accuracy":
        out = []
        for n in sorted({min(4, w), w}):
            for proto in ("shat", "shatroot", "asp", "ensemble"):
                out.append((f"{proto} W={n}", proto, ["servers=1"], n, 1, dev))
        return out
    if suite == "straggler":
        spec = f"{dev}+deterministic:{w - 1}:10"
        return [("shat", "shat", ["servers=1"], w, 1, spec), ("bsp", "bsp", [], w, 0, spec)]
    if suite == "sharding":
        return [(f"asp {mode}", "asp", ["servers=2", f"sharding={mode}"], w, 2, dev) for mode in ("memory", "layer")]
    if suite == "mixed":
        h = w // 2
        spec = f"{dev}+uniform:0:50@0-{h - 1}+uniform:50:100@{h}-{w - 1}"
        groups = [list(range(h)), list(range(h, w))]
        return [("rnah", "rnah", ["servers=1", f"groups={groups}".replace(" ", ""), f"sync_every={args.sync_every}"],
                 w, 1, spec), ("rna", "rna", [], w, 0, spec)]
    return [(f"ssp s={args.staleness}", "ssp", ["servers=1", f"staleness={args.staleness}"], w, 1, f"{dev}+random:6"),
            ("bsp", "bsp", [], w, 0, f"{dev}+random:6")]


def run_one(label, protocol, pargs, workers, servers, spec, seed, args, out):
    """Launch one run; return its figures (dict; ``error`` on failure)."""
    job = launch.job_argv(protocol, out, pargs, extra=launch.dataset_args(args.digits), epochs=args.epochs,
                          lr=args.lr, batch_size=args.batch_size, eval_every=args.eval_every,
                          target_accuracy=args.target, slowdown=spec, seed=seed)
    t0 = time.time()
    proc = launch.run(launch.horovodrun(workers + servers, job), args.timeout)
    if proc.returncode != 0:
        return {"label": label, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    try:
        a = matrix.analyse_run(out, {})
    except ValueError as exc:  # e.g. too few steps to measure a speed: this run fails, the benchmark goes on
        return {"label": label, "error": f"analysis: {exc}"}
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    st = s.get("stats", {})
    keep = ("alpha_mean_per_worker", "alpha_clips", "pushes_per_server", "pulls_per_server", "queue_wait_ms_per_server",
            "shard_elements", "gate_max_lead", "gate_held_replies", "counter_check", "groups", "rounds",
            "ps_exchanges", "ps_exchanges_per_group", "server_clients")
    return {"label": label, "protocol": protocol, "args": pargs, "workers": workers, "servers": servers,
            "launch_s": time.time() - t0, "steps_per_s": a["steps_per_s"], "time_to_target_s": a["time_to_target_s"],
            "final_test_accuracy": a["final_test_accuracy"], "overrun_fraction": a["overrun_fraction"],
            "ensemble_mean_local_accuracy": s.get("ensemble_mean_local_accuracy"),
            "ensemble_prediction_accuracy": s.get("ensemble_prediction_accuracy"),
            "stats": {k: st[k] for k in keep if k in st}}


def _med(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _fmt(m, fmt="{:.2f}"):
    if m is None:
        return "-"
    return f"{fmt.format(m['median'])} ({fmt.format(m['min'])}-{fmt.format(m['max'])})" if m["n"] > 1 else \
        fmt.format(m["median"])


def summarise(runs, suite, baseline):
    """Per label: final accuracy, steps/s, time to target, and ratios against ``baseline`` within each seed."""
    rows = []
    mine_all = [r for r in runs if r["suite"] == suite and "error" not in r]
    for label in dict.fromkeys(r["label"] for r in runs if r["suite"] == suite):
        acc, sps, ttt, speed, dacc, ens, over = [], [], [], [], [], [], []
        for seed in sorted({r["seed"] for r in runs}):
            m = [r for r in mine_all if r["seed"] == seed and r["label"] == label]
            b = [r for r in mine_all if r["seed"] == seed and r["label"] == baseline]
            if not m:
                continue
            m = m[0]
            acc.append(m["final_test_accuracy"])
            sps.append(m["steps_per_s"])
            ttt.append(m["time_to_target_s"])
            ens.append(m.get("ensemble_prediction_accuracy"))
            over.append(100.0 * m["overrun_fraction"] if m.get("overrun_fraction") is not None else None)
            if b:
                b = b[0]
                dacc.append(100.0 * (m["final_test_accuracy"] - b["final_test_accuracy"]))
                if m["time_to_target_s"] and b["time_to_target_s"]:
                    speed.append(b["time_to_target_s"] / m["time_to_target_s"])
        rows.append({"label": label, "final_accuracy": _med(acc), "steps_per_s": _med(sps),
                     "time_to_target_s": _med(ttt), "time_to_target_speedup": _med(speed),
                     "accuracy_delta_pt": _med(dacc), "ensemble_prediction_accuracy": _med(ens),
                     "overrun_pct": _med(over)})
    return rows


def table(rows, baseline):
    """One Markdown table (str)."""
    lines = [f"| run | final accuracy | acc. vs {baseline} (pt) | steps/s (rank 0) | time to target s | "
             f"speed-up vs {baseline} | ensemble prediction acc. | overrun steps % |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {_fmt(r['final_accuracy'], '{:.3f}')} | {_fmt(r['accuracy_delta_pt'], '{:+.2f}')} "
                     f"| {_fmt(r['steps_per_s'], '{:.1f}')} | {_fmt(r['time_to_target_s'])} | "
                     f"{_fmt(r['time_to_target_speedup'])}x | {_fmt(r['ensemble_prediction_accuracy'], '{:.3f}')} | "
                     f"{_fmt(r['overrun_pct'], '{:.1f}')} |")
    return "\n".join(lines)


BASELINES = {"accuracy": "asp W=8", "straggler": "bsp", "sharding": "asp layer", "ssp": "bsp", "mixed": "rna"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/ps_bench")
    p.add_argument("--verbose", action="store_true",
                   help="the jobs keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    p.add_argument("--suites", default=",".join(SUITES))
    p.add_argument("--workers", type=int, default=8, help="workers W (servers are added on top)")
    p.add_argument("--device", type=float, default=40.0, help="emulated device time per step (ms)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--staleness", type=int, default=3, help="SSP's s")
    p.add_argument("--sync-every", type=int, default=1, help="hierarchical RNA's sync_every (mixed suite)")
    p.add_argument("--eval-every", type=int, default=10, help="steps between test evaluations")
    p.add_argument("--target", type=float, default=0.85, help="test accuracy of the time-to-target figure")
    p.add_argument("--digits", action="store_true", help="digits instead of MNIST")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch")
    p.add_argument("--reanalyse", action="store_true", help="print the tables from OUT/results.json, launch nothing")
    args = p.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    args.suite_list = [s.strip() for s in args.suites.split(",") if s.strip()]
    bad = [s for s in args.suite_list if s not in SUITES]
    if bad or not args.suite_list:
        p.error(f"--suites must name some of {', '.join(SUITES)}; got {args.suites!r}")
    if args.sync_every < 1:
        p.error(f"--sync-every must be >= 1, got {args.sync_every}")
    if args.workers < 2 or args.device <= 0 or args.epochs < 1 or args.staleness < 0 or not 0 < args.target <= 1:
        p.error(f"need --workers >= 2, --device > 0, --epochs >= 1, --staleness >= 0, --target in (0, 1]; got "
                f"{args.workers}, {args.device}, {args.epochs}, {args.staleness}, {args.target}")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    runs = []
    if args.reanalyse:  # tables again from an earlier run's results.json, nothing launched
        with open(os.path.join(args.out, "results.json")) as f:
            runs = json.load(f)["runs"]
    for seed in ([] if args.reanalyse else args.seed_list):
        for suite in args.suite_list:
            cs = configurations(suite, args)
            cs = cs[seed % len(cs):] + cs[:seed % len(cs)]  # rotate the order per seed (the machine drifts)
            for label, protocol, pargs, w, k, spec in cs:
                out = os.path.join(args.out, f"s{seed}-{suite}-{label.replace(' ', '_').replace('=', '')}")
                print(f"[ps_bench] seed {seed} {suite}: {label} ({w} workers + {k} servers, {spec}) ...", flush=True)
                rec = run_one(label, protocol, pargs, w, k, spec, seed, args, out)
                rec.update(suite=suite, spec=spec, seed=seed)
                runs.append(rec)
                print("[ps_bench]   " + json.dumps({k2: rec.get(k2) for k2 in (
                    "steps_per_s", "time_to_target_s", "final_test_accuracy", "overrun_fraction", "error")}), flush=True)
                with open(os.path.join(args.out, "results.json"), "w") as f:
                    json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    report = {}
    for suite in args.suite_list:
        base = BASELINES[suite].replace("W=8", f"W={args.workers}")
        report[suite] = summarise(runs, suite, base)
        print(f"\n### {suite} ({args.workers} workers, device:{args.device:g}, seeds {args.seeds})\n")
        print(table(report[suite], base) + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "runs": runs, "report": report}, f, indent=1)
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])  # the launched jobs inherit it
    sys.exit(main())
