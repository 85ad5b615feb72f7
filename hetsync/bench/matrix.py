"""The benchmark matrix: protocols x scenarios x seeds, each a real ``horovodrun --mpi`` launch.

Runs are *interleaved*: for every seed, for every (ranks, data set, scenario) cell,
every protocol of the cell runs once, in an order rotated from cell to cell, so slow spells of this
shared machine hit all protocols alike. Before a cell's first runs, the solo speeds of its scenario
are measured (:func:`hetsync.bench.efficiency.measure_solo`). Every figure is then put against BSP's
run *from the same seed and cell* (ratios), and summarised over seeds by the median and the min-max
spread.

The presets run on the *emulated cluster* (scenario part ``device:MS``, see :mod:`hetsync.emulation.scenario`):
every step lasts the emulated device's time, real math inside, so 4-8 ranks sharing this machine's
two cores measure the protocol, not the scheduler. Emulated runs also get E against the *analytic*
solo speeds (b / expected step time of each rank), and a run is flagged when that E exceeds
:data:`E_FLAG` (impossible on a real cluster) or more than 1% of its steps overran their device time
(the emulation does not hold for it). A few cells without ``device`` run on the real CPU with 2 ranks,
where each rank has a core of its own.
"""
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

from hetsync.bench import alphabeta as _alphabeta, cluster_cells as _cluster_cells, efficiency, launch
from hetsync.bench.presets import (  # noqa: F401 - the presets' names, kept importable from here
    DATASETS, JOB, LAUNCH_ESTIMATE_S, PRESETS, ROOT, SOLO_EPOCHS_FACTOR, SOLO_ESTIMATE_S, TRAIN_SAMPLES, Cell, Preset,
    dataset_argv, missing_data, parse_cell, twin_cell, with_device)
from hetsync.bench.record import machine_description, run_key
from hetsync.bench.results import (  # noqa: F401 - the figures' names, kept importable from here
    AGG_FIELDS, E_FLAG, METRICS, add_ratios, aggregate, analyse_run, protocol_label)

__all__ = ["Preset", "PRESETS", "Cell", "parse_cell", "twin_cell", "with_device", "plan", "E_FLAG", "run_matrix", "analyse_run", "add_ratios", "reanalyse",
           "aggregate", "machine_description", "DATASETS", "ROOT", "JOB", "dataset_argv", "missing_data"]

def plan(preset, protocols):
    """The interleaved run order.

    Args:
        preset: :class:`Preset`. protocols: list of protocol names (BSP first is not required).

    Returns:
        list of ``(seed, cell, protocol)``: for each seed, for each cell that has this seed, every
        protocol once (only BSP and the cell's own ``protocols`` where it names some); the protocol
        order is rotated by one from cell to cell. With ``preset.twins``, BSP on the cell's
        homogeneous twin (:func:`twin_cell`) follows the cell's runs.
    """
    order, k = [], 0
    for seed in sorted({s for c in preset.cells for s in preset.cell_seeds(c)}):
        for cell in [c for c in preset.cells if seed in preset.cell_seeds(c)]:
            if cell.cluster is not None:  # exactly the cell's list, variants included
                mine = [p for p in cell.protocols or protocols if _cluster_cells.parse_variant(p)[0] in protocols]
            else:
                mine = [p for p in protocols if cell.protocols is None or p == "bsp" or p in cell.protocols]
            if not mine:  # every protocol of the cell filtered out
                continue
            rot = k % len(mine)
            order += [(seed, cell, p) for p in mine[rot:] + mine[:rot]]
            k += 1
            twin = twin_cell(preset, cell) if preset.twins else None
            if twin is not None:
                order.append((seed, twin, "bsp"))
    return order


def _env():
    return launch.job_env(stall_shutdown_s=120)


def launch_command(preset, seed, cell, protocol, out, protocol_args=(), dilation=None):
    """The launch (list of str) of one run: ``horovodrun --mpi`` on this machine, or, for a cluster cell,
    ``hetsync-cluster run`` at time dilation ``dilation`` (float >= 1) around ``horovodrun -H {hosts}``
    (the cluster's record goes to ``out/`` :data:`hetsync.bench.launch.CLUSTER_RECORD`). ``protocol`` may be
    a variant ``NAME(KEY=VALUE;...)``; its arguments come before ``protocol_args``."""
    name, own = _cluster_cells.parse_variant(protocol)
    argv = preset.job_argv(cell, eval_every=preset.eval_every(cell)) + [
        "--protocol", name, "--slowdown", cell.scenario, "--seed", str(seed), "--out", out, "--quiet"] \
        + launch.protocol_args(tuple(own) + tuple(protocol_args))
    if cell.cluster is not None:
        return _cluster_cells.launch_command(_cluster_cells.with_dilation(cell.cluster, dilation or 1.0), argv,
                                             os.path.join(out, launch.CLUSTER_RECORD), preset.timeout_s)
    return launch.horovodrun(preset.cell_np(cell), argv)



