"""Train any ``keras.applications`` model data-parallel with a hetsync protocol and report images/s.

The model-zoo benchmark: a model by name (``--model ResNet50``, ``MobileNetV2``, ``EfficientNetB0``,
... with ``weights=None``), trained on synthetic images (random, fixed, as horovod's synthetic
benchmark: pure compute and communication, no input cost) or on real data resized to
``--image-size`` (scikit-learn's digits, or MNIST IDX files), under ``--protocol`` with
``--protocol-arg`` and a straggler scenario ``--slowdown``. Reports images per second per rank
and in total (every rank's images over the slowest rank's time), from the steps after
``--warmup-steps`` (the first steps trace and compile)::

    horovodrun --mpi -np 2 .venv/bin/python examples/keras_applications.py --model ResNet50 \\
        --image-size 32 --batch-size 16 --steps 20 --protocol rna --slowdown random:4

``--out FILE`` writes the report as JSON (rank 0): ``model``, ``protocol``, ``world_size``,
``data``, ``images_per_s_per_rank`` (list), ``images_per_s_total`` (every rank's images over the slowest rank's
timed seconds), ``images_per_rank`` and ``seconds_per_rank`` (lists), ``step_ms_median_per_rank``,
``timed_steps``, ``loss_first``, ``loss_last``, ``weights_max_abs_diff``, ``params``, and over the timed steps
of every rank ``emulated_steps`` and ``overrun_steps`` (steps padded to an emulated device time, and those
whose compute took longer) with the run's time dilation ``dilation``.
"""
import argparse
import json
import os
import sys
import time

import hetsync

# optional: hide TensorFlow's start-up lines (--verbose or HETSYNC_VERBOSE=1 keeps them); before it is imported
hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402



def application_names():
    """Names of the model constructors in ``keras.applications`` (sorted list of str)."""
    names = []
    for name in dir(keras.applications):
        obj = getattr(keras.applications, name)
        if callable(obj) and name[:1].isupper():
            names.append(name)
    return sorted(names)


