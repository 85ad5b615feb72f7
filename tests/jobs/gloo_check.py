"""Run under horovodrun --gloo -np 2: BSP works on Gloo; an MPI-only protocol is refused clearly."""
import json
import sys

import keras

import hetsync
from hetsync.core.protocol import Capabilities
from hetsync.protocols import Protocol, wrap


class NeedsMPI(Protocol):
    name = "needs-mpi"
    capabilities = Capabilities(requires_mpi=True)


hetsync.init()
result = {"mode": hetsync.launch_mode(), "size": hetsync.size()}
try:
    wrap(keras.optimizers.SGD(0.1), NeedsMPI())
except RuntimeError as exc:
    result["mpi_error"] = str(exc)
ds = hetsync.data.load("digits", seed=0)
x, y = hetsync.data.shard(ds.x_train, ds.y_train, hetsync.rank(), hetsync.size())
keras.utils.set_random_seed(hetsync.rank())  # different initial weights: the broadcast must fix them
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
opt = hetsync.BSP(keras.optimizers.SGD(0.1))
model.compile(opt, "sparse_categorical_crossentropy")
model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=hetsync.callbacks.standard(opt))
result["weights_diff"] = hetsync.transport.max_abs_difference_across_ranks(model.trainable_variables)
if hetsync.rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
