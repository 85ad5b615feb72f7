"""RNA's round control: the controller's initiator choice and every rank's message loop (RNA section 3.2).

Rounds are numbered r = 0, 1, ... A *controller* on rank 0 chooses each round's *initiator* by
power-of-d choices: it sends a probe carrying r to ``probes`` random ranks; a probed rank answers
"ready" as soon as it has a gradient pending; the first answer wins and the other probes expire
(their late answers are ignored). The controller then announces the round to every rank, and
every rank joins it (:meth:`RoundLoop` calls the protocol's ``join_round``; the allreduce itself,
Algorithm 2, is in :mod:`hetsync.protocols.rna.protocol`).

Termination: a rank whose training ends reports "done" and keeps joining rounds until the
controller announces the final round, once every rank is done or after ``finish_timeout_s``
seconds without any round while some rank is done (a warning names the ranks that did not
finish). Errors travel the same way: a failing rank reports "error", the controller announces a
final round carrying it, so every rank ends with the same error.

Messages go through the point-to-point dispatcher (:mod:`hetsync.transport.p2p`) on two channels:

* :data:`CONTROL` (controller -> rank): ``("probe", r)``, ``("round", r, initiator, average, drift)``,
  ``("final", reason, error)``;
* :data:`TO_CONTROLLER` (rank -> controller): ``("ready", r)``, ``("done", steps)``, ``("error", message)``.
"""
import logging
import time

import numpy as np
from hetsync import world
from hetsync.transport import channels

__all__ = ["Controller", "RoundLoop", "CONTROL", "TO_CONTROLLER", "CONTROLLER_RANK"]

log = logging.getLogger("hetsync")

#: channel of the controller's messages to every rank.
CONTROL = channels.RNA_CONTROL
#: channel of the ranks' messages to the controller.
TO_CONTROLLER = channels.RNA_TO_CONTROLLER
#: the rank that runs the controller.
CONTROLLER_RANK = 0


