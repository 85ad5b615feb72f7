"""The statistical-efficiency study: samples to target of every asynchronous protocol against BSP.

``python -m hetsync.bench.study [--np 4 8] [--models mlp cnn] [--settings rna,hop-backup,...] [--seeds 1,2,3]
[--lrs 0.2] [--select-seeds 4,5,6] [--out runs/study] [--time-cap-min M] [--update-docs]``

A protocol that computes faster than BSP but needs more samples to reach the target has not won: the
**statistical efficiency** SE = S_BSP / S (S: samples to target, every rank's processed samples up to the first
evaluation at or above the target, :mod:`hetsync.bench.progress`) says how much of its throughput gain survives
(time to target follows samples/s x SE). The study runs, for each world size n (worker ranks; the parameter
servers of ASP, SHAT, SHAT-root, SSP and hierarchical RNA are one more rank), model, learning rate and seed,
BSP and every chosen setting (:data:`SETTINGS`: a protocol and its arguments) on the same emulated scenario
(``device:40+random:6`` by default: random stragglers) and data (MNIST when the data directory is there, else
the digits), and reports per setting the median over seeds of SE, the time-to-target ratio against BSP, the
steady samples/s ratio, and the final accuracy against BSP's. Tuning is fair when BSP runs the same grid of
learning rates (``--lrs``): every cell has its own BSP run. ``--select-seeds`` names the seeds that choose each
setting's rate, BSP's included (:func:`select`); the tables then report only the other seeds, each setting at its
chosen rate against BSP at BSP's, so no figure is tuned on the seeds it reports.

Every run keeps its folder ``OUT/np{n}-{model}/lr{lr}/{setting}/seed{seed}``; a rerun with the same ``--out``
skips the runs whose ``summary.json`` exists (resumable), ``--resume-doc JSON`` also takes the runs an earlier study
document records (:func:`recorded_rows`; the document's command is kept, chained with every command logged in
``OUT/commands.json``, :func:`command_chain`) and
``--time-cap-min`` stops starting new runs after that
many minutes. Epochs are given for 4 ranks and scaled by n / 4 (:func:`epochs_for`). ``--dilation NP=D`` runs world
size NP at time dilation D (default ``8=3``: 8 ranks on a 2-core machine overrun their device time undilated). Rows
whose run overran 1% or more of its steps are marked: they are not evidence. ``--twins`` also runs BSP on the
scenario's homogeneous twin (:data:`TWIN`), and each table entry gains the heterogeneity tax: its time to target over
the twin's at BSP's rate and the same seed. ``--update-docs`` writes
``docs/bench/study.json`` and the table into the benchmarks page.
"""
import argparse
import json
import os
import statistics
import sys
import time

from hetsync.bench import docpages, launch, progress
from hetsync.world import DILATION_ENV

__all__ = ["SETTINGS", "DIAGNOSTIC", "SERVER_PROTOCOLS", "run_dir", "run_one", "rows_from", "recorded_rows", "table",
           "select", "epochs_for", "command_chain", "scenario_of", "TWIN", "main", "BEGIN", "END"]

