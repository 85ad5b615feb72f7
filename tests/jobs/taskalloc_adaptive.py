"""Run under mpirun -np N: task allocation under a slowdown scenario; rank 0 writes the epoch history.

The model is a small CNN on digits (``--width`` filters per conv layer): many FLOPs per sample but
few parameters, so compute dominates the allreduce and its time is close to linear in the batch
size; the per-rank speeds measured by the protocol then follow the scenario's speed ratio.
``--tile K`` repeats the digits training set K times so an epoch has enough rounds to measure.

``--device-ms-per-sample MS`` adds a *simulated device* to the model: a layer whose forward pass
waits MS milliseconds per sample of the batch on hetsync's timer thread (the compiled
``HetsyncDelay`` op, no CPU used). Compute time is then exactly proportional to the samples a rank
processes and does not depend on how the 2 cores of this machine are shared between 4 ranks, so the
test can compare the allocation with the scenario's nominal speed ratio.
"""
import argparse
import json

import keras
import numpy as np

import hetsync

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--slowdown", default="none", help="one or more slowdown specs separated by ';'")
p.add_argument("--mode", default="adaptive", help="static, adaptive, or bsp (BSP, batch size --batch-size per rank)")
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--total", type=int, default=28, help="C, micro-batches per round (without --weights)")
p.add_argument("--weights", default=None, help="comma-separated static weights")
p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size b (samples), as for BSP")
p.add_argument("--micro-batch", type=int, default=None,
               help="samples per micro-batch (default: the protocol's, BSP's global batch n b in C micro-batches)")
p.add_argument("--width", type=int, default=64)
p.add_argument("--tile", type=int, default=4)
p.add_argument("--threshold", type=float, default=0.05)
p.add_argument("--device-ms-per-sample", type=float, default=0.0)
p.add_argument("--fit-dataset", action="store_true",
               help="feed a user's per-rank unbatched tf.data pipeline through fit_dataset instead of fit_data")
a = p.parse_args()
hetsync.init()
ds = hetsync.data.load("digits", seed=0)
x, y = np.concatenate([ds.x_train] * a.tile), np.concatenate([ds.y_train] * a.tile)


class SimulatedDevice(keras.layers.Layer):
    """Identity whose forward pass waits ``ms`` milliseconds per sample (timer thread, no CPU)."""

    def __init__(self, ms, **kw):
        super().__init__(**kw)
        self.ms = ms

    def call(self, x):
        import tensorflow as tf

        n = tf.cast(tf.shape(x)[0], tf.float64)
        ctrl = tf.stack([tf.constant(0.0, tf.float64), tf.constant(1.0, tf.float64), n * self.ms])
        done, _, _ = hetsync.ops.delay([tf.stop_gradient(x)], ctrl)
        with tf.control_dependencies(done):
            return tf.identity(x)


class EpochTimer(keras.callbacks.Callback):
    """Wall time of every epoch in seconds (this rank)."""

    def on_train_begin(self, logs=None):
        self.walls = []

    def on_epoch_begin(self, epoch, logs=None):
        import time

        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        import time

        self.walls.append(time.perf_counter() - self._t0)


def run(spec):
    """Train on a fresh model and optimizer under ``spec``; return rank 0's statistics."""
    keras.utils.set_random_seed(0)
    device = [SimulatedDevice(a.device_ms_per_sample)] if a.device_ms_per_sample > 0 else []
    model = keras.Sequential([keras.Input((8, 8, 1))] + device + [
        keras.layers.Conv2D(a.width, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(a.width, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")])
    weights = [int(v) for v in a.weights.split(",")] if a.weights else None
    timer = EpochTimer()
    if a.mode == "bsp":
        opt = hetsync.BSP(keras.optimizers.SGD(0.05))
        xs, ys = hetsync.data.shard(x, y, hetsync.rank(), hetsync.size(), seed=0)
        data = {"x": xs, "y": ys, "batch_size": a.batch_size, "shuffle": True}
    else:
        opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.05), mode=a.mode, weights=weights,
                                     total=None if weights else a.total, threshold=a.threshold,
                                     micro_batch=a.micro_batch)
        if a.fit_dataset:
            import tensorflow as tf

            xs, ys = hetsync.data.shard(x, y, hetsync.rank(), hetsync.size(), seed=0)
            user = tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(len(xs), seed=hetsync.rank())
            data = opt.hetsync_protocol.fit_dataset(user, a.batch_size)
        else:
            data = opt.hetsync_protocol.fit_data(x, y, a.batch_size, seed=0)
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    cbs = [hetsync.callbacks.Slowdown(spec, seed=0)] + hetsync.callbacks.standard(opt) + [timer]
    model.fit(**data, epochs=a.epochs, verbose=0, callbacks=cbs)
    diff = hetsync.transport.max_abs_difference_across_ranks(model.trainable_variables)
    return {"stats": opt.hetsync_protocol.summary_stats(), "weights_diff": diff, "epoch_wall_s": timer.walls}


results = {spec: run(spec) for spec in a.slowdown.split(";")}
if hetsync.rank() == 0:
    with open(a.out, "w") as f:
        json.dump(results, f)
