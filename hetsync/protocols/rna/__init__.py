"""RNA family: randomized non-blocking partial allreduce (RNA sections 3, 6) and its hierarchical form
(section 4). Modules: ``protocol`` (flat RNA), ``control`` (the initiator and the round loop),
``hierarchical`` (speed groups joined by parameter servers), ``groups`` (the grouping rule, the group
controller and the group server). The group server is the family's one declared tie to the
parameter-server family (:mod:`hetsync.protocols.ps.server`)."""
