"""Small simulators of protocol mechanisms (no TensorFlow, no MPI): ``python -m hetsync.sim.<name>``.

* :mod:`hetsync.sim.rna_initiator`: RNA's initiator choice by power-of-d probes (RNA section 8.4,
  Figure 10).
"""
