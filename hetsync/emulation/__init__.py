"""The emulated heterogeneous cluster: scenarios, faults, and the callback that plays them.

* :mod:`hetsync.emulation.scenario`: the spec grammar (``device:40+random:6``, ...) and
  :class:`Scenario`, the seeded per-rank draws;
* :mod:`hetsync.emulation.components`: the parts of a scenario;
* :mod:`hetsync.emulation.faults`: pause, stall and kill faults, and the record of fired ones;
* :mod:`hetsync.emulation.callback`: :class:`Slowdown`, the Keras callback that plays a scenario.
* :mod:`hetsync.emulation.cluster`: the emulated multi-host cluster (network namespaces as hosts,
  shaped links, an sshd per host; ``hetsync-cluster``), not imported here.

No protocol imports this package: the emulation talks to the compiled step only through the step
controls (:mod:`hetsync.core.controls`). Importing it loads no TensorFlow (the callback module
excepted).
"""
from hetsync.emulation.components import (Component, DeterministicSlowdown, Device, NetDelay, OnRanks,
                                          RandomSlowdown, Speeds, UniformDelay)
from hetsync.emulation.faults import FAULT_ARITY, Fault, fired_faults
from hetsync.emulation.scenario import MAX_RANKS, Scenario, parse_spec

__all__ = ["Scenario", "parse_spec", "MAX_RANKS", "Component", "RandomSlowdown", "DeterministicSlowdown",
           "UniformDelay", "Speeds", "NetDelay", "Device", "OnRanks", "Fault", "FAULT_ARITY", "fired_faults"]
