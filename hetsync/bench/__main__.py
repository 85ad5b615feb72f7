"""``python -m hetsync.bench`` / ``hetsync-bench``: run the benchmark matrix and write its report.

Examples::

    hetsync-bench --preset quick                      # smoke check, every registered protocol
    hetsync-bench --preset full --update-docs         # the documentation's results pages
    hetsync-bench --preset quick --np 2 --scenario digits/random:3 --epochs 2 --protocols bsp
                                                      # (runs on device:40; --device 0 for the real CPU)
    hetsync-bench --micro-only                        # op microbenchmarks only

Writes ``OUT/results.json``, ``OUT/results.md`` (Markdown tables), ``OUT/plots/*.png``.
"""
import argparse
import dataclasses
import json
import os
import sys

__all__ = ["main", "parse_args", "DIGITS_EPOCHS"]

#: without MNIST's files, the cluster preset's MNIST cells train on the embedded digits this many times
#: their epochs (about the same number of steps: 1,437 training samples against 8,000).
DIGITS_EPOCHS = 5


def parse_args(argv=None):
    """Parse the command line; bad values end with a usage error naming them (before anything runs).

    Returns:
        ``(args, preset, protocols, protocol_args)``.
    """
    from hetsync import protocols as _protocols
    from hetsync.bench import launch, matrix

    p = argparse.ArgumentParser(prog="hetsync-bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="quick", choices=sorted(matrix.PRESETS))
    p.add_argument("--protocols", default=None,
                   help="comma-separated protocol names (default: every registered one: "
                        f"{','.join(sorted(_protocols.WRAPPERS))}); bsp is always included")
    p.add_argument("--protocol-arg", action="append", default=[], metavar="PROTO:KEY=VALUE",
                   help="argument for one protocol, repeatable (e.g. rna:probes=2)")
    p.add_argument("--scenario", action="append", default=None, metavar="[DATASET/]SPEC",
                   help=f"replace the preset's cells, repeatable; DATASET in {sorted(matrix.DATASETS)} "
                        "(default digits), SPEC a slowdown spec, e.g. mnist/random:6")
    p.add_argument("--cell", action="append", default=None, metavar="TEXT",
                   help="run only the preset's cells whose key contains TEXT (repeatable: any of them), e.g. "
                        "--cell 1gbit for the cluster preset's sharding cell; not with --update-docs (the "
                        "documents hold every cell of a preset)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds for every scenario (replace the preset's)")
    p.add_argument("--np", type=int, default=None, help="ranks of every run (replace the preset's and the cells')")
    p.add_argument("--device", type=float, default=None, metavar="MS",
                   help="run --scenario cells without a device:MS part on the emulated device of MS ms per "
                        "step (default: 40 with --scenario; 0 keeps them on the real CPU)")
    p.add_argument("--epochs", type=int, default=None, help="epochs of every run (replace the preset's and the cells')")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per launch")
    p.add_argument("--lr", type=float, default=None, help="SGD learning rate of every run (replace the preset's)")
    p.add_argument("--momentum", type=float, default=None,
                   help="SGD momentum of every run's wrapped optimizer, in [0, 1) (default 0)")
    p.add_argument("--out", default=None, help="output folder (default runs/bench-PRESET in this directory)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="folder of MNIST's IDX files for the mnist cells (default: $HETSYNC_DATA_DIR)")
    p.add_argument("--no-micro", action="store_true", help="skip the op microbenchmarks")
    p.add_argument("--micro-only", action="store_true", help="run only the op microbenchmarks")
    p.add_argument("--micro-repeats", type=int, default=30, help="timed repetitions per microbenchmark")
    p.add_argument("--update-docs", action="store_true",
                   help="write this run into the documentation: DOCS/results/PRESET.json (the source of the "
                        "site's decision table and of the documented duration of each preset), the preset's "
                        "section of DOCS/results.md and, for the cluster preset, the README's headline table")
    p.add_argument("--docs-dir", default="docs", help="the documentation folder --update-docs writes (default: docs)")
    p.add_argument("--readme", default="README.md",
                   help="the README whose headline table --update-docs rewrites (default: in this directory)")
    p.add_argument("--dry-run", action="store_true", help="print the run plan and exit")
    p.add_argument("--report-from", default=None, metavar="DIR",
                   help="run nothing: recompute the figures from the run folders under DIR and rebuild "
                        "DIR/results.json, the tables, plots (and the docs with --update-docs)")
    p.add_argument("--twins", action="store_true",
                   help="also run BSP on each emulated heterogeneous cell's homogeneous twin (every rank at the "
                        "scenario's mean step, the same total speed): the reference of the heterogeneity tax")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", default=None, metavar="JSON",
                   help="keep the runs an earlier results.json (or its summary under docs/results/) of this preset "
                   "records as ok, with its cells' calibrations; launch only the others")
    p.add_argument("--time-cap-min", type=float, default=None, metavar="M",
                   help="start no new run after M minutes (resume later with --resume)")
    args = p.parse_args(argv)

    preset = matrix.PRESETS[args.preset]
    try:
        changes = {}
        if args.device is not None and not (args.device >= 0 and args.device < float("inf")):
            raise ValueError(f"--device must be a number of milliseconds >= 0 (0: real CPU), got {args.device}")
        if args.scenario:
            device = 40.0 if args.device is None else args.device
            changes["cells"] = tuple(matrix.with_device(matrix.parse_cell(s), device) for s in args.scenario)
        if args.cell:
            cells = changes.get("cells", preset.cells)
            changes["cells"] = tuple(c for c in cells if any(t in c.key for t in args.cell))
            if not changes["cells"]:
                raise ValueError(f"--cell {' '.join(args.cell)}: no cell of this invocation has a key containing it; "
                                 "the keys are " + ", ".join(c.key for c in cells))
            if args.update_docs:
                raise ValueError("--cell runs part of a preset; --update-docs writes a preset's whole document: "
                                 "give one or the other")
        if args.seeds:
            changes["seeds"] = tuple(int(s) for s in args.seeds.split(","))
            changes["cells"] = tuple(dataclasses.replace(c, seeds=None) for c in changes.get("cells", preset.cells))
        if args.np is not None:
            changes["np"] = args.np
            changes["cells"] = tuple(dataclasses.replace(c, np=None) for c in changes.get("cells", preset.cells))
        if args.epochs is not None:
            if args.epochs <= 0:
                raise ValueError(f"--epochs must be positive, got {args.epochs}")
            changes["epochs"] = {k: args.epochs for k in matrix.DATASETS}
            changes["cells"] = tuple(dataclasses.replace(c, epochs=None) for c in changes.get("cells", preset.cells))
        if args.timeout is not None:
            if args.timeout <= 0:
                raise ValueError(f"--timeout must be positive, got {args.timeout}")
            changes["timeout_s"] = args.timeout
        if args.lr is not None:
            if not (args.lr > 0 and args.lr < float("inf")):
                raise ValueError(f"--lr must be a positive finite learning rate, got {args.lr}")
            changes["lr"] = args.lr
        if args.momentum is not None:
            if not 0 <= args.momentum < 1:
                raise ValueError(f"--momentum must be in [0, 1), got {args.momentum}")
            changes["momentum"] = args.momentum
        if args.twins:
            changes["twins"] = True
        if changes:
            preset = dataclasses.replace(preset, **changes)
        preset.validate()
        names = sorted(_protocols.WRAPPERS) if args.protocols is None else \
            [n.strip() for n in args.protocols.split(",") if n.strip()]
        for n in names:
            _protocols.get_wrapper(n)
        names = ["bsp"] + [n for n in dict.fromkeys(names) if n != "bsp"]
        proto_args = {}
        for pa in args.protocol_arg:
            proto, sep, kv = pa.partition(":")
            if not sep or proto not in names:
                raise ValueError(f"--protocol-arg must look like PROTO:KEY=VALUE with PROTO in {names}, got {pa!r}")
            proto_args.setdefault(proto, []).append(kv)
        for proto, pairs in proto_args.items():
            _protocols.parse_protocol_args(proto, pairs)
        if args.micro_repeats <= 0:
            raise ValueError(f"--micro-repeats must be positive, got {args.micro_repeats}")
        if args.time_cap_min is not None and not args.time_cap_min > 0:
            raise ValueError(f"--time-cap-min must be a positive number of minutes, got {args.time_cap_min}")
        args.resume_doc = None
        if args.resume:
            from hetsync.bench import record

            try:
                args.resume_doc = record.load_resume(args.resume, preset.name)
            except OSError as exc:
                raise ValueError(f"--resume {args.resume}: {exc}") from exc
    except ValueError as exc:
        p.error(str(exc))
    if args.data_dir is not None:  # the launched jobs read it from their environment
        from hetsync.data import DATA_DIR_ENV

        os.environ[DATA_DIR_ENV] = os.path.abspath(args.data_dir)
    if any(c.cluster is not None for c in preset.cells) and launch.mnist_dir() is None:
        # the emulated cluster's cells train on MNIST where its files are, on the embedded digits without them
        preset = dataclasses.replace(preset, cells=tuple(
            dataclasses.replace(c, dataset="digits", epochs=(c.epochs or preset.epochs["mnist"]) * DIGITS_EPOCHS)
            if c.dataset == "mnist" else c for c in preset.cells))
        print(f"note: no MNIST folder (--data-dir or HETSYNC_DATA_DIR): the cluster cells train on the embedded "
              f"digits, {DIGITS_EPOCHS}x the epochs (1,437 training samples against 8,000)", file=sys.stderr)
    if not args.dry_run and not args.report_from and not args.micro_only:
        missing = matrix.missing_data(preset)
        if missing is not None:
            p.error(str(missing))
    return args, preset, names, proto_args


def main(argv=None):
    """Entry point. Returns the exit code: 0, or 1 if a run failed."""
    args, preset, names, proto_args = parse_args(argv)
    from hetsync.bench import matrix, table

    out = args.out or os.path.join("runs", f"bench-{preset.name}")
    order = matrix.plan(preset, names)
    if args.dry_run:
        from hetsync.bench import cluster_cells

        est = sum(cluster_cells.LAUNCH_ESTIMATE_S if c.cluster is not None else matrix.LAUNCH_ESTIMATE_S
                  for _, c, _ in order) + sum(cluster_cells.PREPARE_ESTIMATE_S if c.cluster is not None
                                               else matrix.SOLO_ESTIMATE_S for c in preset.cells)
        print(f"{len(order)} training launches + {len(preset.cells)} solo measurements or cluster calibrations "
              f"({preset.np} ranks unless a cell names its own); "
              f"about {est / 60:.0f} min on a quiet 2-core machine ({matrix.LAUNCH_ESTIMATE_S:.0f} s per launch, "
              f"{matrix.SOLO_ESTIMATE_S:.0f} s per solo measurement; on the multi-host cluster "
              f"{cluster_cells.LAUNCH_ESTIMATE_S:.0f} s per launch, {cluster_cells.PREPARE_ESTIMATE_S:.0f} s per "
              "cell's calibration)")
        for seed, cell, proto in order:
            print(f"  seed {seed}  {cell.key:<32} {proto}")
        return 0
    micro = None
    if args.report_from:
        with open(os.path.join(args.report_from, "results.json")) as f:
            results = json.load(f)
        try:
            matrix.reanalyse(results, args.report_from, preset)
        except ValueError as exc:
            print(f"hetsync-bench: error: --report-from {args.report_from}: {exc}", file=sys.stderr)
            return 2
        return _report(args, results, args.report_from, results.get("micro"), preset)
    if not args.no_micro:
        from hetsync.bench import micro as _micro

        print("op microbenchmarks...", file=sys.stderr)
        micro = _micro.run_all(repeats=args.micro_repeats)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "micro.json"), "w") as f:
            json.dump(micro, f, indent=1)
        print(table.micro_table(micro))
        if args.micro_only:
            return 0
    resume = args.resume_doc
    if resume is not None:
        print(f"resuming: {len(resume['runs'])} runs of {args.resume} are kept", file=sys.stderr)
    results = matrix.run_matrix(preset, names, out, protocol_args=proto_args, progress=not args.no_progress,
                                log=lambda s: print(s, file=sys.stderr), resume=resume,
                                time_cap_s=None if args.time_cap_min is None else args.time_cap_min * 60.0)
    if results.get("left"):
        print(f"time cap: {results['left']} runs not started; continue with --resume {out}/results.json",
              file=sys.stderr)
    results["micro"] = micro
    return _report(args, results, out, micro, preset)


def _report(args, results, out, micro, preset):
    """Write results.json, results.md and the plots (and the documentation pages); print the table. Cluster
    cells with two protocols also get their side-by-side ratios (``results["pairs"]``)."""
    from hetsync.bench import cluster_cells, docpages, plots, table

    pngs = plots.make_all(results, os.path.join(out, "plots"))
    md = table.markdown_table(results)
    pairs = cluster_cells.pair_ratios(results["runs"], preset.cells)
    results["pairs"] = pairs
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(docpages.results_section(results, os.path.relpath(pngs[0], out), micro))
    if pairs:
        md += "\n\n" + cluster_cells.pair_table(pairs)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    print(md)
    print(f"\n{len(results['runs'])} runs in {results['wall_s'] / 60:.1f} min; results: {out}/results.json, "
          f"{out}/results.md, plots: {', '.join(pngs)}")
    if args.update_docs:
        written = docpages.update_docs(args.docs_dir, args.readme, results, pngs[0], micro)
        print(f"updated the documentation: {', '.join(written)}")
    failed = [r for r in results["runs"] if r["status"] != "ok"]
    for r in failed:
        print(f"FAILED: {r['protocol']} seed {r['seed']} {r['cell']}: {r['error'].splitlines()[0]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
