"""The Keras 3 optimizer wrapper: every step of a wrapped optimizer goes through its protocol.

:func:`wrap` turns a user's Keras 3 optimizer into a protocol-aware one by subclassing its class
and overriding ``apply(grads, trainable_variables)``, the hook Keras 3 calls inside the compiled
``model.fit`` step (horovod's own Keras layer is not used: on Keras 3 it averages
nothing). The subclass is named for the protocol and the optimizer (``RNA_SGD``, ``BSP_Adam``)
and is registered with Keras serialization as ``hetsync>RNA`` (one name per protocol): its
``get_config`` adds the protocol's name and configuration, so a saved model reloaded with
:func:`load_model` (or ``keras.models.load_model`` once hetsync is imported) gets an optimizer
wrapped with the same protocol and configuration, as ``hvd.load_model`` does for horovod.

:func:`protocol_wrapper` makes a protocol's public wrapper function (``hetsync.RNA(optimizer,
probes=2, ...)``) from its configuration dataclass: the signature and the docstring's argument
list come from the dataclass fields.

Mixed precision: wrap the ``keras.optimizers.LossScaleOptimizer`` (``hetsync.BSP(
keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))``), not the other way round. The
protocol then sees unscaled gradients and the loss-scale logic runs after it (see
``_ProtocolOptimizer.apply``). Wrapping a protocol-wrapped optimizer in a LossScaleOptimizer is
refused: its skip of a non-finite step would leave the protocol's collective on one rank only.
"""
import inspect
import sys
import threading

import keras
import tensorflow as tf

from hetsync import world
from hetsync.core import step

__all__ = ["wrap", "rebind", "chosen_by", "protocol_of", "protocol_wrapper", "wrapped_class", "load_model",
           "PROTOCOL_CLASSES"]

#: protocol name (``"rna"``) -> protocol class, for every protocol with a public wrapper (filled by
#: :func:`protocol_wrapper`); used to rebuild the protocol of a saved model.
PROTOCOL_CLASSES = {}

_lock = threading.Lock()
_classes = {}  # (protocol class, optimizer class) -> wrapped class
_KEY = "hetsync"


def _class_ref(cls):
    return {"module": cls.__module__, "class_name": cls.__name__,
            "registered_name": keras.saving.get_registered_name(cls)}


def _resolve_class(ref, custom_objects=None):
    """The optimizer class of a saved wrapped optimizer: registered (or in custom_objects), public in
    ``keras.optimizers``, or already imported."""
    cls = keras.saving.get_registered_object(ref.get("registered_name"), custom_objects=custom_objects)
    if cls is None and custom_objects:
        cls = custom_objects.get(ref.get("class_name"))
    if cls is None:
        cls = getattr(keras.optimizers, ref.get("class_name", ""), None)
    if cls is None and ref.get("module") in sys.modules:
        cls = getattr(sys.modules[ref["module"]], ref.get("class_name", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)):
        raise ValueError(f"hetsync.load_model: cannot find the optimizer class {ref.get('class_name')!r} "
                         f"(module {ref.get('module')!r}) of the saved wrapped optimizer; pass it in custom_objects")
    return cls


class _ProtocolOptimizer:
    """Mixin placed before the user's optimizer class; routes ``apply`` through the protocol and
    carries the protocol in the optimizer's config."""

    #: the protocol class and the wrapped optimizer class of this class (set on each subclass).
    hetsync_protocol_class = hetsync_optimizer_class = None

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        base_apply = super().apply
        grads = list(grads)
        if isinstance(self, keras.optimizers.LossScaleOptimizer):
            # Mixed precision with loss scaling: Keras computed the gradients of the *scaled* loss. The
            # protocol sees true gradients (divided by this rank's current scale, a power of two, so
            # exactly), and what it applies is scaled back before LossScaleOptimizer.apply, which
            # unscales it again, skips a non-finite step and adapts the scale. So values averaged
            # across ranks never mix scales (RNA, SelSync's gradient norms), and a step with an
            # inf/nan on any rank under BSP is skipped on every rank (the average carries it).
            if not self.built:
                self.build(variables)
            scale = tf.convert_to_tensor(self.dynamic_scale.value)
            grads = [None if g is None else g / tf.cast(scale, g.dtype) for g in grads]

            def local_apply(g, v):
                return base_apply([None if x is None else x * tf.cast(scale, x.dtype) for x in g], v)
        else:
            def local_apply(g, v):
                return base_apply(g, v)
        return step.run(self.hetsync_protocol, grads, variables, local_apply)

    def get_config(self):
        config = super().get_config()
        proto = self.hetsync_protocol
        config[_KEY] = {"protocol": proto.name, "config": proto.config(),
                        "optimizer": _class_ref(self.hetsync_optimizer_class)}
        if getattr(self, "hetsync_chosen_by", None) is not None:
            config[_KEY]["chosen_by"] = self.hetsync_chosen_by
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        spec = config.pop(_KEY, None)
        if spec is None:
            return super().from_config(config, custom_objects=custom_objects)
        proto_cls = PROTOCOL_CLASSES.get(spec.get("protocol"))
        if proto_cls is None:
            raise ValueError(f"hetsync.load_model: the saved optimizer was wrapped by protocol {spec.get('protocol')!r}, "
                             f"which this hetsync does not have (known: {', '.join(sorted(PROTOCOL_CLASSES))})")
        target = wrapped_class(proto_cls, _resolve_class(spec["optimizer"], custom_objects))
        optimizer = super(_ProtocolOptimizer, target).from_config(config, custom_objects=custom_objects)
        _attach(optimizer, proto_cls(proto_cls.Config(**spec["config"])))
        optimizer.hetsync_chosen_by = spec.get("chosen_by")
        return optimizer