def reanalyse(results, out_dir, preset=None):
    """Recompute every figure of ``results`` from the run folders on disk, in place, and return it.

    Solo speeds are re-read from ``out_dir/solo/<cell>/rank*`` where those folders exist. Runs whose
    folder is gone keep their stored figures. With ``preset`` (:class:`Preset`, the one ``results`` ran), each
    cluster cell's alpha-beta fit is made again from its recorded points
    (:func:`hetsync.bench.alphabeta.fit_measurements`; a cell whose points no longer fit keeps its recorded fit,
    and says so on stderr) and its runs' analytic E recomputed, each with the ``--protocol-arg`` values it ran with
    (a run's ``protocol_args``; runs recorded without them are modelled with their variant's arguments alone).

    Raises:
        ValueError: ``results`` were measured by a preset other than ``preset``.
    """
    for cell, solo in results["solo"].items():
        folder = os.path.join(out_dir, "solo", _slug(cell))
        n = len(solo.get("samples_per_s", ()))
        if n and all(os.path.isfile(os.path.join(folder, f"rank{r}", "summary.json")) for r in range(n)):
            rates = [efficiency.run_rates(os.path.join(folder, f"rank{r}")) for r in range(n)]
            solo["samples_per_s"] = [rt["samples_per_s"] for rt in rates]
            solo["steps_per_s"] = [rt["steps_per_s"] for rt in rates]
            solo["bsp_expected_e"] = efficiency.bsp_expected_efficiency(solo["samples_per_s"])
    name = (results.get("preset") or {}).get("name") if isinstance(results.get("preset"), dict) else None
    if preset is not None and name not in (None, preset.name):
        raise ValueError(f"the results in {out_dir} are of preset {name!r}, not {preset.name!r}: pass --preset {name}")
    cells = {c.key: c for c in preset.cells} if preset is not None else {}
    for key, prepared in (results.get("cells") or {}).items():
        doc = prepared.get("alphabeta") or {}
        if key in cells and doc.get("points") and doc.get("world_size"):
            try:
                doc["fit"] = _alphabeta.fit_measurements(doc["points"], doc["world_size"])
                spec = _cluster_cells.with_dilation(cells[key].cluster, doc.get("dilation") or prepared["dilation"])
                doc["network"] = _alphabeta.network_from_fit(doc["fit"], spec.np, spec.hosts_arg(), spec.link,
                                                             spec.host_links, spec.dilation).describe()
            except (ValueError, KeyError, TypeError) as exc:  # keep the recorded fit
                print(f"hetsync-bench: cell {key}: the links were not fitted again ({exc}); the recorded fit is "
                      "kept", file=sys.stderr)
    for r in results["runs"]:
        if r["status"] == "ok" and os.path.isfile(os.path.join(r["out"], "summary.json")):
            r.update(analyse_run(r["out"], results["solo"][r["cell"]]))
            prepared = (results.get("cells") or {}).get(r["cell"])
            if prepared is not None:
                r["protocol_label"] = r["protocol"]  # a cluster cell's run is labelled by its variant, as it ran
                if r["cell"] in cells:
                    r.update(_model_figures(r, cells[r["cell"]], prepared, r.get("protocol_args") or ()))
    add_ratios(results["runs"])
    results["aggregate"] = aggregate(results["runs"])
    return results


