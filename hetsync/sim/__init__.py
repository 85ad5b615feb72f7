"""Small simulators of protocol mechanisms (no TensorFlow, no MPI): ``python -m hetsync.sim.<name>``.

* :mod:`hetsync.sim.rna_initiator`: RNA's initiator choice by power-of-d probes (RNA section 8.4,
  Figure 10).
* :mod:`hetsync.sim.hop`: Hop's iteration timing on an ideal cluster (standard, backup workers,
  bounded staleness, skipping): the throughput its rules allow and their gap bounds.
"""
