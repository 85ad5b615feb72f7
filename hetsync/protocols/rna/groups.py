"""Hierarchical RNA's pieces outside the training step: the grouping rule, the groups' checks, the
group controller, and the parameter server that averages the groups' models (RNA section 4).

Yang, Rang and Cheng, "Mitigating Stragglers in the Decentralized Training on Heterogeneous
Clusters" (Middleware '20), section 4 (Fig. 5) and section 6 ("Hierarchical synchronization");
``docs/protocols/rnah.md`` resolves the open points. The protocol itself (rounds inside
a group, the push/pull and the broadcast) is :mod:`hetsync.protocols.rna.hierarchical`.

* :func:`speed_groups`: the rule of section 4, paragraph 2 (docs/protocols/rnah.md, grouping).
* :func:`check_groups` / :func:`parse_groups` / :func:`check_groups_fit`: explicit groups, checked
  before training with errors that name the bad value.
* :class:`GroupController`: flat RNA's controller (:class:`hetsync.protocols.rna.control.Controller`,
  power-of-d choices, section 3.2) restricted to one group's ranks, which also marks every
  ``sync_every``-th round of its group as a parameter-server round and, in the warm-up of
  ``groups="auto"``, collects the measured step times and applies the rule.
* :class:`SlotAverage` and :class:`GroupServer`: the central server of section 6, "model averaging":
  it keeps the latest model pushed by each group and returns their mean (rule A of docs/protocols/rnah.md);
  :class:`DeltaSum`, ``server_rule="delta"``: one model to which each group adds what it learnt since its
  last pull (an asynchronous parameter server over the groups).

Messages (all through :mod:`hetsync.transport.p2p`):

* worker -> server, channel :data:`TO_SERVER`: tag ``"push"`` with ``(epoch, group, seq, x shard)``,
  ``"groups"`` with ``(epoch, groups, x0 shard)`` (rank 0, when ``groups="auto"`` splits), ``"alive"``
  (a heartbeat every ``timeout_s / 4`` seconds) and ``"done"`` (the worker's training ended);
* server -> worker, channel :data:`FROM_SERVER`: tag ``seq``, obj the averaged shard (float32);
  :data:`hetsync.transport.channels.PS_ERROR` (the parameter servers' own) carries a server's failure.
"""
import numbers
import time

import numpy as np

from hetsync import transport, world
from hetsync.protocols.rna.control import Controller
from hetsync.protocols.rna.grouping import speed_groups
from hetsync.errors import RNAHError
from hetsync.transport import channels

__all__ = ["speed_groups", "check_groups", "parse_groups", "check_groups_fit", "GroupController", "SlotAverage",
           "DeltaSum", "SERVER_RULES", "GroupServer", "RNAHError", "TO_SERVER", "FROM_SERVER", "REDUCE", "RESULT",
           "PARAMS", "PARAMS_BACK", "BCAST", "GROUP_CHANNELS"]

#: worker -> server (tags "push", "groups", "alive", "done").
TO_SERVER = channels.RNAH_TO_SERVER
#: server -> the pushing initiator: tag = the push's sequence number, obj = float32 shard of the mean.
FROM_SERVER = channels.RNAH_FROM_SERVER
#: group member -> round initiator: ``[w g', w]`` float32 [P + 1], tag ``(epoch, round)``.
REDUCE = channels.RNAH_REDUCE
#: round initiator -> group members: the sum over the group, float32 [P + 1], tag ``(epoch, round)``.
RESULT = channels.RNAH_RESULT
#: group member -> initiator in a parameter round (average / drift): ``(x float32 [P], active bool)``.
PARAMS = channels.RNAH_PARAMS
#: initiator -> members in a parameter round: ``(mean float32 [P] or None, drift float)``.
PARAMS_BACK = channels.RNAH_PARAMS_BACK
#: initiator -> members after the server exchange: the pulled model, float32 [P] (phase 3).
BCAST = channels.RNAH_BCAST
#: the channels only workers use (drained among the workers at the end of a fit).
GROUP_CHANNELS = (REDUCE, RESULT, PARAMS, PARAMS_BACK, BCAST)


