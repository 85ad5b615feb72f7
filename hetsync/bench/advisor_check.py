"""The advisor against measured time to target: does its first choice reach the target first?

``python -m hetsync.bench.advisor_check --out runs/advisor-check [--np 4] [--dilation D] [--scenarios A,B]
[--protocols a,b] [--seeds 1 2 3] [--epochs 4] [--eval-every 4] [--lr 0.2] [--time-cap-min M] [--update-docs]``

For each validation scenario (:data:`hetsync.bench.validate.SCENARIOS`) it trains the job with every protocol of
the validation (:data:`hetsync.bench.validate.PROTOCOLS`, with the same protocol arguments) for a fixed number of
epochs under each seed, on the emulated cluster of this machine, and reads each run's ``time_to_target_s`` (the
first evaluation of rank 0's model at or above the target accuracy; evaluated every ``--eval-every`` steps and
refined near the target, :class:`hetsync.callbacks.TestAccuracy`) and ``samples_to_target``. Per scenario and
protocol the figure is the median over the seeds; a run that did not reach the target counts as later than
every run that did. The *measured best* is the protocol with the smallest median.

The advisor's *first choice* is what ``python -m hetsync.advise --predict --scenario SPEC --np N --host-ms H
--protocols ...`` recommends (:func:`hetsync.advise.predict.predict`, its 5% tie band included), among the same
protocols, ``--samples-per-epoch`` the training set's size and ``--epochs-to-target`` E. H, BSP's host work per
step outside the device time (:func:`hetsync.bench.validate.calibrate_host_ms`), and E, BSP's samples to target
over the training set's size, come from a separate BSP probe run (the check's epochs and evaluation on
``device:40`` under another seed): the prediction never sees the runs it is checked against. The statistical
efficiencies come from the calibrated scenario nearest to the judged one by the predicted throughputs, its own
calibration left out (:mod:`hetsync.advise.kinds`: judged as on a cluster the advisor was not calibrated on). The
check
(:func:`verdict`) passes a scenario when the
choice's median time to target is within :data:`WITHIN` (10%) of the best's, and fails it outright when the
choice is BSP and another protocol reached the target :data:`BSP_RULE` (1.5) times sooner.

Runs keep their folders; a rerun with the same ``--out`` skips the runs whose ``summary.json`` exists
(resumable); ``--resume-doc JSON`` also takes the runs, and the BSP probe, that an earlier check document records
(:func:`recorded_runs`), so a check outlives its run folders; ``--time-cap-min`` stops starting new runs after
that many minutes. ``advisor_check.json`` holds
every run and verdict, and the medians as benchmark result rows (:func:`benchmark_rows`: ``python -m
hetsync.sim.target`` rebuilds the advisor's statistical efficiencies from such a document); ``--update-docs``
writes ``docs/simulator/advisor_check.json`` and the generated table of ``docs/simulator.md``. With
``--calibration`` the run is the advisor's calibration on other seeds (``--seeds 4 5 6``): ``--update-docs`` then
writes ``docs/simulator/advisor_calibration.json``, from which ``python -m hetsync.sim.target`` rebuilds the
statistical efficiencies, and its own table. With ``--fresh`` the seeds are ones never read while the advisor
was built (neither the calibration's nor the check's: ``--seeds 7 8 9``; a seed that a calibration or check
document under ``--docs-dir`` records is refused, :func:`read_seeds`): ``--update-docs`` writes
``docs/simulator/advisor_check_fresh.json`` and its own table beside the check's. A world size other than 4 (the
default) has its own documents (``advisor_check_np8.json``, ``advisor_calibration_np8.json``,
``advisor_check_fresh_np8.json``) and tables.

``--dilation D`` runs the probe and every run at time dilation D (``HETSYNC_DILATION``: device times, delays
and timeouts D times longer), for world sizes whose host work overruns the emulated device time on this machine
(8 ranks on 2 cores: D = 3, as the validation). Host work is not dilated, so the advisor is given the probe's
host time divided by D, as the validation gives the simulator.
"""
import argparse
import glob
import json
import math
import os
import statistics
import sys
import time

