"""Run as one process (or under mpirun): BSP fits on the emulated device, one per scenario.

Usage: emulated_device.py OUT_DIR SPEC [SPEC ...]. Each SPEC gets one 1-epoch fit of 12 steps of 32
digits on a small CNN, with SyncMetrics writing OUT_DIR/<i>/ (per-step records and summary.json).
The test reads the step times and the overrun counts back.
"""
import os
import sys

import keras

import hetsync

out_dir, specs = sys.argv[1], sys.argv[2:]
hetsync.init()
ds = hetsync.data.load("digits", seed=0)
x, y = hetsync.data.shard(ds.x_train, ds.y_train, hetsync.rank(), hetsync.size())
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                          keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
opt = hetsync.BSP(keras.optimizers.SGD(0.05))
model.compile(opt, "sparse_categorical_crossentropy")
for i, spec in enumerate(specs):
    fit_data = opt.hetsync_protocol.fit_data(x, y, 32, seed=0)
    fit_data["steps_per_epoch"] = min(12, fit_data["steps_per_epoch"])
    cbs = [hetsync.callbacks.Slowdown(spec, seed=0)] + hetsync.callbacks.standard(opt) + [
        hetsync.callbacks.SyncMetrics(os.path.join(out_dir, str(i)), opt)]
    model.fit(**fit_data, epochs=1, verbose=0, callbacks=cbs)
