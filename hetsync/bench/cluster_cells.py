"""Benchmark cells on the emulated multi-host cluster: calibration, the communication share, the launch.

A cell with a ``cluster`` (:class:`hetsync.emulation.cluster.ClusterSpec`) runs every launch under
``hetsync-cluster run`` (:func:`hetsync.bench.launch.on_cluster`): ranks on hosts of their own, the hosts
joined by shaped links. Before its first run, :func:`prepare` settles two things for the cell:

* the time dilation D (:mod:`hetsync.bench.calibrate`): the cell's last listed protocol (the candidate)
  on the cell's cluster, model and emulated device, *without* the scenario's slowdowns (every rank
  computing at once: the most contention), for one epoch at each candidate D until under 1% of the steps
  overran; cells with the same cluster, model, device and candidate share one calibration;
* ``comm_fraction`` = (BSP step time on the shaped links - BSP step time unshaped) / shaped, both at
  the calibrated D without slowdowns: the share of a step that the links cost (unshaped:
  :data:`hetsync.emulation.cluster.spec.UNSHAPED`).
  Step time is the median over every rank's steps after the first two (milliseconds of wall time);
* the alpha-beta parameters of the shaped links at that D (:mod:`hetsync.bench.alphabeta`, its largest message
  the model's gradient), written down before any run: every run of the cell is compared with the E they predict.

Protocol *variants* name a protocol with its arguments, ``NAME(KEY=VALUE;KEY=VALUE)``, e.g.
``shat(sharding=layer;servers=2)``: two variants of one protocol run side by side in one cell.
Free of TensorFlow.
"""
import dataclasses
import json
import os
import re
import statistics
import subprocess

from hetsync.bench import alphabeta as _alphabeta, calibrate as _calibrate, efficiency, launch
from hetsync.emulation import scenario as _slowdown
from hetsync.emulation.cluster.spec import UNSHAPED, ClusterSpec

__all__ = ["parse_variant", "cluster_label", "device_only", "median_step_ms", "comm_fraction", "prepare",
           "launch_command", "with_dilation", "CANDIDATES", "pair_ratios", "pair_table", "PAIR_FIGURES"]

#: rough wall seconds of one cluster-cell launch at the dilations calibrated here (the ``cluster`` preset: 18
#: runs and 3 cells' calibrations in 101 min), and of one cell's calibration, for ``--dry-run``'s estimate.
LAUNCH_ESTIMATE_S, PREPARE_ESTIMATE_S = 270.0, 420.0
#: the dilations a cluster cell's calibration tries, in order.
CANDIDATES = (40.0, 60.0, 80.0, 120.0, 160.0)
_VARIANT = re.compile(r"^([A-Za-z_][\w-]*)(?:\((.*)\))?$")


def parse_variant(text):
    """Split a protocol variant ``NAME(KEY=VALUE;...)`` (or a plain ``NAME``) into its parts.

    Args:
        text: str, e.g. ``"rnah(groups=host;servers=2)"``.

    Returns:
        ``(name, args)``: str protocol name and tuple of ``"KEY=VALUE"`` str.

    Raises:
        ValueError: text of another form, or an argument without ``=`` (names it and the form).
    """
    m = _VARIANT.match(str(text).strip())
    if not m:
        raise ValueError(f"protocol variant {text!r}: give NAME or NAME(KEY=VALUE;KEY=VALUE), e.g. "
                         "shat(sharding=layer;servers=2)")
    args = tuple(a.strip() for a in (m.group(2) or "").split(";") if a.strip())
    for a in args:
        if "=" not in a:
            raise ValueError(f"protocol variant {text!r}: argument {a!r} is not KEY=VALUE")
    return m.group(1), args


def cluster_label(spec):
    """The cluster part of a cell's key (str): ``"4x2/10gbit"``, with each host's own slots and rates
    (``"h0:2,h1:2,h2:2,h3:1,h4:1/10gbit,h2=2.5gbit"``)."""
    uniform = not spec.host_slots
    hosts = f"{spec.hosts}x{spec.slots}" if uniform else spec.hosts_arg()
    return f"{hosts}/{spec.link}" + "".join(f",{h}={r}" for h, r in spec.host_links)


def device_only(scenario):
    """The ``device:MS`` part of a scenario spec (str), without its slowdowns.

    Raises:
        ValueError: a scenario with no ``device:MS`` part (a cluster cell needs the emulated device).
    """
    dev = _slowdown.parse_spec(scenario).device_ms
    if dev is None:
        raise ValueError(f"a cluster cell needs an emulated device (a device:MS part), got scenario {scenario!r}")
    return f"device:{dev:g}"


def median_step_ms(run_dir, skip=2):
    """Median wall time of a step over every rank of a finished run (float milliseconds).

    Args:
        run_dir: str, the run's output folder (``rank*.jsonl`` step records). skip: int, steps left out at
            each rank's start (tracing and the first allreduce).

    Raises:
        ValueError: no step records after ``skip`` (names the folder).
    """
    steps = []
    for name in sorted(os.listdir(run_dir)):
        if re.fullmatch(r"rank\d+\.jsonl", name):
            steps += [r["step_ms"] for r in efficiency.read_jsonl(os.path.join(run_dir, name))[skip:]
                      if r.get("step_ms") is not None]
    if not steps:
        raise ValueError(f"no step records past the first {skip} in {run_dir}")
    return statistics.median(steps)


