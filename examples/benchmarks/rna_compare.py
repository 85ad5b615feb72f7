"""Side-by-side BSP vs RNA runs of the example job; prints ratios (RNA section 8.1 style).

    .venv/bin/python examples/benchmarks/rna_compare.py --slowdown random:6 --seeds 2 4 [example args...]

The RNA page's measured figures (4 ranks, ``random:6``, example CNN; ``MNIST_DIR`` is the folder of MNIST's IDX files):

    .venv/bin/python examples/benchmarks/rna_compare.py --seeds 2 4 6 --dataset mnist-idx \
        --data-dir MNIST_DIR --model cnn --epochs 10 --eval-every 10 \
        --target-accuracy 0.95 --also-targets 0.9 0.93 0.94 0.96
    .venv/bin/python examples/benchmarks/rna_compare.py --seeds 2 4 6 --dataset digits --model cnn \
        --epochs 60 --eval-every 10 --target-accuracy 0.95 --also-targets 0.9 0.93 0.96
    .venv/bin/python examples/benchmarks/rna_compare.py --slowdown none --seeds 2 --dataset mnist-idx \
        --data-dir MNIST_DIR --model cnn --epochs 3 --eval-every 10

Each repeat launches ``horovodrun --mpi -np N python -m hetsync.bench.job`` once with ``--protocol bsp``
and once with ``--protocol rna`` (alternating order between repeats, same data, model, seed and
scenario) and reads each run's ``summary.json`` and per-rank step records. Reported per protocol:
time to the target test accuracy (s, rank 0's model; evaluations are deferred to the end of
training, see :class:`hetsync.callbacks.TestAccuracy`), final test accuracy,
and the time per step (ms): the mean over ranks and steps of ``step_ms``, skipping each rank's
first 3 steps (tracing). Ratios: BSP's time to target / RNA's (speed-up), RNA's accuracy minus
BSP's (points), RNA's time per step / BSP's.

Seeds: ``--seeds 2 4`` by default (any seeds work: the Slowdown callback does not slow the first,
tracing step of a fit, so no seed gives either protocol a head start).
"""
import argparse
import json
import os
import statistics
import sys

from tabulate import tabulate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from hetsync.bench import launch  # noqa: E402
import hetsync  # noqa: E402


def step_ms(out_dir, world):
    """Mean step time in ms over ranks and steps (each rank's first 3 steps skipped)."""
    vals = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.jsonl")) as f:
            vals += [json.loads(line)["step_ms"] for line in f if line.strip()][3:]
    return statistics.fmean(vals)


def run(proto, out_dir, args, extra):
    cmd = launch.horovodrun(args.np, launch.job_argv(proto, out_dir, args.rna_arg if proto == "rna" else (),
                                                     extra=extra, slowdown=args.slowdown))
    proc = launch.run(cmd, args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(out_dir, "summary.json")) as f:
        s = json.load(f)
    return {"ttt": s["time_to_target_s"], "acc": s["final_test_accuracy"], "step_ms": step_ms(out_dir, args.np),
            "wall": s["wall_s"], "stats": s["stats"], "curve": s["accuracy_curve"]}


def time_to(curve, target):
    """First wall time (s) in an accuracy curve at which ``target`` is reached, or None."""
    return next((c["wall_s"] for c in curve if c["accuracy"] >= target), None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--slowdown", default="random:6")
    p.add_argument("--seeds", type=int, nargs="+", default=[2, 4], help="one repeat per seed")
    p.add_argument("--rna-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="runs/bench-rna")
    p.add_argument("--verbose", action="store_true",
                   help="the jobs keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--also-targets", type=float, nargs="*", default=[],
                   help="further accuracies whose time-to ratios are read post hoc from the same runs' curves")
    args, extra = p.parse_known_args(argv)
    rows, ratios = [], {"speedup": [], "acc_diff": [], "step_ratio": []}
    ratios.update({f"speedup@{t:g}": [] for t in args.also_targets})
    for rep, seed in enumerate(args.seeds):
        order = ("bsp", "rna") if rep % 2 == 0 else ("rna", "bsp")
        res = {proto: run(proto, os.path.join(args.out, f"{proto}-{rep}"), args, extra + ["--seed", str(seed)])
               for proto in order}
        b, r = res["bsp"], res["rna"]
        for proto in ("bsp", "rna"):
            x = res[proto]
            rows.append([seed, proto, x["ttt"], f"{x['acc']:.4f}", f"{x['step_ms']:.1f}", f"{x['wall']:.1f}"])
        if b["ttt"] and r["ttt"]:
            ratios["speedup"].append(b["ttt"] / r["ttt"])
        ratios["acc_diff"].append((r["acc"] - b["acc"]) * 100)
        for t in args.also_targets:
            tb, tr = time_to(b["curve"], t), time_to(r["curve"], t)
            if tb and tr:
                ratios[f"speedup@{t:g}"].append(tb / tr)
        ratios["step_ratio"].append(r["step_ms"] / b["step_ms"])
        st = r["stats"]
        print(f"repeat {rep}: rna rounds={st.get('rounds')} contributors/round={st.get('contributors_per_round_mean')} "
              f"fresh={st.get('fresh_fraction')} dropped={st.get('dropped_gradients')} "
              f"drift_max={st.get('drift_max')} probe_ms={st.get('probe_response_ms')}", flush=True)
    print(f"settings: --np {args.np} --slowdown {args.slowdown} {' '.join(extra)} rna: {args.rna_arg}")
    print(tabulate(rows, headers=["seed", "protocol", "time to target s", "final acc", "step ms", "wall s"],
                   tablefmt="github"))
    for k, v in ratios.items():
        print(f"{k}: {[round(x, 3) for x in v]} median {statistics.median(v) if v else None}")
    return 0


if __name__ == "__main__":
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])  # the launched jobs inherit it
    sys.exit(main())
