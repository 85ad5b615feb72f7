"""Pause benchmark: what a rank paused for FOR_S seconds adds to a job, per protocol.

``python -m hetsync.bench.pause`` runs, side by side in one invocation, 4-rank jobs of
``python -m hetsync.bench.job`` on the emulated cluster (``device:MS``: every step padded to MS
milliseconds), for BSP and the asynchronous protocols on the sample pool (:mod:`hetsync.data.pool`),
each without a fault, with ``pause:1:AT:FOR`` (SIGSTOP/SIGCONT of rank 1's whole process) and with
``stall:1:AT:FOR`` (rank 1's training thread only sleeps; its background threads keep running).
It reports per run the job's wall time (the launch, seconds), the training wall time
(``summary.json``'s ``wall_s``), the time added against the same protocol's run without the fault,
the lower bound of that added time, the samples per epoch (summed over ranks) and the overrun steps.

Lower bound: with work conservation on n equally fast ranks, the job's work is fixed; a rank lost for
FOR seconds leaves its share of that time to the other n - 1, so the job grows by at least FOR / n
(7.5 s for 30 s on 4 ranks); without work conservation (BSP, fixed shares) it grows by about FOR.
Under a real SIGSTOP anything that needs the paused rank in a collective (RNA's rounds, local SGD's
averaging rounds, the epoch-end metrics) waits for it; ``stall`` leaves the background threads alive.

Results: a tabulate table on stdout and ``OUT/results.json``; every run's folder under ``OUT/runs``.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from tabulate import tabulate

from hetsync.bench import launch

FAULTS = ("none", "pause", "stall")


def scenario(ms, fault, rank, at_s, for_s):
    """The ``--slowdown`` spec (str) of one run: ``device:MS`` plus the fault (``none``, ``pause``, ``stall``)."""
    return f"device:{ms:g}" + ("" if fault == "none" else f"+{fault}:{rank}:{at_s:g}:{for_s:g}")


def command(args, protocol, fault, seed, out):
    """The mpirun command (list of str) of one run."""
    argv = [*launch.JOB, "--protocol", protocol, "--dataset", args.dataset, "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--seed", str(seed),
            "--slowdown", scenario(args.ms, fault, args.rank, args.at, args.for_s), "--out", out, "--quiet"]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    return launch.mpirun(args.np, argv + launch.protocol_args(args.protocol_arg.get(protocol, [])))


def run_one(args, protocol, fault, seed):
    """Launch one run; return its record (dict: status, job_s, wall_s, samples_per_epoch, overruns, pool figures)."""
    out = os.path.join(args.out, "runs", f"seed{seed}", protocol, fault)
    os.makedirs(out, exist_ok=True)
    cmd = command(args, protocol, fault, seed, out)
    rec = {"protocol": protocol, "fault": fault, "seed": seed, "command": " ".join(shlex.quote(c) for c in cmd)}
    t0 = time.time()
    try:
        proc = launch.run(cmd, args.timeout, stall_shutdown_s=300)
        output, failed = proc.stdout + proc.stderr, (None if proc.returncode == 0 else f"exited {proc.returncode}")
    except subprocess.TimeoutExpired as exc:
        output, failed = str(exc.stdout or ""), f"timed out after {args.timeout:g} s"
    rec["job_s"] = time.time() - t0
    with open(os.path.join(out, "launch.log"), "w") as f:
        f.write(rec["command"] + "\n" + output)
    if failed:
        rec.update(status="failed", error=failed + "\n" + output[-1500:])
        return rec
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    pool = s["stats"].get("pool") or {}
    rec.update(status="ok", wall_s=s["wall_s"], samples_per_epoch=sum(r["samples"] for r in s["per_rank"]) / args.epochs,
               steps_per_rank=[r["steps"] for r in s["per_rank"]], overrun_steps=s["overrun_steps"],
               emulated_steps=s["emulated_steps"], accuracy=s.get("final_test_accuracy"),
               pool_lost=pool.get("lost"), pool_repeated=pool.get("repeated"), pool_missing=pool.get("missing"))
    return rec


def add_deltas(records, for_s, n):
    """Set ``added_s`` (wall_s minus the same protocol and seed's no-fault wall_s) and ``lower_bound_s``
    (FOR / n with the pool, FOR for BSP) on every faulted record."""
    base = {(r["protocol"], r["seed"]): r for r in records if r["fault"] == "none" and r["status"] == "ok"}
    for r in records:
        b = base.get((r["protocol"], r["seed"]))
        if r["fault"] != "none" and r["status"] == "ok" and b is not None:
            r["added_s"] = r["wall_s"] - b["wall_s"]
            r["added_job_s"] = r["job_s"] - b["job_s"]
            r["lower_bound_s"] = for_s if r["protocol"] == "bsp" else for_s / n


def table(records):
    """The results as a tabulate ``github`` table (str)."""
    rows = []
    for r in records:
        rows.append([r["protocol"], r["fault"], r["seed"], r["status"], r.get("job_s"), r.get("wall_s"),
                     r.get("added_s"), r.get("lower_bound_s"), r.get("samples_per_epoch"),
                     f"{r.get('overrun_steps')}/{r.get('emulated_steps')}", r.get("pool_lost"), r.get("accuracy")])
    return tabulate(rows, headers=["protocol", "fault", "seed", "status", "job s", "train wall s", "added s",
                                   "lower bound s", "samples/epoch", "overruns", "pool lost", "accuracy"],
                    tablefmt="github", floatfmt=".2f")


def parse_args(argv=None):
    """Command-line arguments (see ``--help``). Raises SystemExit on bad values."""
    p = argparse.ArgumentParser(prog="python -m hetsync.bench.pause", description=__doc__.split("\n\n")[0])
    p.add_argument("--protocols", default="bsp,rna,localsgd", help="comma-separated protocols")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of none, pause, stall")
    p.add_argument("--np", type=int, default=4, help="ranks")
    p.add_argument("--rank", type=int, default=1, help="the rank paused or stalled (not 0: it serves the pool)")
    p.add_argument("--at", type=float, default=10.0, help="seconds after train begin the fault starts")
    p.add_argument("--for", dest="for_s", type=float, default=30.0, help="seconds the fault lasts")
    p.add_argument("--ms", type=float, default=150.0, help="emulated device: milliseconds per step")
    p.add_argument("--dataset", default="digits", choices=("digits", "mnist-idx"))
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="folder of MNIST's IDX files for --dataset mnist-idx (default: $HETSYNC_DATA_DIR)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--protocol-arg", action="append", default=[], metavar="PROTOCOL:KEY=VALUE")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--out", default="runs/pause_bench")
    args = p.parse_args(argv)
    from hetsync.data import DATA_DIR_ENV, data_dir

    args.data_dir = args.data_dir or data_dir()
    if args.dataset == "mnist-idx" and not (args.data_dir and os.path.isdir(args.data_dir)):
        p.error(f"--dataset mnist-idx needs MNIST's IDX files: pass --data-dir DIR or set {DATA_DIR_ENV} "
                f"(now {args.data_dir!r}, not an existing folder)")
    args.protocols = [x for x in args.protocols.split(",") if x]
    args.faults = [x for x in args.faults.split(",") if x]
    bad = [f for f in args.faults if f not in FAULTS]
    if bad:
        p.error(f"--faults: {bad} not in {FAULTS}")
    if not 0 < args.rank < args.np:
        p.error(f"--rank must be in [1, {args.np}) (rank 0 serves the pool), got {args.rank}")
    if args.ms <= 0 or args.for_s <= 0 or args.at < 0 or args.epochs < 1:
        p.error("--ms and --for must be > 0, --at >= 0, --epochs >= 1")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        p.error(f"--seeds must be comma-separated ints, got {args.seeds!r}")
    pa = {}
    for item in args.protocol_arg:
        proto, sep, kv = item.partition(":")
        if not sep or "=" not in kv:
            p.error(f"--protocol-arg must look like PROTOCOL:KEY=VALUE, got {item!r}")
        pa.setdefault(proto, []).append(kv)
    args.protocol_arg = pa
    return args


def main(argv=None):
    """Run the benchmark; print the table; write ``OUT/results.json``. Returns the records (list of dicts)."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    records = []
    for seed in args.seeds:
        for protocol in args.protocols:
            for fault in args.faults:
                print(f"[pause bench] seed {seed} {protocol} {fault} ...", file=sys.stderr, flush=True)
                rec = run_one(args, protocol, fault, seed)
                print(f"[pause bench]   {rec['status']} job {rec['job_s']:.1f} s wall {rec.get('wall_s')}",
                      file=sys.stderr, flush=True)
                records.append(rec)
                add_deltas(records, args.for_s, args.np)
                with open(os.path.join(args.out, "results.json"), "w") as f:
                    json.dump({"args": {k: v for k, v in vars(args).items()}, "records": records}, f, indent=1)
    print(table(records))
    return records


if __name__ == "__main__":
    main()
