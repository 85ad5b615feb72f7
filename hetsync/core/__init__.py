"""What every protocol shares; imports no protocol, no emulation and no callback.

* :mod:`hetsync.core.protocol`: :class:`Protocol`, the life cycle and the hook set;
* :mod:`hetsync.core.config`: :class:`ProtocolConfig` and the field checks;
* :mod:`hetsync.core.wrapper`: the Keras 3 optimizer wrapper, serialization, ``load_model``;
* :mod:`hetsync.core.controls`: the step's control values written by the emulation.
"""
