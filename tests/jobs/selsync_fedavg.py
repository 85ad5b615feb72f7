"""Run under mpirun -np N: FedAvg (C=1, one sync per epoch) against per-epoch model averaging,
plus FedAvg with C < 1 and LocalSGD bookkeeping.

Reference: a plain (unwrapped) model trains one epoch at a time on the same DefDP shard in the
same order; after each epoch its weights are averaged over ranks by hand (eager allreduce).
Writes OUT (rank 0).
"""
import json
import sys

import keras
import numpy as np

import hetsync

out_path, epochs = sys.argv[1], int(sys.argv[2])
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
ds = hetsync.data.load("digits", seed=0)
B = 32
xs, ys = hetsync.data.shard(ds.x_train, ds.y_train, rank, n, seed=0)


def make_model():
    keras.utils.set_random_seed(4)
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(24, activation="tanh"),
                             keras.layers.Dense(10, activation="softmax")])


class SyncCheck(keras.callbacks.Callback):
    """Per step: the protocol's sync flag and the max weight difference across ranks."""

    def __init__(self, opt):
        super().__init__()
        self.proto, self.rows = opt.hetsync_protocol, []

    def on_train_batch_end(self, batch, logs=None):
        self.rows.append((self.proto.step_stats()["sync"],
                          hetsync.transport.max_abs_difference_across_ranks(self.model.trainable_variables)))


def wrapped_run(opt):
    model = make_model()
    model.compile(opt, "sparse_categorical_crossentropy")
    check = SyncCheck(opt)
    model.fit(xs, ys, batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=hetsync.callbacks.standard(opt) + [check])
    return model, check


fed, fed_check = wrapped_run(hetsync.FedAvg(keras.optimizers.SGD(0.1, momentum=0.5), fraction=1.0, syncs_per_epoch=1))

ref = make_model()
ref.compile(keras.optimizers.SGD(0.1, momentum=0.5), "sparse_categorical_crossentropy")
for e in range(epochs):
    ref.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
    avg = hetsync.transport.allreduce_mean([v.value for v in ref.trainable_variables], name=f"ref_avg_{e}")
    for v, a in zip(ref.trainable_variables, avg):
        v.assign(a)
diff_ref = max(float(np.max(np.abs(a - c))) for a, c in zip(fed.get_weights(), ref.get_weights()))
moved = max(float(np.max(np.abs(a - c))) for a, c in zip(fed.get_weights(), make_model().get_weights()))

# DiLoCo's outer Nesterov step after each average (outer_lr 0.7, outer_momentum 0.9), against numpy by hand
outer, _ = wrapped_run(hetsync.FedAvg(keras.optimizers.SGD(0.1, momentum=0.5), fraction=1.0, syncs_per_epoch=1,
                                      outer_lr=0.7, outer_momentum=0.9))
ref2 = make_model()
ref2.compile(keras.optimizers.SGD(0.1, momentum=0.5), "sparse_categorical_crossentropy")
anchor = [np.array(v.numpy()) for v in ref2.trainable_variables]
mom = [np.zeros_like(a) for a in anchor]
for e in range(epochs):
    ref2.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0)
    avg = hetsync.transport.allreduce_mean([v.value for v in ref2.trainable_variables], name=f"ref2_avg_{e}")
    for i, (v, a) in enumerate(zip(ref2.trainable_variables, avg)):
        delta = anchor[i] - a.numpy()
        mom[i] = np.float32(0.9) * mom[i] + delta
        anchor[i] = anchor[i] - np.float32(0.7) * (delta + np.float32(0.9) * mom[i])
        v.assign(anchor[i])
diff_outer = max(float(np.max(np.abs(a - c))) for a, c in zip(outer.get_weights(), ref2.get_weights()))
outer_vs_plain = max(float(np.max(np.abs(a - c))) for a, c in zip(outer.get_weights(), fed.get_weights()))
outer_spread = hetsync.transport.max_abs_difference_across_ranks(outer.trainable_variables)

half_opt = hetsync.FedAvg(keras.optimizers.SGD(0.1), fraction=0.5, syncs_per_epoch=4, seed=2)
_, half_check = wrapped_run(half_opt)
local_opt = hetsync.LocalSGD(keras.optimizers.SGD(0.1), period=5)
_, local_check = wrapped_run(local_opt)

if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"diff_outer_vs_reference": diff_outer, "outer_vs_plain": outer_vs_plain,
                   "outer_spread": outer_spread, "diff_vs_reference": diff_ref, "moved": moved, "steps_per_epoch": len(xs) // B + (len(xs) % B > 0),
                   "fed": fed_check.rows, "fed_summary": fed.optimizer.hetsync_protocol.summary_stats(),
                   "half": half_check.rows, "half_summary": half_opt.hetsync_protocol.summary_stats(),
                   "half_participants": half_opt.hetsync_protocol.participants,
                   "local": local_check.rows, "local_summary": local_opt.hetsync_protocol.summary_stats(),
                   "world_size": n}, f)
