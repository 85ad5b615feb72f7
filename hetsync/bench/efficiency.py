"""Heterogeneity efficiency E and the solo speeds it is measured against.

E = measured samples/s of the whole job / sum over ranks i of v_i, where v_i is rank i's samples/s
when it trains *alone* under the same scenario (no synchronization, nobody to wait for). E = 1 is
the physical limit when every rank has its own cores: every rank busy all the time on useful work.
Where ranks share cores E can exceed 1, because a rank sleeping in the delay op (or finished) leaves
its CPU share to the others, which the solo runs, all busy at once, never get. BSP, which makes every rank wait for
the slowest one each step, is expected to reach ``n * min_i v_i / sum_i v_i``.

Solo speeds are measured by :func:`measure_solo`: the n ranks are started at the same time as n
independent single-process jobs (``python -m hetsync.bench.job --as-rank i --as-world-size n``), so each
one gets the same share of this machine's cores as in the real run but never waits for another. A
lone rank does not synchronize, so the ``netdelay`` parts of the scenario (network latency) are left
out of the solo run (:func:`solo_spec`): the time a protocol spends on the network counts against its E.

All speeds are *steady-state* rates from the per-step records (``rank*.jsonl``), measured after the
warm-up and within epochs (:func:`steady_rate`), so graph tracing and the test evaluations between
epochs do not count.
"""
import json
import os
import subprocess
import sys
import time

from hetsync.emulation import scenario as _slowdown
from hetsync.errors import SoloError

__all__ = ["steady_rate", "run_rates", "window_rates", "efficiency", "bsp_expected_efficiency", "solo_spec",
           "analytic_solo", "bsp_expected_efficiency_emulated", "measure_solo", "SoloError", "read_jsonl"]

#: seconds granted to a killed solo process to exit and hand back its output.
REAP_S = 30.0


def read_jsonl(path):
    """Return the list of dicts of a JSON-lines file (one object per non-empty line).

    Raises:
        FileNotFoundError: no such file.
    """
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _warmup_end(records):
    """Index of the last warm-up record (see :func:`steady_rate`)."""
    later = [i for i, r in enumerate(records) if r.get("epoch", 0) >= 1]
    return later[0] if later else min(2, len(records) - 1)


def _measured_steps(records):
    """Number of steps :func:`steady_rate` measures without a window."""
    multi_epoch = any(r.get("epoch", 0) >= 1 for r in records)
    return sum(1 for i in range(1, len(records))
               if not (multi_epoch and records[i].get("epoch", 0) < 1 or not multi_epoch and i < 3)
               and records[i].get("epoch", 0) == records[i - 1].get("epoch", 0))


def steady_rate(records, samples_per_step, window=None):
    """Steady-state speed of one rank from its per-step records.

    Warm-up: the whole first epoch (tracing, the first evaluation, the retrace of a short last
    batch) when there are later epochs, else the first 3 steps. After it, only *intra-epoch* steps
    count: a step is measured by the wall time since the previous step's end, and the first step of
    each epoch is left out, so the time between epochs (rank 0's test evaluation, epoch-end
    callbacks, and other ranks waiting for them in their next step) is not part of the speed.
    Time to target accuracy, by contrast, includes everything.

    Args:
        records: list of dicts with at least ``wall_s`` (float seconds since training began, at the
            step's end) and ``epoch`` (int), in step order (one rank's ``rank*.jsonl``).
        samples_per_step: float > 0, mean samples per step of this rank (its samples / its steps).
        window: optional ``(t_from, t_to)`` seconds: count only steps that began after ``t_from``
            and ended by ``t_to`` (see :func:`run_rates`).

    Returns:
        ``(steps_per_s, samples_per_s)``, floats: measured steps / their summed wall time.

    Raises:
        ValueError: fewer than 2 measurable steps (the run is too short), a non-positive time, or
            ``samples_per_step`` <= 0.
    """
    if not samples_per_step > 0:
        raise ValueError(f"samples_per_step must be > 0, got {samples_per_step!r}")
    multi_epoch = any(r.get("epoch", 0) >= 1 for r in records)
    steps, elapsed = 0, 0.0
    for i in range(1, len(records)):
        prev, cur = records[i - 1], records[i]
        if multi_epoch and cur.get("epoch", 0) < 1 or not multi_epoch and i < 3:
            continue  # warm-up
        if cur.get("epoch", 0) != prev.get("epoch", 0):
            continue  # first step of an epoch: absorbs the evaluation and epoch-end work
        if window is not None and not (prev["wall_s"] >= window[0] and cur["wall_s"] <= window[1]):
            continue
        steps += 1
        elapsed += cur["wall_s"] - prev["wall_s"]
    if steps < 2:
        raise ValueError(f"only {steps} measurable steps after the warm-up ({len(records)} steps in all): "
                         "run more epochs or steps to measure a speed")
    if elapsed <= 0:
        raise ValueError(f"non-positive measurement time of {elapsed} s over {steps} steps")
    steps_per_s = steps / elapsed
    return steps_per_s, steps_per_s * samples_per_step