class Controller:
    """Rank 0's controller state (RNA section 3.2): probes, initiator choice, round announcements.

    Args:
        cfg: the RNA configuration (``probes``, ``average_every``, ``timeout_s``, ``finish_timeout_s``,
            ``seed``). drift_every: int, the resolved drift period (rounds; 0 never).
        world_size: int n. send: callable ``(dest, message)`` (non-blocking).
        first_round: int, the id of the next round (ids keep increasing across fits).
        members: list of the ranks this controller serves (default: all n ranks; hierarchical RNA,
            :mod:`hetsync.protocols.rna.hierarchical`, runs one controller per group of ranks).
        average_every: int >= 0, the resolved parameter-average period (rounds; 0 never; default: the
            configuration's ``average_every``).

    Attributes:
        round: int, the id of the round being probed for. done: {rank: steps} of finished ranks.
        initiators: list of n ints, rounds initiated by each rank. response_ms: list of floats,
        probe-to-answer times (milliseconds). reprobes: int. final_sent: bool. final_reason: str or None.
    """

    def __init__(self, cfg, drift_every, world_size, send, first_round=0, members=None, average_every=None):
        self.cfg, self.drift_every, self.n, self._send = cfg, drift_every, world_size, send
        self.average_every = int(cfg.average_every if average_every is None else average_every)
        self.members = list(range(world_size)) if members is None else sorted(int(r) for r in members)
        self.rng = np.random.default_rng(cfg.seed)
        self.round = first_round
        self.done = {}
        self.probed = []
        self.probe_t0 = time.monotonic()
        self.last_progress = time.monotonic()
        self.final_sent = False
        self.final_reason = None
        self.initiators = [0] * world_size
        self.response_ms = []
        self.reprobes = 0

    def active(self):
        """Member ranks that have not reported "done" (list of ints)."""
        return [r for r in self.members if r not in self.done]

    def send_probes(self):
        """Probe ``probes`` random active ranks (power-of-d choices) for the current round; every active rank
        with RNA's ``wait_for_round``."""
        active = self.active()
        # with wait_for_round a waiting rank is ready at once: probe every active rank
        k = len(active) if getattr(self.cfg, "wait_for_round", False) else min(self.cfg.probes, len(active))
        self.probed = sorted(int(r) for r in self.rng.choice(active, size=k, replace=False))
        self.probe_t0 = time.monotonic()
        for r in self.probed:
            self._send(r, ("probe", self.round))

    def announce_final(self, reason, error=None):
        """Announce the final round to every member (``error``: the message every rank raises, or None)."""
        for r in self.members:
            self._send(r, ("final", reason, error))
        self.final_sent = True
        self.final_reason = reason

    def round_message(self, r, initiator):
        """The announcement of round ``r`` (tuple ``("round", r, initiator, average, drift)``; every
        ``average_every``-th round averages the parameters, every ``drift_every``-th measures the drift)."""
        k = r + 1
        average = self.average_every > 0 and k % self.average_every == 0
        drift = self.drift_every > 0 and k % self.drift_every == 0
        return ("round", r, initiator, average, drift)

    def on_other(self, src, msg):
        """Handle a message of a kind this controller does not know (ignored here; subclasses extend)."""

    def on_message(self, src, msg):
        """Handle one message from rank ``src``: a "ready" answer, a "done" report or an "error"
        (other kinds go to :meth:`on_other`; "ready" and "done" from non-members are ignored)."""
        kind = msg[0]
        if kind in ("ready", "done") and src not in self.members:
            return  # sent to this rank's controller of an earlier grouping
        if kind == "ready":
            if msg[1] != self.round or self.final_sent:
                return  # an expired probe's late answer
            r = self.round
            self.response_ms.append((time.monotonic() - self.probe_t0) * 1e3)
            self.initiators[src] += 1
            announcement = self.round_message(r, src)
            for dst in self.members:
                self._send(dst, announcement)
            self.round += 1
            self.last_progress = time.monotonic()
            self.send_probes()
        elif kind == "done":
            self.done[src] = msg[1]
            self.last_progress = time.monotonic()
            if not self.active():
                self.announce_final("all ranks finished")
            elif all(r in self.done for r in self.probed):
                self.reprobes += 1
                self.send_probes()
        elif kind == "error":
            if not self.final_sent:
                self.announce_final(f"rank {src} failed", error=msg[1])
        else:
            self.on_other(src, msg)

    def check_timeouts(self):
        """End without the unfinished ranks after ``finish_timeout_s`` idle seconds once some rank is
        done; fail the run if no probed rank answers within ``timeout_s`` while none is done."""
        if self.final_sent:
            return
        idle = time.monotonic() - self.last_progress
        finish_s, timeout_s = world.dilated(self.cfg.finish_timeout_s), world.dilated(self.cfg.timeout_s)  # wall
        if self.done and idle > finish_s:
            missing = self.active()
            reason = (f"ranks {missing} did not finish within finish_timeout_s={finish_s:g} s (wall) "
                      f"of the last round while ranks {sorted(self.done)} had finished; final round announced "
                      f"without them (their later gradients are counted as unsynchronized)")
            log.warning("hetsync RNA controller: %s", reason)
            self.announce_final(reason)
        elif not self.done and time.monotonic() - self.probe_t0 > timeout_s:
            error = (f"controller: no probed rank {self.probed} had a gradient ready for round {self.round} "
                     f"within timeout_s={timeout_s:g} s (wall)")
            self.announce_final("timeout", error=error)