from tabulate import tabulate

from hetsync.bench import launch
from hetsync.bench import validate as _validate
from hetsync.world import parse_dilation

__all__ = ["WITHIN", "BSP_RULE", "BEGIN", "END", "CAL_BEGIN", "CAL_END", "median_time", "verdict", "advisor_choice",
           "recorded_runs", "read_seeds",
           "table", "benchmark_rows",
           "main"]

#: the first choice passes when its median time to target is at most (1 + WITHIN) times the best's.
WITHIN = 0.10
#: the choice must never be BSP where another protocol's median time to target is this many times shorter.
BSP_RULE = 1.5
#: the generated table's markers in the documentation page.
BEGIN, END = "<!-- BEGIN generated: advisor check -->", "<!-- END generated: advisor check -->"
#: the markers of the calibration runs' table (``--calibration``).
CAL_BEGIN, CAL_END = "<!-- BEGIN generated: advisor calibration -->", "<!-- END generated: advisor calibration -->"


def median_time(times):
    """Median time to target over seeds, a run that missed the target counting as later than any that reached it.

    Args:
        times: non-empty list of float seconds or None (not reached).

    Returns:
        float seconds, or ``math.inf`` when the median run did not reach the target.

    Raises:
        ValueError: ``times`` is empty.
    """
    if not times:
        raise ValueError("median_time needs at least one run")
    return float(statistics.median([math.inf if t is None else float(t) for t in times]))


def verdict(medians, choice, within=WITHIN, bsp_rule=BSP_RULE):
    """Judge the advisor's choice against the measured medians of one scenario.

    Args:
        medians: dict protocol -> float median time to target in seconds (``math.inf``: not reached).
        choice: str, the advisor's first choice (a key of ``medians``).
        within: float >= 0, the allowed excess over the best (0.10: 10%). bsp_rule: float > 1.

    Returns:
        dict: ``best`` (str), ``best_s``, ``choice_s`` (floats, seconds), ``ratio`` (choice over best, float,
        ``math.inf`` when the choice did not reach the target), ``bsp_rule_broken`` (bool: the choice is BSP and a
        protocol's median is at most BSP's / ``bsp_rule``), ``ok`` (bool: ratio <= 1 + within and the BSP rule
        holds), ``reached`` (bool: some protocol reached the target in its median run).

    Raises:
        ValueError: ``choice`` has no measurement, or ``medians`` is empty.
    """
    if not medians:
        raise ValueError("no measured protocol")
    if choice not in medians:
        raise ValueError(f"the advisor's choice {choice!r} was not measured; measured: {', '.join(sorted(medians))}")
    best = min(medians, key=lambda p: (medians[p], p != choice))
    best_s, choice_s = medians[best], medians[choice]
    reached = math.isfinite(best_s)
    ratio = choice_s / best_s if reached and math.isfinite(choice_s) else (1.0 if not reached else math.inf)
    broken = choice == "bsp" and any(p != "bsp" and math.isfinite(medians[p]) and medians[p] * bsp_rule <= choice_s
                                     for p in medians)
    return {"best": best, "best_s": best_s, "choice_s": choice_s, "ratio": ratio, "bsp_rule_broken": broken,
            "ok": bool(reached and ratio <= 1.0 + within and not broken), "reached": reached}


