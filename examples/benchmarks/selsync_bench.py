"""SelSync benchmark: LSSR and accuracy beside BSP, time to target under netdelay, non-IID injection vs FedAvg.

Runs the training job ``python -m hetsync.bench.job`` under ``horovodrun --mpi`` once per configuration,
side by side in one invocation (same data, model, seed), and prints ratios. Not a timed test: the machine is
shared, so read the ratios, and use ``--repeats`` for the timing suite.

    .venv/bin/python examples/benchmarks/selsync_bench.py iid --dataset digits --epochs 30 --seeds 0 1 2 3 4
    .venv/bin/python examples/benchmarks/selsync_bench.py iid --dataset mnist-idx --data-dir MNIST_DIR \
        --epochs 5 --seeds 0 1 2
    .venv/bin/python examples/benchmarks/selsync_bench.py netdelay --epochs 30 --repeats 4 --eval-every 5
    .venv/bin/python examples/benchmarks/selsync_bench.py netdelay --device 10 --epochs 30 --seeds 0 1 2 \
        --eval-every 5   # the emulated cluster: 10 ms devices, 50 ms network latency
    .venv/bin/python examples/benchmarks/selsync_bench.py noniid --np 10 --epochs 30

(the SelSync page's measured figures; ``MNIST_DIR`` is the folder of MNIST's IDX files).

Suites:
  iid       BSP and SelSync delta in {0.1, 0.3, 0.5}: LSSR, final accuracy (target: LSSR >= 0.7 and
            accuracy >= BSP - 0.5 points).
  netdelay  BSP and SelSync delta=0.3 under ``netdelay:MS`` (``--device MS``: on the emulated cluster, where
            a step lasts MS ms, so at most (MS + 50) / MS faster than BSP): time to target accuracy,
            one run pair per ``--seeds`` value (or ``--repeats`` of ``--seed``).
  noniid    label-skew:1 (one label per rank): SelSync with injection (0.5, 0.5, delta) vs FedAvg
            (C=1, one aggregation per epoch): final accuracy (target: injection beats FedAvg).
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

#: seconds one launched run may take before it is killed and the benchmark fails.
RUN_TIMEOUT_S = 7200


def run(name, out_root, np_, protocol, proto_args, extra, quiet=True):
    """Launch one example run; return its summary dict (raises CalledProcessError on failure)."""
    out = os.path.join(out_root, name)
    cmd = launch.horovodrun(np_, launch.job_argv(protocol, out, proto_args, extra=extra))
    print("$", " ".join(cmd[1:]), flush=True)
    proc = launch.run(cmd, RUN_TIMEOUT_S, capture=quiet)
    if proc.returncode != 0:
        print(proc.stdout[-4000:] if proc.stdout else "", proc.stderr[-4000:] if proc.stderr else "")
        proc.check_returncode()
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def _common(args, seed=None):
    extra = ["--dataset", args.dataset, "--epochs", str(args.epochs), "--lr", str(args.lr),
             "--batch-size", str(args.batch_size), "--seed", str(args.seed if seed is None else seed),
             "--model", args.model,
             "--target-accuracy", str(args.target)]
    if args.data_dir:
        extra += ["--data-dir", args.data_dir]
    if args.eval_every:
        extra += ["--eval-every", str(args.eval_every)]
    return extra


def iid(args):
    rows, runs = [], {}
    names = ["bsp"] + [f"selsync d={d:g}" for d in args.deltas]
    for seed in args.seeds:
        extra = _common(args, seed)
        runs[("bsp", seed)] = run(f"bsp_s{seed}", args.out, args.np, "bsp", [], extra)
        for delta in args.deltas:
            runs[(f"selsync d={delta:g}", seed)] = run(f"selsync_{delta:g}_s{seed}", args.out, args.np, "selsync",
                                                       [f"delta={delta}", f"aggregation={args.aggregation}"], extra)
    mean = statistics.mean
    bsp_acc = mean(runs[("bsp", s)]["final_test_accuracy"] for s in args.seeds)
    for name in names:
        rs = [runs[(name, s)] for s in args.seeds]
        lssr = mean(r["stats"].get("lssr", 0.0) for r in rs)
        acc = mean(r["final_test_accuracy"] for r in rs)
        ok = lssr >= 0.7 and acc >= bsp_acc - 0.005
        syncs = mean(r["stats"].get("sync_steps", r["stats"]["syncs"]) for r in rs)
        rows.append([name, rs[0]["steps"], f"{lssr:.3f}", syncs,
                     " ".join(f"{r['final_test_accuracy']:.4f}" for r in rs), f"{acc:.4f}",
                     f"{100 * (acc - bsp_acc):+.2f}", f"{mean(r['wall_s'] for r in rs):.1f}",
                     "-" if name == "bsp" else ("met" if ok else "NOT met")])
    print(tabulate(rows, headers=["run", "steps", "LSSR", "sync steps", "final acc per seed", "mean acc",
                                  "acc - BSP (points)", "wall s", "target"]))
    return runs


def _time_to(summary, target):
    """First wall time (s) at which the recorded accuracy curve reaches ``target``, or None."""
    return next((c["wall_s"] for c in summary["accuracy_curve"] if c["accuracy"] >= target), None)


def netdelay(args):
    spec = f"netdelay:{args.netdelay_ms:g}" if not args.device else f"device:{args.device:g}+netdelay:{args.netdelay_ms:g}"
    rows, ratios, pairs = [], [], []
    seeds = args.seeds if len(args.seeds) > 1 else [args.seed] * args.repeats
    for rep, seed in enumerate(seeds):
        extra = _common(args, seed) + ["--slowdown", spec]
        bsp = run(f"bsp_r{rep}", args.out, args.np, "bsp", [], extra)
        sel = run(f"selsync_r{rep}", args.out, args.np, "selsync", [f"delta={args.delta}"], extra)
        tb, ts = bsp["time_to_target_s"], sel["time_to_target_s"]
        ratio = tb / ts if tb and ts else None
        ratios.append(ratio)
        pairs.append((bsp, sel))
        rows.append([f"{rep} (seed {seed})", f"{bsp['wall_s']:.1f}", "-" if tb is None else f"{tb:.1f}",
                     f"{bsp['final_test_accuracy']:.4f}",
                     f"{sel['wall_s']:.1f}", "-" if ts is None else f"{ts:.1f}", f"{sel['final_test_accuracy']:.4f}",
                     f"{sel['stats']['lssr']:.3f}", "-" if ratio is None else f"{ratio:.2f}x"])
    print(tabulate(rows, headers=["rep", "BSP wall s", "BSP t->target s", "BSP acc", "SelSync wall s",
                                  "SelSync t->target s", "SelSync acc", "LSSR", "speed-up"]))
    for target in args.also_targets:  # post hoc, from the same runs' accuracy curves
        per = [(_time_to(r[0], target), _time_to(r[1], target)) for r in pairs]
        txt = ", ".join("-" if not (tb and ts) else f"{tb / ts:.2f}x ({tb:.1f} s vs {ts:.1f} s)" for tb, ts in per)
        print(f"time to {target:.0%} speed-up per repeat: {txt}")
    good = [r for r in ratios if r]
    if good:
        print(f"median time-to-{args.target:.0%} speed-up over BSP with netdelay:{args.netdelay_ms:g}: "
              f"{statistics.median(good):.2f}x (target >= 2x: {'met' if statistics.median(good) >= 2 else 'NOT met'})")
    return ratios


def noniid(args):
    extra = _common(args) + ["--partition", f"label-skew:{args.labels_per_rank}"]
    inj = run("selsync_injection", args.out, args.np, "selsync",
              [f"delta={args.delta}", f"alpha={args.alpha}", f"beta={args.beta}"], extra)
    sel = run("selsync_no_injection", args.out, args.np, "selsync", [f"delta={args.delta}"], extra)
    fed = run("fedavg", args.out, args.np, "fedavg", ["fraction=1.0", "syncs_per_epoch=1"], extra)
    rows = []
    for name, s in (("SelSync + injection", inj), ("SelSync, no injection", sel), ("FedAvg (1, 1)", fed)):
        st = s["stats"]
        rows.append([name, s["steps"], f"{st.get('lssr', 0):.3f}", f"{s['final_test_accuracy']:.4f}",
                     st.get("inject_sent_bytes", 0), st.get("bytes_sent")])
    print(tabulate(rows, headers=["run", "steps", "LSSR", "final acc", "injected bytes sent (rank 0)",
                                  "collective bytes (rank 0)"]))
    verdict = inj["final_test_accuracy"] > fed["final_test_accuracy"]
    print(f"injection ({args.alpha}, {args.beta}, {args.delta}) beats FedAvg: {'met' if verdict else 'NOT met'} "
          f"({inj['final_test_accuracy']:.4f} vs {fed['final_test_accuracy']:.4f})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", choices=("iid", "netdelay", "noniid"))
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--dataset", default="digits", choices=("digits", "mnist-idx"))
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="iid suite: seeds to average over")
    p.add_argument("--target", type=float, default=0.9, help="target test accuracy (time to target)")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--deltas", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    p.add_argument("--delta", type=float, default=0.3)
    p.add_argument("--aggregation", default="parameter", choices=("parameter", "gradient"))
    p.add_argument("--netdelay-ms", type=float, default=50.0)
    p.add_argument("--device", type=float, default=0.0, metavar="MS",
                   help="netdelay suite: run on the emulated device (device:MS ms per step; 0: real CPU)")
    p.add_argument("--also-targets", type=float, nargs="*", default=[0.93],
                   help="netdelay suite: also report time-to-accuracy ratios for these targets (same runs)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--labels-per-rank", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--verbose", action="store_true",
                   help="the jobs keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    args = p.parse_args(argv)
    args.out = args.out or os.path.join(ROOT, "runs", f"selsync_{args.suite}_{args.dataset}")
    {"iid": iid, "netdelay": netdelay, "noniid": noniid}[args.suite](args)


if __name__ == "__main__":
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])  # the launched jobs inherit it
    main()
