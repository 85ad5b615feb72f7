"""Task allocation benchmark: epoch-time ratios and heterogeneity efficiency, side by side in one run.

Runs the training job ``python -m hetsync.bench.job`` under ``horovodrun --mpi -np N`` (``--np``, default 4) for each
configuration below, interleaved, ``--repeats`` times (the machine is shared and noisy):

* ``speeds:1,...,1,0.5`` (the last rank twice slower; ``speeds:1,1,1,0.5`` on 4 ranks): task
  allocation with an equal static allocation vs self-adaptive allocation (same C, same
  micro-batch, so the same global batch), plus BSP with the same global batch for reference;
* no slowdown: BSP vs self-adaptive task allocation (same global batch).

Every run gets the same ``--batch-size`` b = C x micro-batch / N (per rank, as for BSP: BSP's global
batch is C x micro-batch); task allocation gets ``--micro-batch`` as its ``micro_batch`` protocol
argument (``--protocol-arg micro_batch=M``), which here equals its default n b / C.

Epoch time is measured from rank 0's per-step records (``rank0.jsonl``): the duration of epoch e is
the wall time between the last step of epoch e-1 and the last step of epoch e; the figure is the
median over epochs ``--skip`` .. end ("once stable"). Two heterogeneity efficiencies are reported:

* ``E`` (GUIDE section 3): the job's samples/s (samples per epoch / that median epoch time) over the
  sum of the ranks' *solo* speeds, measured right after the run by
  :func:`hetsync.bench.efficiency.measure_solo`: the n ranks as n independent processes started
  together (so they share the cores as in the run, but never wait), each with its own per-step
  workload of the run (w_i x b samples for task allocation, its final w; the BSP batch for BSP) and
  a number of epochs proportional to it, so they run for about as long; speeds over the window in
  which all n ran. ``--no-solo`` skips it. The epoch time includes the epoch-end exchange and
  evaluation snapshot, which the solo speeds leave out, so E errs low;
* ``E in-run``, the protocol's own (:func:`hetsync.protocols.taskalloc.protocol.heterogeneity_efficiency`, the
  paper's v_i = D_i / t_s^i): the fraction of the epoch the ranks spend computing. Where ranks share
  cores it understates E: a waiting rank yields its core and the others compute faster meanwhile.

``--cycle-time-ms`` sets horovod's cycle time (``horovodrun --cycle-time-ms``, the delay between the
background thread's negotiation rounds) for every real-CPU configuration alike (the simulated
variant keeps horovod's default); default 0.2 ms (horovod's own
default is 5 ms, too long against rounds of a few tens of milliseconds; ``--cycle-time-ms 0`` keeps
horovod's default). Prints a table and writes ``OUT/results.json``.

``--device MS`` runs every configuration on the emulated cluster (scenario part ``device:MS``, see
:mod:`hetsync.emulation.scenario`): each step lasts K_i x MS x samples / b ms whatever the cores do, so the
ranks' speeds are those of their devices; E is then also given against the analytic solo speeds
b / (K_i MS) (``E analytic``), and the overrun steps are reported. ``--speeds`` sets the
heterogeneous scenario (e.g. ``speeds:1,1,1,1,1,1,0.5,0.25`` with ``--np 8``).

``--simulated MS`` instead runs ``tests/jobs/taskalloc_adaptive.py`` (digits, small CNN) with a
*simulated device* that waits MS ms per sample on a timer thread (no CPU), so compute time is
proportional to the work and independent of how the machine's cores are shared: equal static
allocation vs adaptive under ``speeds:1,1,1,0.5``, and BSP vs adaptive with equal speeds (epoch
time = median epoch wall time on rank 0 over epochs ``--skip`` .. end).

Usage: ``.venv/bin/python examples/benchmarks/taskalloc_bench.py --out runs/taskalloc_bench``
(``--simulated 1.0`` for the simulated-device variant). The task allocation page's figures came from::

    .venv/bin/python examples/benchmarks/taskalloc_bench.py --out runs/ta32 --np 4 --total 32 \
        --micro-batch 32 --epochs 10 --skip 3 --repeats 3
    .venv/bin/python examples/benchmarks/taskalloc_bench.py --out runs/ta64 --np 4 --total 64 \
        --micro-batch 32 --epochs 10 --skip 3 --repeats 3
    .venv/bin/python examples/benchmarks/taskalloc_bench.py --out runs/tasim --simulated 3.0 --total 28 \
        --micro-batch 8 --epochs 8 --skip 3 --repeats 2

``--target`` is the throughput check on the digits set (no MNIST needed): per seed, BSP against adaptive task
allocation with its defaults, summary.json's ``samples_per_s`` and final accuracy side by side::

    .venv/bin/python examples/benchmarks/taskalloc_bench.py --target --out runs/ta-target --np 4 --epochs 10 \
        --lr 0.2 --model mlp --seeds 1,2,3 --probe-rounds 4 --dilation 1

and on the emulated cluster, with task allocation's default settings (BSP's global batch)::

    .venv/bin/python examples/benchmarks/taskalloc_bench.py --out runs/ta-emu4 --device 40 --np 4 \
        --defaults 32 --model mlp --epochs 8 --skip 3 --repeats 3 --no-solo
    .venv/bin/python examples/benchmarks/taskalloc_bench.py --out runs/ta-emu8 --device 40 --np 8 \
        --speeds speeds:1,1,1,1,1,1,0.5,0.25 --defaults 32 --model mlp --epochs 8 --skip 3 --repeats 3 --no-solo
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

from tabulate import tabulate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from hetsync import emulation as slowdown  # noqa: E402
from hetsync.bench import efficiency, launch  # noqa: E402
import hetsync  # noqa: E402

PY = sys.executable


def slow_spec(np_):
    """``speeds:1,...,1,0.5``: the last of ``np_`` ranks runs at half speed."""
    return "speeds:" + ",".join(["1"] * (np_ - 1) + ["0.5"])


def on_device(spec, device_ms):
    """``spec`` on the emulated device of ``device_ms`` ms per step (``device:MS+spec``), or unchanged if 0."""
    if not device_ms:
        return spec
    return f"device:{device_ms:g}" + ("" if spec == "none" else "+" + spec)


def configs(total, micro, np_=4, speeds=None, device_ms=0, batch_size=None):
    """Return {name: (slowdown spec, protocol argv)}: every run has the global batch total x micro samples.

    Args:
        total: int C, micro-batches per round. micro: int samples per micro-batch (task allocation's
            ``micro_batch``). np_: int ranks. speeds: the heterogeneous scenario (a ``speeds:...``
            spec; default :func:`slow_spec`). device_ms: float, run on the emulated device of that
            many ms per step of the per-rank batch (0: the real CPU). batch_size: int b, or None;
            given, ``total`` and ``micro`` are ignored and task allocation runs with its *default*
            settings (adaptive: single-sample allocation, static: C = n; both BSP's global batch n b).

    Raises:
        SystemExit: ``total`` not a multiple of ``np_`` (the equal allocation and the per-rank batch
            size C x micro / np_ would not be whole).
    """
    if batch_size is not None:  # the protocol's defaults: BSP's global batch
        batch = str(batch_size)
        ta = ["--protocol", "taskalloc", "--batch-size", batch]
    else:
        if total % np_:
            raise SystemExit(f"--total {total} must be a multiple of --np {np_} (equal allocation, BSP batch)")
        batch = str(total * micro // np_)  # the per-rank batch size b of every run (BSP's)
        ta = ["--protocol", "taskalloc", "--batch-size", batch, "--protocol-arg", f"total={total}",
              "--protocol-arg", f"micro_batch={micro}"]
    bsp = ["--protocol", "bsp", "--batch-size", batch]
    hetero = on_device(speeds or slow_spec(np_), device_ms)
    same = on_device("none", device_ms)
    return {
        "hetero/equal": (hetero, ta + ["--protocol-arg", "mode=static"]),
        "hetero/adaptive": (hetero, ta + ["--protocol-arg", "mode=adaptive"]),
        "hetero/bsp": (hetero, bsp),
        "equal/bsp": (same, bsp),
        "equal/adaptive": (same, ta + ["--protocol-arg", "mode=adaptive"]),
    }


def epoch_times(path):
    """Durations (seconds) of each epoch from one rank's per-step records."""
    ends = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                ends[r["epoch"]] = max(ends.get(r["epoch"], 0.0), r["wall_s"])
    e = sorted(ends)
    return [ends[e[0]]] + [ends[b] - ends[a] for a, b in zip(e, e[1:])]


def solo_speeds(spec, batches, args, out, cache):
    """Solo speeds (samples/s, list) of ranks with per-step batches ``batches`` under ``spec``, cached."""
    key = (spec, tuple(batches))
    if key not in cache:
        job = [*launch.JOB, "--dataset", "mnist-idx", "--data-dir", args.data_dir, "--model",
               args.model, "--lr", str(args.lr), "--epochs", str(args.solo_epochs)]
        per_rank = [["--batch-size", str(b), "--epochs", str(math.ceil(args.solo_epochs * b / min(batches)))]
                    for b in batches]
        res = efficiency.measure_solo(job, spec, args.np, out, python=PY, cwd=ROOT, env=launch.job_env(), timeout_s=900,
                                      rank_argv=per_rank, common_window=True)
        cache[key] = res["samples_per_s"]
    return cache[key]


def run(name, spec, argv, args, out, cache=None):
    cmd = launch.horovodrun(args.np, [*launch.JOB, "--dataset", "mnist-idx", "--data-dir", args.data_dir, "--model",
                                      args.model, "--epochs", str(args.epochs), "--lr", str(args.lr),
                                      "--slowdown", spec, "--quiet", "--out", out] + argv,
                            cycle_time_ms=args.cycle_time_ms if args.cycle_time_ms > 0 else None)
    t0 = time.time()
    proc = launch.run(cmd, 1800)
    if proc.returncode != 0:
        sys.exit(f"{name} failed ({' '.join(cmd)}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    times = epoch_times(os.path.join(out, "rank0.jsonl"))[args.skip:]
    samples_per_epoch = sum(p["samples"] for p in s["per_rank"]) / args.epochs  # all ranks
    rec = {"name": name, "epoch_s": statistics.median(times), "accuracy": s["final_test_accuracy"],
           "samples_per_epoch": samples_per_epoch, "launch_s": time.time() - t0}
    rec["us_per_sample"] = rec["epoch_s"] / samples_per_epoch * 1e6
    if s["protocol"] == "taskalloc":
        eps = s["stats"]["epochs"]
        rec["efficiency"] = statistics.median(h["efficiency"] for h in eps[args.skip:])
        rec["w_last"] = eps[-1]["w"]
        rec["w_by_epoch"] = [h["w"] for h in eps]
        rec["stable_epoch"] = s["stats"].get("stable_epoch")
        batches = [w * s["stats"]["micro_batch"] for w in rec["w_last"]]
    else:
        batches = [s["batch_size"]] * args.np
    analytic = efficiency.analytic_solo(spec, args.np, s["batch_size"])
    if analytic:  # emulated device: E against each rank's expected device speed, b / (K_i MS)
        rec["solo_analytic_samples_per_s"] = analytic
        rec["e_analytic"] = efficiency.efficiency(samples_per_epoch / rec["epoch_s"], analytic)
        rec["overrun_steps"], rec["emulated_steps"] = s["overrun_steps"], s["emulated_steps"]
    if cache is not None:
        solo = solo_speeds(spec, batches, args, out + "_solo", cache)
        rec["solo_samples_per_s"] = solo
        rec["e_solo"] = efficiency.efficiency(samples_per_epoch / rec["epoch_s"], solo)
    return rec


def run_simulated(args):
    """Simulated device: equal static vs adaptive allocation under speeds:1,1,1,0.5, and BSP vs
    adaptive with equal speeds (same global batch); returns the results dict."""
    os.makedirs(args.out, exist_ok=True)
    runs = []
    if args.total % 4:
        sys.exit(f"--total {args.total} must be a multiple of 4 (the simulated variant runs 4 ranks)")
    cases = [("equal", "speeds:1,1,1,0.5", ["--mode", "static", "--weights", ",".join([str(args.total // 4)] * 4)]),
             ("adaptive", "speeds:1,1,1,0.5", ["--mode", "adaptive", "--total", str(args.total)]),
             ("bsp_same_speeds", "none", ["--mode", "bsp", "--total", str(args.total)]),
             ("adaptive_same_speeds", "none", ["--mode", "adaptive", "--total", str(args.total)])]
    for rep in range(args.repeats):
        for name, spec, extra in cases[rep % len(cases):] + cases[:rep % len(cases)]:
            out = os.path.join(args.out, f"sim_{name}_{rep}.json")
            job = os.path.join(ROOT, "tests", "jobs", "taskalloc_adaptive.py")  # launched from any directory
            cmd = launch.mpirun(4, [job, out, "--slowdown", spec, "--epochs", str(args.epochs),
                                    "--batch-size", str(args.total * args.micro_batch // 4),
                                    "--micro-batch", str(args.micro_batch), "--tile", "1", "--width", "8",
                                    "--device-ms-per-sample", str(args.simulated)] + extra)
            proc = launch.run(cmd, 1800)
            if proc.returncode != 0:
                sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            with open(out) as f:
                res = json.load(f)[spec]
            st = res["stats"]
            rec = {"name": name, "repeat": rep, "epoch_s": statistics.median(res["epoch_wall_s"][args.skip:])}
            if "epochs" in st:
                eps = st["epochs"][args.skip:]
                rec.update({"efficiency": statistics.median(h["efficiency"] for h in eps),
                            "w_last": st["epochs"][-1]["w"], "w_by_epoch": [h["w"] for h in st["epochs"]]})
            runs.append(rec)
            print(json.dumps(rec), flush=True)
    names = [c[0] for c in cases]
    med = {n: statistics.median(r["epoch_s"] for r in runs if r["name"] == n) for n in names}
    eff = {n: statistics.median(r["efficiency"] for r in runs if r["name"] == n)
           for n in names if n != "bsp_same_speeds"}
    res = {"args": vars(args), "runs": runs, "median_epoch_s": med, "median_efficiency": eff,
           "ratios": {"adaptive_vs_equal_epoch_time": med["adaptive"] / med["equal"],
                      "adaptive_vs_bsp_epoch_time_same_speeds": med["adaptive_same_speeds"] / med["bsp_same_speeds"]}}
    print(json.dumps({k: res[k] for k in ("median_epoch_s", "median_efficiency", "ratios")}, indent=1))
    with open(os.path.join(args.out, "results_simulated.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


def run_target(args):
    """The throughput check on the digits set: BSP against adaptive task allocation (``--probe-rounds``
    K, or the paper's per-epoch rule with 0), each seed of ``--seeds`` side by side, on the emulated
    device ``device:MS+speeds`` at time dilation ``--dilation`` D; returns the results dict.

    Figures are summary.json's own: ``samples_per_s`` (every rank's samples over the fit's wall time,
    the compiling first step included), ``final_test_accuracy``, the overrun share and the final w.
    """
    from hetsync.world import DILATION_ENV

    os.makedirs(args.out, exist_ok=True)
    spec = on_device(args.speeds or slow_spec(args.np), args.device or 40.0)
    ta = ["--protocol", "taskalloc", "--protocol-arg", "mode=adaptive"]
    if args.probe_rounds:
        ta += ["--protocol-arg", f"probe_rounds={args.probe_rounds}"]
    cases = {"bsp": ["--protocol", "bsp"], "taskalloc": ta}
    env = launch.job_env()
    if args.dilation != 1.0:
        env[DILATION_ENV] = f"{args.dilation:g}"
    runs = []
    for seed in args.seeds:
        for name, pargs in cases.items():
            out = os.path.join(args.out, f"{name}_s{seed}")
            cmd = launch.horovodrun(args.np, [*launch.JOB, "--dataset", "digits", "--model", args.model, "--epochs",
                                              str(args.epochs), "--lr", str(args.lr), "--batch-size",
                                              str(args.defaults or 32), "--seed", str(seed), "--slowdown", spec,
                                              "--quiet", "--out", out] + pargs,
                                    cycle_time_ms=args.cycle_time_ms if args.cycle_time_ms > 0 else None)
            s = launch.run_for_summary(cmd, 900 * args.dilation, out, f"taskalloc target run {name} seed {seed}",
                                       env=env)
            rec = {"name": name, "seed": seed, "samples_per_s": s["samples_per_s"],
                   "accuracy": s["final_test_accuracy"], "overrun": s["overrun_steps"] / max(1, s["emulated_steps"]),
                   "w": s["stats"].get("final_w") if name == "taskalloc" else None,
                   "probe_w": (s["stats"].get("probe") or {}).get("next_w") if name == "taskalloc" else None}
            runs.append(rec)
            print(json.dumps(rec), flush=True)
    by = {(r["name"], r["seed"]): r for r in runs}
    rows, ratios, deltas = [], [], []
    for seed in args.seeds:
        b, t = by[("bsp", seed)], by[("taskalloc", seed)]
        ratios.append(t["samples_per_s"] / b["samples_per_s"])
        deltas.append(t["accuracy"] - b["accuracy"])
        rows.append([seed, f"{b['samples_per_s']:.0f}", f"{t['samples_per_s']:.0f}", f"{ratios[-1]:.2f}x",
                     f"{b['accuracy']:.4f}", f"{t['accuracy']:.4f}", f"{100 * deltas[-1]:+.1f}",
                     f"{100 * b['overrun']:.1f}% / {100 * t['overrun']:.1f}%", t["probe_w"] or "-", t["w"]])
    print(f"{args.np} ranks, {spec}, digits, {args.epochs} epochs, dilation {args.dilation:g}, probe_rounds "
          f"{args.probe_rounds or None}")
    print(tabulate(rows, headers=["seed", "BSP samples/s", "task allocation samples/s", "ratio", "BSP accuracy",
                                  "task allocation accuracy", "difference (points)", "overrun steps BSP / TA",
                                  "w after the probe", "final w"], tablefmt="github"))
    res = {"args": vars(args), "runs": runs, "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
           "accuracy_difference_min_points": 100 * min(deltas)}
    print(json.dumps({k: res[k] for k in ("ratio_min", "ratio_median", "accuracy_difference_min_points")}))
    with open(os.path.join(args.out, "results_target.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/taskalloc_bench")
    p.add_argument("--verbose", action="store_true",
                   help="the jobs keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    p.add_argument("--np", type=int, default=4, help="ranks (real-CPU mode); the last one runs at half speed")
    p.add_argument("--data-dir", default=os.environ.get("HETSYNC_DATA_DIR"), metavar="DIR",
                   help="folder of MNIST's IDX files (default: $HETSYNC_DATA_DIR)")
    p.add_argument("--model", default="cnn", choices=("mlp", "cnn"))
    p.add_argument("--total", type=int, default=32, help="C, micro-batches per round")
    p.add_argument("--micro-batch", type=int, default=32,
                   help="samples per micro-batch, task allocation's micro_batch argument; every run's per-rank "
                        "--batch-size is total x micro-batch / np")
    p.add_argument("--defaults", type=int, default=None, metavar="B",
                   help="task allocation with its default settings and per-rank batch B (BSP's global batch n B; "
                        "--total and --micro-batch are then not used)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--skip", type=int, default=3, help="epochs left out of the medians (warm-up, adaptation)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", default=None, help="comma-separated subset of configuration names")
    p.add_argument("--cycle-time-ms", type=float, default=0.2,
                   help="horovod cycle time for every run (ms; 0: horovod's default)")
    p.add_argument("--solo-epochs", type=int, default=12,
                   help="epochs of the smallest-batch solo process (the others run proportionally more)")
    p.add_argument("--no-solo", action="store_true", help="skip the solo speeds and the E they give")
    p.add_argument("--device", type=float, default=0.0, metavar="MS",
                   help="run every configuration on the emulated device (scenario device:MS, MS ms per step of the "
                        "per-rank batch); E is then also computed against the analytic solo speeds; 0: real CPU")
    p.add_argument("--speeds", default=None, metavar="SPEC",
                   help="heterogeneous scenario, a speeds:... spec with one speed per rank (default: the last "
                        "rank at half speed)")
    p.add_argument("--simulated", type=float, default=None, metavar="MS",
                   help="simulated-device variant: MS milliseconds of compute per sample (see above)")
    p.add_argument("--target", action="store_true",
                   help="the throughput check on the digits set: BSP against adaptive task allocation per seed "
                        "(--seeds, --probe-rounds, --dilation; --device defaults to 40 ms, --defaults to 32)")
    p.add_argument("--seeds", default="1,2,3", help="with --target: comma-separated seeds")
    p.add_argument("--probe-rounds", type=int, default=0, metavar="K",
                   help="with --target: task allocation's probe_rounds (0: the first reallocation at the end of "
                        "the first epoch, the paper's rule)")
    p.add_argument("--dilation", type=float, default=1.0, metavar="D",
                   help="with --target: time dilation D >= 1 of the emulated device")
    args = p.parse_args(argv)
    try:
        args.seeds = [int(v) for v in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if args.probe_rounds < 0 or args.probe_rounds == 1:
        p.error(f"--probe-rounds must be 0 (none) or an integer >= 2, got {args.probe_rounds}")
    if not args.dilation >= 1.0:
        p.error(f"--dilation must be a number >= 1, got {args.dilation}")
    for name in ("np", "total", "micro_batch", "epochs", "repeats", "solo_epochs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not 0 <= args.skip < args.epochs:
        p.error(f"--skip must be in [0, --epochs), got {args.skip}")
    if args.cycle_time_ms < 0:
        p.error(f"--cycle-time-ms must be >= 0, got {args.cycle_time_ms}")
    if not args.device >= 0:
        p.error(f"--device must be a number of milliseconds >= 0 (0: real CPU), got {args.device}")
    if args.speeds is not None:
        try:
            scenario = slowdown.parse_spec(args.speeds)
            scenario.validate(args.np)
        except ValueError as exc:
            p.error(f"--speeds: {exc}")
        if [type(c).__name__ for c in scenario.components] != ["Speeds"]:
            p.error(f"--speeds must be one speeds:S0,S1,... spec, got {args.speeds!r}")
    if args.simulated is not None:
        run_simulated(args)
        return 0
    if args.target:
        run_target(args)
        return 0
    if args.defaults is not None and args.defaults < 1:
        p.error(f"--defaults must be a positive batch size, got {args.defaults}")
    if not (args.data_dir and os.path.isdir(args.data_dir)):
        p.error(f"the runs train on MNIST: pass --data-dir DIR or set HETSYNC_DATA_DIR (the folder of MNIST's IDX "
                f"files; now {args.data_dir!r})")
    cfgs = configs(args.total, args.micro_batch, args.np, args.speeds, args.device, args.defaults)
    if args.only:
        cfgs = {k: v for k, v in cfgs.items() if k in args.only.split(",")}
    results, cache = [], None if args.no_solo else {}
    for rep in range(args.repeats):
        names = list(cfgs)
        names = names[rep % len(names):] + names[:rep % len(names)]  # rotate the order between repeats
        for name in names:
            spec, pargs = cfgs[name]
            rec = run(name, spec, pargs, args, os.path.join(args.out, f"{name.replace('/', '_')}_{rep}"), cache)
            rec["repeat"] = rep
            results.append(rec)
            print(json.dumps(rec), flush=True)
    os.makedirs(args.out, exist_ok=True)
    by = {n: [r for r in results if r["name"] == n] for n in cfgs}
    med = {n: statistics.median(r["epoch_s"] for r in rs) for n, rs in by.items() if rs}
    rows = [[n, f"{med[n]:.3f}", " ".join(f"{r['epoch_s']:.3f}" for r in rs),
             " ".join(f"{r['samples_per_epoch']:.0f}" for r in rs),
             " ".join(f"{r['e_solo']:.3f}" for r in rs if "e_solo" in r) or "-",
             " ".join(f"{r['e_analytic']:.3f}" for r in rs if "e_analytic" in r) or "-",
             " ".join(f"{r['overrun_steps']}/{r['emulated_steps']}" for r in rs if "emulated_steps" in r) or "-",
             " ".join(f"{r['efficiency']:.3f}" for r in rs if "efficiency" in r) or "-",
             " ".join(f"{r['accuracy']:.4f}" for r in rs), rs[-1].get("w_last", "-")] for n, rs in by.items() if rs]
    print(tabulate(rows, headers=["config", "epoch s (median)", "per repeat", "samples/epoch", "E per repeat",
                                  "E analytic per repeat", "overrun steps", "E in-run per repeat",
                                  "accuracy", "last w"],
                   tablefmt="github"))
    ratios = {}
    if "hetero/equal" in med and "hetero/adaptive" in med:
        ratios["adaptive_vs_equal_epoch_time"] = med["hetero/adaptive"] / med["hetero/equal"]
    if "hetero/bsp" in med and "hetero/adaptive" in med:
        ratios["adaptive_vs_bsp_epoch_time_hetero"] = med["hetero/adaptive"] / med["hetero/bsp"]
    if "equal/bsp" in med and "equal/adaptive" in med:
        ratios["adaptive_vs_bsp_epoch_time_equal_speeds"] = med["equal/adaptive"] / med["equal/bsp"]
        # BSP leaves each rank's partial last batch out of an epoch, task allocation uses every sample:
        # per sample is the like-for-like comparison.
        per = {n: statistics.median(r["us_per_sample"] for r in by[n]) for n in ("equal/adaptive", "equal/bsp")}
        ratios["adaptive_vs_bsp_time_per_sample_equal_speeds"] = per["equal/adaptive"] / per["equal/bsp"]
    if "hetero/bsp" in med and "hetero/adaptive" in med:
        acc = {n: statistics.median(r["accuracy"] for r in by[n]) for n in ("hetero/adaptive", "hetero/bsp")}
        ratios["adaptive_minus_bsp_accuracy_hetero"] = acc["hetero/adaptive"] - acc["hetero/bsp"]
    for n, rs in by.items():
        es = [r["e_solo"] for r in rs if "e_solo" in r]
        if es:
            ratios[f"e_median/{n}"] = statistics.median(es)
        ea = [r["e_analytic"] for r in rs if "e_analytic" in r]
        if ea:
            ratios[f"e_analytic_median/{n}"] = statistics.median(ea)
    print(json.dumps(ratios, indent=1))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "runs": results, "median_epoch_s": med, "ratios": ratios}, f, indent=1)
    return 0


if __name__ == "__main__":
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])  # the launched jobs inherit it
    sys.exit(main())