#: study settings: name -> (protocol, its ``KEY=VALUE`` arguments, what it tests).
SETTINGS = {
    "bsp": ("bsp", (), "the reference"),
    "rna": ("rna", (), "RNA as in the paper (Algorithm 2: rank-weighted rounds, local steps between them)"),
    "rna-samples": ("rna", ("update_rule=samples",), "RNA, every gradient once on every replica at lr / n (its "
                    "default: no periodic parameter average)"),
    "rna-samples-avg10": ("rna", ("update_rule=samples", "average_every=10"),
                          "RNA with the samples rule and a parameter average every 10 rounds (its former default)"),
    "rna-samples-shard": ("rna", ("update_rule=samples", "data_plan=shard", "average_every=10"),
                          "RNA with the samples rule and the average every 10 rounds, on fixed shards instead of "
                          "the sample pool"),
    "rna-wait": ("rna", ("update_rule=samples", "wait_for_round=true"),
                 "RNA with the samples rule, each step waiting for the round that takes its gradients "
                 "(``wait_for_round``: applied before the next one is computed)"),
    "rna-samples-stalelr": ("rna", ("update_rule=samples", "stale_lr=inverse"),
                            "RNA with the samples rule and the staleness-dependent rate gamma / max(c, 1) (Zhang et "
                            "al., IJCAI 2016)"),
    "rnah": ("rnah", (), "hierarchical RNA"),
    "hop": ("hop", (), "Hop, standard"),
    "hop-backup": ("hop", ("backup_workers=1",), "Hop with one backup worker"),
    "hop-staleness": ("hop", ("staleness=2",), "Hop with staleness 2"),
    "hop-staleness1": ("hop", ("staleness=1",), "Hop with staleness 1 (the bound's effect on the samples)"),
    "hop-staleness4": ("hop", ("staleness=4",), "Hop with staleness 4 (the bound's effect on the samples)"),
    "hop-skip": ("hop", ("backup_workers=1", "skip=2"), "Hop, a backup worker and skipping"),
    "asp": ("asp", (), "ASP (one parameter server)"),
    "shat": ("shat", (), "SHAT"),
    "shatroot": ("shatroot", (), "SHAT-root"),
    "ssp": ("ssp", (), "SSP"),
    "localsgd": ("localsgd", (), "local SGD"),
    "fedavg": ("fedavg", (), "FedAvg"),
    "selsync": ("selsync", (), "SelSync"),
    "bsp-twin": ("bsp", (), "BSP on the scenario's homogeneous twin, every rank at the mean step (the heterogeneity "
                 "tax's reference; ``--twins``)"),
}
#: the setting that runs BSP on the homogeneous twin (:func:`hetsync.bench.progress.homogeneous_twin`).
TWIN = "bsp-twin"
#: settings that isolate one cause, and the twin (left out of the default ``--settings``: name them to run them).
DIAGNOSTIC = ("rna-samples-avg10", "rna-samples-shard", "rna-samples-stalelr", "hop-staleness1", "hop-staleness4",
              TWIN)
#: protocols whose launch has one more rank, the parameter server (their default ``servers=1``).
SERVER_PROTOCOLS = ("asp", "shat", "shatroot", "ensemble", "ssp", "rnah")
#: samples per step of every run (the twin's device time is the mean step of this batch).
BATCH = 32
#: evaluation every that many steps of rank 0 (dense near the target: the grid must not set the figure).
EVAL_EVERY = 8
#: float, accuracy (a fraction: 0.005 = 0.5 points) a setting's chosen rate may end below BSP's on the selection
#: seeds (median final test accuracy), as the final-accuracy target allows.
ACCURACY_SLACK = 0.005
BEGIN = "<!-- BEGIN generated: statistical efficiency study -->"
END = "<!-- END generated: statistical efficiency study -->"


def run_dir(out, n, model, lr, setting, seed):
    """The folder (str) of one run: ``OUT/np{n}-{model}/lr{lr:g}/{setting}/seed{seed}``."""
    return os.path.join(out, f"np{n}-{model}", f"lr{lr:g}", setting, f"seed{seed}")