def run_rates(run_dir):
    """Per-rank and total steady-state speeds of a finished run folder.

    On this shared machine the ranks share cores, so a rank runs faster while another is idle or
    done. The job's speed is therefore measured while *every* rank is in its steady state: the
    window from the latest warm-up end to the earliest last step over ranks (rank clocks start at
    ``on_train_begin``, right after the initial broadcast, so they agree to milliseconds). If that
    common window holds fewer than 2 measurable steps of some rank (ranks that never ran at the same
    time), each rank's measured steps are divided by the whole span from the first warm-up end to the
    last step of any rank (idle time included: a lower bound) and ``concurrent`` is False.

    Args:
        run_dir: str, a folder holding ``summary.json`` and ``rank{r}.jsonl`` for every rank r.
            Parameter-server ranks (``role: "server"`` in ``per_rank``) train nothing and are left out.

    Returns:
        dict with ``per_rank``: list of ``{"rank", "steps_per_s", "samples_per_s"}``;
        ``samples_per_s``: float, sum over ranks (the job's throughput); ``steps_per_s``: float,
        mean over ranks of each rank's own steps per second; ``concurrent``: bool, ``window``:
        ``[t_from, t_to]`` seconds or None.

    Raises:
        FileNotFoundError: a file is missing. ValueError: a run too short to measure.
    """
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return window_rates([_rank_records(run_dir, row) for row in summary["per_rank"]
                         if row.get("role", "worker") == "worker"], run_dir)


def _rank_records(folder, row, jsonl=None):
    """``(rank, records, samples per step)`` of one rank from its ``summary.json`` row."""
    r = int(row["rank"])
    if row["steps"] <= 0 or row["samples"] <= 0:
        raise ValueError(f"{folder}: rank {r} ran {row['steps']} steps on {row['samples']} samples")
    recs = read_jsonl(os.path.join(folder, jsonl or f"rank{r}.jsonl"))
    if not recs:
        raise ValueError(f"{folder}: rank {r} wrote no step records")
    return r, recs, row["samples"] / row["steps"]


def window_rates(ranks, where=""):
    """Steady-state speeds of ranks that ran at the same time, over their common steady window.

    The window runs from the latest warm-up end to the earliest last step over the ranks (their
    clocks, ``wall_s``, start at ``on_train_begin``); if it holds fewer than 2 measurable steps of
    some rank, each rank's measured steps are divided by the whole span from the first warm-up end
    to the last step of any rank (idle time included, so this errs low) and ``concurrent`` is False.

    Args:
        ranks: list of ``(rank, records, samples_per_step)``: int, one rank's per-step records (see
            :func:`steady_rate`), float mean samples per step. where: str, names the run in errors.

    Returns:
        dict as :func:`run_rates`.

    Raises:
        ValueError: a run too short to measure.
    """
    window = (max(recs[_warmup_end(recs)]["wall_s"] for _, recs, _ in ranks),
              min(recs[-1]["wall_s"] for _, recs, _ in ranks))
    try:
        rates = [(r, steady_rate(recs, sps, window)) for r, recs, sps in ranks]
        concurrent = True
    except ValueError:
        # No common steady window: count each rank's steady steps over the whole span from the first
        # warm-up end to the last step (idle time included, so this errs low, never high).
        span = (max(recs[-1]["wall_s"] for _, recs, _ in ranks)
                - min(recs[_warmup_end(recs)]["wall_s"] for _, recs, _ in ranks))
        rates = []
        for r, recs, sps in ranks:
            try:
                steady_rate(recs, sps)  # raises if the run is too short to measure at all
            except ValueError as exc:
                raise ValueError(f"{where}: rank {r}: {exc}") from None
            n = _measured_steps(recs)
            rates.append((r, (n / span, n * sps / span)))
        concurrent, window = False, None
    per_rank = [{"rank": r, "steps_per_s": st, "samples_per_s": sa} for r, (st, sa) in rates]
    return {"per_rank": per_rank,
            "samples_per_s": sum(p["samples_per_s"] for p in per_rank),
            "steps_per_s": sum(p["steps_per_s"] for p in per_rank) / len(per_rank),
            "concurrent": concurrent, "window": list(window) if window else None}


