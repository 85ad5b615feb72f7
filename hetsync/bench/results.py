"""The figures of finished benchmark runs: per-run analysis, ratios against BSP, and the summary over seeds.

:func:`analyse_run` reads one run folder (``summary.json``, the step records); :func:`add_ratios` puts
every run against BSP's run of the same seed and cell (and against BSP on the cell's homogeneous twin,
the heterogeneity tax); :func:`aggregate` gives the median and spread over seeds. A run on the emulated
cluster carries the cluster's record (``cluster.json``: D, rates, bytes and utilisation per link) and its
dilation D; its analytic solo speeds are the devices' divided by D. Free of TensorFlow.
"""
import json
import os
import statistics

from hetsync.bench import efficiency, launch, progress

__all__ = ["METRICS", "E_FLAG", "AGG_FIELDS", "analyse_run", "protocol_label", "add_ratios", "aggregate"]

#: per-run fields copied into results.json, the table and the ratios.
METRICS = ("time_to_target_s", "samples_to_target", "final_test_accuracy", "steps_per_s", "samples_per_s",
           "samples_per_s_steady", "host_ms_median", "efficiency", "efficiency_analytic", "step_ms",
           "overrun_fraction")
#: an emulated run whose E (measured or analytic) exceeds this is flagged: E <= 1 on a real cluster.
E_FLAG = 1.05


def analyse_run(run_dir, solo):
    """Figures of one finished run (see the module docstring of :mod:`hetsync.bench`).

    Time to target counts from the end of rank 0's first (compiling) step, the same offset for
    every protocol; the raw figure from ``summary.json`` is kept as ``time_to_target_raw_s``.

    Args:
        run_dir: str, the run's output folder. solo: dict from :func:`efficiency.measure_solo`
            (``{"error": ...}`` if it failed: E is then None).

    Returns:
        dict of the run's figures (``time_to_target_s`` may be None: target not reached).

    Raises:
        FileNotFoundError / ValueError: missing or unusable outputs.
    """
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    rates = efficiency.run_rates(run_dir)
    records = efficiency.read_jsonl(os.path.join(run_dir, "rank0.jsonl"))
    first = records[0]["wall_s"]
    dilation = float(s.get("dilation") or 1.0)  # a dilated run's devices are D times slower in wall time
    analytic = efficiency.analytic_solo(s["scenario"], s["world_size"], s["batch_size"]) \
        if s.get("scenario") and s.get("batch_size") else None
    # the workers' devices only: a parameter-server protocol's last ranks serve and train nothing
    analytic = [v / dilation for v in analytic[:int(s.get("workers") or len(analytic))]] if analytic else analytic
    e_analytic = efficiency.efficiency(rates["samples_per_s"], analytic) if analytic else None
    e_measured = (efficiency.efficiency(rates["samples_per_s"], solo["samples_per_s"])
                  if "samples_per_s" in solo else None)
    emulated = bool(s.get("emulated_steps"))
    target = s.get("target_accuracy")
    curve = [dict(p, wall_s=max(0.0, p["wall_s"] - first)) for p in s.get("accuracy_curve") or []]
    figures = progress.run_progress(run_dir)
    cluster_file = os.path.join(run_dir, launch.CLUSTER_RECORD)  # a run on the emulated cluster
    cluster = None
    if os.path.exists(cluster_file):
        with open(cluster_file) as f:
            cluster = json.load(f)
    return {
        "dilation": dilation, "cluster": cluster,
        "samples_to_target": figures["samples_to_target"],
        "samples_per_s_steady": figures["samples_per_s_steady"],
        "host_ms_median": figures["host_ms_median"],
        "time_to_target_s": progress.time_after_first_step(s.get("time_to_target_s"), records),
        "time_to_target_raw_s": s.get("time_to_target_s"),
        "final_test_accuracy": s.get("final_test_accuracy"),
        "steps_per_s": rates["steps_per_s"],
        "samples_per_s": rates["samples_per_s"],
        "per_rank_samples_per_s": [p["samples_per_s"] for p in rates["per_rank"]],
        "workers": s.get("workers", s.get("world_size")),  # parameter-server ranks train nothing
        "rates_concurrent": rates["concurrent"], "rates_window_s": rates["window"],
        "efficiency": e_measured,
        "efficiency_analytic": e_analytic,
        "bsp_expected_efficiency": solo.get("bsp_expected_e"),
        "bsp_expected_efficiency_analytic": (efficiency.bsp_expected_efficiency_emulated(
            s["scenario"], s["world_size"], s["batch_size"], steps=4000) if analytic else None),
        "step_ms": 1e3 / rates["steps_per_s"],
        "emulated": emulated,
        "overrun_steps": s.get("overrun_steps", 0), "emulated_steps": s.get("emulated_steps", 0),
        "overrun_fraction": s.get("overrun_fraction", 0.0) if emulated else None,
        "emulation_valid": s.get("emulation_valid"),
        # on the emulated cluster the devices' speeds are known exactly: flag against them (measured solo
        # speeds carry the sampling noise of a short run's random draws)
        "e_flagged": bool(emulated and (e_analytic if e_analytic is not None else e_measured or 0.0) > E_FLAG),
        "steps": s.get("steps"), "wall_s": s.get("wall_s"), "weights_in_sync": s.get("weights_in_sync"),
        "target_accuracy": target, "accuracy_curve": curve, "stats": s.get("stats", {}),
        "protocol_label": protocol_label(s.get("protocol"), s.get("protocol_config") or {}),
    }


