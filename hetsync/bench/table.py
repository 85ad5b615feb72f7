"""The Markdown tables of a benchmark: one row per (data set, scenario, protocol), medians over seeds."""
from tabulate import tabulate

__all__ = ["markdown_table", "micro_table", "HEADERS"]

HEADERS = ["ranks", "data/scenario", "protocol", "time to target s", "speed-up vs BSP", "samples to target",
           "statistical efficiency", "heterogeneity tax", "final acc", "acc - BSP", "step ms / BSP's", "samples/s",
           "host ms", "E", "E analytic", "E model", "E (BSP expected)", "overrun steps", "reached"]


def _cell(stat, spec, suffix=""):
    """``median`` or ``median (min-max)`` when there are several seeds; "-" when missing."""
    if not stat:
        return "-"
    med = format(stat["median"], spec) + suffix
    if stat["n"] > 1 and stat["max"] != stat["min"]:
        return f"{med} ({format(stat['min'], spec)}-{format(stat['max'], spec)})"
    return med


def markdown_table(results, emulated=None):
    """Return the GitHub-Markdown table (str) of ``results["aggregate"]``.

    Every figure is the median over seeds with the min-max spread in brackets; ratios are against
    BSP from the same seed and scenario; "reached" counts runs that reached the target accuracy.
    Samples to target, statistical efficiency (BSP's samples to target over the row's), the
    heterogeneity tax (time to target over BSP's on the homogeneous twin, where it ran) and host ms
    (median milliseconds per step outside the device time) are defined in :mod:`hetsync.bench.progress`.
    "E analytic" is the run's samples/s over the devices' analytic solo speeds; "E model" the E that the alpha-beta
    model of the cell's links predicts (cluster cells: :mod:`hetsync.bench.alphabeta`; "-" elsewhere).

    Args:
        results: dict from :func:`hetsync.bench.matrix.run_matrix`.
        emulated: None (every row), True (only cells on the emulated device) or False (only
            real-CPU cells).

    Returns:
        str, or "" if no row is selected.
    """
    rows = []
    selected = [a for a in results["aggregate"] if emulated is None or bool(a.get("emulated")) == emulated]
    cells = list(dict.fromkeys(a["cell"] for a in selected))  # cells in run order, BSP first within each
    selected.sort(key=lambda a: (cells.index(a["cell"]), a["protocol"] != "bsp", a["protocol"]))
    if not selected:
        return ""
    for a in selected:
        reached = f"{a['reached_target']}/{a['runs']}" + (f" ({a['failed']} failed)" if a["failed"] else "")
        cell = a["cell"].split(":", 1)[1] if a["cell"].startswith("np") else a["cell"]
        ranks = str(a.get("np") or results.get("preset", {}).get("np", "-")) + ("" if a.get("emulated") else " (real CPU)")
        overrun = "-" if not a.get("emulated") else (
            _cell(_percent(a.get("overrun_fraction")), ".1f", "%") + (" !" if a.get("overrun_invalid") else ""))
        bsp_e = a.get("bsp_expected_efficiency_analytic") if a.get("emulated") else None
        rows.append([ranks, cell, a.get("label", a["protocol"]), _cell(a["time_to_target_s"], ".2f"),
                     _cell(a["speedup_time_to_target"], ".2f", "x"), _cell(a.get("samples_to_target"), ".0f"),
                     _cell(a.get("statistical_efficiency"), ".2f"), _cell(a.get("heterogeneity_tax"), ".2f"),
                     _cell(a["final_test_accuracy"], ".3f"),
                     _cell(a["accuracy_delta"], "+.3f"), _cell(a.get("step_ms_ratio"), ".2f", "x"),
                     _cell(a["samples_per_s"], ".0f"), _cell(a.get("host_ms_median"), ".1f"),
                     _cell(a["efficiency"], ".2f") + ("*" if a.get("not_concurrent") else "")
                     + (" !" if a.get("e_flagged") else ""),
                     _cell(a.get("efficiency_analytic"), ".2f"), _cell(a.get("efficiency_model"), ".2f"),
                     _cell(bsp_e or a["bsp_expected_efficiency"], ".2f"), overrun, reached])
    text = tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True)
    notes = []
    if any(a.get("not_concurrent") for a in selected):
        notes.append("\\* in some seeds the ranks never trained at the same time (e.g. one finished before "
                     "another left its warm-up); their speeds count idle time over the whole span, a lower bound.")
    if any(a.get("e_flagged") for a in selected):
        notes.append("E ! : an emulated run with E above 1.05, which no real cluster can reach; its figures are "
                     "suspect.")
    if any(a.get("overrun_invalid") for a in selected):
        notes.append("overrun ! : more than 1% of a run's steps computed longer than their emulated device "
                     "time, so the emulation does not hold for that run.")
    return text + "".join("\n\n" + n for n in notes)


def _percent(stat):
    """A fraction statistic as percentages (same keys)."""
    if not stat:
        return stat
    return {k: (v * 100 if k in ("median", "min", "max", "std") else v) for k, v in stat.items()}


def micro_table(micro):
    """Return the GitHub-Markdown table (str) of op microbenchmarks (``micro["ops"]`` of
    :func:`hetsync.bench.micro.run_all`), then the RNA initiator simulation's table if it ran."""
    rows = []
    for m in micro["ops"]:
        if m.get("skipped"):
            rows.append([m["name"], "skipped", "-", "-", m["skipped"]])
        else:
            rows.append([m["name"], f"{m['op_us']:.1f} us", f"{m['reference_us']:.1f} us", f"{m['ratio']:.3g}x",
                         m.get("note", "")])
    text = tabulate(rows, headers=["benchmark", "op (median)", "reference (median)", "op / reference", "note"],
                    tablefmt="github", disable_numparse=True)
    sim = micro.get("sim") or {}
    if sim.get("skipped"):
        text += f"\n\nRNA initiator simulation: skipped ({sim['skipped']})."
    elif sim.get("rows"):
        text += "\n\n" + sim.get("title", "RNA initiator simulation") + "\n\n" + tabulate(
            sim["rows"], headers=sim["headers"], tablefmt="github", disable_numparse=True)
    return text