def run_one(folder, n, model, lr, setting, seed, spec, epochs, target, digits=False, dilation=1.0, timeout_s=1800.0):
    """Launch one run unless its ``summary.json`` exists; return the summary (dict).

    Args:
        folder: str. n: int worker ranks (a server protocol launches n + 1). model: ``"mlp"`` or ``"cnn"``.
        lr: float SGD learning rate. setting: a :data:`SETTINGS` name. seed: int. spec: str slowdown spec.
        epochs: int. target: float accuracy in (0, 1). digits: bool (the digits set even when MNIST is there).
        dilation: float D >= 1 (``HETSYNC_DILATION``; the timeout is multiplied by it). timeout_s: float seconds.

    Raises:
        RuntimeError: the launch failed (the tail of its output in the message).
        subprocess.TimeoutExpired: the launch ran past the timeout.
    """
    path = os.path.join(folder, "summary.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    protocol, args, _ = SETTINGS[setting]
    os.makedirs(folder, exist_ok=True)
    argv = launch.job_argv(protocol, folder, args, extra=launch.dataset_args(digits=digits), epochs=epochs,
                           slowdown=spec, seed=seed, batch_size=BATCH, lr=lr, model=model, target_accuracy=target,
                           eval_every=EVAL_EVERY)
    env = {DILATION_ENV: f"{dilation:g}"} if dilation != 1.0 else {}
    ranks = n + 1 if protocol in SERVER_PROTOCOLS else n
    return launch.run_for_summary(launch.horovodrun(ranks, argv), timeout_s * dilation + 60.0, folder,
                                  f"study run {setting} np{n} {model} lr {lr:g} seed {seed}", env=env)


def _row(n, model, lr, setting, seed, s, dilation):
    return {"np": n, "model": model, "lr": lr, "setting": setting, "protocol": SETTINGS[setting][0],
            "protocol_args": list(SETTINGS[setting][1]), "seed": seed, "dilation": dilation,
            "samples_to_target": s.get("samples_to_target"), "time_to_target_s": s.get("time_to_target_s"),
            "final_accuracy": s.get("final_test_accuracy"), "samples_per_s": s.get("samples_per_s"),
            "samples_per_s_steady": s.get("samples_per_s_steady"), "overrun": s.get("overrun_fraction") or 0.0,
            "host_ms_median": s.get("host_ms_median")}


def rows_from(out):
    """Every finished run under ``out`` as a row (list of dicts; the folder layout of :func:`run_dir`)."""
    rows = []
    for cell in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if not cell.startswith("np") or "-" not in cell:
            continue
        n, model = int(cell[2:].split("-")[0]), cell.split("-", 1)[1]
        for lr_dir in sorted(os.listdir(os.path.join(out, cell))):
            for setting in sorted(os.listdir(os.path.join(out, cell, lr_dir))):
                if setting not in SETTINGS:
                    continue
                base = os.path.join(out, cell, lr_dir, setting)
                for sd in sorted(os.listdir(base)):
                    path = os.path.join(base, sd, "summary.json")
                    if sd.startswith("seed") and os.path.exists(path):
                        with open(path) as f:
                            s = json.load(f)
                        rows.append(_row(n, model, float(lr_dir[2:]), setting, int(sd[4:]), s,
                                         float(s.get("dilation") or 1.0)))
    return rows


def _key(row):
    return (int(row["np"]), row["model"], float(row["lr"]), row["setting"], int(row["seed"]))


def recorded_rows(path, scenario, target):
    """The runs an earlier study document records, for ``--resume-doc``.

    Args:
        path: str, a study document (``study.json``: ``scenario``, ``target``, ``command``, ``rows`` as
            :func:`rows_from` makes them). scenario: str, this study's scenario. target: float, its target accuracy.

    Returns:
        dict with ``rows`` (list of row dicts) and ``command`` (str, the command that measured them).

    Raises:
        OSError: the file cannot be read. ValueError: not a study document, or one of another scenario or target
            (its runs would not be comparable).
    """
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"--resume-doc {path}: not a study document (no 'rows' list)")
    if doc.get("scenario") != scenario or doc.get("target") != target:
        raise ValueError(f"--resume-doc {path}: measured under scenario {doc.get('scenario')!r} to target "
                         f"{doc.get('target')!r}; this study runs {scenario!r} to {target!r}")
    rows = [r for r in doc["rows"] if r.get("setting") in SETTINGS]
    return {"rows": rows, "command": doc.get("command")}


COMMANDS_FILE = "commands.json"