def wrapped_class(protocol_cls, optimizer_cls):
    """Return the wrapped optimizer class of a protocol and an optimizer class (created once, cached).

    The class is a subclass of ``optimizer_cls`` named ``<display_name>_<optimizer class name>``
    (e.g. ``RNA_SGD``) and registered with Keras serialization as ``hetsync><display_name>``.

    Args:
        protocol_cls: a :class:`hetsync.core.protocol.Protocol` subclass.
        optimizer_cls: a ``keras.optimizers.Optimizer`` subclass.

    Returns:
        the class.
    """
    key = (protocol_cls, optimizer_cls)
    with _lock:
        cls = _classes.get(key)
        if cls is None:
            if issubclass(optimizer_cls, _ProtocolOptimizer):
                raise ValueError(f"{optimizer_cls.__name__} is already a hetsync-wrapped optimizer class")
            name = f"{protocol_cls.display_name}_{optimizer_cls.__name__}"
            cls = type(name, (_ProtocolOptimizer, optimizer_cls),
                       {"__module__": __name__, "__qualname__": name, "hetsync_protocol_class": protocol_cls,
                        "hetsync_optimizer_class": optimizer_cls})
            keras.saving.register_keras_serializable(package=_KEY, name=protocol_cls.display_name)(cls)
            _classes[key] = cls
        return cls


def _attach(optimizer, protocol):
    optimizer.hetsync_protocol = protocol
    protocol.attach(optimizer)


