"""Time-dilation calibration: the smallest dilation D at which the emulated cluster keeps up.

On the emulated cluster (:mod:`hetsync.emulation.cluster`) every rank pads each step to its emulated
device time; a step whose real compute takes longer is an *overrun*, and a run with 1% or more
overrun steps is not evidence. A machine with fewer cores than ranks keeps up only if the emulated
cluster runs slower: under a dilation D the device times and timeouts are D times longer and the
links D times slower (:func:`hetsync.world.dilation`), so the same cluster is emulated D times slower.

:func:`calibrate` runs the training job on the cluster at each candidate D in increasing order (a
short run of the model, rank count and scenario the benchmark will use, under a protocol whose host
work is at least that of the runs it stands for; BSP by default) and returns the first D whose run
had under :data:`MAX_OVERRUN` overrun steps. Host-side Python is not dilated, so a dilated run's
figures are optimistic where host work matters; the benchmark reports D with every figure.

Command line::

    python -m hetsync.bench.calibrate --hosts 4 --slots 2 --link 10gbit --slowdown device:40+random:6 \\
        [--model mlp] [--dataset digits] [--epochs 2] [--candidates 1,1.5,2,3,4,6,8] [--out DIR]

prints one JSON document: ``{"dilation": D or null, "trials": [...]}``.
"""
import argparse
import json
import os
import subprocess
import sys

from hetsync.bench import launch
from hetsync.emulation.cluster.spec import ClusterSpec, parse_host_links, parse_host_slots

__all__ = ["calibrate", "trial", "choose", "main", "MAX_OVERRUN", "DEFAULT_CANDIDATES"]

#: the overrun fraction a calibrated run must stay under: 1% of its emulated steps.
MAX_OVERRUN = 0.01
#: the dilations tried, in order, when none are given.
DEFAULT_CANDIDATES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def choose(trials, max_overrun=MAX_OVERRUN):
    """The calibrated D: the smallest trial dilation whose run finished with emulated steps and an overrun
    fraction under ``max_overrun``.

    Args:
        trials: list of dicts with ``dilation`` (float), ``ok`` (bool), ``emulated_steps`` (int) and
            ``overrun_fraction`` (float in [0, 1]).
        max_overrun: float in (0, 1].

    Returns:
        float D, or None when no trial qualifies.
    """
    good = [t["dilation"] for t in trials
            if t.get("ok") and t.get("emulated_steps") and t["overrun_fraction"] < max_overrun]
    return min(good) if good else None


