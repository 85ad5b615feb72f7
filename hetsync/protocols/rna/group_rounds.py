"""Hierarchical RNA's rounds: flat RNA inside a speed group, the parameter server between groups.

The communication thread's side of :class:`hetsync.protocols.rna.hierarchical.HierarchicalRNAProtocol`
(a mixin): a group's gradient sum at its initiator, the round each member joins, the exchange
with the parameter server that mixes the groups' models (RNA section 4, hierarchical groups), the
group parameter round, and the regrouping by measured step times (``groups="auto"``).
"""
import hashlib
import logging
import time

import numpy as np
import tensorflow as tf

from hetsync import ops
from hetsync.protocols.rna.control import CONTROL, TO_CONTROLLER
from hetsync.protocols.rna.groups import (BCAST, FROM_SERVER, PARAMS, PARAMS_BACK, REDUCE, RESULT, TO_SERVER, RNAHError,
                                          speed_groups)
from hetsync.transport import channels

__all__ = ["GroupRounds", "MAX_LOG"]

log = logging.getLogger("hetsync")

#: the summary keeps at most this many overwrite records per rank (``overwrites_log``).
MAX_LOG = 20000


class GroupRounds:
    """The rounds of :class:`hetsync.protocols.rna.hierarchical.HierarchicalRNAProtocol` (a mixin; RNA section 4).

    Runs on the protocol's communication thread (:meth:`report_time` on the training thread, from a batch-end
    hook). Uses the state the protocol's ``start`` sets: the dispatcher ``_p2p``, this rank ``_rank``, its
    group ``_gid`` / ``_members`` (list of int ranks), the servers' ``server_ranks`` and shard ``ranges``
    (``(lo, hi)`` of the flat parameter vector of P float32), the gradient and parameter caches, the
    statistics and ``cfg.timeout_s`` (seconds, every wait's limit).
    Group messages go on the ``RNAH_*`` channels of :mod:`hetsync.transport.channels`, tagged
    ``(epoch, round)``.
    """

    def _recv(self, channel, source, tag, what):
        """Wait up to ``timeout_s`` for one message; a server's failure (on ``channels.PS_ERROR``) raises at once."""
        return self._p2p.recv_or_fail(
            channel, source, tag=tag, timeout_s=self.cfg.timeout_s, fail_channel=channels.PS_ERROR, error=RNAHError,
            late=(f"HierarchicalRNA: rank {self._rank}: no {what} from rank {source} within "
                  f"timeout_s={self.cfg.timeout_s:g} s (dead or stalled)"),
            failed=lambda src, obj: f"HierarchicalRNA: worker rank {self._rank}: parameter server rank {src} failed: {obj}")

    def _group_sum(self, vec, initiator, tag, what):
        """Sum float32 vectors over the group at the initiator (members in rank order) and return the sum on
        every member (bit-identical)."""
        if len(self._members) == 1:
            return vec
        if self._rank != initiator:
            self._p2p.send(initiator, REDUCE, vec, tag=tag)
            return self._recv(RESULT, initiator, tag, f"{what} result of the round initiator")
        total = None
        for m in self._members:
            part = vec if m == self._rank else self._recv(REDUCE, m, tag, f"{what} of group member")
            total = np.array(part, np.float32, copy=True) if total is None else total + part
        for m in self._members:
            if m != self._rank:
                self._p2p.send(m, RESULT, total, tag=tag)
        return total

    def join_round(self, round_id, initiator, average, drift, ps=False):
        """Join round ``round_id`` of this rank's group (Algorithm 2 over the group's members), then on a
        ``ps`` round the server exchange and the broadcast (phases 2-3), then a parameter round if asked.

        Args:
            round_id: int r, the group's round number. initiator: int rank of the member that sums the group.
            average: bool, average the group's parameters after the round. drift: bool, measure their drift.
            ps: bool, a round that exchanges the initiator's model with the parameter servers.

        Raises:
            RNAHError: a member, the initiator or a server did not answer within ``timeout_s``.
        """
        t0 = time.monotonic()
        tag = (self.epoch, int(round_id))
        flat, its, _ = ops.grad_cache_take(self._cache)
        its = its.numpy()
        if its.size:
            self._local["contributed_rounds"] += 1
            np.add.at(self._local["staleness"], its[-1] - its, 1)
        reduced = self._group_sum(flat.numpy(), initiator, tag, "gradient")
        self._local["round_ms"].append((time.monotonic() - t0) * 1e3)
        if ps:
            self._ps_phase(round_id, initiator, tag)
        self._published += 1
        ops.grad_cache_publish(self._cache, reduced, self._published)
        c = int(round(float(reduced[-1])))
        loc = self._local
        loc["contributors"][c] = loc["contributors"].get(c, 0) + 1
        loc["rounds_joined"] += 1
        loc["rounds_by_epoch"][self.epoch] = loc["rounds_by_epoch"].get(self.epoch, 0) + 1
        self._set_stat("rna_rounds", loc["rounds_joined"])
        self._set_stat("syncs", loc["rounds_joined"])
        if self._ctl is not None and self._ctl.response_ms:
            self._set_stat("rna_probe_ms", self._ctl.response_ms[-1])
        if average or drift:
            self._group_parameter_round(initiator, tag, average)

    def _ps_phase(self, round_id, initiator, tag):
        t0 = time.monotonic()
        if self._rank == initiator:
            x = self.snapshot()
            self.check_finite_arrays([x], "parameters (push to the servers)", int(self._iteration.numpy()))
            seq = self._push_seq
            self._push_seq += 1
            for k, (lo, hi) in enumerate(self.ranges):
                self._p2p.send(self.server_ranks[k], TO_SERVER, (self.epoch, self._gid, seq, x[lo:hi]), tag="push")
            pulled = np.concatenate([np.asarray(self._recv(FROM_SERVER, self.server_ranks[k], seq,
                                                           f"reply to push {seq} from parameter server {k}"),
                                                np.float32) for k in range(len(self.ranges))])
            for m in self._members:
                if m != self._rank:
                    self._p2p.send(m, BCAST, pulled, tag=tag)
            self._local["pushes"] += 1
        else:
            pulled = np.asarray(self._recv(BCAST, initiator, tag, "pulled model of the round initiator"), np.float32)
        values = self._overwrite(pulled)
        loc = self._local
        loc["overwrites"] += 1
        loc["ps_ms"].append((time.monotonic() - t0) * 1e3)
        if len(loc["overwrites_log"]) < MAX_LOG:
            digest = hashlib.sha1(np.ascontiguousarray(values).tobytes()).hexdigest()
            pulled_digest = hashlib.sha1(np.ascontiguousarray(pulled).tobytes()).hexdigest()
            loc["overwrites_log"].append([self.epoch, self._gid, int(round_id), int(initiator), digest, pulled_digest])
        self._set_stat("rnah_ps_syncs", loc["overwrites"])

    def _overwrite(self, pulled):
        """Phase 3: the parameters become ``pulled`` (float32 [P]), inside the step's critical section; returns
        the values read back in the same section (float32 [P]). A pending flat-RNA parameter correction is
        superseded by a zero one, so it cannot move the model away from ``pulled`` afterwards."""
        def assign():
            for v, (lo, hi) in zip(self._vars, self._var_ranges):
                v.assign(tf.reshape(tf.constant(pulled[lo:hi]), v.shape))
            return [tf.identity(v.value) for v in self._vars]

        values = self._section.execute(assign)
        if self._pcache is not None:
            self._pround += 1
            ops.grad_cache_publish(self._pcache, np.append(np.zeros_like(pulled), 1.0).astype(np.float32),
                                   self._pround)
        return np.concatenate([np.ravel(np.asarray(v, np.float32)) for v in values])

    def _group_parameter_round(self, initiator, tag, average):
        """Drift (max over active members of ||x_r - mean||_2) and, with ``average``, flat RNA's parameter
        average over the group (each active member adds mean - x_r at its next step)."""
        x = self.snapshot()
        self.check_finite_arrays([x], "parameters (group average)", int(self._iteration.numpy()))
        active = self.done_steps is None
        if len(self._members) == 1:
            mean, drift = (x, 0.0) if active else (None, -1.0)
        elif self._rank != initiator:
            self._p2p.send(initiator, PARAMS, (x, active), tag=tag)
            mean, drift = self._recv(PARAMS_BACK, initiator, tag, "parameter average of the round initiator")
        else:
            xs = {}
            for m in self._members:
                xm, am = (x, active) if m == self._rank else self._recv(PARAMS, m, tag, "parameters of group member")
                if am:
                    xs[m] = np.asarray(xm, np.float64)
            if xs:
                mean64 = sum(xs[m] for m in sorted(xs)) / len(xs)
                drift = float(max(np.linalg.norm(v - mean64) for v in xs.values()))
                mean = mean64.astype(np.float32)
            else:
                mean, drift = None, -1.0
            for m in self._members:
                if m != self._rank:
                    self._p2p.send(m, PARAMS_BACK, (mean, drift), tag=tag)
        if mean is None:
            return
        self._local["drift"].append((int(tag[1]), drift))
        self._local["drift_rel"].append(drift / max(float(np.linalg.norm(mean)), 1e-12))
        self._set_stat("rna_drift", drift)
        if average and active:
            self._pround += 1
            ops.grad_cache_publish(self._pcache, np.append(mean - x, 1.0).astype(np.float32), self._pround)
            self._local["corrections"] += 1

    def report_time(self, mean_ms):
        """Send this worker's measured mean step time to rank 0's controller (``groups="auto"``, the warm-up).

        Args:
            mean_ms: float, the mean step time in milliseconds.
        """
        self._p2p.send(0, TO_CONTROLLER, ("time", float(mean_ms)))

    def _decide(self, times, current_round):
        """Rank 0's controller, once every worker reported: apply the rule; with several groups, send the
        servers the groups and rank 0's model (x0 of every slot) and announce the groups. Returns bool."""
        ranks = sorted(times)
        result = speed_groups([times[r] for r in ranks])
        groups = [[ranks[i] for i in g] for g in result]
        self.decision = {"round": int(current_round), "times_ms": {str(r): times[r] for r in ranks},
                         "groups": groups}
        if len(groups) == 1:
            log.info("hetsync HierarchicalRNA: measured step times %s ms give one group: flat RNA continues",
                     {r: round(t, 2) for r, t in times.items()})
            return False
        epoch = self.epoch + 1
        x0 = self.snapshot()
        for k, (lo, hi) in enumerate(self.ranges):
            self._p2p.send(self.server_ranks[k], TO_SERVER, (epoch, groups, x0[lo:hi]), tag="groups")
        for r in self.workers:
            self._p2p.send(r, CONTROL, ("regroup", epoch, groups, int(current_round) + 1, dict(self.decision)))
        log.info("hetsync HierarchicalRNA: measured step times %s ms give groups %s",
                 {r: round(t, 2) for r, t in times.items()}, groups)
        return True

    def regroup(self, epoch, groups, first_round, decision):
        """Switch to new groups (the :class:`RoundLoop` calls it on ``("regroup", ...)``).

        Args:
            epoch: int, the group epoch the new groups start. groups: list of lists of int ranks.
            first_round: int, the new groups' first round number. decision: dict of rank 0's measurement
                (``times_ms``: {str rank: float milliseconds}).

        Returns:
            ``(controller or None, controller rank int)``: the group's lowest rank runs a new controller.
        """
        old = self._ctl
        self.epoch, self.groups = int(epoch), [list(g) for g in groups]
        self.changes.append({"epoch": self.epoch, "round": int(first_round), "groups": self.groups, "source": "auto",
                             "times_ms": decision.get("times_ms")})
        self._gid, self._members = self._my_group()
        leader = self._members[0]
        self._ctl = None
        if self._rank == leader:
            self._ctl = self._new_controller(int(first_round), self._members)
            if old is not None:  # messages that reached the closed controller go to its successor
                for src, msg in old.stash:
                    self._ctl.on_message(src, msg)
        self._set_group_stats()
        return self._ctl, leader
