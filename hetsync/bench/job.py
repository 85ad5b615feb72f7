"""Train a Keras 3 model data-parallel with a hetsync protocol, under an injected straggler scenario.

The benchmarks' training job (``python -m hetsync.bench.job``; ``examples/keras_digits.py`` is the same
command line). A normal ``model.fit`` script; the hetsync lines are marked ``# hetsync``. Launch::

    horovodrun --mpi -np 4 .venv/bin/python -m hetsync.bench.job --protocol bsp --slowdown random:6

MNIST's IDX files come from ``--data-dir`` or the ``HETSYNC_DATA_DIR`` environment variable
(:func:`hetsync.data.data_dir`), never from a path inside the checkout.

Writes ``OUT/summary.json`` (fields: the first-run page of the documentation; with ``samples_to_target``, ``samples_per_s_steady`` and
``host_ms_median`` from :mod:`hetsync.bench.progress`), per-rank step records ``OUT/rank*.jsonl`` and
TensorBoard scalars ``OUT/tensorboard``. TensorFlow's start-up lines are hidden
(:func:`hetsync.world.quiet_startup`); ``--verbose`` or ``HETSYNC_VERBOSE=1`` keeps them.
"""
import argparse
import logging
import os
import sys
import time

import hetsync

if __name__ == "__main__":  # python -m hetsync.bench.job: before TensorFlow is imported (--verbose keeps its lines)
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tabulate import tabulate  # noqa: E402

import hetsync.data.shards  # noqa: E402
from hetsync.bench import progress  # noqa: E402

log = logging.getLogger("hetsync")

__all__ = ["build_model", "parse_args", "main", "MODELS"]

#: the models the job trains (:func:`build_model`).
MODELS = ("mlp", "wide", "cnn")


def build_model(kind, input_shape, num_classes, seed):
    """Return one of the job's models, ending in softmax probabilities (a ``keras.Sequential``).

    Args:
        kind: ``"mlp"`` (128 hidden units; 101,770 parameters on MNIST), ``"wide"`` (two hidden layers
            of 1,024 units: 1,863,690 float32 parameters on 28x28 MNIST, 7.5 MB of gradients per step,
            layers from 10 to 1,048,576 parameters; 1,126,410 on 8x8 digits; the communication-heavy
            workload of the emulated multi-host cluster) or ``"cnn"`` (two 3x3 convolutions).
            input_shape: tuple of ints (H, W, C). num_classes: int. seed: int, seeds the initial weights.

    Raises:
        ValueError: an unknown ``kind`` (names the known ones).
    """
    keras.utils.set_random_seed(seed)
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; known: {', '.join(MODELS)}")
    if kind == "mlp":
        layers = [keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                  keras.layers.Dense(num_classes, activation="softmax")]
    elif kind == "wide":
        layers = [keras.layers.Flatten(), keras.layers.Dense(1024, activation="relu"),
                  keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(num_classes, activation="softmax")]
    else:
        # More compute per step than the MLP for few parameters: on 28x28 MNIST about 20k parameters
        # and 6 ms of compute per 32-sample step with 4 ranks sharing 2 cores (the MLP: about 1 ms).
        layers = [keras.layers.Conv2D(16, 3, activation="relu", padding="same"), keras.layers.MaxPooling2D(2),
                  keras.layers.Conv2D(32, 3, activation="relu", padding="same"), keras.layers.MaxPooling2D(2),
                  keras.layers.Flatten(), keras.layers.Dense(num_classes, activation="softmax")]
    return keras.Sequential([keras.Input(shape=input_shape)] + layers)