def efficiency(measured_samples_per_s, solo_samples_per_s):
    """Heterogeneity efficiency E = measured / sum_i v_i.

    Args:
        measured_samples_per_s: float > 0, the job's throughput (samples/s summed over ranks).
        solo_samples_per_s: sequence of float > 0, v_i for every rank i (samples/s alone).

    Returns:
        float E (1 = the physical limit).

    Raises:
        ValueError: an empty or non-positive solo speed, or a non-positive measurement.
    """
    solo = [float(v) for v in solo_samples_per_s]
    if not solo or min(solo) <= 0:
        raise ValueError(f"solo speeds must be a non-empty list of positive samples/s, got {solo}")
    if not measured_samples_per_s > 0:
        raise ValueError(f"measured samples/s must be > 0, got {measured_samples_per_s!r}")
    return float(measured_samples_per_s) / sum(solo)


def bsp_expected_efficiency(solo_samples_per_s):
    """BSP's expected E = n * min_i v_i / sum_i v_i: every step runs at the slowest rank's pace.

    Args:
        solo_samples_per_s: sequence of float > 0, v_i per rank.

    Returns:
        float in (0, 1].

    Raises:
        ValueError: empty or non-positive speeds.
    """
    solo = [float(v) for v in solo_samples_per_s]
    if not solo or min(solo) <= 0:
        raise ValueError(f"solo speeds must be a non-empty list of positive samples/s, got {solo}")
    return len(solo) * min(solo) / sum(solo)


def _emulated(spec, world_size):
    """The parsed, validated scenario if it has a ``device:MS`` part, else None (raises ValueError)."""
    scenario = _slowdown.parse_spec(spec)
    scenario.validate(world_size)
    return scenario if scenario.device_ms is not None else None


def analytic_solo(spec, world_size, batch_size):
    """Analytic solo speeds v_i of an emulated run: samples per second of each rank's expected step.

    v_i = b / (E[K_i] x MS + E[extra_i]) x 1000 (:meth:`hetsync.emulation.scenario.Scenario.expected_step_ms`
    for a full step of b samples): what rank i would train alone on the emulated device. For a
    step of another size the factor part scales with it, so v_i holds for any step size when the
    scenario has no additive (``uniform``) delay.

    Args:
        spec: str slowdown spec. world_size: int n >= 1. batch_size: int b >= 1 (samples per step).

    Returns:
        list of n floats (samples/s), or None if ``spec`` has no ``device:MS`` part (real CPU: the
        solo speeds can only be measured).

    Raises:
        ValueError: a bad spec, or one that does not fit ``world_size``.
    """
    scenario = _emulated(spec, world_size)
    if scenario is None:
        return None
    return [batch_size * 1e3 / scenario.expected_step_ms(r, world_size) for r in range(world_size)]


def bsp_expected_efficiency_emulated(spec, world_size, batch_size, steps=20000, seed=0):
    """BSP's expected E on the emulated device, for any scenario (random ones included).

    Every BSP step lasts as long as the slowest rank's emulated step, max_i T_i with
    T_i = K_i x MS + extra_i drawn from the scenario, so the job does n b / E[max_i T_i] samples
    per second against sum_i b / E[T_i] for the ranks alone:
    E_BSP = n / (E[max_i T_i] x sum_i 1 / E[T_i]). For fixed speeds this is
    :func:`bsp_expected_efficiency`, n min(v) / sum(v); for ``random:K`` it is far lower (each step
    waits for whichever rank is slowed). E[max] is estimated from ``steps`` seeded draws per rank.

    Args:
        spec: str slowdown spec with a ``device:MS`` part. world_size: int n. batch_size: int b.
        steps: int > 0 draws. seed: int.

    Returns:
        float in (0, 1], or None if ``spec`` has no ``device`` part.

    Raises:
        ValueError: a bad spec, or one that does not fit ``world_size``.
    """
    scenario = _emulated(spec, world_size)
    if scenario is None:
        return None
    ms = scenario.device_ms
    draws = [[scenario.draw(rng, r, world_size) for _ in range(steps)]
             for r, rng in ((r, scenario.rng(seed, r)) for r in range(world_size))]
    per_step_max = [max(k * ms + e for k, e in (draws[r][t] for r in range(world_size))) for t in range(steps)]
    mean_max = sum(per_step_max) / steps
    del batch_size  # b cancels: every step of every rank holds b samples
    return world_size / (mean_max * sum(1.0 / scenario.expected_step_ms(r, world_size) for r in range(world_size)))


def solo_spec(spec):
    """Return the scenario a lone rank runs under: ``spec`` without its ``netdelay`` and fault (``pause``,
    ``stall``, ``kill``) parts: a solo speed is measured without them.

    Args:
        spec: str slowdown spec (see :func:`hetsync.emulation.scenario.parse_spec`).

    Returns:
        str spec ("none" if nothing is left).

    Raises:
        ValueError: a bad spec (as :func:`hetsync.emulation.scenario.parse_spec`).
    """
    scenario = _slowdown.parse_spec(spec)
    if scenario.spec == "none":
        return "none"
    parts = [p.strip() for p in scenario.spec.split("+")]
    kept = [p for p, c in zip(parts, scenario.components) if not isinstance(c, (_slowdown.NetDelay, _slowdown.Fault))]
    return "+".join(kept) if kept else "none"