def parse_args(argv=None):
    """The command line (argparse), checked before training starts."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="ResNet50", help="keras.applications model name (weights=None)")
    p.add_argument("--protocol", default="bsp", choices=sorted(hetsync.protocols.WRAPPERS))
    p.add_argument("--protocol-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="protocol argument, repeatable (checked against the protocol's configuration)")
    p.add_argument("--data", default="synthetic", choices=("synthetic",) + hetsync.data.DATASETS,
                   help="synthetic random images, or a real data set resized to --image-size")
    p.add_argument("--data-dir", default=None, help="folder of the IDX files for --data mnist-idx")
    p.add_argument("--image-size", type=int, default=32, help="input height and width in pixels (3 channels)")
    p.add_argument("--num-classes", type=int, default=10, help="classes of the synthetic data")
    p.add_argument("--batch-size", type=int, default=16, help="per-rank batch size (images)")
    p.add_argument("--steps", type=int, default=10, help="training steps per epoch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of images/s")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--slowdown", default="none", help="straggler scenario, e.g. random:6 or device:40+random:6")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON report (rank 0)")
    p.add_argument("--verbose", action="store_true",
                   help="keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    args = p.parse_args(argv)
    if args.model not in application_names():
        p.error(f"--model {args.model!r} is not in keras.applications; choose one of: {', '.join(application_names())}")
    for name in ("image_size", "num_classes", "batch_size", "steps", "epochs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}")
    if args.image_size < 32:
        p.error(f"--image-size must be at least 32 (the smallest input of keras.applications models), "
                f"got {args.image_size}")
    if not 0 <= args.warmup_steps < args.steps * args.epochs:
        p.error(f"--warmup-steps must be in [0, steps x epochs = {args.steps * args.epochs}), got {args.warmup_steps}")
    if args.lr <= 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if args.data == "mnist-idx" and not args.data_dir:
        p.error("--data mnist-idx needs --data-dir (for example ../shared/data/mnist-t10k)")
    return args, p


def per_rank_dataset(args, rank, size):
    """This rank's unbatched training examples ``(image float32 [S, S, 3], label int64)`` and the class count.

    Synthetic: 4 batches of fixed random images and labels per rank (seeded by rank), repeated.
    Real: the training split of the data set, sharded by rank, shuffled, grey levels repeated into
    3 channels and resized to ``--image-size`` on the fly.
    """
    s = args.image_size
    if args.data == "synthetic":
        rng = np.random.default_rng([args.seed, rank])
        n = 4 * args.batch_size
        x = rng.random((n, s, s, 3), dtype=np.float32)
        y = rng.integers(0, args.num_classes, n).astype(np.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat(), args.num_classes
    ds = hetsync.data.load(args.data, args.data_dir, seed=args.seed)
    train = tf.data.Dataset.from_tensor_slices((ds.x_train, ds.y_train)).shard(size, rank)
    train = train.shuffle(len(ds.x_train), seed=args.seed).repeat()

    def resize(x, y):
        return tf.image.resize(tf.image.grayscale_to_rgb(x), (s, s)), y

    return train.map(resize, num_parallel_calls=tf.data.AUTOTUNE), ds.num_classes


class ImageRate(keras.callbacks.Callback):
    """Per-step wall time and images of this rank, after ``warmup`` steps (images/s, step times)."""

    def __init__(self, protocol, warmup):
        super().__init__()
        self.protocol, self.warmup = protocol, warmup
        self.step, self.images, self.seconds, self.step_ms, self.losses = 0, 0, 0.0, [], []
        self.emulated, self.overruns = 0, 0  # timed steps padded to an emulated device time, and those that overran

    def on_train_batch_begin(self, batch, logs=None):
        self._t = time.perf_counter()
        samples = self.protocol.step_samples(batch)
        self._m = samples if samples is not None else self.protocol.batch_size

    def on_train_batch_end(self, batch, logs=None):
        dt = time.perf_counter() - self._t
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if self.step >= self.warmup:
            self.images += int(self._m)
            self.seconds += dt
            self.step_ms.append(dt * 1e3)
            stats = self.protocol.step_stats()
            self.emulated += int(stats.get("emulated_ms", 0.0) > 0)
            self.overruns += int(stats.get("overrun", 0.0) > 0)
        self.step += 1


def main(argv=None):
    args, parser = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", "1")))
    hetsync.init()  # hetsync
    rank, size = hetsync.rank(), hetsync.size()
    try:  # everything the user can get wrong, before any training
        proto_kwargs = hetsync.protocols.parse_protocol_args(args.protocol, args.protocol_arg)
        slowdown = hetsync.callbacks.Slowdown(args.slowdown, seed=args.seed)
        train, num_classes = per_rank_dataset(args, rank, size)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))

    keras.utils.set_random_seed(args.seed)
    model = getattr(keras.applications, args.model)(weights=None, input_shape=(args.image_size, args.image_size, 3),
                                                     classes=num_classes)
    opt = hetsync.protocols.get_wrapper(args.protocol)(keras.optimizers.SGD(args.lr, momentum=0.9),  # hetsync
                                                       **proto_kwargs)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    rate = ImageRate(opt.hetsync_protocol, args.warmup_steps)
    data = opt.hetsync_protocol.fit_dataset(train, args.batch_size, steps_per_epoch=args.steps)  # hetsync
    model.fit(**data, epochs=args.epochs, verbose=0,
              callbacks=[slowdown] + hetsync.callbacks.standard(opt) + [rate])  # hetsync

    mine = {"images": rate.images, "seconds": rate.seconds, "emulated": rate.emulated, "overruns": rate.overruns,
            "step_ms_median": float(np.median(rate.step_ms)) if rate.step_ms else None}
    rows = hetsync.transport.allgather_object(mine, name="images_per_s")
    diff = hetsync.transport.max_abs_difference_across_ranks(model.trainable_variables)
    per_rank = [r["images"] / r["seconds"] if r["seconds"] > 0 else 0.0 for r in rows]
    total = sum(r["images"] for r in rows) / max(r["seconds"] for r in rows)
    report = {"model": args.model, "protocol": args.protocol, "world_size": size, "data": args.data,
              "image_size": args.image_size, "batch_size": args.batch_size, "scenario": args.slowdown,
              "images_per_s_per_rank": per_rank, "images_per_s_total": total,
              "images_per_rank": [r["images"] for r in rows], "seconds_per_rank": [r["seconds"] for r in rows],
              "step_ms_median_per_rank": [r["step_ms_median"] for r in rows],
              "timed_steps": rate.step - args.warmup_steps, "loss_first": rate.losses[0], "loss_last": rate.losses[-1],
              "weights_max_abs_diff": float(diff), "params": int(model.count_params()),
              "emulated_steps": sum(r["emulated"] for r in rows), "overrun_steps": sum(r["overruns"] for r in rows),
              "dilation": hetsync.world.dilation()}
    if rank == 0:
        print(f"{args.model} ({report['params']:,} parameters), {args.protocol}, {size} ranks, {args.data} "
              f"{args.image_size}x{args.image_size}, batch {args.batch_size} per rank")
        for r, v in enumerate(per_rank):
            print(f"  rank {r}: {v:.1f} images/s (median step {rows[r]['step_ms_median']:.0f} ms)")
        print(f"  total: {total:.1f} images/s")
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
