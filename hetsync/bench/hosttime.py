"""Where a step's host time goes: the split of ``host_ms``, and the allreduce's latency on this machine.

``python -m hetsync.bench.hosttime split RUN_DIR`` reads a finished run's step records (``rank*.jsonl``,
:class:`hetsync.callbacks.SyncMetrics`) and splits each step's host time (``host_ms``: the step less its compute and
emulated device time) of a protocol whose every step ends in one collective of all ranks (BSP, task allocation):

* ``wait_for_last_ms``: from the rank's arrival at the collective (its step start + ``compute_ms`` +
  ``delay_ms``) to the last rank's arrival at the same step: waiting for the other ranks;
* ``collective_ms``: from the last arrival to the rank's result (its arrival + ``sync_wait_ms``): the collective
  itself, negotiation and wake-ups included;
* ``after_ms``: from the result to the step's end: the optimizer's update and Keras' per-step work;
* ``start_spread_ms`` and ``result_spread_ms``: per step, the latest rank's step start (or result) less the
  earliest's. The ranks of one host share the clock of ``time.time()``, so the split is exact there; across
  hosts it carries their clock offset.

``horovodrun -np N python -m hetsync.bench.hosttime allreduce [--idle-ms MS] [--spin] [--calls K]`` times the
averaged allreduce of the example job's gradients (the MLP's four tensors, 407,080 bytes) through
:func:`hetsync.transport.allreduce_mean`, K calls, each after ``MS`` milliseconds of idle time (a sleep, as the
emulated device's padding sleeps; ``--spin`` busy-waits instead), and prints one JSON line: per rank the median
milliseconds per call. It separates the collective's floor on this machine from what the emulation adds.
"""
import argparse
import glob
import json
import math
import os
import statistics
import sys
import time

__all__ = ["MLP_SHAPES", "load_records", "split", "allreduce_latency", "main"]

#: the example job's MLP (784-128-10): its trainable variables' shapes, float32 (407,080 bytes of gradients).
MLP_SHAPES = ((784, 128), (128,), (128, 10), (10,))


def load_records(run_dir):
    """Every rank's step records of a run folder.

    Args:
        run_dir: str, a folder with ``rank{r}.jsonl`` files.

    Returns:
        dict int rank -> list of dict records, in step order.

    Raises:
        FileNotFoundError: the folder has no ``rank*.jsonl``.
    """
    out = {}
    for path in glob.glob(os.path.join(run_dir, "rank*.jsonl")):
        stem = os.path.basename(path)[len("rank"):-len(".jsonl")]
        if stem.isdigit():
            with open(path) as f:
                out[int(stem)] = [json.loads(line) for line in f if line.strip()]
    if not out:
        raise FileNotFoundError(f"no rank*.jsonl step records in {run_dir!r}")
    return out


def split(records_by_rank, skip_epochs=1):
    """Split the host time of lock-step collective steps (see the module docstring), medians over ranks and steps.

    Args:
        records_by_rank: dict rank -> list of step records (each with ``step``, ``epoch``, ``unix_s`` seconds,
            ``step_ms``, ``compute_ms``, ``delay_ms``, ``sync_wait_ms``, ``host_ms`` milliseconds).
        skip_epochs: int >= 0, leading epochs left out (the first holds graph tracing).

    Returns:
        dict of floats in milliseconds: ``host_ms``, ``sync_wait_ms``, ``wait_for_last_ms``, ``collective_ms``,
        ``after_ms``, ``start_spread_ms``, ``result_spread_ms``; and ``steps`` (int, steps every rank recorded).

    Raises:
        ValueError: no step recorded by every rank after ``skip_epochs``, a record without those fields, or steps
            that are not lock-step collectives (the median result comes before the last rank's arrival).
    """
    need = ("step", "epoch", "unix_s", "step_ms", "compute_ms", "delay_ms", "sync_wait_ms")
    by_step = {}
    for rank, recs in records_by_rank.items():
        for rec in recs:
            missing = [k for k in need if k not in rec]
            if missing:
                raise ValueError(f"rank {rank} step record lacks {', '.join(missing)}: not a hetsync step record")
            if rec["epoch"] < skip_epochs:
                continue
            start = rec["unix_s"] - rec["step_ms"] / 1e3
            arrive = start + (rec["compute_ms"] + rec["delay_ms"]) / 1e3
            by_step.setdefault(rec["step"], {})[rank] = {
                "start": start, "arrive": arrive, "result": arrive + rec["sync_wait_ms"] / 1e3, "end": rec["unix_s"],
                "host_ms": rec.get("host_ms", 0.0), "sync_wait_ms": rec["sync_wait_ms"]}
    full = [s for s in by_step.values() if len(s) == len(records_by_rank)]
    if not full:
        raise ValueError(f"no step after epoch {skip_epochs - 1} was recorded by all {len(records_by_rank)} ranks")
    cols = {k: [] for k in ("host_ms", "sync_wait_ms", "wait_for_last_ms", "collective_ms", "after_ms")}
    spreads = {"start_spread_ms": [], "result_spread_ms": []}
    for ranks in full:
        last = max(v["arrive"] for v in ranks.values())
        for v in ranks.values():
            cols["host_ms"].append(v["host_ms"])
            cols["sync_wait_ms"].append(v["sync_wait_ms"])
            cols["wait_for_last_ms"].append((last - v["arrive"]) * 1e3)
            cols["collective_ms"].append((v["result"] - last) * 1e3)
            cols["after_ms"].append((v["end"] - v["result"]) * 1e3)
        for key, field in (("start_spread_ms", "start"), ("result_spread_ms", "result")):
            times = [v[field] for v in ranks.values()]
            spreads[key].append((max(times) - min(times)) * 1e3)
    out = {k: float(statistics.median(v)) for k, v in {**cols, **spreads}.items()}
    if out["collective_ms"] < 0:
        raise ValueError(f"the ranks' results came before the last rank arrived (median {out['collective_ms']:.1f} "
                         "ms): the steps are not lock-step collectives of all ranks (a free-running protocol such "
                         "as RNA or Hop); only host_ms applies to it")
    out["steps"] = len(full)
    return out


