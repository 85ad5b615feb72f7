"""Protocols, one module each, registered by their lowercase CLI name.

Each protocol module declares its parameters once (a frozen ``Config`` dataclass,
:mod:`hetsync.protocols.config`), its update rule (a :class:`Protocol` subclass) and its public
wrapper made from both by :func:`hetsync.protocols.wrapper.protocol_wrapper`. ``bsp`` ->
:func:`hetsync.protocols.bsp.BSP`; a new protocol adds one module and one entry in :data:`WRAPPERS`.
"""
from . import allocation
from .base import Protocol
from .bsp import BSP, BSPConfig, BSPProtocol
from .config import ProtocolConfig
from .fedavg import FedAvg, FedAvgConfig, FedAvgProtocol
from .hop import Hop, HopConfig, HopProtocol
from .localsgd import LocalSGD, LocalSGDConfig, LocalSGDProtocol
from .notifyack import NotifyAck, NotifyAckConfig, NotifyAckProtocol
from .rna import RNA, RNAConfig, RNAProtocol
from .selsync import SelSync, SelSyncConfig, SelSyncProtocol
from .taskalloc import TaskAllocation, TaskAllocationConfig, TaskAllocationProtocol
from .wrapper import load_model, protocol_of, wrap

__all__ = ["Protocol", "ProtocolConfig", "wrap", "protocol_of", "load_model", "WRAPPERS", "get_wrapper",
           "get_config_class", "parse_protocol_args", "from_cli", "allocation",
           "BSP", "BSPProtocol", "BSPConfig", "RNA", "RNAProtocol", "RNAConfig",
           "SelSync", "SelSyncProtocol", "SelSyncConfig", "FedAvg", "FedAvgProtocol", "FedAvgConfig",
           "LocalSGD", "LocalSGDProtocol", "LocalSGDConfig",
           "TaskAllocation", "TaskAllocationProtocol", "TaskAllocationConfig", "Hop", "HopProtocol", "HopConfig",
           "NotifyAck", "NotifyAckProtocol", "NotifyAckConfig"]

#: lowercase name -> wrapper function ``(optimizer, **config fields) -> optimizer``.
WRAPPERS = {"bsp": BSP, "rna": RNA, "selsync": SelSync, "fedavg": FedAvg, "localsgd": LocalSGD,
            "taskalloc": TaskAllocation, "hop": Hop, "notifyack": NotifyAck}


def get_wrapper(name):
    """Return the wrapper function registered as ``name``.

    Raises:
        ValueError: unknown protocol name (the message lists the known ones).
    """
    try:
        return WRAPPERS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known protocols: {', '.join(sorted(WRAPPERS))}") from None


def get_config_class(name):
    """Return the configuration dataclass of the protocol registered as ``name``.

    Raises:
        ValueError: unknown protocol name.
    """
    return get_wrapper(name).protocol_class.Config


def parse_protocol_args(name, pairs):
    """Parse ``--protocol-arg KEY=VALUE`` strings against the protocol's configuration dataclass.

    Each value is converted to its field's type (:meth:`hetsync.protocols.config.ProtocolConfig.parse_arg`:
    ``probes=2`` an int, ``delta=0.3`` a float, ``scale_lr=True`` a bool, ``mode=adaptive`` a
    str, ``weights=[3, 1]`` a list, ``micro_batch=None`` None); ranges are checked when the
    wrapper builds the configuration.

    Args:
        name: protocol name. pairs: iterable of ``"KEY=VALUE"`` strings.

    Returns:
        dict of keyword arguments.

    Raises:
        ValueError: unknown protocol, a pair without ``=``, a repeated key, a key that is not a
            field (the message lists the fields), or a value not of the field's type.
    """
    config_cls = get_config_class(name)
    kwargs = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--protocol-arg must look like KEY=VALUE, got {pair!r}")
        if key in kwargs:
            raise ValueError(f"--protocol-arg {key} given twice")
        try:
            kwargs[key] = config_cls.parse_arg(key, value)
        except ValueError as exc:
            raise ValueError(str(exc).replace(f"protocol {config_cls.owner} ", f"protocol {name!r} ", 1)) from None
    return kwargs


def from_cli(name, optimizer, pairs=()):
    """Wrap ``optimizer`` with the protocol ``name`` and its ``KEY=VALUE`` arguments (see
    :func:`parse_protocol_args`). Raises what the parser and the wrapper raise."""
    return get_wrapper(name)(optimizer, **parse_protocol_args(name, pairs))