def wrap(optimizer, protocol):
    """Return a copy of a Keras 3 optimizer whose every step goes through ``protocol``.

    The copy is an instance of :func:`wrapped_class` (a subclass of the optimizer's own class,
    built with ``from_config(optimizer.get_config())``), so learning rate, schedules and slots
    behave as the user configured them. The protocol is reachable as ``optimizer.hetsync_protocol``.

    Args:
        optimizer: a ``keras.optimizers.Optimizer`` instance (Keras 3), not yet used.
        protocol: a :class:`hetsync.core.protocol.Protocol` instance, not yet attached.

    Returns:
        keras.optimizers.Optimizer.

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance (for example a string, a
            class, a learning rate or a schedule).
        ValueError: the optimizer is already wrapped by a hetsync protocol.
        RuntimeError: hetsync not initialised, or an MPI-only protocol under Gloo.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"hetsync.{protocol.display_name} wraps a Keras 3 optimizer instance such as "
            f"keras.optimizers.SGD(learning_rate=0.1); got {type(optimizer).__name__}: {optimizer!r}"
        )
    if getattr(optimizer, "hetsync_protocol", None) is not None:
        raise ValueError(f"optimizer is already wrapped by hetsync protocol {optimizer.hetsync_protocol.name!r}")
    cls = wrapped_class(type(protocol), type(optimizer))
    wrapped = super(_ProtocolOptimizer, cls).from_config(optimizer.get_config())
    _attach(wrapped, protocol)
    return wrapped


def rebind(optimizer, protocol, chosen_by=None):
    """Switch a wrapped optimizer to another protocol between two training steps (:func:`hetsync.Auto`'s switch).

    The optimizer keeps its variables, slots, learning rate and iteration count; it becomes an instance of
    the new protocol's wrapped class (``Auto_SGD`` becomes ``RNA_SGD``: same base optimizer class, same
    layout), ``protocol`` is attached to it (:meth:`hetsync.core.protocol.Protocol.attach`: roles, statistics,
    :meth:`~hetsync.core.protocol.Protocol.build`), and ``chosen_by`` is saved with the model beside the
    protocol (``get_config``), so :func:`load_model` restores the new protocol and keeps the record. The
    compiled train step still holds the old protocol's step: the caller rebuilds it
    (``model.make_train_function(force=True)``, from a training hook, before the next step); the callbacks
    find the new protocol through the optimizer.

    Args:
        optimizer: an optimizer wrapped by a hetsync protocol.
        protocol: a :class:`hetsync.core.protocol.Protocol` instance, not yet attached.
        chosen_by: JSON-serialisable dict or None: why this protocol (saved with the model, read by
            :func:`chosen_by`).

    Returns:
        ``optimizer`` (the same object).

    Raises:
        TypeError: ``optimizer`` is not hetsync-wrapped.
        ValueError: ``protocol`` is already attached to an optimizer.
        RuntimeError: what :meth:`~hetsync.core.protocol.Protocol.attach` raises (an MPI-only protocol under Gloo).
    """
    protocol_of(optimizer)
    if protocol.optimizer is not None:
        raise ValueError(f"hetsync.rebind: protocol {protocol.name!r} is already attached to an optimizer")
    optimizer.__class__ = wrapped_class(type(protocol), optimizer.hetsync_optimizer_class)
    _attach(optimizer, protocol)
    optimizer.hetsync_chosen_by = chosen_by
    return optimizer


def chosen_by(optimizer):
    """Return the record of why the optimizer's protocol was chosen (dict), or None if it was not switched.

    Set by :func:`rebind` (:func:`hetsync.Auto`'s choice) and restored by :func:`load_model`.

    Raises:
        TypeError: ``optimizer`` is not hetsync-wrapped.
    """
    protocol_of(optimizer)
    return getattr(optimizer, "hetsync_chosen_by", None)


def protocol_of(optimizer):
    """Return the :class:`hetsync.core.protocol.Protocol` of a wrapped optimizer.

    Raises:
        TypeError: ``optimizer`` was not wrapped by a hetsync protocol.
    """
    proto = getattr(optimizer, "hetsync_protocol", None)
    if proto is None:
        raise TypeError(f"{optimizer!r} is not a hetsync-wrapped optimizer; wrap it with e.g. hetsync.BSP(optimizer)")
    return proto


def protocol_wrapper(protocol_cls, doc):
    """Make a protocol's public wrapper function from its configuration dataclass.

    The function is ``<display_name>(optimizer, <every Config field, with its default>)``; it
    binds its arguments like a normal function (positional or keyword; an unknown one is a
    TypeError), builds the frozen ``Config`` (which validates them) and returns
    ``wrap(optimizer, protocol_cls(config))``. Its ``__signature__`` is built from the fields,
    and ``{args}`` in ``doc`` is replaced by the fields' documentation. Registers the protocol in
    :data:`PROTOCOL_CLASSES` (for :func:`load_model`).

    Args:
        protocol_cls: the Protocol subclass (with ``name``, ``display_name`` and ``Config``).
        doc: str, the wrapper's docstring with an ``{args}`` placeholder in its Args section.

    Returns:
        the wrapper function.
    """
    fields = protocol_cls.Config.field_names()
    params = [inspect.Parameter("optimizer", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    defaults = {f.name: f.default for f in protocol_cls.Config.__dataclass_fields__.values()}
    params += [inspect.Parameter(f, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults[f]) for f in fields]
    signature = inspect.Signature(params)

    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        optimizer = arguments.pop("optimizer")
        return wrap(optimizer, protocol_cls(protocol_cls.Config(**arguments)))

    wrapper.__signature__ = signature
    wrapper.__name__ = wrapper.__qualname__ = protocol_cls.display_name
    wrapper.__module__ = protocol_cls.__module__
    wrapper.__doc__ = doc.replace("{args}", protocol_cls.Config.describe_args().lstrip())
    wrapper.protocol_class = protocol_cls
    PROTOCOL_CLASSES[protocol_cls.name] = protocol_cls
    wrapped_class(protocol_cls, keras.optimizers.SGD)  # registers hetsync><display_name> at import time
    return wrapper


def load_model(filepath, custom_objects=None, compile=True, safe_mode=True):
    """Load a Keras model saved with a hetsync-wrapped optimizer, re-wrapping it (like ``hvd.load_model``).

    The optimizer of the loaded model is an instance of the same wrapped class (e.g. ``RNA_SGD``)
    with a new protocol of the same name and configuration (``opt.hetsync_protocol.config()``
    equals the saved one) and the saved optimizer state; a fresh protocol has no statistics yet.
    Call :func:`hetsync.init` first (the protocol is attached to this process's world).

    Args:
        filepath: str or path of a ``.keras`` file (``model.save``).
        custom_objects: optional dict of the model's custom objects; include the class of a
            custom (non-Keras) base optimizer here.
        compile: bool, restore the optimizer (and loss, metrics) as saved. safe_mode: bool, as Keras.

    Returns:
        keras.Model.

    Raises:
        RuntimeError: hetsync not initialised (the protocol cannot attach).
        ValueError: the saved protocol or optimizer class is unknown (the message says which).
    """
    if not world.is_initialized():
        raise RuntimeError("hetsync.load_model: call hetsync.init() first (the reloaded optimizer's protocol "
                           "attaches to this process's world)")
    return keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile, safe_mode=safe_mode)