def advisor_choice(spec, n, host_ms, protocols, samples_per_epoch=None, epochs_to_target=None, exclude=()):
    """The advisor's ranking for a scenario, as ``python -m hetsync.advise --predict`` makes it.

    Args:
        spec: str slowdown spec. n: int ranks. host_ms: float milliseconds of BSP's host work per step.
        protocols: sequence of protocol names to rank (BSP is always among them).
        samples_per_epoch: int or None, the training set's samples. epochs_to_target: float or None, BSP's
            epochs to the target (``--samples-per-epoch`` and ``--epochs-to-target``).
        exclude: iterable of calibrated scenario names the statistical efficiencies may not come from
            (:mod:`hetsync.advise.kinds`; the check leaves the judged scenario's own calibration out).

    Returns:
        list of :func:`hetsync.advise.predict.predict` rows, the first choice first.

    Raises:
        ValueError: a bad scenario or protocol (names it).
    """
    from hetsync.advise import predict as _predict

    inputs = _predict.inputs_from_args(spec, n, host_ms=host_ms, samples_per_epoch=samples_per_epoch,
                                       epochs_to_target=epochs_to_target)
    return _predict.predict(inputs, tuple(protocols), exclude_kinds=tuple(exclude))


def _finite(obj):
    """``obj`` with every infinite float replaced by None (JSON has no infinity)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _fmt_s(t):
    return "not reached" if not math.isfinite(t) else f"{t:.1f}"


def table(scenarios):
    """The check's table (Markdown, str) and its summary line (str).

    Args:
        scenarios: list of dicts, one per scenario: ``scenario``, ``protocols`` (list of names in column order),
            ``medians`` (protocol -> seconds), ``samples`` (protocol -> median samples to target or None),
            ``choice``, ``predicted`` (the choice's predicted time-to-target speed-up over BSP), ``verdict``
            (:func:`verdict`), ``overrun_max`` (float), ``overrun_runs`` (int runs with 1% or more overrun steps),
            ``seeds`` (int runs per protocol), ``seed_list`` (optional list of int: the seeds judged; a scenario
            with fewer seeds than the others is named under the tables).

    Returns:
        (str, str).
    """
    protos = []
    for s in scenarios:
        protos += [p for p in s["protocols"] if p not in protos]
    body = []
    for s in scenarios:
        v = s["verdict"]
        cells = []
        for p in protos:
            t = s["medians"].get(p)
            if t is None:
                cells.append("")
                continue
            mark = ("*" if p == s["choice"] else "") + ("<" if p == v["best"] else "")
            cells.append(_fmt_s(t) + mark)
        body.append([s["scenario"], *cells, f"{s['choice']} ({s['predicted']:.2f}x)",
                     "" if not math.isfinite(v["ratio"]) else f"{v['ratio']:.2f}",
                     ("yes" if v["ok"] else "no") + (" (BSP rule)" if v["bsp_rule_broken"] else ""),
                     f"{s['overrun_max'] * 100:.1f}%" + (" (!)" if s["overrun_max"] >= 0.01 else ""),
                     f"{s.get('overrun_runs', 0)} of {s['seeds'] * len(s['protocols'])}"])
    text = tabulate(body, headers=["scenario", *protos, "advisor's choice (predicted vs BSP)", "choice / best",
                                   "within 10%", "worst overruns", "runs >= 1% overruns"], tablefmt="github",
                    disable_numparse=True)
    kbody = []
    for s in scenarios:
        k = s.get("samples", {})
        kbody.append([s["scenario"], *["" if k.get(p) is None else ("not reached" if not math.isfinite(k[p]) else
                                                                     f"{k[p] / 1e3:.1f}k") for p in protos]])
    text += ("\n\nMedian samples to target (all ranks' samples up to the first evaluation at or above the target):\n\n"
             + tabulate(kbody, headers=["scenario", *protos], tablefmt="github", disable_numparse=True))
    most = max((s["seeds"] for s in scenarios), default=0)
    fewer = [f"{s['scenario']} (seeds {', '.join(map(str, s['seed_list']))})" for s in scenarios
             if s["seeds"] < most and s.get("seed_list")]
    if fewer:
        text += ("\n\nJudged over fewer seeds than the others (a sitting stopped before their runs were all there): "
                 + ", ".join(fewer) + ".")
    ok = sum(1 for s in scenarios if s["verdict"]["ok"])
    broken = sum(1 for s in scenarios if s["verdict"]["bsp_rule_broken"])
    summary = (f"the advisor's first choice was within {WITHIN * 100:.0f}% of the measured best median time to target "
               f"in {ok} of {len(scenarios)} scenarios" + (f" ({ok / len(scenarios) * 100:.0f}%)" if scenarios else "")
               + f"; BSP chosen where a protocol was {BSP_RULE:g}x faster: {broken}")
    return text, summary


def benchmark_rows(scenarios, n, dataset):
    """The scenarios' medians as benchmark result rows, one per scenario and protocol, so that
    :func:`hetsync.sim.target.estimate_from_results` can rebuild the statistical efficiencies from a check run
    (on seeds other than those the check reports).

    Args:
        scenarios: list of per-scenario dicts (:func:`table`'s input, with ``spec``, ``medians``, ``samples`` and
            ``samples_per_s``: protocol -> median samples/s). n: int ranks. dataset: str, ``"mnist"`` or ``"digits"``.

    Returns:
        list of dicts: ``cell`` (``npN:DATASET/SPEC[check]``: the tag keeps the cell apart from a benchmark cell
        of the same scenario, whose runs are other runs), ``protocol``, ``samples_to_target``, ``time_to_target_s``
        (medians; None where the median run missed the target), ``samples_per_s`` (median).
    """
    rows = []
    for s in scenarios:
        for p in s["protocols"]:
            t, k = s["medians"][p], s["samples"].get(p)
            rows.append({"cell": f"np{n}:{dataset}/{s['spec']}[check]", "protocol": p,
                         "samples_to_target": k if k is not None and math.isfinite(k) else None,
                         "time_to_target_s": t if math.isfinite(t) else None,
                         "samples_per_s": s.get("samples_per_s", {}).get(p)})
    return rows


def doc_names(n, fresh=False):
    """The documents of a check of ``n`` ranks (int): ``(check JSON, calibration JSON, (BEGIN, END) of the check's
    table, (BEGIN, END) of the calibration's)``; 4 ranks, the default, keeps the plain names. ``fresh`` (bool): the
    check on seeds never read while the advisor was built (``--fresh``), whose document and table are apart from
    the check's: ``advisor_check_fresh[_npN].json``."""
    begin, end = (BEGIN, END) if not fresh else (BEGIN.replace(" -->", " fresh -->"), END.replace(" -->", " fresh -->"))
    check = "advisor_check_fresh" if fresh else "advisor_check"
    if n == 4:
        return f"{check}.json", "advisor_calibration.json", (begin, end), (CAL_BEGIN, CAL_END)
    tag = f" np{n} -->"
    return (f"{check}_np{n}.json", f"advisor_calibration_np{n}.json",
            (begin.replace(" -->", tag), end.replace(" -->", tag)),
            (CAL_BEGIN.replace(" -->", tag), CAL_END.replace(" -->", tag)))


def read_seeds(docs_dir):
    """The seeds read while the advisor was built: those of every calibration document (its statistical
    efficiencies) and every check document other than a fresh check's (its rule was chosen reading them) under
    ``docs_dir/simulator`` (``docs_dir``: str, the documentation folder). Returns ``{seed (int): [document
    names]}``; empty when there are none. Raises ValueError when a document there cannot be read."""
    read = {}
    for path in sorted(glob.glob(os.path.join(docs_dir, "simulator", "advisor_*.json"))):
        name = os.path.basename(path)
        if not name.startswith(("advisor_calibration", "advisor_check")) or name.startswith("advisor_check_fresh"):
            continue
        try:
            with open(path) as f:
                seeds = json.load(f).get("seeds") or []
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the seeds of {path}: {exc}") from exc
        for seed in seeds:
            read.setdefault(int(seed), []).append(name)
    return read


def _np_dir(n, dilation):
    return f"np{n}" if dilation == 1.0 else f"np{n}-d{dilation:g}"


def _probe(out, n, seed, digits, epochs, samples_per_epoch, dilation=1.0, **flags):
    """BSP on ``device:40`` under ``seed`` (at time dilation ``dilation``): its host time per step in wall
    milliseconds (the advisor's ``--host-ms`` is this over D) and its epochs to the target
    (``--epochs-to-target``; None when it missed the target)."""
    pdir = os.path.join(out, "probes", _np_dir(n, dilation), "bsp-target")
    summ = _validate.run_one(pdir, n, "device:40", "bsp", seed, epochs, digits, dilation=dilation, **flags)
    over = _validate.probe_overheads(pdir)
    if over is None:
        raise RuntimeError(f"the BSP probe in {pdir} left no step records")
    k = summ.get("samples_to_target")
    return (_validate.calibrate_host_ms("bsp", n, over, dilation=dilation), over,
            (k / samples_per_epoch if k else None))


def recorded_runs(path, args, dilation, dataset):
    """The runs an earlier check document holds, to resume a check whose run folders are gone.

    Args:
        path: str, an ``advisor_check*.json`` written by this command.
        args: the parsed arguments of this invocation (``np``, ``epochs``, ``target``, ``lr``, ``eval_every``).
        dilation: float D of this invocation.
        dataset: str, ``"mnist"`` or ``"digits"``.

    Returns:
        ``(runs, probe)``: dict ``(scenario, protocol, seed) -> run record`` (the fields :func:`_scenario_result`
        reads from a ``summary.json``) and the document's probe ``{"host_ms": ..., "epochs_to_target": ...}``, so
        that the advisor is given the same inputs for every run of the check, with the document's ``"command"``
        (str or None: the commands that measured it, which the resumed document extends).

    Raises:
        ValueError: the document was measured with other settings (world size, dilation, epochs, target, learning
            rate, data set), naming the setting and both values.
        OSError: the file cannot be read.
    """
    with open(path) as f:
        doc = json.load(f)
    recorded = dict(doc, dilation=doc.get("dilation") or 1.0)  # documents from before dilation ran undilated
    for key, want in (("np", args.np), ("dilation", dilation), ("epochs", args.epochs), ("target", args.target),
                      ("lr", args.lr), ("dataset", dataset)):
        if recorded.get(key) != want:
            raise ValueError(f"{path} was measured with {key} = {recorded.get(key)!r}, this check runs {want!r}")
    runs = {(r["scenario"], r["protocol"], r["seed"]): dict(r) for r in doc.get("runs", [])}
    return runs, {"host_ms": doc["host_ms"], "epochs_to_target": doc.get("epochs_to_target"),
                  "command": doc.get("command")}


def _scenario_result(out, n, sname, protocols, seeds, host_ms, samples_per_epoch=None, epochs_to_target=None,
                     dilation=1.0, recorded=None):
    # a scenario is judged over its complete seeds (every protocol has that seed's run): a sitting stopped by the
    # time cap keeps the seeds it finished in the document instead of dropping the scenario (and its cells)
    spec = _validate.scenario_spec(sname, n)
    runs, found, overrun, over_runs = [], {}, 0.0, 0
    for proto in protocols:
        for seed in seeds:
            path = os.path.join(out, "runs", _np_dir(n, dilation), sname, proto, f"seed{seed}", "summary.json")
            if os.path.exists(path):
                with open(path) as f:
                    summ = json.load(f)
            elif recorded and (sname, proto, seed) in recorded:
                summ = recorded[(sname, proto, seed)]
            else:
                continue
            found[(proto, seed)] = summ
            runs.append({"protocol": proto, "seed": seed, "time_to_target_s": summ.get("time_to_target_s"),
                         "samples_to_target": summ.get("samples_to_target"),
                         "fit_wall_s": summ.get("fit_wall_s"), "samples_per_s": summ.get("samples_per_s"),
                         "final_test_accuracy": summ.get("final_test_accuracy"),
                         "time_to_target_resolution_s": summ.get("time_to_target_resolution_s"),
                         "overrun_fraction": summ.get("overrun_fraction")})
    complete = [seed for seed in seeds if all((proto, seed) in found for proto in protocols)]
    if not complete:
        return None, runs
    medians, samples, rates = {}, {}, {}
    for proto in protocols:
        summs = [found[(proto, seed)] for seed in complete]
        for summ in summs:
            overrun = max(overrun, summ.get("overrun_fraction") or 0.0)
            over_runs += (summ.get("overrun_fraction") or 0.0) >= 0.01
        medians[proto] = median_time([x.get("time_to_target_s") for x in summs])
        samples[proto] = median_time([x.get("samples_to_target") for x in summs])
        speeds = [x.get("samples_per_s") for x in summs if x.get("samples_per_s")]
        rates[proto] = statistics.median(speeds) if speeds else None
    rows = advisor_choice(spec, n, host_ms, protocols, samples_per_epoch, epochs_to_target, exclude=(sname,))
    choice = rows[0]["protocol"]
    return {"scenario": sname, "spec": spec, "protocols": list(protocols), "medians": medians, "samples": samples,
            "samples_per_s": rates, "choice": choice, "predicted": rows[0]["time_to_target_vs_bsp"],
            "ranking": [{k: r[k] for k in ("protocol", "time_to_target_vs_bsp", "samples_per_s_vs_bsp",
                                           "statistical_efficiency", "se_source")} for r in rows],
            "verdict": verdict(medians, choice), "overrun_max": overrun, "overrun_runs": over_runs,
            "seeds": len(complete), "seed_list": complete}, runs


def main(argv=None):
    """``python -m hetsync.bench.advisor_check``: run (or resume) the check and print its table.

    Args:
        argv: list of str (default ``sys.argv[1:]``); see ``--help``.

    Returns:
        int exit status: 0, or 1 when a run failed (the others are kept).

    Raises:
        SystemExit: bad arguments (argparse names the value).
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/advisor-check", help="output folder (reused: finished runs are skipped)")
    p.add_argument("--np", type=int, default=4, help="ranks of every run")
    p.add_argument("--dilation", default="1", metavar="D",
                   help="run the probe and every run at time dilation D >= 1 (e.g. 3 for 8 ranks on 2 cores)")
    p.add_argument("--scenarios", default=",".join(_validate.SCENARIOS),
                   help="comma-separated: " + ", ".join(_validate.SCENARIOS))
    p.add_argument("--protocols", default=",".join(_validate.PROTOCOLS),
                   help="comma-separated, BSP among them: " + ", ".join(_validate.PROTOCOLS))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds of every scenario and protocol")
    p.add_argument("--epochs", type=int, default=4, help="epochs of every run (the same samples for every protocol)")
    p.add_argument("--eval-every", type=int, default=4, help="evaluate rank 0's model every N of its steps")
    p.add_argument("--target", type=float, default=0.9, help="target test accuracy, in (0, 1]")
    p.add_argument("--lr", type=float, default=0.2, help="SGD learning rate of every run (that of the main job and "
                   "the benchmarks, whose runs gave the advisor's statistical efficiencies)")
    p.add_argument("--time-cap-min", type=float, default=None, help="start no new run after this many minutes")
    p.add_argument("--digits", action="store_true", help="the digits set even when MNIST is there")
    p.add_argument("--resume-doc", metavar="JSON", default=None,
                   help="resume from the runs (and BSP probe) an earlier check document records, e.g. "
                   "docs/simulator/advisor_check_np8.json, when their run folders are gone")
    p.add_argument("--update-docs", action="store_true", help="write docs/simulator/advisor_check.json and the table "
                   "of docs/simulator.md")
    p.add_argument("--docs-dir", default="docs", help="the documentation folder (--update-docs)")
    p.add_argument("--fresh", action="store_true", help="these seeds were never read while the advisor was built: "
                   "--update-docs writes docs/simulator/advisor_check_fresh.json (advisor_check_fresh_npN.json) and "
                   "its own table, beside the check's")
    p.add_argument("--calibration", action="store_true", help="these seeds calibrate the advisor (its statistical "
                   "efficiencies are rebuilt from their samples to target): --update-docs writes "
                   "docs/simulator/advisor_calibration.json and the calibration table instead of the check's")
    args = p.parse_args(argv)
    scenarios, protocols = _validate.parse_selection(p, args.scenarios, args.protocols, verb="checked")
    if "bsp" not in protocols:
        p.error(f"--protocols must include bsp (the BSP rule needs it), got {args.protocols!r}")
    if args.np < 2:
        p.error(f"--np must be at least 2 ranks, got {args.np}")
    if args.epochs < 1 or args.eval_every < 1:
        p.error(f"--epochs and --eval-every must be >= 1, got {args.epochs} and {args.eval_every}")
    if not args.lr > 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    if not 0 < args.target <= 1:
        p.error(f"--target must be in (0, 1], got {args.target}")
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds lists a seed twice: {args.seeds}")
    if args.fresh and args.calibration:
        p.error("--fresh and --calibration exclude each other: calibration seeds are read to build the advisor")
    if args.fresh:
        try:
            read = read_seeds(args.docs_dir)
        except ValueError as exc:
            p.error(f"--fresh: {exc}")
        clash = sorted(set(args.seeds) & set(read))
        if clash:
            named = ", ".join(sorted({name for seed in clash for name in read[seed]}))
            p.error(f"--fresh: seeds {clash} were read while the advisor was built ({named}); choose seeds other "
                    "than " + ", ".join(map(str, sorted(read))))
    try:
        dil = parse_dilation(args.dilation, "--dilation")
    except ValueError as exc:
        p.error(str(exc))

    t0 = time.monotonic()
    failed = 0
    mnist = launch.mnist_dir() is not None and not args.digits
    per_epoch = _validate.TRAIN_SAMPLES["mnist" if mnist else "digits"]
    recorded, earlier = {}, None
    if args.resume_doc:
        try:
            recorded, probe = recorded_runs(args.resume_doc, args, dil, "mnist" if mnist else "digits")
        except (ValueError, OSError, KeyError) as exc:
            p.error(f"--resume-doc {args.resume_doc}: {exc}")
        host_ms, to_target, earlier = probe["host_ms"], probe["epochs_to_target"], probe["command"]
        print(f"resumed {len(recorded)} runs and the BSP probe (advisor --host-ms {host_ms:.1f}) from "
              f"{args.resume_doc}", flush=True)
    else:
        host_ms, over, to_target = _probe(args.out, args.np, max(args.seeds) + 100, args.digits, args.epochs,
                                          per_epoch, dilation=dil, eval_every=args.eval_every,
                                          target_accuracy=args.target, lr=args.lr)
        host_ms /= dil  # the advisor's host time: host work is not dilated (the validation's rule)
        print(f"probe: BSP {over['cycle_ms']:.1f} ms per step beyond the device time (D = {dil:g}); advisor "
              f"--host-ms {host_ms:.1f}, --samples-per-epoch {per_epoch}, --epochs-to-target "
              f"{'none (the probe missed the target)' if to_target is None else f'{to_target:.2f}'}", flush=True)
    results, all_runs = [], []
    for sname in scenarios:
        spec = _validate.scenario_spec(sname, args.np)
        for seed in args.seeds:
            for proto in protocols:
                rdir = os.path.join(args.out, "runs", _np_dir(args.np, dil), sname, proto, f"seed{seed}")
                done = os.path.exists(os.path.join(rdir, "summary.json"))
                if not done and (sname, proto, seed) in recorded:
                    continue
                if not done and args.time_cap_min is not None and time.monotonic() - t0 > args.time_cap_min * 60:
                    continue
                try:
                    summ = _validate.run_one(rdir, args.np, spec, proto, seed, args.epochs, args.digits,
                                             dilation=dil, eval_every=args.eval_every, target_accuracy=args.target,
                                             lr=args.lr)
                except (RuntimeError, OSError) as exc:
                    print(str(exc), file=sys.stderr)
                    failed += 1
                    continue
                if not done:
                    t = summ.get("time_to_target_s")
                    print(f"{sname:15s} seed {seed} {proto:10s} time to target "
                          f"{'not reached' if t is None else f'{t:.1f} s'}, {summ['samples_per_s']:.0f} samples/s, "
                          f"overruns {summ.get('overrun_fraction', 0) * 100:.1f}%", flush=True)
        res, runs = _scenario_result(args.out, args.np, sname, protocols, args.seeds, host_ms, per_epoch, to_target,
                                     dilation=dil, recorded=recorded)
        all_runs += [{"scenario": sname, **r} for r in runs]
        if res is None:
            print(f"{sname}: no seed has every protocol's run (time cap or failure); left out of the verdict",
                  file=sys.stderr)
            continue
        if res["seeds"] < len(args.seeds):
            print(f"{sname}: judged over seeds {', '.join(map(str, res['seed_list']))} only (the others' runs are "
                  "not all there: time cap or failure)", file=sys.stderr)
        results.append(res)
        print(f"{sname}: advisor chose {res['choice']}, measured best {res['verdict']['best']} "
              f"(choice / best {res['verdict']['ratio']:.2f})", flush=True)
    text, summary = table(results)
    from hetsync.bench import docpages

    given = " ".join(sys.argv[1:] if argv is None else argv)
    command = docpages.without_out("python -m hetsync.bench.advisor_check " + given)
    doc = {"command": command if not earlier else f"{earlier}; then {command}",
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "np": args.np, "dilation": dil,
           "seeds": args.seeds, "fresh": bool(args.fresh),
           "epochs": args.epochs, "target": args.target, "lr": args.lr, "dataset": "mnist" if mnist else "digits",
           "host_ms": host_ms, "samples_per_epoch": per_epoch, "epochs_to_target": to_target, "scenarios": results,
           "runs": all_runs, "summary": summary,
           "rows": benchmark_rows(results, args.np, "mnist" if mnist else "digits")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "advisor_check.json"), "w") as f:
        json.dump(_finite(doc), f, indent=1)
    print(text)
    print(summary)
    if args.update_docs:
        body = (f"Measured {doc['date_utc']} UTC with `{doc['command']}` ({args.np} ranks"
                + ("" if dil == 1.0 else f" at time dilation {dil:g}") + f", {doc['dataset']}, "
                f"{args.epochs} epochs, learning rate {args.lr:g}, target {args.target:g}, seeds "
                f"{', '.join(map(str, args.seeds))}; advisor "
                f"`--host-ms {host_ms:.1f} --samples-per-epoch {per_epoch}"
                + ("" if to_target is None else f" --epochs-to-target {to_target:.2f}")
                + f"` from the BSP probe): {summary}.\n\n"
                "Median time to target in seconds over the seeds; `*` the advisor's choice, `<` the measured best.\n\n"
                + text)
        check_json, cal_json, (begin, end), (cal_begin, cal_end) = doc_names(args.np, fresh=args.fresh)
        ranks = "" if args.np == 4 else f", {args.np} ranks"
        if args.calibration:
            _validate.write_docs(args.docs_dir, cal_json, _finite(doc), cal_begin, cal_end,
                                 "The calibration runs (their samples to target give the advisor's statistical "
                                 "efficiencies; the check reports other seeds). " + body,
                                 "### The runs that calibrate the advisor" + ranks)
        elif args.fresh:
            _validate.write_docs(args.docs_dir, check_json, _finite(doc), begin, end,
                                 "On seeds never read while the advisor's rule was chosen. " + body,
                                 "### The advisor on fresh seeds" + ranks)
        else:
            _validate.write_docs(args.docs_dir, check_json, _finite(doc), begin, end, body,
                                 "### Does the advisor choose well?" + ranks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