def parse_args(argv=None):
    """Parse and check the job's command line (``--help`` lists every flag with its unit and default).

    ``--data-dir`` defaults to :func:`hetsync.data.data_dir` (the ``HETSYNC_DATA_DIR`` environment
    variable), read when this is called.

    Args:
        argv: list of str, the arguments after the program name (None: ``sys.argv[1:]``).

    Returns:
        ``(args, parser)``: the ``argparse.Namespace`` and the ``ArgumentParser`` (for later usage errors).

    Raises:
        SystemExit: status 2 with a message naming the bad value (``--dataset mnist-idx`` without a data
            folder names ``--data-dir`` and ``HETSYNC_DATA_DIR``); status 0 after ``--help``.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--protocol", default="bsp",
                   choices=sorted(hetsync.protocols.WRAPPERS) + sorted(hetsync.protocols.SELECTORS),
                   help="synchronization protocol (the wrapper's lowercase name; auto: hetsync.Auto chooses one "
                        "after a warm-up)")
    p.add_argument("--protocol-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="protocol argument, repeatable (checked against the wrapper's signature)")
    p.add_argument("--dataset", default="digits", choices=hetsync.data.DATASETS)
    p.add_argument("--data-dir", default=hetsync.data.data_dir(),
                   help=f"folder of the IDX files for --dataset mnist-idx (default: ${hetsync.data.DATA_DIR_ENV})")
    p.add_argument("--model", default="mlp", choices=MODELS)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size (samples)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum, in [0, 1)")
    p.add_argument("--target-accuracy", type=float, default=0.9, help="test accuracy for time_to_target_s")
    p.add_argument("--eval-every", type=int, default=None, help="also evaluate every N steps (default: per epoch)")
    p.add_argument("--slowdown", default="none", help="straggler scenario spec, e.g. random:6, speeds:1,1,1,0.5; "
                   "add device:MS to run on the emulated cluster (MS milliseconds per step of --batch-size "
                   "samples), e.g. device:40+random:6")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--partition", default="iid", help="training data split over ranks: iid (the protocol's own "
                   "order) or label-skew:K (non-IID: each rank holds the samples of K labels)")
    p.add_argument("--out", default="runs/latest", help="output folder")
    p.add_argument("--backup-dir", default=None, metavar="DIR",
                   help="checkpoint every rank's state into DIR (hetsync.callbacks.BackupAndRestore); relaunching "
                        "the same command resumes from it; deleted when training completes")
    p.add_argument("--backup-every-steps", type=int, default=None, metavar="N",
                   help="with --backup-dir: save after every N-th step (default 50 unless --backup-every-s)")
    p.add_argument("--backup-every-s", type=float, default=None, metavar="S",
                   help="with --backup-dir: save at the first step boundary S seconds after the previous save")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="keep TensorFlow's start-up lines and print full "
                   f"tracebacks (also {hetsync.world.VERBOSE_ENV}=1)")
    p.add_argument("--as-rank", type=int, default=None, metavar="R",
                   help="solo-speed measurement (one process, no launcher): train alone on rank R's data shard "
                        "with the scenario drawn as for rank R of --as-world-size ranks")
    p.add_argument("--as-world-size", type=int, default=None, metavar="N", help="world size for --as-rank")
    args = p.parse_args(argv)
    if (args.as_rank is None) != (args.as_world_size is None):
        p.error("--as-rank and --as-world-size go together")
    if args.as_world_size is not None and not (args.as_world_size >= 1 and 0 <= args.as_rank < args.as_world_size):
        p.error(f"--as-rank must be in [0, --as-world-size) with --as-world-size >= 1, "
                f"got {args.as_rank} and {args.as_world_size}")
    for name in ("epochs", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.lr <= 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if not 0 <= args.momentum < 1:
        p.error(f"--momentum must be in [0, 1), got {args.momentum}")
    if not 0 < args.target_accuracy <= 1:
        p.error(f"--target-accuracy must be in (0, 1], got {args.target_accuracy}")
    if args.dataset == "mnist-idx" and not args.data_dir:
        p.error(f"--dataset mnist-idx needs --data-dir DIR or the environment variable {hetsync.data.DATA_DIR_ENV} "
                "(a folder of MNIST's IDX files)")
    return args, p


def main(argv=None, extra_callbacks=()):
    """Run the training job.

    Args:
        argv: list of str command-line arguments (None: ``sys.argv[1:]``; ``--help`` lists them).
        extra_callbacks: Keras callbacks put last in the list (tests).

    Returns:
        dict, the run's summary (also written to ``OUT/summary.json``).

    Raises:
        SystemExit: a bad argument (exit status 2, before any training), with its message.
    """
    args, parser = parse_args(argv)
    if args.verbose:  # the start-up lines were decided before TensorFlow's import; this keeps full tracebacks
        hetsync.quiet_startup(verbose=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", "1")))
    hetsync.init()  # hetsync
    rank, size = hetsync.rank(), hetsync.size()

    # Everything the user can get wrong is checked here, before any training.
    try:
        proto_kwargs = hetsync.protocols.parse_protocol_args(args.protocol, args.protocol_arg)
        hetsync.data.shards.parse_partition(args.partition)
        if args.as_rank is not None and size != 1:
            raise ValueError(f"--as-rank runs one process alone; launched with {size} ranks")
        slowdown = hetsync.callbacks.Slowdown(args.slowdown, seed=args.seed, rank=args.as_rank,
                                              world_size=args.as_world_size)
        ds = hetsync.data.load(args.dataset, args.data_dir, seed=args.seed)
        if args.backup_dir is None and (args.backup_every_steps is not None or args.backup_every_s is not None):
            raise ValueError("--backup-every-steps / --backup-every-s need --backup-dir")
        backup_every = args.backup_every_steps
        if args.backup_dir is not None and backup_every is None and args.backup_every_s is None:
            backup_every = 50
        backup = None if args.backup_dir is None else hetsync.callbacks.BackupAndRestore(  # hetsync
            args.backup_dir, save_every_steps=backup_every, save_every_s=args.backup_every_s)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    if args.as_rank is not None:  # solo: this process stands for rank R of N, on R's shard
        ds.x_train, ds.y_train = hetsync.data.shard(ds.x_train, ds.y_train, args.as_rank, args.as_world_size,
                                                    seed=args.seed)

    model = build_model(args.model, ds.input_shape, ds.num_classes, args.seed)
    opt = hetsync.protocols.get_wrapper(args.protocol)(keras.optimizers.SGD(args.lr, momentum=args.momentum), **proto_kwargs)  # hetsync
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    accuracy = hetsync.callbacks.TestAccuracy(ds.x_test, ds.y_test, target=args.target_accuracy,
                                              every_steps=args.eval_every)
    metrics = hetsync.callbacks.SyncMetrics(args.out, opt)
    # SyncMetrics before TestAccuracy: a step's record (its end time) precedes an evaluation after it, so
    # samples to target counts the evaluated step
    callbacks = [slowdown] + hetsync.callbacks.standard(opt) + [metrics, accuracy]  # hetsync
    t0 = time.time()
    fit_data = hetsync.data.shards.local_fit_data(opt.hetsync_protocol, ds.x_train, ds.y_train, args.batch_size,
                                                seed=args.seed, partition=args.partition)
    if backup is not None:  # before standard(): it restores before the initial broadcast
        backup.dataset, backup.metrics = fit_data["x"], metrics
        callbacks.insert(1, backup)
    callbacks += list(extra_callbacks)
    model.fit(**fit_data, epochs=args.epochs, callbacks=callbacks, verbose=1 if (rank == 0 and not args.quiet) else 0)
    wall = time.time() - t0

    diff = hetsync.transport.max_abs_difference_across_ranks(model.trainable_variables)
    samples = sum(r["samples"] for r in metrics.per_rank)
    summary = metrics.write_summary(
        dataset=args.dataset, partition=args.partition, model=args.model, scenario=slowdown.scenario.spec,
        epochs=args.epochs,
        batch_size=args.batch_size, lr=args.lr, seed=args.seed, target_accuracy=args.target_accuracy,
        fit_wall_s=wall, time_to_target_s=accuracy.time_to_target_s, final_test_accuracy=accuracy.final_accuracy,
        time_to_target_resolution_s=accuracy.time_to_target_resolution_s,
        accuracy_curve=accuracy.curve, samples_per_s=samples / metrics.summary["wall_s"], **accuracy.extra,
        weights_max_abs_diff=diff, weights_in_sync=bool(diff <= 1e-6), dilation=slowdown.dilation,
        collectives=hetsync.world.collectives(),
    )
    if rank == 0:
        try:  # every rank's step records are in args.out (one host, or hosts that share the folder)
            summary = metrics.write_summary(**progress.run_progress(args.out))
        except FileNotFoundError as exc:
            log.warning("samples to target not counted: %s (the ranks' step records are not all in %s)",
                        exc, args.out)
            summary = metrics.write_summary(  # rank 0's own records are here: the time to target still is
                samples_to_target=None, samples_per_s_steady=None, host_ms_median=None,
                time_to_target_after_first_step_s=progress.run_time_after_first_step(
                    args.out, summary["time_to_target_s"]))
        ttt = summary["time_to_target_after_first_step_s"]  # the benchmarks' time to target
        chosen = summary.get("chosen_by")
        rows = [("protocol", summary["protocol"] if not chosen else
                 f"{summary['protocol']}: {chosen['protocol']} from step {chosen['step']}"), ("ranks", size if hetsync.num_servers() == 0 else
                                                    f"{size} ({hetsync.num_workers()} workers, "
                                                    f"{hetsync.num_servers()} servers)"), ("scenario", summary["scenario"]),
                ("dataset", f"{args.dataset} ({len(ds.x_train)} train / {len(ds.x_test)} test)"),
                ("steps per rank", summary["steps"]), ("wall time", f"{summary['wall_s']:.1f} s"),
                (f"time to {args.target_accuracy:.0%}", "not reached" if ttt is None else f"{ttt:.1f} s"),
                (f"samples to {args.target_accuracy:.0%}", "not reached" if summary["samples_to_target"] is None
                 else summary["samples_to_target"]),
                ("final test accuracy", f"{summary['final_test_accuracy']:.4f}"),
                ("samples/s", f"{summary['samples_per_s']:.0f}"),
                ("weights in sync", f"{summary['weights_in_sync']} (max diff {diff:.2g})"),
                ("overrun steps", "no emulated device" if not summary["emulated_steps"] else
                 f"{summary['overrun_steps']} of {summary['emulated_steps']} emulated steps"
                 + ("" if summary["emulation_valid"] else " (emulation INVALID: over 1%)")),
                ("summary", os.path.join(args.out, "summary.json"))]
        print(tabulate(rows, tablefmt="plain"))
    return summary


if __name__ == "__main__":
    main()
    sys.exit(0)
