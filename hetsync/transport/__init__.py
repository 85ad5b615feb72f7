"""Transport: every byte hetsync puts on the wire goes through this package, so the wire is visible in one place.

* :mod:`hetsync.transport.collectives`: horovod's core collectives (allreduce, allgather,
  broadcast; never its Keras layer, broken on Keras 3) and :func:`allgather_object`, the one
  helper for cross-rank statistics. They may run inside a compiled ``tf.function`` (except
  ``allgather_object``), under MPI, Gloo or a world of one rank.
* :mod:`hetsync.transport.p2p` (and :mod:`hetsync.transport.endpoint`, which creates it; the channel
  names in :mod:`hetsync.transport.channels`): point-to-point messages through one :class:`Dispatcher` per
  process (its own duplicated communicator, a receive thread routing messages to named channels,
  timeouts on every wait, a counted shutdown). Needs an MPI launch (or a world of one rank).

MPI itself is initialised (with thread support, the world shared with horovod) by
:func:`hetsync.world.init`; apart from it, no module of hetsync outside this package imports mpi4py.

"""
from hetsync.transport.collectives import (allgather, allgather_object, allreduce_max, allreduce_mean, allreduce_sum,
                                          broadcast_variables, max_abs_difference_across_ranks)
from hetsync.transport.endpoint import dispatcher, shutdown
from hetsync.transport.p2p import Dispatcher, Message, TransportError, TransportTimeout

__all__ = [
    "allreduce_mean", "allreduce_sum", "allreduce_max", "allgather", "allgather_object", "broadcast_variables",
    "max_abs_difference_across_ranks", "Dispatcher", "Message", "TransportError", "TransportTimeout", "dispatcher",
    "shutdown",
]
