"""Run under mpirun -np N: BSP on N ranks equals one process on the concatenated batches.

Rank r trains on its own fixed batches; global batch k is the concatenation over ranks of each
rank's k-th batch. Rank 0 then replays the same steps in a plain (unwrapped) model with batch
N*b and writes the largest weight difference to OUT.
"""
import json
import sys

import keras
import numpy as np

import hetsync

out_path, steps, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
ds = hetsync.data.load("digits", seed=0)
x_all, y_all = ds.x_train[: n * b * steps], ds.y_train[: n * b * steps]
# rank r's k-th batch: rows [(k*n + r) * b, (k*n + r + 1) * b)
idx = np.concatenate([np.arange((k * n + rank) * b, (k * n + rank + 1) * b) for k in range(steps)])


def model_and_init():
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="tanh"),
                          keras.layers.Dense(10, activation="softmax")])
    return m


model = model_and_init()
opt = hetsync.BSP(keras.optimizers.SGD(0.2, momentum=0.5))
model.compile(opt, "sparse_categorical_crossentropy")
model.fit(x_all[idx], y_all[idx], batch_size=b, epochs=1, shuffle=False, verbose=0,
          callbacks=hetsync.callbacks.standard(opt))
diff_ranks = hetsync.transport.max_abs_difference_across_ranks(model.trainable_variables)

if rank == 0:
    ref = model_and_init()
    ref.compile(keras.optimizers.SGD(0.2, momentum=0.5), "sparse_categorical_crossentropy")
    ref.fit(x_all, y_all, batch_size=n * b, epochs=1, shuffle=False, verbose=0)
    diff_ref = max(float(np.max(np.abs(a - c))) for a, c in zip(model.get_weights(), ref.get_weights()))
    moved = max(float(np.max(np.abs(a - c))) for a, c in zip(model.get_weights(), model_and_init().get_weights()))
    with open(out_path, "w") as f:
        json.dump({"diff_vs_single": diff_ref, "diff_across_ranks": diff_ranks, "moved": moved,
                   "syncs": opt.hetsync_protocol.summary_stats()["syncs"]}, f)