def allreduce_latency(idle_ms=0.0, calls=100, spin=False, shapes=MLP_SHAPES, warmup=5):
    """Median milliseconds of one averaged allreduce of ``shapes`` after ``idle_ms`` of idle time, on this rank.

    Call on every rank of a launched job after :func:`hetsync.init`; every rank must pass the same arguments.

    Args:
        idle_ms: float >= 0, milliseconds of idle time before each timed call (0: back to back).
        calls: int >= 1 timed calls. spin: bool, busy-wait the idle time instead of sleeping.
        shapes: sequence of int tuples, the float32 tensors' shapes. warmup: int >= 0 untimed calls first.

    Returns:
        float, the median milliseconds from the call to its result on the host.

    Raises:
        ValueError: ``idle_ms`` < 0 or ``calls`` < 1.
    """
    if not idle_ms >= 0 or calls < 1:
        raise ValueError(f"idle_ms must be >= 0 and calls >= 1, got idle_ms={idle_ms!r}, calls={calls!r}")
    import tensorflow as tf

    from hetsync import transport

    tensors = [tf.ones(s, tf.float32) for s in shapes]

    @tf.function
    def reduce(ts):
        return transport.allreduce_mean(ts, name="hetsync_hosttime")

    for _ in range(warmup):
        reduce(tensors)[0].numpy()
    times = []
    for _ in range(calls):
        if spin:
            until = time.perf_counter() + idle_ms / 1e3
            while time.perf_counter() < until:
                pass
        elif idle_ms:
            time.sleep(idle_ms / 1e3)
        t0 = time.perf_counter()
        reduce(tensors)[0].numpy()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(times))


def main(argv=None):
    """``python -m hetsync.bench.hosttime split RUN_DIR`` or ``... allreduce [--idle-ms MS] [--spin] [--calls K]``.

    Args:
        argv: list of str (default ``sys.argv[1:]``).

    Returns:
        int exit status (0).

    Raises:
        SystemExit: bad arguments (argparse names the value), or a run folder that cannot be split (status 2, with
            :func:`split`'s reason).
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="split the host time of a finished run's steps")
    s.add_argument("run_dir")
    s.add_argument("--skip-epochs", type=int, default=1, help="leading epochs left out (default 1)")
    a = sub.add_parser("allreduce", help="time the example job's gradient allreduce (under horovodrun)")
    a.add_argument("--idle-ms", type=float, default=0.0, help="idle milliseconds before each call (default 0)")
    a.add_argument("--spin", action="store_true", help="busy-wait the idle time instead of sleeping")
    a.add_argument("--calls", type=int, default=100, help="timed calls (default 100)")
    args = p.parse_args(argv)
    if args.command == "split":
        if args.skip_epochs < 0:
            p.error(f"--skip-epochs must be >= 0, got {args.skip_epochs}")
        try:
            out = split(load_records(args.run_dir), args.skip_epochs)
        except (ValueError, FileNotFoundError) as exc:
            p.exit(2, f"hosttime split: {exc}\n")
        print(json.dumps({k: round(v, 3) for k, v in out.items()}))
        return 0
    if not args.idle_ms >= 0 or args.calls < 1:
        p.error(f"--idle-ms must be >= 0 and --calls >= 1, got {args.idle_ms} and {args.calls}")
    from hetsync import transport, world

    world.init()
    ms = allreduce_latency(args.idle_ms, args.calls, args.spin)
    per_rank = transport.allgather_object(round(ms, 3), name="hetsync_hosttime_gather")
    if world.rank() == 0:
        print(json.dumps({"np": world.size(), "idle_ms": args.idle_ms, "spin": args.spin, "calls": args.calls,
                          "bytes": 4 * sum(math.prod(s) for s in MLP_SHAPES), "median_ms_per_rank": per_rank}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
