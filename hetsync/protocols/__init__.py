"""The protocols, one folder per family, and the one registry of their CLI names.

=============  ===========================  ==================================================================
family         CLI names                    module
=============  ===========================  ==================================================================
BSP            ``bsp``                      :mod:`hetsync.protocols.bsp`
local          ``localsgd fedavg selsync``  :mod:`hetsync.protocols.local` (periodic averaging, SelSync)
RNA            ``rna rnah``                 :mod:`hetsync.protocols.rna` (partial allreduce, groups)
Hop            ``hop notifyack``            :mod:`hetsync.protocols.hop` (queues, graphs)
PS             ``asp shat shatroot          :mod:`hetsync.protocols.ps` (parameter servers, SSP)
               ensemble ssp``
task alloc.    ``taskalloc``                :mod:`hetsync.protocols.taskalloc`
=============  ===========================  ==================================================================

Each protocol declares its parameters once (a frozen ``Config`` dataclass,
:class:`hetsync.core.config.ProtocolConfig`), its update rule (a :class:`hetsync.core.protocol.Protocol`
subclass) and its public wrapper made from both (:func:`hetsync.core.wrapper.protocol_wrapper`). A new
protocol adds one module and one line in :data:`REGISTRY`.

Importing this package loads no TensorFlow: the registry names modules, and a protocol's module is
imported the first time its wrapper, class or configuration is asked for (so the TF-free parts of a
family, such as :mod:`hetsync.protocols.hop.graph`, can be used by the simulators).
"""
import collections.abc
import importlib

__all__ = ["REGISTRY", "SELECTORS", "WRAPPERS", "get_wrapper", "get_config_class", "parse_protocol_args", "from_cli", "describe",
           "load_all", "load_model"]

#: CLI name -> (module, wrapper name, one-line description). The one registry.
REGISTRY = {
    "bsp": ("hetsync.protocols.bsp", "BSP", "bulk-synchronous: averaged allreduce of the gradients every step"),
    "rna": ("hetsync.protocols.rna.protocol", "RNA",
            "randomized partial allreduce started by an initiator, with a gradient cache"),
    "rnah": ("hetsync.protocols.rna.hierarchical", "HierarchicalRNA",
             "RNA inside speed groups, groups joined through parameter servers"),
    "selsync": ("hetsync.protocols.local.selsync", "SelSync",
                "local steps, synchronizing only when the relative gradient change exceeds delta"),
    "fedavg": ("hetsync.protocols.local.fedavg", "FedAvg",
               "federated averaging: a random fraction of ranks averages every H local steps"),
    "localsgd": ("hetsync.protocols.local.localsgd", "LocalSGD", "local SGD: parameter averaging every H steps"),
    "taskalloc": ("hetsync.protocols.taskalloc.protocol", "TaskAllocation",
                  "per-rank workloads proportional to speed, weighted gradient average"),
    "hop": ("hetsync.protocols.hop.protocol", "Hop",
            "decentralized training with update and token queues, backup workers, staleness, skipping"),
    "notifyack": ("hetsync.protocols.hop.notifyack", "NotifyAck",
                  "NOTIFY-ACK, the conservative decentralized baseline of the Hop paper"),
    "asp": ("hetsync.protocols.ps.shat", "ASP", "asynchronous parallel SGD on parameter servers (alpha = 1)"),
    "shat": ("hetsync.protocols.ps.shat", "SHAT", "asynchronous parameter servers with staleness-aware mixing"),
    "ensemble": ("hetsync.protocols.ps.shat", "Ensemble", "ENSEMBLE baseline: local training only (alpha = 0), models combined at the end"),
    "shatroot": ("hetsync.protocols.ps.shat", "SHATRoot", "SHAT-root: staleness-aware mixing with alpha = 1 - s / sqrt(n)"),
    "ssp": ("hetsync.protocols.ps.ssp", "SSP", "stale-synchronous parallel parameter server (bounded staleness)"),
}

#: names that select a protocol rather than being one (``--protocol auto``): name -> (module, wrapper name,
#: description). :func:`get_wrapper`, :func:`get_config_class`, :func:`parse_protocol_args`, :func:`from_cli` and
#: :func:`describe` take them; :data:`WRAPPERS` (the protocols a benchmark compares) does not hold them.
SELECTORS = {
    "auto": ("hetsync.advise.auto", "Auto",
             "BSP for a warm-up, then the protocol the advisor predicts reaches the target soonest"),
}

