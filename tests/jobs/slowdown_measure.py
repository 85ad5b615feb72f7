"""Run under mpirun -np 2: measure the step time a `deterministic:1:K` scenario adds to rank 1.

Two BSP fits in one job, first without injection, then with; every rank writes its per-step
records. The test compares rank 1's measured extra step time with the delay the op applied.
"""
import sys

import keras

import hetsync

out_dir, spec = sys.argv[1], sys.argv[2]
hetsync.init()
ds = hetsync.data.load("digits", seed=0)
x, y = hetsync.data.shard(ds.x_train, ds.y_train, hetsync.rank(), hetsync.size())
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                          keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
opt = hetsync.BSP(keras.optimizers.SGD(0.05))
model.compile(opt, "sparse_categorical_crossentropy")
for name, scenario in (("none", "none"), ("slow", spec)):
    cbs = [hetsync.callbacks.Slowdown(scenario, seed=0)] + hetsync.callbacks.standard(opt) + [
        hetsync.callbacks.SyncMetrics(f"{out_dir}/{name}", opt)]
    model.fit(x, y, batch_size=192, epochs=8, verbose=0, callbacks=cbs)