# -- the grouping rule (section 4) ------------------------------------------------------------------------
# -- explicit groups ----------------------------------------------------------------------------------------
def check_groups(owner, label, value):
    """Check the ``groups`` argument's form: ``"auto"``, ``"host"`` or a non-empty list of non-empty lists of
    distinct ranks (ints >= 0); normalised to ``"auto"``, ``"host"`` or a tuple of sorted tuples, in the given
    group order.

    Args:
        owner: str (e.g. ``"HierarchicalRNA"``), label: str, both named in the message. value: the argument.

    Returns:
        ``"auto"``, ``"host"`` or tuple of tuples of ints.

    Raises:
        ValueError: anything else; the message names the bad group or element, e.g. "groups[1] = [2, 2]:
            rank 2 is listed twice" or "groups[0][1] = 'a' is not a rank (an int >= 0)".
    """
    what = "'auto', 'host' or a non-empty list of non-empty lists of worker ranks, e.g. [[0, 1], [2, 3]]"
    if isinstance(value, str):
        if value in ("auto", "host"):
            return value
        raise ValueError(f"{owner}: {label} must be {what}, got {value!r}")
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{owner}: {label} must be {what}, got {value!r}")
    out, seen = [], {}
    for g, group in enumerate(value):
        if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple)) or not group:
            raise ValueError(f"{owner}: {label} must be {what}; {label}[{g}] = {group!r} is not a non-empty list "
                             f"of ranks")
        for j, r in enumerate(group):
            if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 0:
                raise ValueError(f"{owner}: {label} must be {what}; {label}[{g}][{j}] = {r!r} is not a rank "
                                 f"(an int >= 0)")
            if int(r) in seen:
                where = f"listed twice in {label}[{g}]" if seen[int(r)] == g else \
                    f"in both {label}[{seen[int(r)]}] and {label}[{g}]"
                raise ValueError(f"{owner}: {label} must be {what}; rank {int(r)} is {where} (every worker "
                                 f"belongs to exactly one group)")
            seen[int(r)] = g
        out.append(tuple(sorted(int(r) for r in group)))
    return tuple(out)


def parse_groups(text):
    """Convert the CLI text of ``groups`` (``--protocol-arg groups=auto`` or ``groups=[[0,1],[2,3]]``).

    Returns:
        ``"auto"``, ``"host"`` or a list of lists (checked later by :func:`check_groups`).

    Raises:
        ValueError: text that is neither ``auto`` nor a Python list literal.
    """
    import ast

    text = text.strip()
    if text in ("auto", "host"):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # literal_eval("{[1]}"): TypeError
        raise ValueError(f"protocol HierarchicalRNA argument groups must be auto, host or a list of lists of ranks "
                         f"such as [[0,1],[2,3]], got {text!r}") from None
    return value


def host_groups(hosts):
    """Workers grouped by the host they were launched on (``groups="host"``): one group per host, in the
    order hosts first appear, each group's ranks ascending.

    Args:
        hosts: list of str, the launch host name of each worker rank 0 .. n - 1
            (:func:`hetsync.world.host_names`, servers left out).

    Returns:
        list of lists of int, e.g. ``["h0", "h0", "h1", "h1"]`` gives ``[[0, 1], [2, 3]]``.

    Raises:
        ValueError: ``hosts`` empty.
    """
    if not hosts:
        raise ValueError("host_groups: no worker host names")
    out = {}
    for r, h in enumerate(hosts):
        out.setdefault(h, []).append(r)
    return list(out.values())


def check_groups_fit(owner, groups, n_workers, world_size):
    """Check explicit groups against the launch: every worker (ranks 0 .. n - 1) in exactly one group.

    Args:
        owner: str named in the message. groups: tuple of tuples from :func:`check_groups`.
        n_workers: int n >= 1, the worker ranks. world_size: int, workers plus servers.

    Raises:
        ValueError: a rank that is not a worker (a server rank or beyond the launch; names it and its
            group) or workers in no group (names them).
    """
    for g, group in enumerate(groups):
        for r in group:
            if r >= n_workers:
                role = "a parameter-server rank" if r < world_size else f"not in the launch of {world_size} ranks"
                raise ValueError(f"{owner}: groups[{g}] = {list(group)} names rank {r}, which is {role}; the "
                                 f"workers are ranks 0..{n_workers - 1}")
    covered = {r for group in groups for r in group}
    missing = [r for r in range(n_workers) if r not in covered]
    if missing:
        raise ValueError(f"{owner}: groups {[list(g) for g in groups]} leave worker rank(s) {missing} in no group; "
                         f"every worker 0..{n_workers - 1} must belong to exactly one group")


