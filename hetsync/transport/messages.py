"""The dispatcher's message types and constants (:mod:`hetsync.transport.p2p` re-exports the public ones): the
MPI tag, the receive thread's poll interval and limits, the per-channel counters, a received :data:`Message`,
the end-of-channel marker and a tracked send.
"""
import collections

#: MPI tag of every dispatcher message on its communicator (below 32767, the smallest TAG_UB MPI allows).
MPI_TAG = 4853
#: seconds the receive thread sleeps when nothing arrived (it wakes at once for shutdown).
POLL_S = 0.0005
#: seconds the receive thread allows one matched message to complete (a sender dying mid-message).
RECEIVE_TIMEOUT_S = 600.0
#: default timeout in seconds of :meth:`Dispatcher.recv`, :meth:`Dispatcher.flush` and :meth:`Dispatcher.drain`.
DEFAULT_TIMEOUT_S = 60.0
#: seconds :meth:`Dispatcher.recv_or_fail` waits at a time before it looks at its failure channel again.
WAIT_SLICE_S = 0.05
#: per-channel counters of :meth:`Dispatcher.stats`: messages handed to ``isend``, received by the thread, returned
#: by ``recv``/``poll``, discarded unread (``drain``, ``shutdown``), and sends not completed when ``shutdown`` gave up.
COUNTERS = ("sent", "received", "read", "discarded", "undelivered")


#: one received message: ``source`` (int rank), ``channel`` (str), ``tag`` (the sender's tag, any
#: picklable value or None) and ``obj`` (the payload).
Message = collections.namedtuple("Message", ["source", "channel", "tag", "obj"])


class _End:
    """End-of-channel marker sent by :meth:`Dispatcher.drain` (never returned by ``recv``)."""

    def __eq__(self, other):
        return isinstance(other, _End)

    def __hash__(self):
        return 0


_END = _End()

#: one tracked send: the MPI request, the destination rank, the channel, the tag, and whether it is an end marker.
_Send = collections.namedtuple("_Send", ["request", "dest", "channel", "tag", "marker"])


def _who(source):
    return "any rank" if source is None else f"rank {source}"


def _tag_text(tag):
    return "" if tag is None else f" with tag {tag!r}"
