"""The simulator against the emulation: predicted and measured samples/s, one resumable command.

``python -m hetsync.bench.validate --out runs/validate [--np 4 8] [--dilation NP=D ...]
[--cluster HOSTSxSLOTS/RATE[@D] ...] [--scenarios A,B] [--protocols a,b] [--fit-s S] [--time-cap-min M]
[--update-docs]``

For each rank count, scenario and protocol it launches the training job on the emulated cluster of this
machine (``device:MS`` scenarios, one host; MNIST from the data directory, else the digits set), reads the
run's ``summary.json`` ``samples_per_s`` (samples over the fit's wall time), and compares it with
:mod:`hetsync.sim`'s prediction for the same scenario, world size, model and batch size. The prediction's
inputs never come from the run being predicted: the step times are drawn from the scenario language, and
what happens outside the device time comes from a separate *probe run* of each protocol (2 epochs,
``device:40`` without slowdowns, another seed) at the same world size (:func:`probe_overheads`): the time
per step beyond the device time, from which the simulator is calibrated so that it reproduces the probe
(:func:`calibrate`: its ``host_ms``, and for Hop across hosts the fraction of the link rate its point-to-point
messages reach, with the host work set to the probe's time outside its waits), and two fixed costs added to the
simulated time of the fit, the first step (tracing) and each epoch boundary (:func:`with_fixed_costs`). Runs are long enough that the first step
(tracing, the compile) is under 5% of the fit: the table reports that share, and the emulation's overrun
fraction, per run; rows at or above 1% overruns are marked, as the benchmark marks them.

With ``--cluster 2x2/100mbit`` (repeatable) the same runs also go on the emulated multi-host cluster
(:mod:`hetsync.emulation.cluster`: hosts as network namespaces, each host's link shaped to RATE; no time
dilation), at hosts x slots ranks, with their own probes there; the prediction then uses the alpha-beta model
of those hosts and that link (:meth:`hetsync.sim.network.Network.from_spec`). Each row names its cluster
(``one host`` for the single-host runs).

*Time dilation.* Where the machine cannot keep up (8 ranks on 2 cores overrun their emulated device time),
``--dilation NP=D`` runs the one-host world size NP, and ``HOSTSxSLOTS/RATE@D`` the cluster, at time
dilation D (:func:`hetsync.world.dilation`): device times, added delays and timeouts D times longer, links
shaped to RATE / D. The probe runs at the same D. Host-side work is not dilated, so the simulator is given
the probe's host time in the emulated cluster's time (``host_ms`` / D) and its samples/s are divided by D
to compare with the run's wall-clock ``samples_per_s``; every row records its D.

Every run keeps its folder; a rerun with the same ``--out`` skips the runs whose ``summary.json`` exists
(resumable), and ``--time-cap-min`` stops starting new runs after that many minutes. ``validation.json``
holds every row; ``--update-docs`` writes ``docs/simulator/validation.json`` (beside the page; ``docs/results/``
holds only benchmark summaries) and the generated table of ``docs/simulator.md``. ``--repredict`` runs nothing:
it predicts the recorded rows again (:func:`repredict`, from the probe each row keeps), for a changed simulator.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

from tabulate import tabulate

from hetsync.bench import launch
from hetsync.bench.simfit import (PROTOCOL_ARGS, TRAIN_SAMPLES, _records, calibrate, calibrate_host_ms, predict,
                                  probe_overheads, repredict, with_fixed_costs)
from hetsync.world import DILATION_ENV, parse_dilation

__all__ = ["SCENARIOS", "PROTOCOLS", "PROTOCOL_ARGS", "scenario_spec", "parse_cluster", "cluster_label", "predict",
           "run_one",
           "main", "BEGIN", "END", "probe_overheads", "calibrate", "calibrate_host_ms", "with_fixed_costs",
           "TRAIN_SAMPLES", "parse_selection", "write_docs", "parse_dilations", "merge_rows", "recorded_with",
           "repredict"]

#: the validation scenarios, each a function of the world size n giving a slowdown spec, and which protocol
#: the scenario is expected to favour.
SCENARIOS = {
    "homogeneous": (lambda n: "device:40", "BSP: no heterogeneity"),
    "random": (lambda n: "device:40+random:6", "RNA: random stragglers"),
    "uniform": (lambda n: "device:40+uniform:0:50", "RNA: random extra delays (RNA section 8)"),
    "speeds": (lambda n: "device:40+speeds:" + ",".join(["1"] * (n - 1) + ["0.5"]), "task allocation: a speed mix"),
    "straggler": (lambda n: f"device:40+deterministic:{n - 1}:4", "Hop: one deterministic straggler"),
    "slownet": (lambda n: "device:40+netdelay:50", "local SGD or FedAvg: a slow network"),
    "mixed": (lambda n: "device:40+uniform:0:50@0-" + str(n // 2 - 1) + "+uniform:50:100@" + str(n // 2) + "-"
              + str(n - 1), "RNA: mixed heterogeneity (RNA section 8.1)"),
    "random-slownet": (lambda n: "device:40+random:6+netdelay:20", "random stragglers on a slow network"),
}
#: the protocols validated (no server ranks: every rank computes).
PROTOCOLS = ("bsp", "rna", "localsgd", "fedavg", "taskalloc", "hop")
#: the generated table's markers in the documentation page.
BEGIN, END = "<!-- BEGIN generated: simulator validation -->", "<!-- END generated: simulator validation -->"


def scenario_spec(name, n):
    """The slowdown spec (str) of validation scenario ``name`` at ``n`` ranks.

    Raises:
        ValueError: an unknown scenario (names the known ones).
    """
    if name not in SCENARIOS:
        raise ValueError(f"unknown validation scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name][0](n)


def parse_cluster(text):
    """A validation cluster ``HOSTSxSLOTS/RATE[@D]`` (``2x2/100mbit``, ``2x4/100mbit@3``) as a
    :class:`hetsync.emulation.cluster.spec.ClusterSpec` (time dilation D, default 1).

    Raises:
        ValueError: not of that form, or a value the cluster tool refuses (names it).
    """
    from hetsync.emulation.cluster.spec import ClusterSpec

    body, at, d = str(text).partition("@")
    hosts, sep, link = body.partition("/")
    h, x, s = hosts.partition("x")
    if not sep or not x or not h.isdigit() or not s.isdigit() or not link or (at and not d):
        raise ValueError(f"--cluster must look like HOSTSxSLOTS/RATE[@D] (e.g. 2x2/100mbit), got {text!r}")
    d = parse_dilation(d, f"--cluster {text}: D") if at else 1.0
    return ClusterSpec(hosts=int(h), slots=int(s), link=link, dilation=d)


def parse_dilations(items):
    """The ``--dilation NP=D`` values (list of str) as a dict {world size (int): D (float >= 1)}.

    Raises:
        ValueError: an item not of the form NP=D, NP not an integer >= 2, or D not a finite number >= 1 (names it).
    """
    out = {}
    for item in items:
        n, eq, d = str(item).partition("=")
        if not eq or not n.strip().isdigit() or int(n) < 2:
            raise ValueError(f"--dilation must look like NP=D with NP >= 2 ranks (e.g. 8=3), got {item!r}")
        out[int(n)] = parse_dilation(d, f"--dilation {item}: D")
    return out


def cluster_label(cluster):
    """The label of a validation cluster in folder names and rows (str): ``2x2-100mbit``, or ``one host``."""
    return "one host" if cluster is None else f"{cluster.hosts}x{cluster.slots}-{cluster.link}"


def _np_dir(n, cluster, dilation=1.0):
    where = f"np{n}" if cluster is None else f"np{n}-{cluster_label(cluster)}"
    return where if dilation == 1.0 else f"{where}-d{dilation:g}"


def _run_dir(out, n, scenario, protocol, seed, cluster=None, dilation=1.0):
    return os.path.join(out, "runs", _np_dir(n, cluster, dilation), scenario, protocol, f"seed{seed}")


def _data_args(digits):
    return launch.dataset_args(digits=digits)


def run_one(out_dir, n, spec, protocol, seed, epochs, digits=False, timeout_s=1800.0, cluster=None, dilation=1.0,
            **flags):
    """Launch one validation run unless its ``summary.json`` exists; return the summary (dict).

    Args:
        out_dir: str run folder. n: int ranks. spec: str slowdown spec. protocol: str. seed: int. epochs: int.
        digits: bool, use the digits set even when MNIST is there. timeout_s: float seconds.
        cluster: a :class:`hetsync.emulation.cluster.spec.ClusterSpec` (its hosts x slots is ``n``; its
            dilation is the run's) to run on the emulated multi-host cluster, or None (horovodrun on this host).
        dilation: float D >= 1, the time dilation of a run on this host (``HETSYNC_DILATION``; the cluster's
            own for a cluster run). ``timeout_s`` is multiplied by D.
        flags: more job flags (:func:`hetsync.bench.launch.job_argv`'s keywords, e.g. ``eval_every=5``,
            ``target_accuracy=0.9``).

    Raises:
        RuntimeError: the launch failed (its output's tail in the message).
        subprocess.TimeoutExpired: the launch ran past ``timeout_s``.
    """
    path = os.path.join(out_dir, "summary.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    argv = launch.job_argv(protocol, out_dir, PROTOCOL_ARGS.get(protocol, ()),
                           extra=_data_args(digits), epochs=epochs, slowdown=spec, seed=seed, batch_size=32,
                           **flags)
    env = {}
    if cluster is None:
        timeout_s *= dilation
        cmd = launch.horovodrun(n, argv)
        if dilation != 1.0:
            env[DILATION_ENV] = f"{dilation:g}"
    else:
        timeout_s *= cluster.dilation
        cmd = launch.on_cluster(cluster, argv, record=os.path.join(out_dir, launch.CLUSTER_RECORD),
                                timeout_s=timeout_s)
    return launch.run_for_summary(cmd, timeout_s + 60.0, out_dir, f"validation run {protocol} np{n} {spec!r} seed "
                                  f"{seed}", env=env)


def compile_fraction(run_dir, summary):
    """Share of the fit's wall time taken by the first step (tracing and compile): the largest over ranks of the
    first record's ``wall_s`` over the summary's ``wall_s`` (float), or None without records."""
    firsts = [recs[0]["wall_s"] for recs in _records(run_dir) if recs and "wall_s" in recs[0]]
    return max(firsts) / summary["wall_s"] if firsts and summary.get("wall_s") else None


def _overrun(summary):
    return summary.get("overrun_fraction")


def table(rows):
    """The validation table (Markdown, str) and the error summary line (str: per world size and cluster, the
    runs, the median and worst |error|, and the same over the runs under 1% overrun steps)."""
    body = []
    errs = []
    for r in rows:
        err = r.get("error")
        if err is not None:
            errs.append(abs(err))
        body.append([f"np{r['np']}", r.get("cluster", "one host"), f"{r.get('dilation', 1.0):g}", r["scenario"],
                     r["protocol"], f"{r['measured']:.0f}",
                     f"{r['predicted']:.0f}", "" if err is None else f"{err * 100:+.1f}%",
                     "" if r.get("compile_fraction") is None else f"{r['compile_fraction'] * 100:.1f}%",
                     "" if r.get("overrun") is None else f"{r['overrun'] * 100:.1f}%" + (" (!)" if r["overrun"] >= 0.01 else "")])
    text = tabulate(body, headers=["ranks", "hosts", "D", "scenario", "protocol", "measured samples/s", "predicted",
                                   "error", "first step", "overruns"], tablefmt="github")
    groups = {}
    for r in rows:
        if r.get("error") is not None:
            groups.setdefault((r["np"], r.get("cluster", "one host"), r.get("dilation", 1.0)), []).append(r)
    parts = []
    for (n, where, d), group in groups.items():
        e = [abs(r["error"]) for r in group]
        clean = [abs(r["error"]) for r in group if r.get("overrun") is not None and r["overrun"] < 0.01]
        dil = "" if d == 1.0 else f" at dilation {d:g}"
        part = (f"np{n} on {where}{dil}: {len(e)} runs, median |error| {statistics.median(e) * 100:.1f}%, worst "
                f"{max(e) * 100:.1f}%")
        part += (f" ({len(clean)} under 1% overruns: median {statistics.median(clean) * 100:.1f}%, worst "
                 f"{max(clean) * 100:.1f}%)" if clean else " (none under 1% overruns)")
        parts.append(part)
    summary = "; ".join(parts) if parts else "no runs"
    return text, summary


def merge_rows(old, new):
    """The validation rows after a run: ``new`` (list of dicts) plus each row of ``old`` that no new row replaces
    (same world size, cluster, scenario, protocol and seed; a new row replaces the old one whatever their
    dilations), in a stable order (world size, cluster, the order of :data:`SCENARIOS` and :data:`PROTOCOLS`).

    So a validation resumed on another machine, or one that re-measures some rows (at a dilation, say),
    updates the document without losing the rows it did not re-measure.
    """
    def key(r):
        return (r["np"], r.get("cluster", "one host"), r["scenario"], r["protocol"], r.get("seed"))

    fresh = {key(r) for r in new}
    rows = [r for r in old if key(r) not in fresh] + list(new)

    def order(r):
        where = r.get("cluster", "one host")
        return (where != "one host", where, r["np"], list(SCENARIOS).index(r["scenario"]) if r["scenario"] in
                SCENARIOS else len(SCENARIOS), PROTOCOLS.index(r["protocol"]) if r["protocol"] in PROTOCOLS else
                len(PROTOCOLS), r.get("seed") or 0)
    return sorted(rows, key=order)


def recorded_with(doc, path):
    """``doc`` (this run's validation document) merged into the recorded one at ``path`` (:func:`merge_rows`;
    its ``commands`` list extended, the summary recomputed); ``doc`` itself when nothing is recorded there.

    Raises:
        ValueError: the recorded file is not a validation document (names the path).
    """
    if not os.path.exists(path):
        return doc
    with open(path) as f:
        old = json.load(f)
    if not isinstance(old, dict) or not isinstance(old.get("rows"), list):
        raise ValueError(f"{path} is not a validation document (no rows list)")
    rows = merge_rows(old["rows"], doc["rows"])
    commands = list(old.get("commands") or ([old["command"]] if old.get("command") else []))
    commands += [c for c in doc["commands"] if c not in commands]
    return dict(doc, rows=rows, commands=commands, summary=table(rows)[1])


def parse_selection(parser, scenarios, protocols, verb="validated"):
    """The ``--scenarios`` and ``--protocols`` values (comma-separated str) as lists, or an argparse error.

    Args:
        parser: ``argparse.ArgumentParser`` (its ``error`` ends the command). scenarios, protocols: str.
        verb: str, how the message names the protocols this command accepts (``"validated"``).

    Returns:
        (list of str scenarios of :data:`SCENARIOS`, list of str protocols of :data:`PROTOCOLS`).

    Raises:
        SystemExit: an unknown scenario or protocol (through ``parser.error``, naming it and the known ones).
    """
    scen = [s.strip() for s in scenarios.split(",") if s.strip()]
    protos = [s.strip() for s in protocols.split(",") if s.strip()]
    for s in scen:
        if s not in SCENARIOS:
            parser.error(f"unknown scenario {s!r}; known: {', '.join(SCENARIOS)}")
    for proto in protos:
        if proto not in PROTOCOLS:
            parser.error(f"protocol {proto!r} is not {verb}; choose from {', '.join(PROTOCOLS)}")
    return scen, protos


def write_docs(docs_dir, name, doc, begin, end, body, heading):
    """Write ``doc`` to ``DOCS_DIR/simulator/NAME`` and ``body`` between ``begin`` and ``end`` of
    ``DOCS_DIR/simulator.md`` (:func:`hetsync.bench.docpages.replace_block`; under ``heading`` when the page has
    no markers).

    Args:
        docs_dir: str folder. name: str JSON file name. doc: JSON-serialisable dict. begin, end, body, heading: str.

    Raises:
        OSError: the page is missing or not writable. ValueError: only one of the markers is on the page.
    """
    from hetsync.bench import docpages

    os.makedirs(os.path.join(docs_dir, "simulator"), exist_ok=True)
    with open(os.path.join(docs_dir, "simulator", name), "w") as f:
        json.dump(doc, f, indent=1)
    page = os.path.join(docs_dir, "simulator.md")
    with open(page) as f:
        old = f.read()
    with open(page, "w") as f:
        f.write(docpages.replace_block(old, begin, end, body, heading))


def main(argv=None):
    """``python -m hetsync.bench.validate``: run (or resume) the validation and print its table.

    Args:
        argv: list of str (default ``sys.argv[1:]``); see ``--help``.

    Returns:
        int exit status: 0, or 1 when a run failed (the others are kept).

    Raises:
        SystemExit: bad arguments (argparse names the value).
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/validate", help="output folder (reused: finished runs are skipped)")
    p.add_argument("--np", type=int, nargs="*", default=[4, 8], help="world sizes on this host")
    p.add_argument("--dilation", action="append", default=[], metavar="NP=D",
                   help="run world size NP on this host at time dilation D (repeatable), e.g. 8=3")
    p.add_argument("--cluster", action="append", default=[], metavar="HOSTSxSLOTS/RATE[@D]",
                   help="also validate on the emulated multi-host cluster (repeatable), e.g. 2x2/100mbit; @D "
                   "runs it at time dilation D")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated: " + ", ".join(PROTOCOLS))
    p.add_argument("--fit-s", type=float, default=55.0, help="seconds each run should train: its epochs are chosen "
                   "from the predicted samples/s so that the first step (about 2.5 s) stays under 5%% of the fit")
    p.add_argument("--seed", type=int, default=1, help="seed of the validated runs (the probes use seed + 100)")
    p.add_argument("--time-cap-min", type=float, default=None, help="start no new run after this many minutes")
    p.add_argument("--digits", action="store_true", help="the digits set even when MNIST is there")
    p.add_argument("--update-docs", action="store_true", help="write docs/simulator/validation.json and the table "
                   "of docs/simulator.md, keeping the recorded rows this run did not re-measure")
    p.add_argument("--docs-dir", default="docs", help="the documentation folder (--update-docs)")
    p.add_argument("--repredict", action="store_true", help="run nothing: predict the recorded rows of "
                   "DOCS/simulator/validation.json (those of --scenarios and --protocols) again with this simulator "
                   "and calibration, from the probes kept in the rows")
    args = p.parse_args(argv)
    scenarios, protocols = parse_selection(p, args.scenarios, args.protocols)
    if args.repredict:
        return _repredict_main(args, scenarios, protocols, argv)
    if any(n < 2 for n in args.np):
        p.error(f"--np needs world sizes >= 2, got {args.np}")
    try:
        clusters = [parse_cluster(c) for c in args.cluster]
        dilations = parse_dilations(args.dilation)
    except ValueError as exc:
        p.error(str(exc))
    if set(dilations) - set(args.np):
        p.error(f"--dilation names world sizes {sorted(set(dilations) - set(args.np))} that --np does not run "
                f"({args.np})")
    if any(c.np < 2 for c in clusters):
        p.error(f"--cluster needs at least 2 ranks (hosts x slots), got {args.cluster}")
    targets = [(n, None) for n in args.np] + [(c.np, c) for c in clusters]
    if not targets:
        p.error("nothing to validate: give --np or --cluster")
    from hetsync.sim import workload

    t0 = time.monotonic()
    rows, failed = [], 0
    mnist = launch.mnist_dir() is not None and not args.digits
    train_samples = TRAIN_SAMPLES["mnist" if mnist else "digits"]
    for n, cluster in targets:
        dil = dilations.get(n, 1.0) if cluster is None else cluster.dilation
        where = _np_dir(n, cluster, dil)
        host = {}
        for proto in protocols:
            pdir = os.path.join(args.out, "probes", where, proto)
            try:
                run_one(pdir, n, "device:40", proto, args.seed + 100, 2, args.digits, cluster=cluster, dilation=dil)
            except (RuntimeError, OSError) as exc:
                print(f"probe {proto} {where} failed: {exc}", file=sys.stderr)
                failed += 1
                continue
            over = probe_overheads(pdir)
            if over is None:
                print(f"probe {proto} {where}: no step records", file=sys.stderr)
                failed += 1
                continue
            try:
                over.update(calibrate(proto, n, over, cluster=cluster, dilation=dil))
            except Exception as exc:  # noqa: BLE001 - no model yet: the measured cycle as it is
                print(f"probe {proto} {where}: not calibrated ({exc})", file=sys.stderr)
                over.update(host_ms=over["cycle_ms"], p2p_efficiency=1.0)
            host[proto] = over
            print(f"probe {proto} {where}: {over['cycle_ms']:.1f} ms per step beyond the device time (median step "
                  f"{over['host_ms_median']:.1f}, waits {over['wait_ms']:.1f}), simulator host_ms "
                  f"{over['host_ms']:.1f} and p2p efficiency {over['p2p_efficiency']:.3f}, first step "
                  f"{over['first_step_s']:.2f} s, epoch boundary {over['boundary_s']:.2f} s", flush=True)
        for sname in scenarios:
            spec = scenario_spec(sname, n)
            for proto in protocols:
                if proto not in host:
                    continue
                rdir = _run_dir(args.out, n, sname, proto, args.seed, cluster, dil)
                done = os.path.exists(os.path.join(rdir, "summary.json"))
                if not done and args.time_cap_min is not None and time.monotonic() - t0 > args.time_cap_min * 60:
                    print(f"time cap reached: {where} {sname} {proto} not started", file=sys.stderr)
                    continue
                try:
                    guess = predict(proto, spec, n, host[proto]["host_ms"], workload.EXAMPLE_MODEL_BYTES, 32,
                                    seed=args.seed + 7, cluster=cluster, dilation=dil,
                                    p2p_efficiency=host[proto]["p2p_efficiency"])
                except Exception as exc:  # noqa: BLE001 - no model yet: size the run by BSP's
                    print(f"no prediction for {proto} ({exc}); sizing the run by BSP's", file=sys.stderr)
                    guess = predict("bsp", spec, n, host[proto]["host_ms"], workload.EXAMPLE_MODEL_BYTES, 32,
                                    seed=args.seed + 7, cluster=cluster, dilation=dil)
                epochs = max(2, math.ceil(args.fit_s * guess.samples_per_s / dil / train_samples))
                try:
                    summ = run_one(rdir, n, spec, proto, args.seed, epochs, args.digits, cluster=cluster,
                                   dilation=dil)
                except (RuntimeError, OSError) as exc:
                    print(str(exc), file=sys.stderr)
                    failed += 1
                    continue
                epochs = summ.get("epochs") or epochs
                try:
                    pred = predict(proto, spec, n, host[proto]["host_ms"], workload.EXAMPLE_MODEL_BYTES, 32,
                                   seed=args.seed, samples_per_epoch=train_samples, cluster=cluster, dilation=dil,
                                   p2p_efficiency=host[proto]["p2p_efficiency"])
                except Exception as exc:  # noqa: BLE001 - keep the run; predict again on a rerun
                    print(f"no prediction for {proto} {where} {sname}: {exc}", file=sys.stderr)
                    continue
                meas = summ["samples_per_s"]
                whole = with_fixed_costs(pred.samples_per_s / dil, summ.get("samples") or epochs * train_samples,
                                         epochs, host[proto])
                rows.append({"np": n, "cluster": cluster_label(cluster), "scenario": sname, "spec": spec, "protocol": proto, "seed": args.seed,
                             "dilation": dil, "measured": meas, "predicted": whole,
                             "predicted_steady": pred.samples_per_s / dil,
                             "measured_steady": summ.get("samples_per_s_steady"),
                             "error": whole / meas - 1.0, "probe": host[proto],
                             "compile_fraction": compile_fraction(rdir, summ), "overrun": _overrun(summ),
                             "dataset": "mnist" if mnist else "digits", "epochs": epochs,
                             "samples": summ.get("samples") or epochs * train_samples,
                             "wall_s": summ.get("wall_s")})
                print(f"{where} {sname:15s} {proto:10s} measured {meas:8.0f} predicted {whole:8.0f} "
                      f"({rows[-1]['error'] * 100:+.1f}%)", flush=True)
    from hetsync.bench import docpages

    given = " ".join(sys.argv[1:] if argv is None else argv)
    command = docpages.without_out("python -m hetsync.bench.validate " + given)
    text, summary = table(rows)
    doc = {"command": command, "commands": [command],
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "rows": rows, "summary": summary}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "validation.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(text)
    print(summary)
    if args.update_docs:
        doc = recorded_with(doc, os.path.join(args.docs_dir, "simulator", "validation.json"))
        commands = "; then ".join(f"`{c}`" for c in doc["commands"])
        write_docs(args.docs_dir, "validation.json", doc, BEGIN, END,
                   f"Measured up to {doc['date_utc']} UTC with {commands}; {doc['summary']}.\n\n"
                   f"{table(doc['rows'])[0]}",
                   "## Validation")
    return 1 if failed else 0


def _repredict_main(args, scenarios, protocols, argv):
    path = os.path.join(args.docs_dir, "simulator", "validation.json")
    if not os.path.exists(path):
        print(f"--repredict: no recorded validation at {path}", file=sys.stderr)
        return 2
    with open(path) as f:
        recorded = json.load(f)
    chosen = [r for r in recorded["rows"] if r["scenario"] in scenarios and r["protocol"] in protocols]
    rows = repredict(chosen)
    from hetsync.bench import docpages

    given = " ".join(sys.argv[1:] if argv is None else argv)
    command = docpages.without_out("python -m hetsync.bench.validate " + given)
    text, summary = table(rows)
    print(text)
    print(summary)
    if args.update_docs:
        doc = recorded_with({"command": command, "commands": [command], "rows": rows, "summary": summary,
                             "date_utc": recorded.get("date_utc")}, path)
        commands = "; then ".join(f"`{c}`" for c in doc["commands"])
        write_docs(args.docs_dir, "validation.json", doc, BEGIN, END,
                   f"Measured up to {doc['date_utc']} UTC with {commands}; {doc['summary']}.\n\n"
                   f"{table(doc['rows'])[0]}", "## Validation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