# -- the group controller --------------------------------------------------------------------------------------
class GroupController(Controller):
    """One group's round controller (flat RNA's, section 3.2, over the group's ranks), run by the group's
    lowest rank.

    Round announcements are ``("round", r, initiator, average, drift, ps)``: ``ps`` is True on every
    ``sync_every``-th round of this controller when there are several groups (the initiator then pushes
    to and pulls from the server and broadcasts, section 4); ``average`` (flat RNA's parameter average
    every ``average_every`` rounds) only with a single group, where the hierarchy is flat RNA. With
    ``decide`` (``groups="auto"``, the warm-up's single group on rank 0) it collects ``("time", ms)``
    messages and, once every member reported and none has finished, calls ``decide(times, round)``;
    a True return (the groups were announced) closes this controller: later messages are kept in
    :attr:`stash` for the rank's next controller.

    Args:
        cfg: the HierarchicalRNA configuration. drift_every: int rounds (0: never). world_size: int.
        send: callable ``(dest, message)``. first_round: int, the next round id. members: list of ranks.
        n_groups: int >= 1, the number of groups in force. decide: None or callable
        ``({rank: ms}, round) -> bool``.

    Attributes:
        local_rounds: int, rounds announced by this controller. times: {rank: ms}. closed: bool.
        stash: list of ``(src, message)`` received after closing.
    """

    def __init__(self, cfg, drift_every, world_size, send, first_round, members, n_groups, decide=None):
        super().__init__(cfg, drift_every, world_size, send, first_round, members=members)
        self.n_groups = int(n_groups)
        self.decide = decide
        self.local_rounds = 0
        self.ps_rounds = 0
        self.times = {}
        self.closed = False
        self.stash = []

    def round_message(self, r, initiator):
        """``("round", r, initiator, average, drift, ps)`` for the next round of this group."""
        self.local_rounds += 1
        k = self.local_rounds
        grouped = self.n_groups > 1
        average = not grouped and self.average_every > 0 and k % self.average_every == 0
        drift = self.drift_every > 0 and k % self.drift_every == 0
        ps = grouped and k % self.cfg.sync_every == 0
        self.ps_rounds += int(ps)
        return ("round", r, initiator, average, drift, ps)

    def on_message(self, src, msg):
        """As :meth:`Controller.on_message`, or keep the message in :attr:`stash` once closed."""
        if self.closed:
            self.stash.append((src, msg))
            return
        super().on_message(src, msg)

    def check_timeouts(self):
        """As :meth:`Controller.check_timeouts` while open."""
        if not self.closed:
            super().check_timeouts()

    def on_other(self, src, msg):
        """A member's ``("time", ms)``: its mean step time over the warm-up (milliseconds)."""
        if msg[0] != "time" or self.decide is None or src not in self.members:
            return
        self.times[src] = float(msg[1])
        if len(self.times) == len(self.members) and not self.final_sent:
            decide, self.decide = self.decide, None
            if decide(dict(self.times), self.round):
                self.closed = True


# -- the server (section 6: "the PS only executes the parameter summation, i.e., model averaging") ----------
def _check_groups_count(rule, n_groups):
    """``n_groups`` as an int >= 1, or ValueError naming the server rule ``rule`` (str)."""
    if isinstance(n_groups, bool) or not isinstance(n_groups, numbers.Integral) or n_groups < 1:
        raise ValueError(f"{rule}: n_groups must be an int >= 1, got {n_groups!r}")
    return int(n_groups)


def _check_push(rule, group, x, n_groups, shape):
    """A push's shard ``x`` as float32 (ValueError naming ``rule`` for a group outside [0, N) or another shape)."""
    if not 0 <= group < n_groups:
        raise ValueError(f"{rule}: group {group!r} outside [0, {n_groups})")
    x = np.asarray(x, np.float32)
    if x.shape != shape:
        raise ValueError(f"{rule}: a shard of shape {x.shape}; the server's shard is {shape}")
    return x