def run_matrix(preset, protocols, out_dir, protocol_args=None, progress=True, log=print, resume=None,
               time_cap_s=None):
    """Run the whole matrix and return the results dict (also written to ``out_dir/results.json``, after every
    run as well, so an interrupted matrix keeps what it measured).

    Args:
        preset: :class:`Preset` (validated here). protocols: list of protocol names; must contain
            "bsp" (the reference of every ratio). out_dir: str output folder.
        protocol_args: dict protocol -> list of ``"KEY=VALUE"`` (passed as ``--protocol-arg``).
        progress: bool, show a tqdm bar. log: callable(str) for messages.
        resume: dict from :func:`hetsync.bench.record.load_resume` or None: its ``ok`` runs are kept, not
            launched (also those of protocols or seeds this invocation does not plan, so a filtered sitting keeps
            them in its document), and its cluster cells' calibrations and solo speeds are reused.
        time_cap_s: float seconds or None: start no new run after this long (the runs left are counted).

    Returns:
        dict with ``preset``, ``protocols``, ``machine``, ``command``, ``solo`` (cell -> solo dict),
        ``runs`` (list of per-run dicts), ``aggregate`` (see :func:`aggregate`), ``wall_s``, ``cells``
        (cluster cell -> its calibration), ``resumed`` (runs taken from ``resume``) and ``left`` (runs not
        started: the time cap).

    A failed run or solo measurement is recorded (``status``/``error``) and logged; the matrix goes on.

    Raises:
        ValueError: bad preset, or "bsp" missing from ``protocols``.
    """
    from tqdm import tqdm

    preset.validate()
    if "bsp" not in protocols:
        raise ValueError(f"the protocol list must include 'bsp' (every ratio is against it), got {protocols}")
    protocol_args = protocol_args or {}
    os.makedirs(out_dir, exist_ok=True)
    order = plan(preset, list(protocols))
    t0 = time.time()
    results = {"preset": _preset_dict(preset), "protocols": list(protocols), "machine": machine_description(),
               "command": " ".join(shlex.quote(a) for a in ["hetsync-bench"] + sys.argv[1:]),
               "solo": {}, "runs": []}
    bar = tqdm(total=len(order) + len(preset.cells), desc=f"hetsync-bench {preset.name}", unit="launch",
               disable=not progress, file=sys.stderr)
    cluster_cache = {}
    resume = resume or {"runs": {}, "cells": {}, "solo": {}}
    results.update(resumed=0, left=0)
    keys = {c.key for c in preset.cells}
    # a resumed cell keeps its calibration (D, comm_fraction, alpha-beta) and solo speeds: no second calibration
    results["cells"] = {k: v for k, v in resume["cells"].items() if k in keys}
    results["solo"].update({k: v for k, v in resume["solo"].items() if k in keys})
    planned = {run_key(seed, cell.key, proto) for seed, cell, proto in order}
    for key, done in resume["runs"].items():  # runs this invocation's filters leave out stay in its document
        if key not in planned and done.get("cell") in keys:
            results["runs"].append(dict(done))
            results["resumed"] += 1
            if done["protocol"] not in results["protocols"]:
                results["protocols"].append(done["protocol"])
    try:
        for seed, cell, proto in order:
            done = resume["runs"].get(run_key(seed, cell.key, proto))
            if done is not None:
                results["runs"].append(dict(done))
                results["resumed"] += 1
                bar.update(1)
                continue
            if time_cap_s is not None and time.time() - t0 > time_cap_s:
                results["left"] += 1
                continue
            if cell.cluster is not None and cell.key not in results["cells"]:
                bar.set_postfix_str(f"calibration {cell.key}")
                results["cells"][cell.key] = _cluster_cells.prepare(
                    cell, preset.job_argv(cell), os.path.join(out_dir, "cells", _slug(cell.key)), cluster_cache,
                    timeout_s=preset.timeout_s, log=log)
            if cell.cluster is not None and cell.key not in results["solo"]:
                results["solo"][cell.key] = {"error": "not measured on the emulated cluster: E against the devices' "
                                                      "analytic speeds only"}
            if cell.key not in results["solo"] and cell.twin_of:
                results["solo"][cell.key] = {"error": "not measured: a homogeneous twin (the tax's reference)"}
            if cell.key not in results["solo"]:
                bar.set_postfix_str(f"solo speeds {cell.key}")
                solo_dir = os.path.join(out_dir, "solo", _slug(cell.key))
                try:
                    results["solo"][cell.key] = efficiency.measure_solo(
                        preset.job_argv(cell, 1 if cell.emulated else SOLO_EPOCHS_FACTOR), cell.scenario,
                        preset.cell_np(cell),
                        solo_dir, env=_env(), timeout_s=preset.timeout_s)
                except (efficiency.SoloError, OSError, ValueError) as exc:
                    # keep going: the cell's runs still give every figure but E (reported as missing)
                    results["solo"][cell.key] = {"error": str(exc)[-3000:]}
                    log(f"solo measurement FAILED for {cell.key} (E will be missing): {str(exc)[:500]}")
                bar.update(1)
            bar.set_postfix_str(f"seed {seed} {cell.key} {proto}")
            run_dir = os.path.join(out_dir, "runs", f"seed{seed}", _slug(cell.key), proto)
            results["runs"].append(_one_run(preset, seed, cell, proto, run_dir,
                                            protocol_args.get(_cluster_cells.parse_variant(proto)[0], ()),
                                            results["solo"][cell.key], log, results["cells"].get(cell.key)))
            bar.update(1)
            with open(os.path.join(out_dir, "results.json"), "w") as f:  # what is measured so far
                json.dump(results, f, indent=1, sort_keys=True, default=str)
    finally:
        bar.close()
    add_ratios(results["runs"])
    results["aggregate"] = aggregate(results["runs"])
    results["wall_s"] = time.time() - t0
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    return results


