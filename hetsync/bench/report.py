"""Side-by-side table of finished runs: ``python -m hetsync.bench.report RUN_DIR [RUN_DIR ...]``.

Each RUN_DIR is a folder holding a ``summary.json`` written by :class:`hetsync.callbacks.SyncMetrics`
(or a parent folder whose sub-folders hold one). Ratios are against the BSP run in the same list.
"""
import argparse
import glob
import json
import os
import sys

from tabulate import tabulate

from hetsync.bench import progress

__all__ = ["load_summaries", "time_to_target", "comparison_rows", "main"]


def load_summaries(paths):
    """Return the list of summary dicts found in ``paths`` (folders or summary.json files).

    Raises:
        FileNotFoundError: a path holds no summary.json (the message names it).
    """
    out = []
    for path in paths:
        if os.path.isfile(path):
            files = [path]
        else:
            files = [os.path.join(path, "summary.json")] if os.path.isfile(os.path.join(path, "summary.json")) else \
                sorted(glob.glob(os.path.join(path, "*", "summary.json")))
        if not files:
            raise FileNotFoundError(f"no summary.json in {path}")
        for f in files:
            with open(f) as fh:
                s = json.load(fh)
            s["_path"] = f
            out.append(s)
    return out


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _overruns(s):
    """``"overrun/emulated"`` steps of an emulated run (``"!"`` appended when over 1%), "-" otherwise."""
    if not s.get("emulated_steps"):
        return "-"
    return f"{s.get('overrun_steps', 0)}/{s['emulated_steps']}" + ("" if s.get("emulation_valid", True) else " !")


def time_to_target(summary):
    """A run's time to target from the end of rank 0's first (compiling) step (float seconds, or None).

    The summary's ``time_to_target_after_first_step_s`` when it has one; else (a summary written before that
    field) :func:`hetsync.bench.progress.run_time_after_first_step` of the folder beside it (``summary["_path"]``,
    :func:`load_summaries`); None when neither can say.
    """
    if summary.get("time_to_target_after_first_step_s") is not None:
        return summary["time_to_target_after_first_step_s"]
    return progress.run_time_after_first_step(os.path.dirname(summary.get("_path", "")),
                                              summary.get("time_to_target_s"))


def comparison_rows(summaries):
    """Return (headers, rows) comparing runs; speed-ups are BSP's time divided by the run's time.

    ``time to target``: seconds from the end of rank 0's first (compiling) step to the first evaluation at or
    above the target (:func:`time_to_target`).

    ``samples to target``: samples all ranks processed up to the first evaluation at or above the
    target (:mod:`hetsync.bench.progress`); ``statistical efficiency``: BSP's samples to target over
    the run's (below 1: the run needed more samples than BSP); ``steady samples/s``: after the first
    epoch, epoch boundaries included.

    ``steps``: the most steps any rank ran; ``syncs``: collective rounds rank 0 joined (BSP: one per
    step; RNA: its partial-allreduce rounds; SelSync and local SGD: their synchronizations)."""
    bsp = next((s for s in summaries if s.get("protocol") == "bsp"), None)
    headers = ["protocol", "scenario", "ranks", "steps", "syncs", "wall s", "time to target s", "speed-up vs BSP",
               "samples to target", "statistical efficiency", "final acc", "samples/s", "steady samples/s",
               "weights in sync", "overrun steps"]
    rows = []
    for s in summaries:
        ttt, bsp_ttt = time_to_target(s), time_to_target(bsp) if bsp is not None else None
        speedup = bsp_ttt / ttt if ttt and bsp_ttt else None
        stt = s.get("samples_to_target")
        stat_eff = bsp["samples_to_target"] / stt if bsp is not None and stt and bsp.get("samples_to_target") else None
        rows.append([s.get("protocol"), s.get("scenario"), s.get("world_size"), s.get("steps"),
                     (s.get("stats") or {}).get("syncs", "-"),
                     _fmt(s.get("wall_s"), ".1f"), _fmt(ttt, ".1f"), _fmt(speedup, ".2f") + ("x" if speedup else ""),
                     _fmt(stt, "d"), _fmt(stat_eff, ".2f"),
                     _fmt(s.get("final_test_accuracy"), ".4f"), _fmt(s.get("samples_per_s"), ".0f"),
                     _fmt(s.get("samples_per_s_steady"), ".0f"),
                     s.get("weights_in_sync"), _overruns(s)])
    return headers, rows


def main(argv=None):
    """Print the comparison table of the given run folders. Returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run folders (or their parent)")
    args = p.parse_args(argv)
    try:
        summaries = load_summaries(args.runs)
    except FileNotFoundError as exc:
        p.error(str(exc))
    headers, rows = comparison_rows(summaries)
    print(tabulate(rows, headers=headers, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
