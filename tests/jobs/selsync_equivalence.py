"""Run under mpirun -np N: SelSync step by step against BSP, a huge delta, and PA consistency.

Writes OUT (rank 0) with, per run, the per-step weights of rank 0 (flattened), per-step stats and
the per-step max weight difference across ranks. Runs (all on the same SelDP batches, same seed):

* ``bsp``: hetsync.BSP;  ``ga0``: SelSync delta=0, gradient aggregation;  ``pa0``: delta=0, PA;
* ``huge``: SelSync delta=1e9 (PA): only the first step may synchronize;
* ``mixed``: SelSync delta=MIXED (PA): some steps synchronize, some do not.

Also, for the first steps of ``ga0``, the squared norm of rank 0's local gradient recomputed
eagerly with a GradientTape from the recorded pre-step weights and batch.
"""
import json
import sys

import keras
import numpy as np
import tensorflow as tf

import hetsync
from hetsync.data import shards as partition

out_path, epochs, mixed_delta = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
ds = hetsync.data.load("digits", seed=0)
B = 16


def make_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(24, activation="tanh"),
                             keras.layers.Dense(10, activation="softmax")])


class Recorder(keras.callbacks.Callback):
    def __init__(self, opt):
        super().__init__()
        self.proto = opt.hetsync_protocol
        self.weights, self.before, self.stats, self.diffs = [], [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.before.append([w.copy() for w in self.model.get_weights()])

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(np.concatenate([w.ravel() for w in self.model.get_weights()]).tolist())
        self.stats.append(self.proto.step_stats())
        self.diffs.append(hetsync.transport.max_abs_difference_across_ranks(self.model.trainable_variables))


def run(opt):
    model = make_model()
    model.compile(opt, "sparse_categorical_crossentropy")
    sampler = partition.SelDPSampler(len(ds.x_train), rank, n, B, seed=0)
    data = partition.BatchDataset(ds.x_train, ds.y_train, sampler)
    rec = Recorder(opt)
    model.fit(data, steps_per_epoch=sampler.steps_per_pass, epochs=epochs, shuffle=False, verbose=0,
              callbacks=hetsync.callbacks.standard(opt) + [rec])
    return model, rec, sampler


def sgd():
    return keras.optimizers.SGD(0.2, momentum=0.5)


results = {}
_, bsp, sampler = run(hetsync.BSP(sgd()))
results["bsp"] = bsp
model_ga, ga0, _ = run(hetsync.SelSync(sgd(), delta=0.0, aggregation="gradient"))
results["ga0"] = ga0
results["pa0"] = run(hetsync.SelSync(sgd(), delta=0.0))[1]
huge_opt = hetsync.SelSync(sgd(), delta=1e9)
model_huge, results["huge"], _ = run(huge_opt)
# average_at_end (default): every rank leaves fit with the mean of the ranks' last local weights.
last = np.array(results["huge"].weights[-1], np.float32)
final = np.concatenate([w.ravel() for w in model_huge.get_weights()]).astype(np.float32)
huge_last_all = hetsync.transport.allgather(tf.constant(last[None]), name="t_last").numpy()
huge_final_all = hetsync.transport.allgather(tf.constant(final[None]), name="t_final").numpy()
results["mixed"] = run(hetsync.SelSync(sgd(), delta=mixed_delta))[1]

# Independent check of ||g_i||^2 on rank 0 for the first steps of ga0.
ref = make_model()
loss_fn = keras.losses.SparseCategoricalCrossentropy()
sq_ref = []
for t in range(4):
    ref.set_weights(ga0.before[t])
    idx = sampler(t)
    with tf.GradientTape() as tape:
        loss = loss_fn(ds.y_train[idx], ref(ds.x_train[idx], training=True))
    grads = tape.gradient(loss, ref.trainable_variables)
    sq_ref.append(float(sum(np.sum(np.square(g.numpy().astype(np.float64))) for g in grads)))

if rank == 0:
    out = {name: {"weights": r.weights, "stats": r.stats, "diffs": r.diffs} for name, r in results.items()}
    out["grad_sq_norm_ref"] = sq_ref
    out["steps_per_epoch"] = sampler.steps_per_pass
    out["world_size"] = n
    out["huge_summary"] = huge_opt.hetsync_protocol.summary_stats()
    out["huge_last_all"] = huge_last_all.tolist()
    out["huge_final_all"] = huge_final_all.tolist()
    with open(out_path, "w") as f:
        json.dump(out, f)
