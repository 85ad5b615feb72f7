"""Run under mpirun -np N: horovod's collectives on Gloo with point-to-point traffic on MPI.

    python tests/jobs/gloo_over_mpi_check.py OUT.json

Only rank 0 sets ``HETSYNC_COLLECTIVES=gloo`` (as mpirun leaves a variable on the launching host unless told
``-x``): every rank must follow rank 0. Then closed-form allreduces (sum, max) on horovod, a ring of tagged
messages on the point-to-point dispatcher, and two epochs of BSP from different initial weights (equal weights after).
Rank 0 writes what every rank saw to OUT.
"""
import json
import os
import sys

if os.environ.get("OMPI_COMM_WORLD_RANK") == "0":
    os.environ["HETSYNC_COLLECTIVES"] = "gloo"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hetsync  # noqa: E402
from hetsync import transport, world  # noqa: E402

hetsync.init()
import horovod.tensorflow as hvd  # noqa: E402

rank, n = hetsync.rank(), hetsync.size()
res = {"rank": rank, "size": n, "mode": hetsync.launch_mode(), "collectives": world.collectives(),
       "gloo": bool(hvd.gloo_enabled()), "mpi_p2p": world.mpi_enabled()}
res["sum"] = float(transport.allreduce_sum([np.array([rank + 1.0], np.float32)], name="gloo_check_sum")[0][0])
res["max"] = transport.allreduce_max([np.array([rank + 1.0, -rank], np.float64)],
                                    name="gloo_check_max")[0].numpy().tolist()
p2p = transport.dispatcher()
for i in range(5):
    p2p.send((rank + 1) % n, "ring", {"from": rank, "i": i}, tag=i)
res["ring"] = [p2p.recv("ring", source=(rank - 1) % n, tag=i, timeout_s=60).obj for i in range(5)]
ds = hetsync.data.load("digits", seed=0)
x, y = hetsync.data.shard(ds.x_train, ds.y_train, rank, n)
keras.utils.set_random_seed(rank)  # different initial weights: the broadcast must fix them
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
opt = hetsync.BSP(keras.optimizers.SGD(0.1))
model.compile(opt, "sparse_categorical_crossentropy")
model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=hetsync.callbacks.standard(opt))
res["weights_diff"] = transport.max_abs_difference_across_ranks(model.trainable_variables)
rows = p2p.gather_at(0, list(range(n)), "gather", "gathered", res, timeout_s=60)
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f)
hetsync.shutdown()
