"""The one table of protocol timing models: protocol name -> the function that simulates it.

Every model takes the same three inputs, :class:`hetsync.sim.workload.StepTimes` (device times of the
workers), :class:`hetsync.sim.network.Network` (every rank of the launch, servers included) and
:class:`hetsync.sim.workload.Workload`, plus the protocol's own timing parameters under the names of
its configuration (``period`` for local SGD, ``backup_workers`` for Hop, ``servers`` for the parameter
servers, ...), and returns a :class:`hetsync.sim.result.SimResult`. The names are those of
:mod:`hetsync.protocols` (``hetsync.protocols.REGISTRY``), so a prediction and a launch speak of the same thing.
"""
import importlib

__all__ = ["MODELS", "SERVER_PROTOCOLS", "simulate", "names"]

#: protocol name -> (module, function, fixed keyword arguments).
MODELS = {
    "bsp": ("hetsync.sim.bsp", "simulate", {}),
    "rna": ("hetsync.sim.rna", "simulate", {"protocol": "rna"}),
    "rnah": ("hetsync.sim.rna", "simulate", {"protocol": "rnah"}),
    "hop": ("hetsync.sim.hop", "simulate_cluster", {"protocol": "hop"}),
    "notifyack": ("hetsync.sim.hop", "simulate_cluster", {"protocol": "notifyack"}),
    "asp": ("hetsync.sim.ps", "simulate", {"protocol": "asp"}),
    "shat": ("hetsync.sim.ps", "simulate", {"protocol": "shat"}),
    "shatroot": ("hetsync.sim.ps", "simulate", {"protocol": "shatroot"}),
    "ensemble": ("hetsync.sim.ps", "simulate", {"protocol": "ensemble"}),
    "ssp": ("hetsync.sim.ps", "simulate", {"protocol": "ssp"}),
    "localsgd": ("hetsync.sim.local", "simulate", {"protocol": "localsgd"}),
    "fedavg": ("hetsync.sim.local", "simulate", {"protocol": "fedavg"}),
    "selsync": ("hetsync.sim.local", "simulate", {"protocol": "selsync"}),
    "taskalloc": ("hetsync.sim.taskalloc", "simulate", {}),
}

#: protocols whose launch holds parameter-server ranks besides the workers (their ``servers`` argument).
SERVER_PROTOCOLS = ("asp", "shat", "shatroot", "ensemble", "ssp", "rnah")


def names():
    """The protocols a timing model exists for (list of str, sorted)."""
    return sorted(MODELS)


def simulate(protocol, times, net, work, **config):
    """Simulate one protocol.

    Args:
        protocol: str, a name of :data:`MODELS`.
        times: :class:`hetsync.sim.workload.StepTimes` [K, workers] milliseconds.
        net: :class:`hetsync.sim.network.Network` over every rank of the launch (workers, then servers).
        work: :class:`hetsync.sim.workload.Workload`.
        **config: the protocol's timing parameters (names of its configuration dataclass).

    Returns:
        :class:`hetsync.sim.result.SimResult`.

    Raises:
        ValueError: an unknown protocol (names the known ones), or a parameter the model does not know.
    """
    if protocol not in MODELS:
        raise ValueError(f"no timing model for protocol {protocol!r}; known: {', '.join(names())}")
    module, fn, fixed = MODELS[protocol]
    return getattr(importlib.import_module(module), fn)(times, net, work, **fixed, **config)