def trial(spec, job_args, out, timeout_s=900.0):
    """One calibration run: the training job on the cluster ``spec`` (its dilation included).

    Args:
        spec: :class:`ClusterSpec`. job_args: list of str, the job's flags (``--protocol``,
            ``--slowdown`` with a ``device:MS`` part, the model, the data, the epochs). out: str folder.
        timeout_s: float seconds > 0 for the launch (the cluster gets the same as its ``--timeout``).

    Returns:
        dict: ``dilation``, ``ok`` (bool), ``emulated_steps``, ``overrun_steps``, ``overrun_fraction``,
        ``wall_s``, ``samples_per_s`` (wall time of this run: divide by nothing, it is what was measured),
        ``cluster`` (the cluster's record) or ``error`` (str).
    """
    os.makedirs(out, exist_ok=True)
    record = os.path.join(out, launch.CLUSTER_RECORD)
    cmd = launch.on_cluster(spec, list(launch.JOB) + list(job_args) + ["--out", out, "--quiet"], record=record,
                            timeout_s=timeout_s)
    row = {"dilation": spec.dilation, "ok": False, "command": cmd}
    try:
        proc = launch.run(cmd, timeout_s + 60.0, stall_shutdown_s=120)
    except subprocess.TimeoutExpired:
        return dict(row, error=f"timed out after {timeout_s + 60.0:g} s")
    with open(os.path.join(out, "launch.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return dict(row, error=f"exited {proc.returncode}: {(proc.stdout + proc.stderr)[-1200:]}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    with open(record) as f:
        cluster = json.load(f)
    emulated, overrun = int(s.get("emulated_steps") or 0), int(s.get("overrun_steps") or 0)
    return dict(row, ok=True, emulated_steps=emulated, overrun_steps=overrun,
                overrun_fraction=overrun / emulated if emulated else None, wall_s=s["wall_s"],
                samples_per_s=s["samples_per_s"], dilation_seen=s.get("dilation"), cluster=cluster)


def calibrate(hosts, slots, link, job_args, out_dir, candidates=DEFAULT_CANDIDATES, host_links=(),
              max_overrun=MAX_OVERRUN, timeout_s=900.0, log=print, host_slots=()):
    """Try each candidate D in increasing order until a run keeps under ``max_overrun`` overrun steps.

    Args:
        hosts, slots: ints, the cluster's hosts and ranks per host. link: str rate (``tc`` units), emulated.
        job_args: list of str, the job's flags; its ``--slowdown`` must have a ``device:MS`` part.
        out_dir: str folder for the trial runs (``D<d>/`` each).
        candidates: iterable of floats >= 1. host_links: tuple of ``(host, rate)`` pairs.
        host_slots: tuple of ``(host, int)`` pairs, hosts with their own rank count.
        max_overrun: float in (0, 1]. timeout_s: float seconds per trial. log: callable(str) for progress.

    Returns:
        dict ``{"dilation": D or None, "max_overrun": ..., "trials": [trial rows]}``.

    Raises:
        ValueError: no candidates, a candidate below 1, a bad cluster argument, or job flags without a
            ``--slowdown`` that has a ``device:MS`` part (nothing to overrun); all before any launch.
    """
    from hetsync.emulation.scenario import parse_spec

    cands = sorted(float(c) for c in candidates)
    if not cands or cands[0] < 1:
        raise ValueError(f"candidates must be dilations >= 1, got {list(candidates)!r}")
    if not 0 < max_overrun <= 1:
        raise ValueError(f"max_overrun must be in (0, 1], got {max_overrun!r}")
    args = list(job_args)
    spec_text = args[args.index("--slowdown") + 1] if "--slowdown" in args[:-1] else None
    if spec_text is None or parse_spec(spec_text).device_ms is None:
        raise ValueError(f"calibration needs the job's --slowdown with a device:MS part (the emulated device "
                         f"whose overruns it counts), got {spec_text!r}")
    specs = [ClusterSpec(hosts=hosts, slots=slots, link=link, host_links=tuple(host_links), dilation=d,
                         host_slots=tuple(host_slots)) for d in cands]
    trials = []
    for spec in specs:
        row = trial(spec, args, os.path.join(out_dir, f"D{spec.dilation:g}"), timeout_s=timeout_s)
        trials.append(row)
        log(f"calibration: D={spec.dilation:g}: " + (f"{row['overrun_steps']} of {row['emulated_steps']} steps "
                                                    f"overran ({row['overrun_fraction']:.2%})" if row["ok"]
                                                    else f"failed: {row['error'][:300]}"))
        if choose([row], max_overrun) is not None:
            break
    for row in trials:
        row.pop("command", None)
    return {"dilation": choose(trials, max_overrun), "max_overrun": max_overrun, "trials": trials}


def main(argv=None):
    """The command line (see the module docstring); returns 0 when a D was found, 1 when none was."""
    p = argparse.ArgumentParser(prog="python -m hetsync.bench.calibrate", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--link", default="10gbit")
    p.add_argument("--host-link", action="append", default=[], metavar="HOST=RATE")
    p.add_argument("--host-slots", action="append", default=[], metavar="HOST=S")
    p.add_argument("--slowdown", required=True, help="the scenario, with a device:MS part")
    p.add_argument("--protocol", default="bsp")
    p.add_argument("--model", default="mlp")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--digits", action="store_true", help="scikit-learn's digits even where MNIST's files exist")
    p.add_argument("--candidates", default=",".join(f"{c:g}" for c in DEFAULT_CANDIDATES))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per trial run")
    p.add_argument("--out", default="runs/calibrate")
    a = p.parse_args(argv)
    try:
        cands = [float(c) for c in a.candidates.split(",") if c.strip()]
    except ValueError:
        p.error(f"--candidates must be comma-separated numbers >= 1, got {a.candidates!r}")
    try:
        links = parse_host_links(a.host_link)
        host_slots = parse_host_slots(a.host_slots)
    except ValueError as exc:
        p.error(str(exc))
    job = ["--protocol", a.protocol, "--slowdown", a.slowdown, "--model", a.model, "--epochs", str(a.epochs),
           "--batch-size", str(a.batch_size)] + launch.dataset_args(digits=a.digits)
    try:
        result = calibrate(a.hosts, a.slots, a.link, job, a.out, candidates=cands, host_links=links, host_slots=host_slots,
                           timeout_s=a.timeout, log=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as exc:
        p.error(str(exc))
    print(json.dumps(result, indent=1))
    return 0 if result["dilation"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
