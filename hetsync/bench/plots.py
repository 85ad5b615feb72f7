"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

* ``accuracy_vs_time.png`` (the main plot): test accuracy against wall-clock time, one panel per
  (data set, scenario), one colour per protocol; seed 0 thick with markers, other seeds thin.
  Time counts from the end of rank 0's first (compiling) step, as the table's time to target.
* ``timeline_<cell>.png``: per-rank step timelines for seed 0, one panel per protocol: each step is a
  bar split into computing (``compute_ms``), injected slowdown (``delay_ms``, the simulated slower
  device), waiting in synchronization (``sync_wait_ms``) and the rest of the step (``step_ms`` minus
  those: optimizer update, callbacks, framework).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hetsync.bench.efficiency import read_jsonl  # noqa: E402

__all__ = ["accuracy_plot", "timeline_plot", "make_all", "SEGMENTS"]

#: timeline segments: (record field or None for the remainder, label, colour).
SEGMENTS = (("compute_ms", "computing", "#2ca02c"), ("delay_ms", "injected slowdown", "#bcbd22"),
            ("sync_wait_ms", "waiting in sync", "#d62728"), (None, "rest of step", "#c7c7c7"))


def _colors(protocols):
    cmap = plt.get_cmap("tab10")
    return {p: cmap(i % 10) for i, p in enumerate(protocols)}


def accuracy_plot(results, path):
    """Write the accuracy-vs-wall-clock figure of every cell to ``path`` (PNG). Returns ``path``."""
    cells = list(dict.fromkeys(r["cell"] for r in results["runs"]))
    colors = _colors(list(dict.fromkeys(list(results["protocols"]) + [r["protocol"] for r in results["runs"]])))  # variants too
    ncols = 2 if len(cells) > 1 else 1
    nrows = (len(cells) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 3.6 * nrows), squeeze=False)
    for ax, cell in zip(axes.flat, cells):
        target = None
        seed0 = min(r["seed"] for r in results["runs"] if r["cell"] == cell)
        for r in results["runs"]:
            if r["cell"] != cell or r["status"] != "ok" or not r.get("accuracy_curve"):
                continue
            xs = [p["wall_s"] for p in r["accuracy_curve"]]
            ys = [p["accuracy"] for p in r["accuracy_curve"]]
            main = r["seed"] == seed0
            ax.plot(xs, ys, color=colors[r["protocol"]], lw=2.0 if main else 0.8, alpha=1.0 if main else 0.5,
                    marker="o" if main else None, ms=3, label=r["protocol"] if main else None)
            target = r.get("target_accuracy", target)
        if target is not None:
            ax.axhline(target, color="k", ls=":", lw=1)
        ax.set_title(cell, fontsize=11)
        ax.set_xlabel("wall-clock time after the first step (s)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in list(axes.flat)[len(cells):]:
        ax.set_visible(False)
    fig.suptitle("Test accuracy vs wall-clock (thick: first seed; thin: other seeds; "
                 "dotted: target)", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _steady_start(records):
    later = [r for r in records if r.get("epoch", 0) >= 1]
    return (later[0] if later else records[min(2, len(records) - 1)])["wall_s"]


def timeline_plot(results, cell, path, window_steps=40):
    """Write the per-rank step timelines of ``cell`` (seed 0, every protocol) to ``path`` (PNG).

    Each panel starts when the first rank ends its warm-up (first epoch) and lasts ``window_steps``
    of BSP's median rank-0 steps; ranks' clocks start at ``on_train_begin``, just after the initial
    broadcast, so they line up to a few milliseconds. Returns ``path``, or None if the cell has no run.
    """
    seeds = [r["seed"] for r in results["runs"] if r["cell"] == cell]
    if not seeds:
        return None
    seed0 = min(seeds)
    runs = [r for r in results["runs"] if r["cell"] == cell and r["seed"] == seed0 and r["status"] == "ok"]
    if not runs:
        return None
    recs = {r["protocol"]: [read_jsonl(os.path.join(r["out"], f"rank{k}.jsonl")) for k in range(r["np"])]
            for r in runs}
    ref = recs.get("bsp") or next(iter(recs.values()))
    steps = sorted(x["step_ms"] for x in ref[0] if x["wall_s"] > _steady_start(ref[0]))
    width_s = window_steps * (steps[len(steps) // 2] if steps else 50.0) / 1e3
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 1.0 + 0.55 * runs[0]["np"] * len(runs)), squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        ranks = recs[r["protocol"]]
        # the first rank to reach its steady state (a parameter-server rank writes no step records)
        t0 = min(_steady_start(x) for x in ranks if x)
        for k, records in enumerate(ranks):
            for x in records:
                end = x["wall_s"] - t0
                start = end - x["step_ms"] / 1e3
                if end < 0 or start > width_s:
                    continue
                left = start
                parts = [max(0.0, x.get(f, 0.0)) for f, _, _ in SEGMENTS[:-1]]
                parts.append(max(0.0, x["step_ms"] - sum(parts)))
                for ms, (_, _, color) in zip(parts, SEGMENTS):
                    ax.broken_barh([(left, ms / 1e3)], (k - 0.4, 0.8), facecolors=color, edgecolor="none")
                    left += ms / 1e3
                ax.plot([end, end], [k - 0.4, k + 0.4], color="k", lw=0.4)
        ax.set_xlim(0, width_s)
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([f"rank {k}" for k in range(len(ranks))])
        ax.invert_yaxis()
        e = "n/a" if r.get("efficiency") is None else f"{r['efficiency']:.2f}"
        ax.set_title(f"{r['protocol']}  (E = {e})", fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("wall-clock time in steady state (s); black ticks: step ends")
    handles = [matplotlib.patches.Patch(color=c, label=lab) for _, lab, c in SEGMENTS]
    fig.legend(handles=handles, loc="upper right", ncol=4, fontsize=9)
    fig.suptitle(f"Per-rank step timelines, {cell}, seed {seed0}", fontsize=11, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def make_all(results, out_dir):
    """Write every plot of ``results`` under ``out_dir`` and return the list of PNG paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [accuracy_plot(results, os.path.join(out_dir, "accuracy_vs_time.png"))]
    for cell in dict.fromkeys(r["cell"] for r in results["runs"]):
        slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in cell)
        p = timeline_plot(results, cell, os.path.join(out_dir, f"timeline_{slug}.png"))
        if p:
            paths.append(p)
    return paths