def command_chain(earlier, out, this):
    """The commands that measured a study's runs, in order, as one string joined by ``"; then "``.

    Every invocation logs its command line in ``OUT/commands.json`` before its first run, so the runs of an
    invocation without ``--update-docs`` are attributed when a later one writes the document.

    Args:
        earlier: str or None, the chain of the ``--resume-doc`` document. out: str, the run folder (created).
        this: str, this invocation's command line.

    Returns:
        str: ``earlier``'s commands, then each logged command not already in them (the log's order), ``this`` last
        among the logged ones.

    Raises:
        OSError: the log cannot be written.
    """
    path = os.path.join(out, COMMANDS_FILE)
    try:
        with open(path) as f:
            logged = [c for c in json.load(f) if isinstance(c, str)]
    except (OSError, ValueError, TypeError):
        logged = []
    if this not in logged:
        logged.append(this)
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(logged, f, indent=1)
    chain = earlier.split("; then ") if earlier else []
    chain += [c for c in logged if c not in chain]
    return "; then ".join(chain)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _stats(pairs, twins=None):
    """Medians over (run, BSP run) pairs of the same seed: the fields :func:`table` documents; with ``twins``
    (seed -> the twin's row at BSP's rate) also the heterogeneity taxes."""
    def ratio(a, b):
        return a / b if a and b else None
    twins = twins or {}
    return {
        "tax": _median(ratio(r["time_to_target_s"], twins[r["seed"]]["time_to_target_s"]) for r, _ in pairs
                       if r["seed"] in twins),
        "bsp_tax": _median(ratio(b["time_to_target_s"], twins[b["seed"]]["time_to_target_s"]) for _, b in pairs
                           if b["seed"] in twins),
        "seeds": len(pairs),
        "se": _median(ratio(b["samples_to_target"], r["samples_to_target"]) for r, b in pairs),
        "samples_ratio": _median(ratio(r["samples_to_target"], b["samples_to_target"]) for r, b in pairs),
        "time_ratio": _median(ratio(b["time_to_target_s"], r["time_to_target_s"]) for r, b in pairs),
        "steady_ratio": _median(ratio(r["samples_per_s_steady"], b["samples_per_s_steady"]) for r, b in pairs),
        "accuracy_delta": _median((r["final_accuracy"] - b["final_accuracy"]) * 100.0 for r, b in pairs
                                  if r["final_accuracy"] is not None and b["final_accuracy"] is not None),
        "reached": f"{sum(1 for r, _ in pairs if r['samples_to_target'])}/{len(pairs)}",
        "overrun_max": max(max(r["overrun"], b["overrun"]) for r, b in pairs),
    }


def _order(setting):
    return list(SETTINGS).index(setting)


def table(rows, exclude_seeds=()):
    """The study's summary: one dict per (world size, model, learning rate, setting other than BSP) with the
    medians over the seeds that have a BSP run of the same cell.

    Args:
        rows: :func:`rows_from`'s list. exclude_seeds: iterable of int, seeds left out (those that chose the
            learning rates, :func:`select`: reporting them would tune on the reported seeds).

    Returns:
        list of dicts: ``np``, ``model``, ``lr``, ``setting``, ``seeds`` (int), ``se`` (S_BSP / S; None when
        either missed the target), ``tax`` and ``bsp_tax`` (the heterogeneity tax of the setting and of BSP: time to
        target over that of BSP on the homogeneous twin at the same rate and seed, :data:`TWIN`; None without
        twin runs), ``time_ratio`` (BSP's time to target over the setting's: > 1 is sooner),
        ``steady_ratio`` (steady samples/s over BSP's), ``samples_ratio`` (S / S_BSP), ``accuracy_delta``
        (final accuracy minus BSP's, points), ``reached`` ("k/m" seeds that reached the target),
        ``overrun_max`` (float fraction; 0.01 or more: not evidence).
    """
    exclude = {int(s) for s in exclude_seeds}
    rows = [r for r in rows if int(r["seed"]) not in exclude]
    bsp = {(r["np"], r["model"], r["lr"], r["seed"]): r for r in rows if r["setting"] == "bsp"}
    groups = {}
    for r in rows:
        key = (r["np"], r["model"], r["lr"], r["seed"])
        if r["setting"] not in ("bsp", TWIN) and key in bsp:
            groups.setdefault((r["np"], r["model"], r["lr"], r["setting"]), []).append((r, bsp[key]))
    out = []
    for (n, model, lr, setting), pairs in sorted(groups.items(),
                                                 key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], _order(kv[0][3]))):
        out.append({"np": n, "model": model, "lr": lr, "setting": setting,
                    **_stats(pairs, _twins(rows, n, model, lr))})
    return out


