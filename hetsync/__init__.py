"""hetsync: data-parallel training for heterogeneous clusters, as TensorFlow/Keras 3 optimizer wrappers.

Launch with ``horovodrun --mpi -np N python script.py``; in the script::

    import hetsync
    hetsync.init()
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))            # or another protocol
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=hetsync.callbacks.standard(opt))
    model.save("model.keras"); model = hetsync.load_model("model.keras")  # same protocol and config

Layout (the architecture page of the documentation has the rules of what may import what):
``hetsync.world`` (launch, rank, size), ``hetsync.roles`` (workers and servers), ``hetsync.errors``
(every exception), ``hetsync.transport`` (horovod collectives, point-to-point dispatcher),
``hetsync.ops`` (compiled op library), ``hetsync.core`` (what every protocol shares),
``hetsync.protocols`` (one folder per family, the registry), ``hetsync.data`` (data sets, shards,
the sample pool), ``hetsync.emulation`` (heterogeneity scenarios, faults), ``hetsync.callbacks``
(Keras callbacks), ``hetsync.sim`` (TF-free simulators), ``hetsync.advise`` (which protocol for this
cluster; ``hetsync.Auto`` chooses during training), ``hetsync.bench`` (the training job and benchmarks).

Importing hetsync loads no TensorFlow and changes no process-wide setting: names are resolved on
first use, and ``init()`` sets horovod's stall timeout and OpenMPI's yield when oversubscribed, and
reports an uncaught non-finite stop in one line. ``hetsync.quiet_startup()``, called by a script before
it imports TensorFlow, hides TensorFlow's start-up lines (``HETSYNC_VERBOSE=1`` keeps them).
"""
import importlib

__version__ = "0.1.0"

_WORLD = ("init", "rank", "size", "local_rank", "local_size", "launch_mode", "mpi_enabled", "shutdown",
          "quiet_startup")
_ROLES = ("num_workers", "num_servers", "is_server", "worker_rank", "role")
_PROTOCOLS = ("BSP", "RNA", "SelSync", "FedAvg", "LocalSGD", "TaskAllocation", "Hop", "NotifyAck", "Protocol",
              "ASP", "SHAT", "SHATRoot", "Ensemble", "SSP", "HierarchicalRNA", "load_model")
_SUBMODULES = ("world", "roles", "errors", "transport", "ops", "core", "protocols", "data", "emulation", "callbacks",
               "sim", "advise", "bench")

_EXPORTS = {**{n: "hetsync.world" for n in _WORLD}, **{n: "hetsync.roles" for n in _ROLES},
            **{n: "hetsync.protocols" for n in _PROTOCOLS}, "Auto": "hetsync.advise.auto"}

__all__ = list(_WORLD + _ROLES + _PROTOCOLS + ("Auto",) + _SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"hetsync.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hetsync' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