def _one_run(preset, seed, cell, proto, run_dir, proto_args, solo, log, prepared=None):
    dilation = None
    if prepared is not None:
        dilation = prepared["dilation"] or max(_cluster_cells.CANDIDATES)
    cmd = launch_command(preset, seed, cell, proto, run_dir, proto_args, dilation=dilation)
    rec = {"protocol": proto, "seed": seed, "cell": cell.key, "dataset": cell.dataset, "scenario": cell.scenario,
           "np": preset.cell_np(cell), "out": run_dir, "twin_of": cell.twin_of, "command": " ".join(shlex.quote(a) for a in cmd)}
    if prepared is not None:
        rec.update(comm_fraction=prepared.get("comm_fraction"), calibrated=prepared["dilation"] is not None,
                   cluster_label=_cluster_cells.cluster_label(cell.cluster), model=cell.model or preset.model,
                   protocol_args=list(proto_args))  # --report-from models the run as it ran
    os.makedirs(run_dir, exist_ok=True)
    t = time.time()
    try:
        # a cluster launch ends itself at the preset's timeout (its --timeout) and tears the hosts down
        proc = launch.run(cmd, preset.timeout_s + (60.0 if cell.cluster is not None else 0.0), stall_shutdown_s=120)
        output = proc.stdout + proc.stderr
        failed = f"exited {proc.returncode}" if proc.returncode != 0 else None
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        failed = f"timed out after {preset.timeout_s:.0f} s"
    rec["launch_s"] = time.time() - t
    with open(os.path.join(run_dir, "launch.log"), "w") as f:
        f.write(rec["command"] + "\n" + output)
    if failed is None:
        try:
            rec.update(analyse_run(run_dir, solo))
            if prepared is not None:
                rec["protocol_label"] = proto
                rec.update(_model_figures(rec, cell, prepared, proto_args))
        except (OSError, ValueError, KeyError, IndexError) as exc:
            failed = f"unusable output: {type(exc).__name__}: {exc}"
    rec["status"] = "ok" if failed is None else "failed"
    if failed:
        rec["error"] = f"{failed}; see {os.path.join(run_dir, 'launch.log')}\n{output[-1500:]}"
        log(f"run FAILED: {proto} seed {seed} {cell.key}: {failed} (log: {run_dir}/launch.log)")
    return rec


def _model_figures(rec, cell, prepared, proto_args=()):
    """The analytic E of a cluster cell's run ``rec`` (:func:`hetsync.bench.alphabeta.model_figures`), from the
    alpha-beta fit of the cell's links; {} when the cell has no fit."""
    if not (prepared.get("alphabeta") or {}).get("fit"):
        return {}
    name, vargs = _cluster_cells.parse_variant(rec["protocol"])
    args = dict(kv.split("=", 1) for kv in (*proto_args, *vargs))
    spec = _cluster_cells.with_dilation(cell.cluster, prepared["dilation"] or max(_cluster_cells.CANDIDATES))
    return _alphabeta.model_figures(prepared["alphabeta"], spec, name, args, rec["out"], rec.get("efficiency_analytic"),
                                    rec.get("samples_per_s"))


def _slug(text):
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def _preset_dict(preset):
    d = dataclasses.asdict(preset)
    d["cells"] = [c.key for c in preset.cells]
    d["cell_np"] = {c.key: preset.cell_np(c) for c in preset.cells}
    d["cell_protocols"] = {c.key: list(c.protocols) if c.protocols else None for c in preset.cells}
    d["cell_cluster"] = {c.key: (dataclasses.asdict(c.cluster) if c.cluster is not None else None) for c in preset.cells}
    d["cell_seeds"] = {c.key: list(preset.cell_seeds(c)) for c in preset.cells}
    d["seeds"] = sorted({s for c in preset.cells for s in preset.cell_seeds(c)})
    return d
