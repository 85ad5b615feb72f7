"""Run under mpirun -np N: numerical faults and model state, on the digits data.

    python tests/jobs/nonfinite_check.py MODE PROTOCOL OUT_DIR [KEY=VALUE ...]

KEY=VALUE pairs are the protocol's arguments (parsed as the CLI does).

MODE:
  nan        rank 1's loss (so its gradients) becomes NaN at its step 5 (a NaN added to the model's
             output through a variable outside the model); every rank writes OUT_DIR/rank<R>.json
             after every step and again on error: {"step", "finite" (all its weights finite),
             "error" (the exception text or None)}. The script re-raises the error (exit status 1).
  batchnorm  a model with BatchNormalization trains 2 epochs; every rank saves its full
             ``model.get_weights()`` (trainable and non-trainable) to OUT_DIR/rank<R>.npz.
"""
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import hetsync

BAD_RANK, BAD_STEP = 1, 5

mode, protocol, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
kwargs = hetsync.protocols.parse_protocol_args(protocol, sys.argv[4:])
hetsync.init()
rank = hetsync.rank()
os.makedirs(out_dir, exist_ok=True)
ds = hetsync.data.load("digits", None, seed=0)
keras.utils.set_random_seed(0)
poison = tf.Variable(0.0, trainable=False)  # outside the model: not a weight, not averaged

layers = [keras.Input(shape=ds.input_shape), keras.layers.Flatten(), keras.layers.Dense(32)]
if mode == "batchnorm":
    layers += [keras.layers.BatchNormalization(momentum=0.5)]
layers += [keras.layers.Activation("relu"), keras.layers.Dense(ds.num_classes),
           keras.layers.Lambda(lambda t: t + poison), keras.layers.Activation("softmax")]
model = keras.Sequential(layers)
opt = hetsync.protocols.get_wrapper(protocol)(keras.optimizers.SGD(0.05), **kwargs)
model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
proto = opt.hetsync_protocol


def weights_finite():
    return bool(all(np.isfinite(w).all() for w in model.get_weights()))


def record(step, error=None):
    # written to a temporary file and renamed: a rank ended by another rank's MPI_Abort in the middle of
    # a write leaves its previous record, never an empty file
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "step": step, "finite": weights_finite(), "error": error,
                   "nonfinite_dropped": proto.step_stats().get("nonfinite_dropped")}, f)
    os.replace(path + ".tmp", path)


class Poison(keras.callbacks.Callback):
    """Rank BAD_RANK's step BAD_STEP gets a NaN output; every rank records its state after each step."""

    def __init__(self):
        super().__init__()
        self.step = 0

    def on_train_batch_begin(self, batch, logs=None):
        poison.assign(np.nan if (rank == BAD_RANK and self.step == BAD_STEP) else 0.0)

    def on_train_batch_end(self, batch, logs=None):
        record(self.step)
        self.step += 1


fit = proto.fit_data(ds.x_train, ds.y_train, 16, seed=0)
callbacks = hetsync.callbacks.standard(opt) + ([Poison()] if mode == "nan" else [])
try:
    model.fit(**fit, epochs=2 if mode == "batchnorm" else 1, callbacks=callbacks, verbose=0)
except Exception as exc:
    if mode == "nan":
        record(-1, f"{type(exc).__name__}: {exc}")
        print(f"rank {rank} stopped: {type(exc).__name__}: {str(exc)[:600]}", flush=True)
    raise
if mode == "batchnorm" and not hetsync.is_server():
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), *model.get_weights())
print(f"rank {rank} finished", flush=True)