def protocol_label(name, config):
    """The protocol's name as the tables show it: task allocation with its mode (``taskalloc (static)``,
    whose default is an equal static allocation, is not the self-adaptive one); others unchanged."""
    if name == "taskalloc" and config.get("mode"):
        return f"taskalloc ({config['mode']})"
    return name


def add_ratios(runs):
    """Add ratios against BSP of the same seed and cell to every ok run, in place.

    ``speedup_time_to_target`` = BSP's time to target / the run's (> 1: faster than BSP; None if
    either missed the target); ``statistical_efficiency`` = BSP's samples to target / the run's (< 1:
    the run needed more samples than BSP); ``heterogeneity_tax`` = the run's time to target / BSP's on
    the cell's homogeneous twin (:func:`twin_cell`; only when the twin ran); ``samples_per_s_ratio``, ``steps_per_s_ratio``, ``efficiency_ratio`` =
    the run's / BSP's; ``step_ms_ratio`` = the run's time per step / BSP's; ``accuracy_delta`` =
    run's final accuracy - BSP's (points of [0, 1]).
    """
    bsp = {(r["seed"], r["cell"]): r for r in runs if r["protocol"] == "bsp" and r["status"] == "ok"}
    twins = {(r["seed"], r["twin_of"]): r for r in runs if r.get("twin_of") and r["status"] == "ok"}
    for r in runs:
        base = bsp.get((r["seed"], r["cell"]))
        if r["status"] != "ok" or base is None:
            continue
        t, tb = r["time_to_target_s"], base["time_to_target_s"]
        r["speedup_time_to_target"] = tb / t if t and tb else None
        s, sb = r.get("samples_to_target"), base.get("samples_to_target")
        r["statistical_efficiency"] = sb / s if s and sb else None
        twin = twins.get((r["seed"], r["cell"]))
        if twin is not None:
            tt = twin["time_to_target_s"]
            r["heterogeneity_tax"] = t / tt if t and tt else None
        for k in ("samples_per_s", "steps_per_s", "efficiency", "step_ms"):
            r[f"{k}_ratio"] = r[k] / base[k] if r.get(k) and base.get(k) else None
        r["accuracy_delta"] = r["final_test_accuracy"] - base["final_test_accuracy"]


def _stats(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "std": statistics.pstdev(vals), "n": len(vals)}


AGG_FIELDS = METRICS + ("bsp_expected_efficiency", "bsp_expected_efficiency_analytic", "speedup_time_to_target",
                        "samples_per_s_ratio", "steps_per_s_ratio", "efficiency_ratio", "step_ms_ratio",
                        "accuracy_delta", "statistical_efficiency", "heterogeneity_tax", "comm_fraction", "dilation",
                        "efficiency_model", "efficiency_model_gap")


def aggregate(runs):
    """Median and spread over seeds for every (cell, protocol).

    Returns:
        list of dicts ``{"cell", "dataset", "scenario", "protocol", "runs", "failed", "reached_target",
        FIELD: {"median", "min", "max", "std", "n"} or None}`` in the order cells and protocols first
        appear.
    """
    groups = {}
    for r in runs:
        groups.setdefault((r["cell"], r["protocol"]), []).append(r)
    out = []
    for (cell, proto), rs in groups.items():
        ok = [r for r in rs if r["status"] == "ok"]
        row = {"cell": cell, "dataset": rs[0]["dataset"], "scenario": rs[0]["scenario"], "protocol": proto,
               "label": next((r["protocol_label"] for r in rs if r.get("protocol_label")), proto),
               "runs": len(rs), "failed": len(rs) - len(ok),
               "reached_target": sum(1 for r in ok if r["time_to_target_s"] is not None),
               "not_concurrent": sum(1 for r in ok if r.get("rates_concurrent") is False),
               "np": rs[0].get("np"), "emulated": any(r.get("emulated") for r in ok),
               "overrun_invalid": sum(1 for r in ok if r.get("emulation_valid") is False),
               "e_flagged": sum(1 for r in ok if r.get("e_flagged"))}
        for k in AGG_FIELDS:
            row[k] = _stats([r.get(k) for r in ok])
        out.append(row)
    return out