class SlotAverage:
    """The server's rule (docs/protocols/rnah.md, the server's rule): one slot per group, the mean of the slots returned.

    Every slot starts as x0 (the common model when the groups were formed); a push from group g replaces
    slot g and returns (1/N) sum_h slot_h (summed in float64, returned as float32). So with N groups pushing
    x_1 .. x_N in turn from x0, group g's pull is (sum_{h<=g} x_h + (N - g) x0) / N, and a group pushing
    twice replaces its own slot. Equal weights: a slow group's older model counts as much as a fast
    group's newer one (not weighted by group size).

    Args:
        x0: float32 array [m], this server's shard of the initial model. n_groups: int N >= 1.

    Raises:
        ValueError: ``n_groups`` < 1.
    """

    def __init__(self, x0, n_groups):
        n_groups = _check_groups_count("SlotAverage", n_groups)
        x0 = np.array(x0, np.float32, copy=True)
        self.slots = [x0.copy() for _ in range(n_groups)]
        self.pushes = [0] * n_groups

    def push(self, group, x):
        """Replace slot ``group`` (int in [0, N)) by ``x`` (float32 [m]); return the mean of the slots (float32 [m]).

        Raises:
            ValueError: a group outside [0, N) or a shard of the wrong shape.
        """
        x = _check_push("SlotAverage", group, x, len(self.slots), self.slots[0].shape)
        self.slots[group] = x.copy()
        self.pushes[group] += 1
        return self.mean()

    def mean(self):
        """Return (1/N) sum of the slots, float32 [m] (summed in float64)."""
        total = np.zeros(self.slots[0].shape, np.float64)
        for s in self.slots:
            total += s
        return (total / len(self.slots)).astype(np.float32)

    def current(self):
        """The model a pull returns now without a push (float32 [m]): the mean of the slots."""
        return self.mean()


class DeltaSum:
    """The server's rule ``server_rule="delta"``: one model, to which a group adds what it learnt since its last pull.

    The asynchronous parameter server of Dean et al. ("Large Scale Distributed Deep Networks", NIPS 2012,
    Downpour SGD) with the groups as its clients, option C of the paper's open point: the server keeps one model
    x (float64, starts as x0) and, per group, the model b_g its last pull returned (x0 at first). A push of x_g
    from group g adds x_g - b_g to x, sets b_g = x and returns x. With N groups each moving by d_g from x0 and
    pushing in turn, group g's pull is x0 + sum_{h<=g} d_h: the groups' progress adds up, where the slot average
    (:class:`SlotAverage`) returns x0 + (1/N) sum_{h<=g} d_h, so a step of each group moves the model 1/N as far.

    Args:
        x0: float32 array [m], this server's shard of the initial model. n_groups: int N >= 1.

    Raises:
        ValueError: ``n_groups`` < 1.
    """

    def __init__(self, x0, n_groups):
        n_groups = _check_groups_count("DeltaSum", n_groups)
        self.model = np.array(x0, np.float64, copy=True)
        self.bases = [self.model.astype(np.float32) for _ in range(n_groups)]
        self.pushes = [0] * n_groups

    def push(self, group, x):
        """Add ``x`` - the model group ``group`` last pulled to the server's model; return it (float32 [m]).

        Args:
            group: int in [0, N). x: float32 [m], the group's parameters now.

        Raises:
            ValueError: a group outside [0, N) or a shard of the wrong shape.
        """
        x = _check_push("DeltaSum", group, x, len(self.bases), self.model.shape)
        self.model += x.astype(np.float64) - self.bases[group]
        out = self.model.astype(np.float32)
        self.bases[group] = out
        self.pushes[group] += 1
        return out.copy()

    def current(self):
        """The model a pull returns now without a push (float32 [m])."""
        return self.model.astype(np.float32)


#: the servers' rules by ``server_rule``.
SERVER_RULES = {"average": SlotAverage, "delta": DeltaSum}


