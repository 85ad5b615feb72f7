"""The process's one point-to-point endpoint: create the :class:`hetsync.transport.p2p.Dispatcher`
collectively on first use, and shut it down (counted) at ``hetsync.shutdown()`` and at exit.

Re-exported by :mod:`hetsync.transport.p2p` and :mod:`hetsync.transport` (``transport.dispatcher()``).
"""
import atexit
import threading
import time

from hetsync import world
from hetsync.errors import TransportTimeout

__all__ = ["dispatcher", "shutdown", "CREATE_TIMEOUT_S"]

#: seconds the first :func:`dispatcher` call waits for every rank to make it (the collective communicator
#: duplication) before :class:`TransportTimeout`; every rank makes it at a protocol's start.
CREATE_TIMEOUT_S = 120.0


_lock = threading.Lock()
_state = {"dispatcher": None, "atexit": False, "pending": None}


def dispatcher(timeout_s=None):
    """Return this process's :class:`Dispatcher`, creating it (and its thread) at the first call.

    The first call duplicates ``MPI.COMM_WORLD`` and is therefore collective: every rank must make
    it (protocols call it on every rank in ``start`` or ``fit_data``). The duplication is a
    non-blocking ``MPI_Comm_idup`` polled every :data:`POLL_S` x 10 seconds, so a rank that never
    makes the call (dead, stalled, or on another code path) fails the others with a clear error
    instead of a silent hang; a call that timed out leaves its duplication pending and
    the next call waits for that same one. Works under a world of one rank (messages to oneself).

    Args:
        timeout_s: float seconds > 0 the first call waits for every rank (default
            :data:`CREATE_TIMEOUT_S`); ignored once the dispatcher exists.

    Raises:
        RuntimeError: hetsync is not initialised, or the job runs on Gloo (no MPI point-to-point).
        TransportTimeout: not every rank made its first call within ``timeout_s`` (names this rank
            and the world size).
        ValueError: a bad ``timeout_s``.
    """
    timeout_s = CREATE_TIMEOUT_S if timeout_s is None else timeout_s
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"dispatcher: timeout_s must be a positive number of seconds, got {timeout_s!r}")
    with _lock:
        d = _state["dispatcher"]
        if d is None:
            world.require_mpi("point-to-point messaging (hetsync.transport.dispatcher)")
            from hetsync.transport.p2p import Dispatcher

            # the receive thread's idle sleep is a host-side latency of the emulated cluster: D times longer
            # under a time dilation D (the same emulated latency, D times fewer wake-ups on shared cores)
            d = Dispatcher(_duplicate_world(timeout_s), poll_s=world.dilated(_poll_s()))
            _state["pending"] = None
            _state["dispatcher"] = d
            world.register_shutdown(shutdown)  # hetsync.shutdown() counts what is in flight
            if not _state["atexit"]:
                atexit.register(_shutdown_at_exit)
                _state["atexit"] = True
        return d


def _duplicate_world(timeout_s):
    """``MPI.COMM_WORLD`` duplicated collectively (``Idup``), waiting at most ``timeout_s`` seconds."""
    from mpi4py import MPI

    comm_world = MPI.COMM_WORLD
    if _state.get("pending") is None:  # a call that timed out left its duplication pending: wait for that one
        _state["pending"] = comm_world.Idup()
    comm, request = _state["pending"]
    timeout_s = world.dilated(timeout_s)  # wall seconds of this run
    deadline = time.monotonic() + timeout_s
    while not request.Test():
        if time.monotonic() > deadline:
            raise TransportTimeout(
                f"rank {comm_world.Get_rank()}: timed out after {timeout_s:g} s creating the point-to-point dispatcher "
                f"(a collective duplication of the world of {comm_world.Get_size()} ranks): some rank did not call "
                "hetsync.transport.dispatcher() (dead, stalled or on another code path)")
        time.sleep(_poll_s() * 10)
    return comm


def shutdown(timeout_s=5.0):
    """Shut this process's dispatcher down (see :meth:`Dispatcher.shutdown`); the next
    :func:`dispatcher` call creates a new one (collectively).

    Returns:
        the shutdown report (dict), or None if there was no dispatcher.
    """
    with _lock:
        d, _state["dispatcher"] = _state["dispatcher"], None
    return None if d is None else d.shutdown(timeout_s)


def _shutdown_at_exit():
    try:
        shutdown(2.0)
    except Exception:  # noqa: BLE001 - never fail the interpreter's exit
        pass


def _poll_s():
    from hetsync.transport.p2p import POLL_S

    return POLL_S