def _twins(rows, n, model, lr):
    """seed -> the :data:`TWIN` row of world size ``n``, ``model`` and rate ``lr`` (dict)."""
    return {r["seed"]: r for r in rows if r["setting"] == TWIN and (r["np"], r["model"], r["lr"]) == (n, model, lr)}


def select(rows, select_seeds):
    """Fair tuning: each setting's learning rate, BSP's included, chosen on seeds that are not reported, then every
    setting at its rate against BSP at BSP's rate on the other seeds.

    For each (world size, model, setting) the learning rates with a run on every selection seed compete; the one
    with the smallest median time to target over those seeds wins (a run that missed the target counts as
    infinitely slow; a tie goes to the smaller median samples to target, then the smaller rate). A rate whose
    selection runs overran 1% or more of their steps does not compete (not evidence). BSP's rate is chosen
    first; a setting's rate then competes only if its median final accuracy over the selection seeds is at least
    BSP's at BSP's chosen rate minus :data:`ACCURACY_SLACK` (the study's two targets: time and final accuracy);
    when no rate of the setting meets that, every rate competes as before.

    Args:
        rows: :func:`rows_from`'s list. select_seeds: iterable of int, the seeds that choose.

    Returns:
        dict: ``select_seeds`` (sorted list of int), ``chosen`` (list of dicts ``np``, ``model``, ``setting``,
        ``lr``, ``time_to_target_s`` (the winning median, seconds; None when every rate missed)), and ``tuned``
        (list of :func:`table` entries, each with ``lr`` the setting's chosen rate and ``bsp_lr`` BSP's, over the
        seeds not in ``select_seeds`` that have both runs; the taxes against the twin at BSP's chosen rate).

    Raises:
        ValueError: ``select_seeds`` is empty.
    """
    chosen_seeds = sorted({int(s) for s in select_seeds})
    if not chosen_seeds:
        raise ValueError("select needs at least one selection seed")
    by_cell = {}
    for r in rows:
        if int(r["seed"]) in chosen_seeds:
            by_cell.setdefault((r["np"], r["model"], r["setting"], r["lr"]), {})[int(r["seed"])] = r
    scored = {}  # (np, model, setting) -> [(median time, median samples, lr, median final accuracy)]
    for (n, model, setting, lr), runs in by_cell.items():
        if set(runs) != set(chosen_seeds) or max(r["overrun"] for r in runs.values()) >= 0.01:
            continue
        times = [r["time_to_target_s"] if r["time_to_target_s"] else float("inf") for r in runs.values()]
        samples = [r["samples_to_target"] if r["samples_to_target"] else float("inf") for r in runs.values()]
        accuracy = statistics.median(r["final_accuracy"] or 0.0 for r in runs.values())
        scored.setdefault((n, model, setting), []).append((statistics.median(times), statistics.median(samples),
                                                           lr, accuracy))
    best = {}
    for key, scores in scored.items():
        bsp_scores = scored.get((key[0], key[1], "bsp"))
        floor = min(bsp_scores)[3] - ACCURACY_SLACK if bsp_scores and key[2] not in ("bsp", TWIN) else None
        meeting = [s for s in scores if floor is None or s[3] >= floor - 1e-12]
        best[key] = min(meeting or scores)[:3]
    chosen = [{"np": n, "model": model, "setting": setting, "lr": score[2],
               "time_to_target_s": None if score[0] == float("inf") else score[0]}
              for (n, model, setting), score in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                      _order(kv[0][2])))]
    report = {(int(r["np"]), r["model"], r["setting"], float(r["lr"]), int(r["seed"])): r for r in rows
              if int(r["seed"]) not in chosen_seeds}
    report_seeds = sorted({key[4] for key in report})
    tuned = []
    for c in chosen:
        bsp = best.get((c["np"], c["model"], "bsp"))
        if c["setting"] in ("bsp", TWIN) or bsp is None:
            continue
        mine, ref = (c["np"], c["model"], c["setting"], c["lr"]), (c["np"], c["model"], "bsp", bsp[2])
        pairs = [(report[mine + (seed,)], report[ref + (seed,)]) for seed in report_seeds
                 if mine + (seed,) in report and ref + (seed,) in report]
        if pairs:
            twins = {seed: r for (n, model, setting, lr, seed), r in report.items()
                     if (n, model, setting, lr) == (c["np"], c["model"], TWIN, bsp[2])}
            tuned.append({"np": c["np"], "model": c["model"], "lr": c["lr"], "bsp_lr": bsp[2],
                          "setting": c["setting"], **_stats(pairs, twins)})
    return {"select_seeds": chosen_seeds, "chosen": chosen, "tuned": tuned}


