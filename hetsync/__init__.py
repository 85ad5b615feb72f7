"""hetsync: data-parallel training for heterogeneous clusters, as TensorFlow/Keras 3 optimizer wrappers.

Launch with ``horovodrun --mpi -np N python script.py``; in the script::

    import hetsync
    hetsync.init()
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))            # or another protocol
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=hetsync.callbacks.standard(opt))

Layout: ``hetsync.ops`` (compiled op library), ``hetsync.transport`` (horovod collectives,
mpi4py point-to-point), ``hetsync.protocols.<name>`` (one module per protocol),
``hetsync.callbacks`` (Keras callbacks), ``hetsync.slowdown`` (straggler scenarios),
``hetsync.data`` (data sets).
"""
import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from . import callbacks, data, ops, protocols, slowdown, transport  # noqa: E402
from .protocols import BSP, Protocol  # noqa: E402
from .protocols import RNA  # noqa: E402
from .protocols import FedAvg, LocalSGD, SelSync  # noqa: E402
from .protocols import TaskAllocation  # noqa: E402
from . import partition  # noqa: E402
from .runtime import init, launch_mode, local_rank, local_size, mpi_enabled, rank, shutdown, size  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "init", "rank", "size", "local_rank", "local_size", "launch_mode", "mpi_enabled", "shutdown",
    "BSP", "Protocol", "callbacks", "data", "ops", "protocols", "slowdown", "transport",
]
__all__ += ["SelSync", "FedAvg", "LocalSGD", "partition"]
__all__ += ["TaskAllocation"]
__all__ += ["RNA"]