def comm_fraction(shaped_ms, unshaped_ms):
    """(shaped - unshaped) / shaped (float; may be slightly negative from noise on fast links).

    Args:
        shaped_ms, unshaped_ms: floats > 0, BSP's median step time on shaped and on unshaped links.

    Raises:
        ValueError: a step time not > 0.
    """
    if not (shaped_ms > 0 and unshaped_ms > 0):
        raise ValueError(f"step times must be > 0 ms, got shaped={shaped_ms!r}, unshaped={unshaped_ms!r}")
    return (shaped_ms - unshaped_ms) / shaped_ms


def launch_command(spec, argv, record, timeout_s):
    """The launch (list of str) of one run of a cluster cell: :func:`hetsync.bench.launch.on_cluster`."""
    return launch.on_cluster(spec, argv, record=record, timeout_s=timeout_s)


def prepare(cell, job_argv, out_dir, cache, candidates=CANDIDATES, timeout_s=900.0, log=print):
    """Calibrate D and measure ``comm_fraction`` for a cluster cell (see the module docstring).

    The calibration runs the cell's *last* listed protocol (the candidate, whose host work overlaps its
    communication: RNA's rounds run beside the compute, so on shared cores it needs a larger D than BSP)
    on the device alone; ``comm_fraction`` then comes from two BSP runs at the chosen D, on the shaped
    and on unshaped links.

    Args:
        cell: :class:`hetsync.bench.matrix.Cell` with ``cluster`` set. job_argv: list of str, the job's
            arguments for this cell (with or without :data:`hetsync.bench.launch.JOB` first: data, model,
            batch size; ``--slowdown``, ``--protocol`` and ``--epochs`` are set here). out_dir: str folder
            for the runs. cache: dict shared by the cells of one benchmark (same cluster, model, device and
            candidate protocol: one calibration).
        candidates: floats >= 1, the dilations tried. timeout_s: float seconds per run. log: callable(str).

    Returns:
        dict: ``dilation`` (float, or None when no candidate kept up: the cell's runs then use the largest
        and say so), ``calibrated_with`` (the protocol), ``calibration``
        (:func:`hetsync.bench.calibrate.calibrate`'s dict), ``shaped_step_ms``, ``unshaped_step_ms``,
        ``comm_fraction`` (None when a run failed), ``shaped_overrun_fraction``,
        ``unshaped_overrun_fraction``, ``error`` (str) when a run failed, and ``alphabeta``
        (:func:`hetsync.bench.alphabeta.measure`'s document, or ``{"error": ...}``).
    """
    spec = cell.cluster
    device = device_only(cell.scenario)
    name, proto_args = parse_variant((cell.protocols or ("bsp",))[-1])
    key = (spec, cell.model, device, cell.dataset, name, proto_args)
    if key in cache:
        return cache[key]
    job = list(job_argv)
    if tuple(job[:len(launch.JOB)]) == tuple(launch.JOB):  # the calibration's trials put the job's module first
        job = job[len(launch.JOB):]
    job = _set(_set(job, "--slowdown", device), "--epochs", "1")
    cal_job = _set(job, "--protocol", name) + launch.protocol_args(proto_args)
    cal = _calibrate.calibrate(spec.hosts, spec.slots, spec.link, cal_job, os.path.join(out_dir, "calibrate"),
                               candidates=candidates, host_links=spec.host_links, timeout_s=timeout_s,
                               log=log, host_slots=spec.host_slots)
    d = cal["dilation"]
    out = {"dilation": d, "calibrated_with": (cell.protocols or ("bsp",))[-1], "calibration": cal,
           "shaped_step_ms": None, "unshaped_step_ms": None, "comm_fraction": None}
    used = d if d is not None else max(candidates)
    bsp = _set(job, "--protocol", "bsp")
    try:
        steps = {}
        for what, link in (("shaped", None), ("unshaped", UNSHAPED)):
            run_spec = dataclasses.replace(spec, dilation=used) if link is None else \
                dataclasses.replace(spec, link=link, host_links=(), dilation=used)
            row = _calibrate.trial(run_spec, bsp, os.path.join(out_dir, f"bsp-{what}"), timeout_s=timeout_s)
            if not row["ok"]:
                raise RuntimeError(f"the {what} BSP run failed: {row['error'][:500]}")
            steps[what] = median_step_ms(os.path.join(out_dir, f"bsp-{what}"))
            out[f"{what}_overrun_fraction"] = row.get("overrun_fraction")
        out["shaped_step_ms"], out["unshaped_step_ms"] = steps["shaped"], steps["unshaped"]
        out["comm_fraction"] = comm_fraction(steps["shaped"], steps["unshaped"])
    except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"comm_fraction of {cell.key} not measured: {out['error'][:300]}")
    out["alphabeta"] = _alphabeta_of(spec, used, out_dir, timeout_s, log, cell.key)
    with open(os.path.join(out_dir, "prepare.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
    cache[key] = out
    return out


def _alphabeta_of(spec, dilation, out_dir, timeout_s, log, key):
    """The alpha-beta microbenchmark on the cell's shaped links at ``dilation``
    (:func:`hetsync.bench.alphabeta.measure`), its largest message the gradient of the shaped BSP run's model;
    ``{"error": ...}`` when it failed."""
    try:
        with open(os.path.join(out_dir, "bsp-shaped", "summary.json")) as f:
            grad = json.load(f).get("gradient_bytes")
        if not grad:
            raise ValueError("the shaped BSP run's summary names no gradient_bytes")
        return _alphabeta.measure(dataclasses.replace(spec, dilation=dilation), int(grad),
                                  os.path.join(out_dir, "alphabeta"), timeout_s=timeout_s)
    except (OSError, ValueError, RuntimeError) as exc:
        log(f"alpha-beta microbenchmark of {key} failed: {exc}"[:400])
        return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def with_dilation(spec, dilation):
    """``spec`` (:class:`ClusterSpec`) at time dilation ``dilation`` (float >= 1)."""
    if not isinstance(spec, ClusterSpec):
        raise ValueError(f"expected a ClusterSpec, got {spec!r}")
    return dataclasses.replace(spec, dilation=float(dilation))


def _set(argv, flag, value):
    """``argv`` with ``flag``'s value replaced (or the pair appended)."""
    if flag in argv[:-1]:
        i = argv.index(flag)
        return argv[:i + 1] + [value] + argv[i + 2:]
    return argv + [flag, value]


#: the figures :func:`pair_ratios` puts side by side: (field, whether the candidate's smaller value wins).
PAIR_FIGURES = (("time_to_target_s", True), ("samples_to_target", True), ("samples_per_s", False))


def pair_ratios(runs, cells):
    """Each cluster cell's two protocols side by side, seed by seed: the second listed (the candidate)
    against the first (the reference), e.g. RNA against BSP, hierarchical RNA against flat RNA,
    memory-wise against layer-wise sharding.

    Args:
        runs: list of run dicts (``cell``, ``protocol``, ``seed``, ``status`` and the figures of
            :data:`PAIR_FIGURES`). cells: list of :class:`hetsync.bench.matrix.Cell`; only cluster cells
            with exactly two protocols are paired.

    Returns:
        list of dicts, one per paired cell: ``cell``, ``reference``, ``candidate``, ``comm_fraction``
        (the median of the cell's runs), ``dilation``, ``overrun_fraction_max`` (the largest of every run:
        1% or more and the pair is not evidence), and for each figure F: ``F_ratio`` (dict seed ->
        the candidate's gain: reference / candidate for times and samples, candidate / reference for
        samples/s; > 1: the candidate wins; None where a run missed the target or failed) and
        ``F_ratio_median`` (float or None).
    """
    out = []
    for cell in cells:
        if cell.cluster is None or not cell.protocols or len(cell.protocols) != 2:
            continue
        ref, cand = cell.protocols
        mine = [r for r in runs if r["cell"] == cell.key and r["status"] == "ok"]
        by = {(r["protocol"], r["seed"]): r for r in mine}
        seeds = sorted({r["seed"] for r in mine})
        row = {"cell": cell.key, "reference": ref, "candidate": cand,
               "comm_fraction": _median([r.get("comm_fraction") for r in mine]),
               "dilation": _median([r.get("dilation") for r in mine]),
               "overrun_fraction_max": max([r.get("overrun_fraction") or 0.0 for r in mine], default=None)}
        for field, smaller_wins in PAIR_FIGURES:
            ratios = {}
            for s in seeds:
                a, b = by.get((ref, s)), by.get((cand, s))
                va, vb = (a or {}).get(field), (b or {}).get(field)
                ratios[s] = ((va / vb if smaller_wins else vb / va) if va and vb else None)
            row[f"{field}_ratio"] = ratios
            row[f"{field}_ratio_median"] = _median(list(ratios.values()))
        out.append(row)
    return out


def pair_table(rows):
    """Markdown table (str) of :func:`pair_ratios`' rows: the candidate's gains, median over seeds."""
    def f(v, fmt="{:.2f}", unit=""):
        return "-" if v is None else fmt.format(v) + unit

    lines = ["| cell | candidate vs reference | time to target | samples to target | samples/s | comm_fraction "
             "| D | max overrun |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['cell']}` | {r['candidate']} vs {r['reference']} | "
                     f"{f(r['time_to_target_s_ratio_median'], unit='x')} | {f(r['samples_to_target_ratio_median'], unit='x')} | "
                     f"{f(r['samples_per_s_ratio_median'], unit='x')} | {f(r['comm_fraction'])} | {f(r['dilation'], '{:g}')} | "
                     f"{f(r['overrun_fraction_max'], '{:.1%}')} |")
    return "\n".join(lines)


def _median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None
