"""Faults of a scenario: a paused process, a stalled training thread, a dead rank.

``pause:RANK:AT_S:FOR_S`` stops rank RANK's whole process (SIGSTOP, every thread, as a paused VM)
and a detached watcher continues it FOR_S seconds later; ``stall:RANK:AT_S:FOR_S`` makes only the
training thread sleep (background threads keep running: a preempted device); ``kill:RANK:AT_S``
makes the rank kill itself (SIGKILL: a dead peer). Each fault fires once per process and is
recorded (:func:`fired_faults`), so that the run's statistics report it.
"""
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from hetsync import world
from hetsync.emulation.components import Component

__all__ = ["Fault", "FAULT_ARITY", "fired_faults"]

log = logging.getLogger("hetsync")


#: the fault kinds and their number of arguments after the name
FAULT_ARITY = {"pause": 3, "stall": 3, "kill": 2}


# Watcher run as a separate process by a pause: waits until the paused process is really stopped
# (/proc state T; at most 60 s, or at once where /proc is missing), sleeps FOR_S, then sends SIGCONT.
_WATCHER = """
import os, signal, sys, time
pid, for_s = int(sys.argv[1]), float(sys.argv[2])
def state():
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return None
end = time.monotonic() + 60.0
while state() not in ('T', None) and time.monotonic() < end:
    time.sleep(0.002)
time.sleep(for_s)
try:
    os.kill(pid, signal.SIGCONT)
except OSError:
    pass
"""


_fired_lock = threading.Lock()


_fired = []      # records of the faults fired in this process, in order


_fired_keys = set()


def fired_faults():
    """The faults fired in this process so far.

    Returns:
        list of dicts ``{"kind", "rank", "at_s", "for_s", "fired_at_s", "resumed_at_s"}`` (seconds;
        ``fired_at_s`` and ``resumed_at_s`` count from the train begin of the ``fit`` that fired it;
        ``for_s`` and ``resumed_at_s`` are None for ``kill``), copies.
    """
    with _fired_lock:
        return [dict(r) for r in _fired]


@dataclasses.dataclass(frozen=True)
class Fault(Component):
    """A fault: ``pause:RANK:AT_S:FOR_S``, ``stall:RANK:AT_S:FOR_S`` or ``kill:RANK:AT_S``.

    ``pause`` stops the whole process (SIGSTOP: all threads, the point-to-point receiver and protocol
    threads too) for ``for_s`` seconds; a detached watcher process sends SIGCONT. ``stall`` sleeps the
    calling (training) thread only, so background threads keep serving: a stalled device.
    ``kill`` sends SIGKILL to the process itself (a dead peer; the launcher sees a rank killed by
    signal 9). A fault takes no part in the per-step draw (``draw`` returns ``(1.0, 0.0)`` and
    consumes nothing from the generator).

    Attributes:
        kind: str, ``"pause"``, ``"stall"`` or ``"kill"``. rank: int >= 0, the rank it hits.
        at_s: float >= 0, seconds after that rank's train begin. for_s: float > 0 seconds (pause,
            stall) or None (kill).
    """

    kind: str
    rank: int
    at_s: float
    for_s: float = None

    @property
    def spec(self):
        """The part's spec text, e.g. ``"pause:1:2:3"``."""
        tail = "" if self.for_s is None else f":{self.for_s:g}"
        return f"{self.kind}:{self.rank}:{self.at_s:g}{tail}"

    def validate(self, world_size):
        """Raises ValueError if ``rank`` is not in [0, world_size)."""
        if not 0 <= self.rank < world_size:
            raise ValueError(f"slowdown spec {self.spec}: RANK {self.rank} is not a rank of this launch; allowed: "
                             f"0..{world_size - 1}")

    def draw(self, rng, rank, world_size):
        return 1.0, 0.0

    def fired(self):
        """Whether this fault already fired in this process (bool)."""
        with _fired_lock:
            return self in _fired_keys

    def fire(self, elapsed_s):
        """Inflict the fault on this process now, once per process (a second call does nothing).

        Args:
            elapsed_s: float seconds since the train begin, recorded as ``fired_at_s``.

        A pause or stall lasts ``for_s`` x D wall seconds under a time dilation D (:func:`hetsync.world.dilation`).

        Returns:
            dict, the record (see :func:`fired_faults`), or None if it had fired already. ``kill`` does
            not return.

        Raises:
            OSError: the pause watcher could not be started (the process is then not stopped).
        """
        with _fired_lock:
            if self in _fired_keys:
                return None
            _fired_keys.add(self)
            record = {"kind": self.kind, "rank": self.rank, "at_s": self.at_s, "for_s": self.for_s,
                      "fired_at_s": float(elapsed_s), "resumed_at_s": None}
            _fired.append(record)
        msg = f"hetsync: fault {self.spec}: rank {self.rank} (pid {os.getpid()}) at {elapsed_s:.2f} s: "
        if self.kind == "kill":
            sys.stderr.write(f"{msg}SIGKILL to itself (unix time {time.time():.3f})\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60.0)  # not reached: SIGKILL cannot be caught
        t, for_s = time.monotonic(), world.dilated(self.for_s)
        if self.kind == "pause":
            log.warning("%sSIGSTOP for %g s", msg, for_s)
            for h in logging.getLogger().handlers + log.handlers:
                h.flush()
            sys.stderr.flush()
            sys.stdout.flush()
            subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, str(os.getpid()), repr(for_s)],
                             start_new_session=True, stdin=subprocess.DEVNULL, close_fds=True)
            # SIGSTOP stops the whole process; sent to this very thread (not the process, whose signal the kernel
            # may hand to another thread) it also stops the caller before it returns, so resumed_at_s is right
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        else:
            log.warning("%sthe training thread sleeps %g s", msg, for_s)
            time.sleep(for_s)
        with _fired_lock:
            record["resumed_at_s"] = float(elapsed_s) + time.monotonic() - t
            return dict(record)
