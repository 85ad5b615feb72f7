"""The Keras "simple MNIST convnet" example, trained data-parallel with a hetsync protocol.

A user's own script: its own ``tf.data`` input pipeline, ``keras.optimizers.Adam``,
``BatchNormalization``, validation, ``ModelCheckpoint`` and TensorBoard. The lines that differ from
the single-process script are marked ``# hetsync`` (documentation, "Coming from horovod"):

1. ``hetsync.init()``;
2. the optimizer is wrapped with a protocol;
3. each rank keeps its part of the training data (``hetsync.data.shard_dataset``: horovod's
   ``shard(size, rank)``, over the workers only when some ranks serve parameters) and the
   protocol batches it (``opt.hetsync_protocol.fit_dataset``: plain batches for every protocol,
   w_i micro-batches per step for task allocation, one batch on a server rank);
4. the callbacks: ``hetsync.callbacks.standard(opt)`` (initial broadcast, protocol hooks),
   ``MetricAverage()`` and the file-writing callbacks on rank 0 only.

Launch (MNIST's IDX files from ``--data-dir`` or the ``HETSYNC_DATA_DIR`` environment variable; scikit-learn's
digits when neither is set)::

    horovodrun --mpi -np 2 .venv/bin/python examples/keras_mnist_convnet.py --protocol bsp

Options beyond the original script exist for the test suite (``--steps-per-epoch``,
``--train-samples``, ``--mixed-precision``, ``--loss-scale``, ``--steps-per-execution``, ``--out``
for a JSON report written by rank 0).
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
from keras import layers  # noqa: E402


def parse_args(argv=None):
    """Command line (argparse); every value is checked before training starts."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--protocol", default="bsp", choices=sorted(hetsync.protocols.WRAPPERS))
    p.add_argument("--protocol-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="protocol argument, repeatable (checked against the protocol's configuration)")
    p.add_argument("--data-dir", default=os.environ.get("HETSYNC_DATA_DIR") or None,
                   help="folder of MNIST IDX files (default: $HETSYNC_DATA_DIR; scikit-learn's digits if neither is set)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per-rank batch size (samples)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="default: one pass over the rank's data")
    p.add_argument("--train-samples", type=int, default=None, help="use only the first N training samples")
    p.add_argument("--mixed-precision", default="none", choices=("none", "mixed_bfloat16", "mixed_float16"),
                   help="Keras dtype policy (mixed_bfloat16 runs on CPU)")
    p.add_argument("--loss-scale", action="store_true",
                   help="wrap Adam in keras.optimizers.LossScaleOptimizer (inside the protocol)")
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--checkpoint-dir", default=None, help="ModelCheckpoint and TensorBoard on rank 0 here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON report written by rank 0")
    p.add_argument("--verbose", action="store_true",
                   help="keep TensorFlow's start-up lines and print full tracebacks (also HETSYNC_VERBOSE=1)")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "steps_per_execution"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}")
    for name in ("steps_per_epoch", "train_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}")
    if args.lr <= 0:
        p.error(f"--lr must be positive, got {args.lr}")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        p.error(f"--data-dir (or HETSYNC_DATA_DIR): no such folder: {args.data_dir}")
    return args, p


def load_data(data_dir, seed):
    """MNIST from the IDX files in ``data_dir``, or scikit-learn's digits when it is None: (train, test, shape, name)."""
    name = "digits" if data_dir is None else "mnist-idx"
    ds = hetsync.data.load(name, data_dir if name == "mnist-idx" else None, seed=seed)
    return (ds.x_train, ds.y_train), (ds.x_test, ds.y_test), ds.input_shape, name


def build_model(input_shape, num_classes):
    """Two convolution blocks (with batch normalization), dropout, softmax."""
    return keras.Sequential([
        keras.Input(shape=input_shape),
        layers.Conv2D(32, 3, padding="same", use_bias=False),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, padding="same", use_bias=False),
        layers.BatchNormalization(),
        layers.Activation("relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dropout(0.5),
        # float32 output under mixed precision, as Keras' mixed-precision guide advises
        layers.Dense(num_classes, activation="softmax", dtype="float32"),
    ])


def main(argv=None):
    args, parser = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", "1")))
    hetsync.init()  # hetsync
    try:  # bad input stops here, before training
        proto_kwargs = hetsync.protocols.parse_protocol_args(args.protocol, args.protocol_arg)
    except ValueError as exc:
        parser.error(str(exc))
    if args.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(args.mixed_precision)
    keras.utils.set_random_seed(args.seed)

    (x_train, y_train), (x_test, y_test), input_shape, data_name = load_data(args.data_dir, args.seed)
    if args.train_samples:
        x_train, y_train = x_train[:args.train_samples], y_train[:args.train_samples]
    num_classes = 10

    model = build_model(input_shape, num_classes)
    optimizer = keras.optimizers.Adam(learning_rate=args.lr)
    if args.loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer = hetsync.protocols.get_wrapper(args.protocol)(optimizer, **proto_kwargs)  # hetsync

    # The input pipeline: one example at a time, shuffled per epoch.
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    train = hetsync.data.shard_dataset(train)  # hetsync: this worker's part of the data
    train = train.shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(256)

    model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer, metrics=["accuracy"],
                  steps_per_execution=args.steps_per_execution)

    callbacks = hetsync.callbacks.standard(optimizer) + [hetsync.callbacks.MetricAverage()]  # hetsync
    if args.checkpoint_dir:
        callbacks += hetsync.callbacks.on_rank0(  # hetsync: files are written by rank 0
            keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "best.keras"), monitor="val_loss",
                                            save_best_only=True),
            keras.callbacks.TensorBoard(os.path.join(args.checkpoint_dir, "tensorboard")))
    data = optimizer.hetsync_protocol.fit_dataset(train, args.batch_size,  # hetsync: the protocol batches
                                                  steps_per_epoch=args.steps_per_epoch)
    t0 = time.time()
    history = model.fit(**data, epochs=args.epochs, validation_data=test, callbacks=callbacks,
                        verbose=2 if hetsync.rank() == 0 else 0)
    wall = time.time() - t0

    score = model.evaluate(test, verbose=0)
    diff = hetsync.transport.max_abs_difference_across_ranks(model.trainable_variables)
    if hetsync.rank() == 0:
        print(f"test loss {score[0]:.4f}, test accuracy {score[1]:.4f}, weights max diff across ranks {diff:.3g}")
    report = {"protocol": args.protocol, "world_size": hetsync.size(), "workers": hetsync.num_workers(),
              "train_samples_this_rank": int(train.cardinality().numpy()), "dataset": data_name,
              "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
              "steps_per_epoch": data["steps_per_epoch"], "test_loss": float(score[0]),
              "test_accuracy": float(score[1]), "weights_max_abs_diff": float(diff), "fit_wall_s": wall,
              "optimizer_class": type(optimizer).__name__, "policy": keras.mixed_precision.global_policy().name,
              "compute_dtype": model.layers[0].compute_dtype,
              "stats": optimizer.hetsync_protocol.summary_stats()}
    if args.loss_scale:
        scales = hetsync.transport.allgather_object(float(optimizer.dynamic_scale.numpy()), name="loss_scales")
        report["loss_scales"] = scales
    if args.out and hetsync.rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o))
    return report


if __name__ == "__main__":
    main()