# public names of the family modules, resolved on first use (hetsync.protocols.RNAProtocol, ...)
_FAMILY_EXPORTS = {
    "hetsync.protocols.bsp": ("BSP", "BSPConfig", "BSPProtocol"),
    "hetsync.protocols.rna.protocol": ("RNA", "RNAConfig", "RNAProtocol"),
    "hetsync.protocols.rna.hierarchical": ("HierarchicalRNA", "HierarchicalRNAConfig", "HierarchicalRNAProtocol"),
    "hetsync.protocols.local.selsync": ("SelSync", "SelSyncConfig", "SelSyncProtocol"),
    "hetsync.protocols.local.fedavg": ("FedAvg", "FedAvgConfig", "FedAvgProtocol"),
    "hetsync.protocols.local.localsgd": ("LocalSGD", "LocalSGDConfig", "LocalSGDProtocol"),
    "hetsync.protocols.taskalloc.protocol": ("TaskAllocation", "TaskAllocationConfig", "TaskAllocationProtocol"),
    "hetsync.protocols.hop.protocol": ("Hop", "HopConfig", "HopProtocol"),
    "hetsync.protocols.hop.notifyack": ("NotifyAck", "NotifyAckConfig", "NotifyAckProtocol"),
    "hetsync.protocols.ps.worker": ("PSConfig", "PSProtocol"),
    "hetsync.protocols.ps.shat": ("ASP", "ASPConfig", "ASPProtocol", "SHAT", "SHATConfig", "SHATProtocol", "SHATRoot",
                                  "SHATRootConfig", "SHATRootProtocol", "Ensemble", "EnsembleConfig",
                                  "EnsembleProtocol", "shat_alpha"),
    "hetsync.protocols.ps.ssp": ("SSP", "SSPConfig", "SSPProtocol"),
    "hetsync.core.protocol": ("Protocol",),
    "hetsync.core.config": ("ProtocolConfig",),
    "hetsync.core.wrapper": ("wrap", "protocol_of"),
}
_EXPORTS = {name: module for module, names in _FAMILY_EXPORTS.items() for name in names}
__all__ += sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hetsync.protocols' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


class _Wrappers(collections.abc.Mapping):
    """CLI name -> wrapper function, importing a protocol's module on first access (a read-only mapping
    over :data:`REGISTRY`; iterating it loads nothing)."""

    def __getitem__(self, name):
        module, attr, _ = REGISTRY[name]
        return getattr(importlib.import_module(module), attr)

    def __iter__(self):
        return iter(REGISTRY)

    def __len__(self):
        return len(REGISTRY)

    def __repr__(self):
        return f"WRAPPERS({', '.join(REGISTRY)})"


#: CLI name -> wrapper function ``(optimizer, **config fields) -> optimizer`` (lazy).
WRAPPERS = _Wrappers()


def describe(name):
    """The one-line description (str) of the protocol registered as ``name``.

    Raises:
        ValueError: unknown protocol name (the message lists the known ones).
    """
    return _entry(name)[2]


def _entry(name):
    entry = REGISTRY.get(name) or SELECTORS.get(name)
    if entry is None:
        raise ValueError(f"unknown protocol {name!r}; known protocols: {', '.join(sorted(REGISTRY))} "
                         f"(and {', '.join(sorted(SELECTORS))}, which chooses one)")
    return entry


def get_wrapper(name):
    """Return the wrapper function registered as ``name`` in :data:`REGISTRY` or :data:`SELECTORS` (imports its
    module).

    Raises:
        ValueError: unknown protocol name (the message lists the known ones).
    """
    module, attr, _ = _entry(name)
    return getattr(importlib.import_module(module), attr)


def get_config_class(name):
    """Return the configuration dataclass of the protocol registered as ``name``.

    Raises:
        ValueError: unknown protocol name.
    """
    return get_wrapper(name).protocol_class.Config


def load_all():
    """Import every registered protocol's module and every selector's (registers their serialization names
    with Keras: a model saved by ``hetsync.Auto`` before its switch is ``hetsync>Auto``).

    Returns:
        dict CLI name -> wrapper function (the registry's protocols, not the selectors).
    """
    for name in SELECTORS:
        get_wrapper(name)
    return {name: WRAPPERS[name] for name in REGISTRY}


def parse_protocol_args(name, pairs):
    """Parse ``--protocol-arg KEY=VALUE`` strings against the protocol's configuration dataclass.

    Each value is converted to its field's type (:meth:`hetsync.core.config.ProtocolConfig.parse_arg`:
    ``probes=2`` an int, ``delta=0.3`` a float, ``scale_lr=True`` a bool, ``mode=adaptive`` a
    str, ``weights=[3, 1]`` a list, ``micro_batch=None`` None); ranges are checked when the
    wrapper builds the configuration.

    Args:
        name: str protocol name. pairs: iterable of ``"KEY=VALUE"`` strings.

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


def load_model(filepath, custom_objects=None, compile=True, safe_mode=True):
    """Load a Keras model saved with a hetsync-wrapped optimizer, re-wrapped with the same protocol and
    configuration (as ``hvd.load_model``); see :func:`hetsync.core.wrapper.load_model` for the arguments,
    the return value and the errors. Imports every registered protocol first, so that every saved
    class name (``hetsync>RNA``, ...) resolves."""
    from hetsync.core import wrapper

    load_all()
    return wrapper.load_model(filepath, custom_objects=custom_objects, compile=compile, safe_mode=safe_mode)