def scenario_of(setting, scenario, n):
    """The slowdown spec (str) a run of ``setting`` at ``n`` ranks uses: ``scenario``, or for :data:`TWIN` its
    homogeneous twin (:func:`hetsync.bench.progress.homogeneous_twin` at the study's :data:`BATCH`).

    Raises:
        ValueError: the twin of a scenario without ``device:MS`` (no expected speeds).
    """
    return progress.homogeneous_twin(scenario, n, BATCH) if setting == TWIN else scenario


def epochs_for(epochs, model, n):
    """Epochs (int >= 1) of a run of ``model`` at ``n`` ranks: ``epochs[model]`` (given for 4 ranks) x n / 4,
    rounded, so every world size runs about the same number of BSP steps."""
    return max(1, int(round(epochs[model] * n / 4.0)))


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _mark(t):
    return " !" if t["overrun_max"] >= 0.01 else ""


def _ratios(t):
    """A table row's cells from ``seeds`` to the taxes (str, ending with the row's closing bar)."""
    tax = "-" if t.get("tax") is None else f"{t['tax']:.2f} ({_fmt(t.get('bsp_tax'), '.2f')})"
    return (f"{t['seeds']} | {_fmt(t['se'], '.2f')} | {_fmt(t['time_ratio'], '.2f')}x | "
            f"{_fmt(t['steady_ratio'], '.2f')}x | {_fmt(t['accuracy_delta'], '+.1f')} pt | {t['reached']} | {tax} |")


