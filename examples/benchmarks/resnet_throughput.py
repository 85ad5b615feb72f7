"""The communication-heavy throughput cell: ResNet-50 under BSP on the emulated multi-host cluster.

horovod's synthetic benchmark reports images/s of a model trained on fixed random images: pure compute and
communication. This cell runs ``examples/keras_applications.py`` (``keras.applications.ResNet50``,
23.6M parameters, 94 MB of float32 gradients a step) that way, twice on the emulated cluster
(:mod:`hetsync.emulation.cluster`) at one time dilation D:

* one rank on one host (no communication): the device alone, step time T_1;
* ``hosts x slots`` ranks on hosts joined by links of the given rate: step time T_n.

Every step is padded to a device profile's step time (:mod:`hetsync.emulation.profiles`, e.g. V100 FP32
at batch 128: 310.68 ms), while the real math runs on 32x32 images at a small batch (this machine's CPU
could not do 224x224 in time). The gradients, and so the bytes on the links, are the full model's
whatever the image size, so the links carry exactly what the profiled step would send. Reported, in
the profile's terms: images/s = n x profile batch / (T_n / D), and the weak-scaling efficiency
T_1 / T_n, beside horovod's published figure (:data:`hetsync.emulation.profiles.HOROVOD_SCALING`) and the
step's compute-to-communication ratio (profile step time over the ring allreduce's time on the links,
2 (H - 1) / H x gradient bytes x 8 / rate for H hosts). Steps whose compute overran the padded time are
counted: 1% or more and the cell is not evidence (raise D).

Command line (from a checkout)::

    python examples/benchmarks/resnet_throughput.py --hosts 4 --slots 2 --link 25gbit --profile v100-16g-resnet50-fp32 \\
        --dilation 40 --steps 8 --out runs/throughput
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from hetsync.bench import launch
import hetsync
from hetsync.emulation import profiles
from hetsync.emulation.cluster.spec import ClusterSpec, parse_rate

__all__ = ["SCRIPT", "ring_allreduce_s", "figures", "run_cell", "main"]

#: the model-zoo example this cell launches (beside this folder, in a checkout).
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_applications.py")


def ring_allreduce_s(nbytes, hosts, rate_bps):
    """Seconds a ring allreduce of ``nbytes`` (int bytes) takes over ``hosts`` (int >= 1) hosts whose links run
    at ``rate_bps`` (float bits per second): each link carries 2 (H - 1) / H x nbytes each way (0 for one host).

    Raises:
        ValueError: hosts < 1 or a rate not > 0.
    """
    if hosts < 1 or not rate_bps > 0:
        raise ValueError(f"need hosts >= 1 and a rate > 0, got hosts={hosts!r}, rate_bps={rate_bps!r}")
    return 2.0 * (hosts - 1) / hosts * nbytes * 8.0 / rate_bps


def figures(solo, multi, profile, hosts, rate_bps):
    """The cell's figures from the two reports of ``examples/keras_applications.py``.

    Args:
        solo, multi: dicts (the script's ``--out`` JSON: ``step_ms_median_per_rank``, ``world_size``,
            ``params``, ``emulated_steps``, ``overrun_steps``, ``dilation``) of the one-rank and the n-rank run.
        profile: :class:`hetsync.emulation.profiles.DeviceProfile`. hosts: int H of the n-rank run.
        rate_bps: float emulated link rate (bits per second).

    Returns:
        dict: ``t1_ms`` and ``tn_ms`` (median wall step, ms), ``dilation``, ``images_per_s`` (emulated, the
        profile's batch), ``images_per_s_one``, ``scaling_efficiency`` (T_1 / T_n), ``compute_to_comm``,
        ``overrun_fraction`` (the larger of the two runs'), ``horovod`` (the published figure).

    Raises:
        ValueError: the two runs had different dilations, or no timed steps.
    """
    if solo["dilation"] != multi["dilation"]:
        raise ValueError(f"the runs' dilations differ: {solo['dilation']} and {multi['dilation']}")
    d = float(multi["dilation"])
    t1 = statistics.median(solo["step_ms_median_per_rank"])
    tn = statistics.median(multi["step_ms_median_per_rank"])
    if not (t1 and tn):
        raise ValueError("no timed steps in a run")
    n = int(multi["world_size"])
    overrun = max(r["overrun_steps"] / r["emulated_steps"] if r["emulated_steps"] else 1.0 for r in (solo, multi))
    comm_s = ring_allreduce_s(4 * int(multi["params"]), hosts, rate_bps)
    return {"t1_ms": t1, "tn_ms": tn, "dilation": d, "world_size": n,
            "images_per_s": n * profile.batch / (tn / d / 1e3),
            "images_per_s_one": profile.batch / (t1 / d / 1e3),
            "scaling_efficiency": t1 / tn, "compute_to_comm": (profile.step_ms / 1e3) / comm_s if comm_s else None,
            "overrun_fraction": overrun, "horovod": profiles.HOROVOD_SCALING}


def run_cell(hosts, slots, link, profile_name, dilation, steps, out_dir, image_size=32, batch=16, timeout_s=1800.0,
             log=print):
    """Run the one-rank and the n-rank launches and return :func:`figures` plus both reports.

    Args:
        hosts, slots: ints, the n-rank cluster. link: str emulated rate (``tc`` units). profile_name: str, a
        key of :data:`hetsync.emulation.profiles.DEVICES`. dilation: float D >= 1. steps: int timed steps
        (2 more warm up). out_dir: str folder. image_size, batch: ints of the real math. timeout_s: float
        seconds per launch. log: callable(str).

    Raises:
        ValueError: a bad argument (before any launch). FileNotFoundError: no ``examples/`` beside the
            package (an installed hetsync: run from a checkout). RuntimeError: a launch failed (its output's end).
    """
    profile = profiles.device(profile_name)
    rate = parse_rate(link)
    if not os.path.isfile(SCRIPT):
        raise FileNotFoundError(f"{SCRIPT} not found: the throughput cell runs the model-zoo example beside it")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    reports = {}
    for what, spec in (("one", ClusterSpec(hosts=1, slots=1, link=link, dilation=dilation)),
                       ("n", ClusterSpec(hosts=hosts, slots=slots, link=link, dilation=dilation))):
        folder = os.path.join(out_dir, what)
        os.makedirs(folder, exist_ok=True)
        report = os.path.join(folder, "report.json")
        argv = [SCRIPT, "--model", "ResNet50", "--image-size", str(image_size), "--batch-size", str(batch),
                "--steps", str(steps + 2), "--warmup-steps", "2", "--protocol", "bsp",
                "--slowdown", profiles.device_spec(profile_name), "--out", report]
        cmd = launch.on_cluster(spec, argv, record=os.path.join(folder, launch.CLUSTER_RECORD), timeout_s=timeout_s)
        log(f"throughput: {what}: {spec.np} rank(s) on {spec.hosts} host(s), D={dilation:g}")
        try:
            proc = launch.run(cmd, timeout_s + 60.0, stall_shutdown_s=600)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the {what} launch ran past {timeout_s + 60:g} s") from None
        with open(os.path.join(folder, "launch.log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"the {what} launch exited {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}")
        with open(report) as f:
            reports[what] = json.load(f)
    out = figures(reports["one"], reports["n"], profile, hosts, rate)
    out.update(profile=profile.name, link=link, hosts=hosts, slots=slots, reports=reports)
    with open(os.path.join(out_dir, "throughput.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def main(argv=None):
    """The command line (see the module docstring); prints the figures as JSON, returns 0 (1 on a failed launch)."""
    p = argparse.ArgumentParser(prog="resnet_throughput.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--link", default="25gbit", help="emulated link rate (tc units)")
    p.add_argument("--profile", default="v100-16g-resnet50-fp32", choices=sorted(profiles.DEVICES))
    p.add_argument("--dilation", type=float, default=40.0)
    p.add_argument("--steps", type=int, default=8, help="timed steps (2 more warm up)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch")
    p.add_argument("--out", default="runs/throughput")
    p.add_argument("--verbose", action="store_true",
                   help="the jobs keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    a = p.parse_args(argv)
    try:
        ClusterSpec(hosts=a.hosts, slots=a.slots, link=a.link, dilation=a.dilation)
        out = run_cell(a.hosts, a.slots, a.link, a.profile, a.dilation, a.steps, a.out, timeout_s=a.timeout,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as exc:
        p.error(str(exc))
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in out.items() if k != "reports"}, indent=1))
    return 0


if __name__ == "__main__":
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])  # the launched jobs inherit it
    sys.exit(main())
