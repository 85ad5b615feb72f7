"""RNA family: randomized non-blocking partial allreduce (RNA sections 3, 6) and its hierarchical form
(section 4). Modules: ``protocol`` (flat RNA), ``control`` (the initiator and the round loop),
``hierarchical`` (speed groups joined by parameter servers), ``group_rounds`` (its rounds, a mixin),
``groups`` (the group controller and the group server), ``grouping`` (the grouping rule by speed; TF-free,
used by the simulator). Hierarchical RNA's shard plan
(:func:`hetsync.protocols.ps.server.plan_shards`) is the family's one declared tie to the parameter-server
family; its servers report a failure on the parameter servers' channel, ``transport.channels.PS_ERROR``."""