class RoundLoop:
    """One rank's message loop: answers probes, joins announced rounds, reports "done" (and on rank 0
    drives the :class:`Controller`).

    Args:
        p2p: the process's :class:`hetsync.transport.Dispatcher`.
        rank: int. controller: a :class:`Controller` on rank 0, else None.
        participant: the protocol side, with ``gradient_pending(timeout_ms) -> bool`` (blocks up to
            ``timeout_ms`` milliseconds until a gradient is cached), ``join_round(round_id,
            initiator, average, drift)`` and ``done_steps`` (None while training, then the number
            of steps this rank ran).
        timeout_s: float seconds (RNA's ``timeout_s``). poll_ms: float milliseconds, the idle wait.
        controller_rank: int, the rank whose controller this rank follows (default :data:`CONTROLLER_RANK`).

    A ``("regroup", ...)`` message from the controller (hierarchical RNA) hands its arguments to the
    participant's ``regroup(...)``, which returns ``(controller or None, controller_rank)``: from then on
    this rank follows that controller (its pending probe is dropped and "done" is reported again).

    Attributes:
        probes_answered, probes_expired: ints. final_reason: str or None. error: str or None, the
        error announced in the final round.
    """

    def __init__(self, p2p, rank, controller, participant, timeout_s, poll_ms, controller_rank=CONTROLLER_RANK):
        self.p2p, self.rank, self.ctl, self.part = p2p, rank, controller, participant
        self.controller_rank = int(controller_rank)
        # wall time of this run: the timeout and the idle wait are both D times longer under a dilation D
        self.timeout_s, self.poll_ms = world.dilated(float(timeout_s)), world.dilated(float(poll_ms))
        self.probes_answered = self.probes_expired = 0
        self.final_reason = None
        self.error = None

    def send_to_controller(self, msg):
        """Send ``msg`` to the controller (channel :data:`TO_CONTROLLER`)."""
        self.p2p.send(self.controller_rank, TO_CONTROLLER, msg)

    def run(self):
        """Loop until the final round. Returns normally then (``error`` holds an announced error).

        Raises:
            RuntimeError: no message from the controller for 1.5 ``timeout_s`` + 5 seconds
                (names the rank), or what ``join_round`` or the transport raise.
        """
        probe = None
        sent_done = False
        last_heard = time.monotonic()
        worker_timeout = self.timeout_s * 1.5 + 5.0
        if self.ctl is not None:
            self.ctl.send_probes()
        while True:
            progressed = False
            if self.ctl is not None:
                while True:
                    m = self.p2p.poll(TO_CONTROLLER)
                    if m is None:
                        break
                    self.ctl.on_message(m.source, m.obj)
                self.ctl.check_timeouts()
            while True:
                m = self.p2p.poll(CONTROL, source=self.controller_rank)
                if m is None:
                    break
                msg = m.obj
                last_heard = time.monotonic()
                progressed = True
                if msg[0] == "probe":
                    probe = msg[1]
                elif msg[0] == "round":
                    if probe is not None and probe <= msg[1]:
                        probe = None
                        self.probes_expired += 1
                    self.part.join_round(*msg[1:])
                elif msg[0] == "regroup":
                    self.ctl, self.controller_rank = self.part.regroup(*msg[1:])
                    probe, sent_done = None, False
                    if self.ctl is not None and not self.ctl.final_sent:
                        self.ctl.send_probes()
                    break  # poll the new controller
                else:  # final
                    self.final_reason, self.error = msg[1], msg[2]
                    return
            if probe is not None and self.part.gradient_pending(0.0):
                self.send_to_controller(("ready", probe))
                self.probes_answered += 1
                probe = None
            if self.part.done_steps is not None and not sent_done:
                self.send_to_controller(("done", self.part.done_steps))
                sent_done = True
            if time.monotonic() - last_heard > worker_timeout:
                raise RuntimeError(f"rank {self.rank}: no message from the RNA controller (rank {self.controller_rank}) "
                                   f"for {worker_timeout:g} s (timeout_s={self.timeout_s:g})")
            if progressed:
                continue
            if probe is not None and self.part.done_steps is None:
                self.part.gradient_pending(self.poll_ms)  # wakes at once when the step writes
            else:  # wakes at once when a message arrives
                self.p2p.wait([CONTROL, TO_CONTROLLER] if self.ctl is not None else CONTROL, self.poll_ms / 1e3)
