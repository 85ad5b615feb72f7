"""TF-free timing simulators of hetsync's protocols (no TensorFlow, no MPI).

* :mod:`hetsync.sim.registry`: protocol name -> timing model, :func:`hetsync.sim.registry.simulate`.
* :mod:`hetsync.sim.network`: the alpha-beta model of hosts, slots and links; :mod:`hetsync.sim.workload`:
  step times from the scenario language or a probe, the model's size; :mod:`hetsync.sim.result`: what a model returns.
* The models: :mod:`hetsync.sim.bsp`, :mod:`hetsync.sim.rna` (flat and hierarchical), :mod:`hetsync.sim.hop`
  (Hop and NOTIFY-ACK), :mod:`hetsync.sim.ps` (ASP, SHAT, SHAT-root, ENSEMBLE, SSP), :mod:`hetsync.sim.local`
  (local SGD, FedAvg, SelSync), :mod:`hetsync.sim.taskalloc`.
* :mod:`hetsync.sim.target`: time to target through the measured statistical efficiency.
* :mod:`hetsync.sim.scale`: 4 to 1024 ranks (``python -m hetsync.sim.scale``).
* :mod:`hetsync.sim.rna_initiator`: RNA's initiator choice by power-of-d probes (RNA section 8.4, Figure 10).

The advisor (:mod:`hetsync.advise`) ranks protocols with these models; ``python -m hetsync.bench.validate``
compares them with the emulated cluster.
"""
