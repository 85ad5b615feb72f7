"""Samples to target, the steady-state rate, host time per step and the heterogeneity tax.

Time to target alone cannot tell a protocol that computes faster from one that learns more per sample:
a protocol that is faster per step but needs more samples to reach the target has not won. These
figures, read from a run's per-step records (``rank*.jsonl``, written by
:class:`hetsync.callbacks.SyncMetrics`) and its accuracy curve (``summary.json``), separate the two:

* **samples to target** S: the samples all worker ranks had processed, by their step records, at the
  first evaluation whose accuracy is at or above the target. Every processed sample counts, also those
  of a gradient a protocol later dropped (they were computed).
* **statistical efficiency**: BSP's S over the protocol's S on the same cell and seed (1: every sample
  is worth what it is worth under BSP; below 1: the protocol needs more samples).
* **steady samples/s**: the samples per second of every rank after its first epoch (its warm-up: graph
  tracing and the first evaluation), epoch boundaries included, summed over ranks.
* **host time** ``host_ms``: per step, the milliseconds outside the (emulated) device time:
  synchronization waits, the optimizer's update, Keras' own work.
* **heterogeneity tax**: a protocol's time to target over BSP's on the *homogeneous twin* of the
  scenario, the cluster whose ranks all run at the same speed with the same total speed
  (:func:`homogeneous_twin`); 1.0 is the physical limit, BSP's is about 1 / E.

Every function here is free of TensorFlow: the benchmark's controller and the simulators use it.
"""
import json
import os
import statistics

from hetsync.bench import efficiency

__all__ = ["rank_progress", "samples_at", "samples_to_target", "time_after_first_step", "run_time_after_first_step",
           "steady_samples_per_s", "host_ms_median", "homogeneous_twin", "run_progress"]


def rank_progress(records):
    """One rank's progress: ``[(unix_s, samples)]`` from its step records, in step order.

    Args:
        records: list of dicts, one rank's step records, each with ``unix_s`` (float seconds, the
            step's end on ``time.time()``'s clock) and ``samples_processed`` (int, the rank's cumulative
            samples through that step).

    Returns:
        list of ``(float, int)`` pairs.

    Raises:
        ValueError: a record lacks ``unix_s`` or ``samples_processed`` (written before these fields existed, or
            by a protocol that knows no batch size); the message names the step.
    """
    out = []
    for rec in records:
        if "unix_s" not in rec or "samples_processed" not in rec:
            raise ValueError(f"step record {rec.get('step')!r} has no 'unix_s'/'samples_processed' field: these records "
                             "do not say how many samples were processed when")
        out.append((float(rec["unix_s"]), int(rec["samples_processed"])))
    return out


def samples_at(progress, unix_s):
    """Samples all ranks had processed at the moment ``unix_s``.

    Args:
        progress: list (one entry per worker rank) of :func:`rank_progress` lists.
        unix_s: float seconds on ``time.time()``'s clock.

    Returns:
        int, the sum over ranks of each rank's cumulative samples at its last step that ended at or
        before ``unix_s`` (0 for a rank with none). A step's end is its record's ``unix_s``: place
        :class:`hetsync.callbacks.SyncMetrics` before :class:`hetsync.callbacks.TestAccuracy` in the
        callback list, so that the step an evaluation follows is recorded before it.
    """
    total = 0
    for steps in progress:
        done = 0
        for t, n in steps:
            if t > unix_s:
                break
            done = n
        total += done
    return total


def samples_to_target(progress, curve, target):
    """Samples to target: the samples all ranks had processed at the first evaluation at or above ``target``.

    Args:
        progress: list of :func:`rank_progress` lists, one per worker rank.
        curve: list of accuracy points, dicts with ``accuracy`` (float in [0, 1]) and ``unix_s``
            (float seconds, the evaluation's moment) in evaluation order
            (:attr:`hetsync.callbacks.TestAccuracy.curve`).
        target: float in (0, 1], or None.

    Returns:
        int samples, or None if ``target`` is None or never reached.

    Raises:
        ValueError: a point that reached the target has no ``unix_s`` (a curve written before the field
            existed).
    """
    if target is None:
        return None
    for point in curve:
        if point["accuracy"] >= target:
            if "unix_s" not in point:
                raise ValueError("the accuracy curve has no 'unix_s' field: samples to target cannot be counted")
            return samples_at(progress, float(point["unix_s"]))
    return None


def time_after_first_step(time_to_target_s, records):
    """Time to target from the end of rank 0's first (compiling) step, the benchmarks' definition.

    ``summary.json``'s ``time_to_target_s`` counts from the start of training (Keras' train begin), so it
    includes the first step, which traces and compiles the step function (0.7-1.3 s on this 2-core machine,
    longer under some protocols): in a run that reaches its target within seconds that offset, not the
    protocol, would set the ratio. Both figures leave out the evaluations' own time.

    Args:
        time_to_target_s: float seconds from the start of training, or None (target not reached).
        records: list of dicts, rank 0's step records (``rank0.jsonl``); the first one's ``wall_s`` (float
            seconds since the start of training) is the first step's end.

    Returns:
        float seconds (>= 0), or None when the target was not reached or there is no record.
    """
    if time_to_target_s is None or not records or "wall_s" not in records[0]:
        return None
    return max(0.0, float(time_to_target_s) - float(records[0]["wall_s"]))