def markdown(summary, meta, selection=None):
    """The generated docs block (str): how it was measured, then one table row per :func:`table` entry and, with a
    ``selection`` (:func:`select`'s dict), the tuned comparison: every setting at its chosen learning rate against
    BSP at its own."""
    seeds_note = ""
    if selection:
        seeds_note = f" on the seeds other than {', '.join(map(str, selection['select_seeds']))}"
    lines = [f"Measured {meta['date_utc']} with `{meta['command']}` ({meta['scenario']}, {meta['dataset']}, target "
             f"{meta['target']:g}; medians over seeds{seeds_note}; `!` marks a run with 1% or more overrun steps).", "",
             "| ranks | model | lr | setting | seeds | SE (S_BSP / S) | time to target vs BSP "
             "| steady samples/s vs BSP | final accuracy vs BSP | reached | heterogeneity tax (BSP's) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in summary:
        lines.append(f"| {t['np']} | {t['model']} | {t['lr']:g} | {t['setting']}{_mark(t)} | {_ratios(t)}")
    if selection:
        sel = ", ".join(map(str, selection["select_seeds"]))
        lines += ["", f"**Tuned fairly**: each setting's learning rate, BSP's included, chosen on seeds {sel} (the "
                  "smallest median time to target of the rates run there, among the rates whose median final accuracy "
                  f"there is at least BSP's minus {ACCURACY_SLACK * 100:g} points when any is); every setting at its "
                  "rate against BSP at BSP's, on the other seeds.", "",
                  "| ranks | model | setting | lr | BSP's lr | seeds | SE (S_BSP / S) | time to target vs BSP "
                  "| steady samples/s vs BSP | final accuracy vs BSP | reached | heterogeneity tax (BSP's) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for t in selection["tuned"]:
            lines.append(f"| {t['np']} | {t['model']} | {t['setting']}{_mark(t)} | {t['lr']:g} | {t['bsp_lr']:g} | "
                         f"{_ratios(t)}")
    return "\n".join(lines)


def _parse_list(text, kind, what, allowed=None):
    try:
        items = [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{what} {text!r}: give comma-separated values") from None
    if not items:
        raise ValueError(f"--{what} is empty")
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad:
        raise ValueError(f"--{what}: unknown {', '.join(map(str, bad))}; choose from {', '.join(map(str, allowed))}")
    return items


def parser():
    """The command line (``argparse.ArgumentParser``)."""
    p = argparse.ArgumentParser(prog="python -m hetsync.bench.study", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--np", type=int, nargs="+", default=[4, 8], help="worker ranks (2 or more)")
    p.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    p.add_argument("--settings", default=",".join(s for s in SETTINGS if s != "bsp" and s not in DIAGNOSTIC),
                   help=f"comma-separated settings (BSP always runs): {', '.join(SETTINGS)}")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    p.add_argument("--select-seeds", default=None, help="comma-separated seeds whose runs choose each setting's "
                   "learning rate (BSP's too); the tables report the other seeds")
    p.add_argument("--lrs", default="0.2", help="comma-separated SGD learning rates (BSP runs each too)")
    p.add_argument("--scenario", default="device:40+random:6", help="slowdown spec of every run")
    p.add_argument("--twins", action="store_true", help="also run BSP on the scenario's homogeneous twin (setting "
                   f"{TWIN}: every rank at the mean step) for the heterogeneity tax")
    p.add_argument("--epochs", default="mlp=3,cnn=2", help="epochs per model at 4 ranks, MODEL=E,...; n ranks run "
                   "E x n / 4 (rounded): the same number of BSP steps, whose batches are n / 4 times larger")
    p.add_argument("--target", type=float, default=0.9, help="target test accuracy in (0, 1)")
    p.add_argument("--digits", action="store_true", help="the digits set even when MNIST is there")
    p.add_argument("--dilation", action="append", default=["8=3"], metavar="NP=D",
                   help="time dilation D for world size NP, repeatable")
    p.add_argument("--out", default="runs/study", help="output folder (resumable)")
    p.add_argument("--time-cap-min", type=float, default=None,
                   help="start no new run after this many minutes (> 0; left out: no cap)")
    p.add_argument("--resume-doc", metavar="JSON", default=None,
                   help="an earlier study document (docs/bench/study.json): its runs count as done and join the "
                   "table, so a study outlives its run folders")
    p.add_argument("--update-docs", action="store_true", help="write docs/bench/study.json and the table")
    p.add_argument("--docs-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "docs"))
    return p


def main(argv=None):
    """``python -m hetsync.bench.study``: run (or resume) the study and print its table; return the exit status
    (0; 1 when a run failed). Bad arguments exit with status 2 and a message before anything runs."""
    from hetsync.bench.validate import parse_dilations

    p = parser()
    args = p.parse_args(argv)
    try:
        models = _parse_list(args.models, str, "models", ("mlp", "cnn"))
        settings = _parse_list(args.settings, str, "settings", tuple(SETTINGS))
        seeds = _parse_list(args.seeds, int, "seeds")
        select_seeds = _parse_list(args.select_seeds, int, "select-seeds") if args.select_seeds else []
        lrs = _parse_list(args.lrs, float, "lrs")
        epochs = dict(kv.split("=", 1) for kv in args.epochs.split(","))
        epochs = {m: int(e) for m, e in epochs.items()}
        dil = parse_dilations(args.dilation)
    except ValueError as exc:
        p.error(str(exc))
    if any(n < 2 for n in args.np):
        p.error(f"--np needs world sizes >= 2, got {args.np}")
    if args.time_cap_min is not None and not args.time_cap_min > 0:
        p.error(f"--time-cap-min must be > 0 minutes (a cap of {args.time_cap_min:g} would start no run); leave it "
                "out for no cap")
    if not 0 < args.target < 1 or any(lr <= 0 for lr in lrs):
        p.error(f"--target must be in (0, 1) and --lrs > 0, got {args.target} and {lrs}")
    if args.twins and TWIN not in settings:
        settings.append(TWIN)
    try:
        for n in args.np if TWIN in settings else ():
            scenario_of(TWIN, args.scenario, n)
    except ValueError as exc:
        p.error(f"--twins: {exc}")
    missing = [m for m in models if epochs.get(m, 0) < 1]
    if missing:
        p.error(f"--epochs gives no epochs >= 1 for {', '.join(missing)} ({args.epochs!r})")
    try:
        earlier = recorded_rows(args.resume_doc, args.scenario, args.target) if args.resume_doc else {"rows": []}
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    recorded = {_key(r) for r in earlier["rows"]}
    this = "python -m hetsync.bench.study " + " ".join(argv if argv is not None else sys.argv[1:])
    chain = command_chain(earlier.get("command"), args.out, this)  # logged before any run starts
    t0, failed = time.monotonic(), 0
    for n in args.np:
        for model in models:
            for lr in lrs:
                for seed in seeds:
                    for setting in ["bsp"] + [s for s in settings if s != "bsp"]:
                        folder = run_dir(args.out, n, model, lr, setting, seed)
                        done = os.path.exists(os.path.join(folder, "summary.json"))
                        if not done and (n, model, float(lr), setting, int(seed)) in recorded:
                            continue
                        if not done and args.time_cap_min is not None and \
                                time.monotonic() - t0 > args.time_cap_min * 60:
                            continue
                        try:
                            s = run_one(folder, n, model, lr, setting, seed, scenario_of(setting, args.scenario, n),
                                        epochs_for(epochs, model, n), args.target, args.digits, dil.get(n, 1.0))
                        except Exception as exc:  # noqa: BLE001 - one failed run is reported, the rest go on
                            print(str(exc), file=sys.stderr)
                            failed += 1
                            continue
                        print(f"np{n} {model} lr {lr:g} {setting:13s} seed {seed}: samples to target "
                              f"{s.get('samples_to_target')}, time {s.get('time_to_target_s')}, final accuracy "
                              f"{s.get('final_test_accuracy')}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    fresh = rows_from(args.out)
    measured_here = {_key(f) for f in fresh}  # a run folder supersedes the document's row of the same run
    rows = [r for r in earlier["rows"] if _key(r) not in measured_here] + fresh
    summary = table(rows, exclude_seeds=select_seeds)
    selection = select(rows, select_seeds) if select_seeds else None
    dataset = "digits" if args.digits or launch.dataset_args()[1] == "digits" else "MNIST"
    meta = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "scenario": args.scenario,
            "dataset": dataset, "target": args.target, "command": chain}
    body = markdown(summary, meta, selection)
    print(body)
    doc = {**meta, "rows": rows, "summary": summary}
    if selection:
        doc["selection"] = selection
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump(doc, f, indent=1)
    if args.update_docs:
        os.makedirs(os.path.join(args.docs_dir, "bench"), exist_ok=True)
        with open(os.path.join(args.docs_dir, "bench", "study.json"), "w") as f:
            json.dump(doc, f, indent=1)
        page = os.path.join(args.docs_dir, "benchmarks.md")
        with open(page) as f:
            text = f.read()
        with open(page, "w") as f:
            f.write(docpages.replace_block(text, BEGIN, END, body, "## The statistical-efficiency study"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
