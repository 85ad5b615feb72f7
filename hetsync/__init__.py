"""hetsync: data-parallel training for heterogeneous clusters, as TensorFlow/Keras 3 optimizer wrappers.

Launch with ``horovodrun --mpi -np N python script.py``; in the script::

    import hetsync
    hetsync.init()
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))            # or another protocol
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=hetsync.callbacks.standard(opt))
    model.save("model.keras"); model = hetsync.load_model("model.keras")  # same protocol and config

Layout: ``hetsync.ops`` (compiled op library), ``hetsync.transport`` (horovod collectives and the
point-to-point dispatcher), ``hetsync.protocols.<name>`` (one module per protocol),
``hetsync.callbacks`` (Keras callbacks), ``hetsync.slowdown`` (straggler scenarios),
``hetsync.data`` (data sets). Importing hetsync changes no process-wide setting; ``init()`` does
(horovod's stall timeout, OpenMPI's yield when oversubscribed).
"""
from . import callbacks, data, ops, partition, protocols, slowdown, transport
from .protocols import RNA, BSP, FedAvg, Hop, LocalSGD, NotifyAck, Protocol, SelSync, TaskAllocation, load_model
from .runtime import init, launch_mode, local_rank, local_size, mpi_enabled, rank, shutdown, size

__version__ = "0.1.0"

__all__ = [
    "init", "rank", "size", "local_rank", "local_size", "launch_mode", "mpi_enabled", "shutdown", "load_model",
    "BSP", "RNA", "SelSync", "FedAvg", "LocalSGD", "TaskAllocation", "Hop", "NotifyAck", "Protocol",
    "callbacks", "data", "ops", "partition", "protocols", "slowdown", "transport",
]