def run_time_after_first_step(run_dir, time_to_target_s):
    """:func:`time_after_first_step` of a run folder: ``time_to_target_s`` and the first record of its
    ``rank0.jsonl`` (rank 0 writes it on its own host). Returns float seconds, or None when the target was not
    reached or the folder has no ``rank0.jsonl``."""
    path = os.path.join(run_dir, "rank0.jsonl")
    if time_to_target_s is None or not os.path.isfile(path):
        return None
    with open(path) as f:
        first = f.readline()
    return time_after_first_step(time_to_target_s, [json.loads(first)] if first.strip() else [])


def steady_samples_per_s(records_by_rank):
    """Steady-state samples per second of a run: after each rank's first epoch, boundaries included.

    Per rank: (samples at its last step - samples at its last step of epoch 0) / (the time between
    those two steps); summed over ranks. Unlike :func:`hetsync.bench.efficiency.steady_rate` (steps
    inside epochs only), the time between epochs counts here: a protocol that stalls at epoch
    boundaries is slower by exactly that stall.

    Args:
        records_by_rank: list of step-record lists (one per worker rank), each with ``epoch``,
            ``unix_s`` and ``samples_processed``.

    Returns:
        float samples/s, or None when some rank ran a single epoch (no steady part).

    Raises:
        ValueError: records without ``unix_s``/``samples_processed`` (see :func:`rank_progress`).
    """
    total = 0.0
    for recs in records_by_rank:
        first = [i for i, r in enumerate(recs) if r.get("epoch", 0) == 0]
        if not first or first[-1] >= len(recs) - 1:
            return None
        (t0, s0), (t1, s1) = rank_progress([recs[first[-1]], recs[-1]])
        if t1 <= t0:
            return None
        total += (s1 - s0) / (t1 - t0)
    return total


def host_ms_median(records_by_rank):
    """Median ``host_ms`` (milliseconds per step outside the device time) over every rank's steps.

    Each rank's first step (graph tracing) is left out.

    Args:
        records_by_rank: list of step-record lists, one per worker rank.

    Returns:
        float milliseconds, or None when no record carries ``host_ms``.
    """
    vals = [r["host_ms"] for recs in records_by_rank for r in recs[1:] if "host_ms" in r]
    return statistics.median(vals) if vals else None


def homogeneous_twin(spec, n, batch_size):
    """The homogeneous twin of a scenario: every rank at the same speed, the same total speed.

    On ``n`` ranks with expected speeds v_i (samples/s alone, from the scenario's emulated device:
    :func:`hetsync.bench.efficiency.analytic_solo`), the twin gives every rank the device time
    ``n * b / sum_i v_i`` seconds per step. ``device:40+random:6`` on 4 ranks has mean step
    40 x (1 + 5/4) = 90 ms, so its twin is ``device:90``.

    Args:
        spec: str scenario with a ``device:MS`` part. n: int ranks >= 1. batch_size: int b >= 1 samples
            per step.

    Returns:
        str, ``"device:MS"`` with MS in milliseconds (3 decimals at most).

    Raises:
        ValueError: ``spec`` has no ``device:MS`` part (no expected speed to match) or does not parse.
    """
    v = efficiency.analytic_solo(spec, n, batch_size)
    if not v:
        raise ValueError(f"scenario {spec!r} has no emulated device (device:MS): its speeds are unknown, so it "
                         "has no homogeneous twin")
    ms = 1e3 * n * batch_size / sum(v)
    return f"device:{round(ms, 3):g}"


def run_progress(run_dir):
    """Samples to target, steady samples/s and host time of a finished run folder.

    Args:
        run_dir: str, a folder with ``summary.json`` (its ``per_rank``, ``accuracy_curve`` and
            ``target_accuracy``) and ``rank{r}.jsonl`` for every worker rank.

    Returns:
        dict with ``samples_to_target`` (int or None), ``samples_per_s_steady`` (float or None),
        ``host_ms_median`` (float or None), ``time_to_target_after_first_step_s`` (float seconds or None,
        :func:`time_after_first_step`). Records without the fields these need (older runs) give None.

    Raises:
        FileNotFoundError: a missing file.
    """
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    ranks = [r["rank"] for r in summary.get("per_rank", []) if r.get("role", "worker") == "worker"]
    records = []
    for r in ranks:
        with open(os.path.join(run_dir, f"rank{r}.jsonl")) as f:
            records.append([json.loads(line) for line in f if line.strip()])
    out = {"samples_to_target": None, "samples_per_s_steady": None, "host_ms_median": host_ms_median(records),
           "time_to_target_after_first_step_s": time_after_first_step(
               summary.get("time_to_target_s"), records[ranks.index(0)] if 0 in ranks else None)}
    try:
        progress = [rank_progress(recs) for recs in records]
        out["samples_to_target"] = samples_to_target(progress, summary.get("accuracy_curve") or [],
                                                     summary.get("target_accuracy"))
        out["samples_per_s_steady"] = steady_samples_per_s(records)
    except ValueError:
        pass  # records or curve from before these fields existed
    return out