class GroupServer:
    """One server rank's loop: serve the groups' pushes with the server's rule (:data:`SERVER_RULES`: the slot
    average :class:`SlotAverage` or the sum of deltas :class:`DeltaSum`) until every worker is done.

    Args:
        p2p: the :class:`hetsync.transport.p2p.Dispatcher`. index: int k, this server's index (shard k).
        x0: float32 [m], this server's shard of the initial model. workers: list of worker ranks.
        groups: list of groups (lists of ranks) in force, or None (a single group: nothing is pushed until
            a ``"groups"`` message arrives). epoch: int, the grouping's number (0: warm-up, one group).
        timeout_s: float seconds > 0: the server fails when an unfinished worker sent nothing (not even its
            heartbeat) for this long.
        rule: str, a key of :data:`SERVER_RULES` (``"average"``, the default, or ``"delta"``).

    Raises:
        ValueError: no workers, a bad timeout or an unknown rule.
    """

    def __init__(self, p2p, index, x0, workers, groups, epoch, timeout_s, rule="average"):
        if not workers:
            raise ValueError("a parameter server needs at least one worker")
        if rule not in SERVER_RULES:
            raise ValueError(f"server rule {rule!r}: the rules are {sorted(SERVER_RULES)}")
        self.rule = SERVER_RULES[rule]
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        self.p2p, self.index = p2p, int(index)
        self.workers = [int(r) for r in workers]
        self.timeout_s = world.dilated(float(timeout_s))  # wall seconds of this run (times the dilation D)
        self.epoch = int(epoch)
        self.x0 = np.array(x0, np.float32, copy=True)
        self.groups = [list(g) for g in groups] if groups else [list(self.workers)]
        self.avg = self.rule(self.x0, len(self.groups))
        self.done = set()
        self.pushes_per_rank = {r: 0 for r in self.workers}
        self.order = []  # (epoch, group, rank) per push, in service order
        self.regroups = 0
        self.stale = 0
        self.deferred = []
        self.heartbeats = 0

    def serve(self):
        """Serve until every worker sent ``"done"``; return :meth:`stats`.

        Raises:
            RNAHError: an unfinished worker silent for ``timeout_s``, a message from a non-worker, or a bad
                push. Every unfinished worker is told first (channel ``ps.error``).
        """
        try:
            self._loop()
        except RNAHError as exc:
            self.p2p.tell([r for r in self.workers if r not in self.done], channels.PS_ERROR, str(exc))
            raise
        return self.stats()

    def _loop(self):
        heard = {r: time.monotonic() for r in self.workers}
        while len(self.done) < len(self.workers):
            try:
                m = self.p2p.recv(TO_SERVER, timeout_s=1.0)
            except transport.TransportTimeout:
                now = time.monotonic()
                late = [r for r in self.workers if r not in self.done and now - heard[r] > self.timeout_s]
                if late:
                    raise RNAHError(f"HierarchicalRNA parameter server {self.index} (rank {self.p2p.rank}): no message "
                                    f"from worker rank(s) {late} within timeout_s={self.timeout_s:g} s (not even a "
                                    f"heartbeat; they have not finished: dead or stalled)") from None
                continue
            if m.source not in heard:
                raise RNAHError(f"HierarchicalRNA parameter server {self.index}: a message from rank {m.source}, "
                                f"which is not a worker (workers: {self.workers})")
            heard[m.source] = time.monotonic()
            if m.tag == "done":
                self.done.add(m.source)
            elif m.tag == "alive":
                self.heartbeats += 1
            elif m.tag == "groups":
                epoch, groups, x0 = m.obj
                self.epoch, self.groups = int(epoch), [list(g) for g in groups]
                self.avg = self.rule(x0, len(self.groups))
                self.regroups += 1
                waiting, self.deferred = self.deferred, []
                for d in waiting:
                    self._push(d)
            elif m.tag == "push":
                self._push(m)
            else:
                raise RNAHError(f"HierarchicalRNA parameter server {self.index}: unknown message tag {m.tag!r} "
                                f"from rank {m.source}")

    def _push(self, m):
        epoch, group, seq, shard = m.obj
        if epoch > self.epoch:  # the initiator heard of the new groups before this server did
            self.deferred.append(m)
            return
        if epoch < self.epoch:  # a push of an older grouping: answered with the current model, not stored
            self.stale += 1
            reply = self.avg.current()
        else:
            try:
                reply = self.avg.push(int(group), shard)
            except ValueError as exc:
                raise RNAHError(f"HierarchicalRNA parameter server {self.index}: bad push from rank {m.source}: "
                                f"{exc}") from None
        self.pushes_per_rank[m.source] += 1
        self.order.append((int(epoch), int(group), int(m.source)))
        self.p2p.send(m.source, FROM_SERVER, reply, tag=seq)  # isend pickles the reply now

    def stats(self):
        """Return this server's statistics (JSON-serialisable dict): ``server`` (index), ``rank``, ``pushes``
        (= pulls: every push is answered), ``pushes_per_group`` (list, the grouping in force at the end),
        ``pushes_per_rank`` ({rank: int}; the ranks that ever initiated an exchange are the server's
        clients), ``clients``, ``regroups``, ``stale_pushes``, ``deferred_pushes`` (left unanswered at the
        end), ``heartbeats``, ``epoch``, ``groups`` and ``order`` ((epoch, group, rank) per push, first 20000)."""
        return {"server": self.index, "rank": self.p2p.rank, "pushes": int(sum(self.pushes_per_rank.values())),
                "pulls": int(sum(self.pushes_per_rank.values())), "pushes_per_group": list(self.avg.pushes),
                "pushes_per_rank": {str(r): v for r, v in self.pushes_per_rank.items()},
                "clients": sorted(r for r, v in self.pushes_per_rank.items() if v),
                "regroups": self.regroups, "stale_pushes": self.stale, "deferred_pushes": len(self.deferred),
                "heartbeats": self.heartbeats, "epoch": self.epoch, "groups": self.groups,
                "order": self.order[:20000], "shard_elements": int(self.x0.size)}
