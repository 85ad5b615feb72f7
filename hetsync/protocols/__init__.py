"""Protocols, one module each, registered by their lowercase CLI name.

``bsp`` -> :func:`hetsync.protocols.bsp.BSP`. Later protocols (``rna``, ``taskalloc``,
``selsync``, ``fedavg``, ``localsgd``...) add one module and one line in :data:`WRAPPERS`.
"""
import ast
import inspect

from .base import Protocol, protocol_of, wrap
from .bsp import BSP, BSPProtocol
from .rna import RNA, RNAProtocol
from .fedavg import FedAvg, FedAvgProtocol
from .localsgd import LocalSGD, LocalSGDProtocol
from .selsync import SelSync, SelSyncProtocol
from .taskalloc import TaskAllocation, TaskAllocationProtocol

__all__ = ["Protocol", "wrap", "protocol_of", "BSP", "BSPProtocol", "WRAPPERS", "get_wrapper", "parse_protocol_args",
           "from_cli"]

#: lowercase name -> wrapper function ``(optimizer, **kwargs) -> optimizer``.
WRAPPERS = {"bsp": BSP}
WRAPPERS["rna"] = RNA
__all__ += ["RNA", "RNAProtocol"]
WRAPPERS.update({"selsync": SelSync, "fedavg": FedAvg, "localsgd": LocalSGD})
__all__ += ["SelSync", "SelSyncProtocol", "FedAvg", "FedAvgProtocol", "LocalSGD", "LocalSGDProtocol"]
WRAPPERS["taskalloc"] = TaskAllocation
__all__ += ["TaskAllocation", "TaskAllocationProtocol"]


def get_wrapper(name):
    """Return the wrapper function registered as ``name``.

    Raises:
        ValueError: unknown protocol name (the message lists the known ones).
    """
    try:
        return WRAPPERS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known protocols: {', '.join(sorted(WRAPPERS))}") from None


def parse_protocol_args(name, pairs):
    """Parse ``--protocol-arg KEY=VALUE`` strings against the wrapper's signature.

    Values are Python literals where they parse as one (``0.3``, ``True``, ``[1, 2]``), otherwise
    strings (``mode=adaptive``).

    Args:
        name: protocol name. pairs: iterable of ``"KEY=VALUE"`` strings.

    Returns:
        dict of keyword arguments.

    Raises:
        ValueError: unknown protocol, a pair without ``=``, a repeated key, or a key that the
            wrapper does not take (the message lists the keys it does take).
    """
    fn = get_wrapper(name)
    params = [p for p in inspect.signature(fn).parameters if p != "optimizer"]
    kwargs = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--protocol-arg must look like KEY=VALUE, got {pair!r}")
        if key not in params:
            allowed = ", ".join(params) if params else "(none)"
            raise ValueError(f"protocol {name!r} takes no argument {key!r}; its arguments: {allowed}")
        if key in kwargs:
            raise ValueError(f"--protocol-arg {key} given twice")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def from_cli(name, optimizer, pairs=()):
    """Wrap ``optimizer`` with the protocol ``name`` and its ``KEY=VALUE`` arguments (see
    :func:`parse_protocol_args`). Raises what the parser and the wrapper raise."""
    return get_wrapper(name)(optimizer, **parse_protocol_args(name, pairs))