def measure_solo(job_argv, spec, world_size, out_dir, python=None, cwd=None, env=None, seed=0, timeout_s=900,
                 rank_argv=None, common_window=False):
    """Measure v_i for every rank i: ``world_size`` solo processes started together.

    The processes start together: each imports TensorFlow, then waits at a file barrier
    (:mod:`hetsync.bench.solo`) until all n are ready, then runs
    ``python JOB --as-rank i --as-world-size n --slowdown solo_spec(spec) --out
    out_dir/rank{i} --protocol bsp --seed seed`` followed by ``job_argv`` (data set, model, epochs,
    batch size... exactly as in the real runs), without any launcher, so each is a world of one
    rank that never synchronizes. Rates are steady-state (:func:`steady_rate`), each over its own
    run, or with ``common_window`` over the window in which every solo process was in its steady
    state (:func:`window_rates`): a process that finishes first then leaves its cores to the
    others, which would make their solo speeds too high.

    Args:
        job_argv: list of str, the training job's interpreter arguments (:data:`hetsync.bench.launch.JOB`,
            ``-m hetsync.bench.job``, or a script path) then its common arguments (no ``--out``,
            ``--slowdown``, ``--protocol``, ``--seed``).
        rank_argv: optional list of n lists of str, extra arguments of rank i's process (argparse
            takes the last of a repeated option, so ``["--batch-size", "352"]`` overrides
            ``job_argv``'s): e.g. each rank's own per-step workload.
        common_window: bool, measure every rank over the common steady window (see above).
        spec: str, the scenario of the real runs. world_size: int n >= 1.
        out_dir: str, folder for the solo runs' outputs.
        python: interpreter (default this one). cwd, env: for the subprocesses. seed: int.
        timeout_s: float seconds before the processes are killed and :class:`SoloError` raised.

    Returns:
        dict: ``spec`` (the solo spec), ``samples_per_s`` (list of v_i, float, rank order),
        ``steps_per_s`` (list), ``bsp_expected_e`` (float), ``wall_s`` (float, measurement time).

    Raises:
        SoloError: a process failed or timed out (the message has its command and output tail).
        ValueError: ``rank_argv`` is not one list per rank.
    """
    if rank_argv is not None and len(rank_argv) != world_size:
        raise ValueError(f"rank_argv must hold one argument list per rank ({world_size}), got {len(rank_argv)}")
    python = python or sys.executable
    sspec = solo_spec(spec)
    env = dict(os.environ if env is None else env)
    for key in [k for k in env if k.startswith(("OMPI_", "PMI", "PMIX", "HOROVOD_GLOO"))]:
        if key not in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
            del env[key]  # a world of one, even if the harness itself runs under a launcher
    t0 = time.time()
    procs = []
    for r in range(world_size):
        cmd = [python, "-m", "hetsync.bench.solo", os.path.join(out_dir, "barrier"), str(world_size), str(r),
               str(timeout_s)] + list(job_argv) + ["--protocol", "bsp", "--slowdown", sspec, "--seed", str(seed),
                                           "--as-rank", str(r), "--as-world-size", str(world_size),
                                           "--out", os.path.join(out_dir, f"rank{r}"), "--quiet"]
        if rank_argv is not None:
            cmd += list(rank_argv[r])
        procs.append((cmd, subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)))
    failures = []
    for cmd, p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, timeout_s - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate(timeout=REAP_S)
            failures.append(f"{' '.join(cmd)} timed out after {timeout_s} s\n{out[-3000:]}")
            continue
        if p.returncode != 0:
            failures.append(f"{' '.join(cmd)} exited {p.returncode}\n{out[-3000:]}")
    if failures:
        raise SoloError("solo-speed measurement failed:\n" + "\n".join(failures))
    if common_window:  # each solo process is rank 0 of its own world, in its own folder
        ranks = []
        for r in range(world_size):
            with open(os.path.join(out_dir, f"rank{r}", "summary.json")) as f:
                row = json.load(f)["per_rank"][0]
            ranks.append(_rank_records(os.path.join(out_dir, f"rank{r}"), dict(row, rank=r), "rank0.jsonl"))
        rates = window_rates(ranks, out_dir)["per_rank"]
    else:
        rates = [run_rates(os.path.join(out_dir, f"rank{r}")) for r in range(world_size)]
    samples = [rt["samples_per_s"] for rt in rates]
    return {"spec": sspec, "samples_per_s": samples, "steps_per_s": [rt["steps_per_s"] for rt in rates],
            "bsp_expected_e": bsp_expected_efficiency(samples), "wall_s": time.time() - t0}
