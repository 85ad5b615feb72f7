"""Run under mpirun -np 3: task allocation's update equals the exact mean over the round; sample accounting.

Phase 1 (closed form, static weights 1,2,3, per-rank batch size b = 4, so by default BSP's
global batch 3 x 4 = 12 samples in C = 6 micro-batches of 2): a linear model y = x W (no bias,
W = 0, SGD lr 0.5, MSE) trains one epoch of N = 12 + 5 samples (one full round, one partial
round). Rank 0 replays the rounds in numpy from the sample ids each rank really received and
compares W. Phase 2 (accounting, adaptive under ``speeds:1,1,0.25``, C = 6 n with an explicit
``micro_batch=8``, a global batch of 48 n samples): every rank logs the ids of every batch its data
set served; rank 0 gets all logs and writes them with the allocation history.
"""
import json
import sys

import keras
import numpy as np

import hetsync
from hetsync.protocols.taskalloc import protocol as taskalloc

out_path = sys.argv[1]
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
served = []
_orig_getitem = taskalloc.AllocatedData.__getitem__
logging_on = [False]


def logging_getitem(self, t):
    x, y = _orig_getitem(self, t)
    # Item t is round t mod R of epoch t // R (the data set is infinite; Keras prefetches ahead, and
    # items of epochs after the last are never trained on). Keras also peeks at 2 batches to infer
    # shapes before training; not logged.
    if logging_on[0]:
        epoch, r = divmod(int(t), self.protocol.rounds)
        served.append((epoch, r, [int(v) for v in x[:, 0]]))
    return x, y


class LogServed(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        logging_on[0] = True

    def on_train_end(self, logs=None):
        logging_on[0] = False


taskalloc.AllocatedData.__getitem__ = logging_getitem


def gather_json(obj):
    """Allgather a JSON-serialisable object from every rank (through a uint8 tensor)."""
    import tensorflow as tf

    raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    lens = hetsync.transport.allgather(tf.constant([len(raw)], tf.int64), name=f"len{len(served)}").numpy()
    blob = hetsync.transport.allgather(tf.constant(raw), name=f"blob{len(served)}").numpy().tobytes()
    out, pos = [], 0
    for ln in lens:
        out.append(json.loads(blob[pos:pos + ln].decode()))
        pos += ln
    return out


# ---- phase 1: closed form ------------------------------------------------------------------------
weights, mb, d, lr = [1, 2, 3][:n], 2, 4, 0.5
C = sum(weights)
b = C * mb // n  # per-rank batch size whose BSP global batch n b is C micro-batches of mb
N = C * mb + 5
rng = np.random.default_rng(7)
feat = rng.normal(size=(N, d)).astype(np.float32)
x = np.concatenate([np.arange(N, dtype=np.float32)[:, None], feat], axis=1)  # column 0: sample id
target = rng.normal(size=(N, 1)).astype(np.float32)
mask = np.array([0.0] + [1.0] * d, np.float32)  # the id column does not enter the model
model = keras.Sequential([keras.Input((d + 1,)), keras.layers.Lambda(lambda t: t * mask),
                          keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
opt = hetsync.TaskAllocation(keras.optimizers.SGD(lr), mode="static", weights=weights)
model.compile(opt, "mse")
served.clear()
model.fit(**opt.hetsync_protocol.fit_data(x, target, b, seed=3), epochs=1, verbose=0,
          callbacks=hetsync.callbacks.standard(opt) + [LogServed()])
assert opt.hetsync_protocol.micro_batch == mb, (opt.hetsync_protocol.micro_batch, mb)
mine = [s for s in served]
all_served = gather_json(mine)
w_final = model.get_weights()[0][1:, 0]
diff_ranks = hetsync.transport.max_abs_difference_across_ranks(model.trainable_variables)
result = {}
if rank == 0:
    rounds = opt.hetsync_protocol.rounds
    W = np.zeros(d, np.float64)
    naive = np.zeros(d, np.float64)
    for r in range(rounds):
        ids = [next(s[2] for s in all_served[k] if s[1] == r) for k in range(n)]
        allids = np.concatenate([np.asarray(i, np.int64) for i in ids])
        X, Y = feat[allids].astype(np.float64), target[allids, 0].astype(np.float64)
        g = (2.0 / len(allids)) * X.T @ (X @ W - Y)  # mean over every sample of the round
        # what an unweighted average of the ranks' mean gradients would give (wrong when shares differ)
        gn = np.mean([(2.0 / len(i)) * feat[i].T.astype(np.float64) @ (feat[i].astype(np.float64) @ naive
                      - target[i, 0]) for i in map(np.asarray, ids)], axis=0)
        W, naive = W - lr * g, naive - lr * gn
    result["closed_form"] = {"rounds": rounds, "counts": opt.hetsync_protocol.counts.tolist(),
                             "max_err": float(np.max(np.abs(W - w_final))),
                             "naive_err": float(np.max(np.abs(naive - w_final))), "moved": float(np.max(np.abs(W))),
                             "iterations": int(opt.iterations.numpy()), "diff_ranks": diff_ranks,
                             "batch_size": opt.hetsync_protocol.batch_size,
                             "micro_batch": opt.hetsync_protocol.micro_batch,
                             "global_batch": opt.hetsync_protocol.global_batch,
                             "syncs": opt.hetsync_protocol.summary_stats()["syncs"]}

# ---- phase 2: sample accounting under adaptive reallocation ----------------------------------------
ds = hetsync.data.load("digits", seed=0)
xd = np.concatenate([np.arange(len(ds.x_train), dtype=np.float32)[:, None], ds.x_train.reshape(len(ds.x_train), -1)],
                    axis=1)
keras.utils.set_random_seed(0)
model2 = keras.Sequential([keras.Input((65,)), keras.layers.Lambda(lambda t: t[:, 1:]),
                           keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10, activation="softmax")])
opt2 = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", total=6 * n, threshold=0.0, micro_batch=8)
model2.compile(opt2, "sparse_categorical_crossentropy")
served.clear()
spec = "speeds:" + ",".join(["1"] * (n - 1) + ["0.25"])
model2.fit(**opt2.hetsync_protocol.fit_data(xd, ds.y_train, 8, seed=1), epochs=3, verbose=0,
           callbacks=[hetsync.callbacks.Slowdown(spec)] + hetsync.callbacks.standard(opt2) + [LogServed()])
all_served = gather_json(served)
if rank == 0:
    result["accounting"] = {"n_samples": len(xd), "served": all_served,
                            "history": opt2.hetsync_protocol.history,
                            "steps_per_rank": opt2.hetsync_protocol.rounds,
                            "global_batch": opt2.hetsync_protocol.global_batch}
    with open(out_path, "w") as f:
        json.dump(result, f)
