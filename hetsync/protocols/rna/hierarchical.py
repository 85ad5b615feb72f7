"""Hierarchical RNA (RNA section 4): flat RNA inside groups of similar speed, groups averaged by a server.

Yang, Rang and Cheng, "Mitigating Stragglers in the Decentralized Training on Heterogeneous
Clusters" (Middleware '20), section 4 (Fig. 5) and section 6; ``docs/protocols/rnah.md``
resolves the open points (its choices are marked "design" below). The grouping rule, the group
controller and the server are in :mod:`hetsync.protocols.rna.groups`.

Roles: as for the parameter-server protocols (:mod:`hetsync.protocols.ps.worker`), the last ``servers`` = K
ranks of the launch serve and ranks 0 .. n - 1 are the workers; data is sharded over the workers.

Each synchronization has three phases (section 4, paragraph 1):

1. **Inside a group, flat RNA** (sections 3.1-3.3, Algorithm 2): the compute step is flat RNA's
   (WriteOp / ReadOp of the gradient cache, :class:`hetsync.protocols.rna.protocol.RNAProtocol`); the group's
   lowest rank runs the group's controller (power-of-d choice of the round's initiator among the
   group's members, :class:`hetsync.protocols.rna.control.Controller` restricted to the group), and
   every member joins each announced round. The round's reduction ``sum_i [w_i g'_i, w_i]`` over the
   group's members goes through the point-to-point layer: every member sends its vector to the round's
   initiator, which sums them in rank order and sends the sum back, so every member publishes the same
   bits. (horovod process sets would need every rank, servers included, to register each grouping in
   the same order, and dynamic process sets must be switched on for the whole job at ``hvd.init``.)
2. **Push/pull** on every ``sync_every``-th round of a group (design: ``ps_every``, default 1 as in
   section 4): the round's initiator pushes its current parameters (float32 [P], sharded over the K
   servers as the other PS protocols do, memory- or layer-wise) and pulls the servers' average of the
   groups' latest models (design rule A, :class:`hetsync.protocols.rna.groups.SlotAverage`).
   Asynchronous across groups: each group talks to the servers on its own.
3. **Broadcast** in the group: the initiator sends the pulled model to every member and each member
   overwrites its parameters with it (``set_weight``), in the critical section the compute step's
   update also runs in, so right after phase 3 every member of a group holds the same bits. The round's
   averaged gradient is then applied by every member at its next step, on top of the pulled model.

With one group the server is never used and the protocol is flat RNA (inside the group, flat RNA's
parameter average every ``average_every`` rounds; with several groups that average is replaced by the
server exchange).

Groups: explicit (``groups=[[0, 1], [2, 3]]``, checked before training: every worker in exactly one
group, no server rank), ``"host"`` (one group per host the launch placed workers on, from the launcher's
host names, :func:`hetsync.protocols.rna.groups.host_groups`; a hierarchy that follows the network) or
``"auto"``: training starts as one group (flat RNA over all workers); every
worker measures its mean step time (wall time of the compiled step, milliseconds) over
``warmup_steps`` steps after its first one and sends it to rank 0's controller, which applies the rule
of section 4 (:func:`hetsync.protocols.rna.groups.speed_groups`: split while max - min > mean). If
that gives several groups, rank 0 sends the servers the groups and its current model (every slot
starts from it: x0 of rule A), and announces the groups to every worker; groups are then fixed (the
paper never regroups; design notes, grouping). Workers that finished still take part (they join their new group's
rounds with the null gradient until it ends); if a worker's training ends before it measured its
warm-up, no grouping is made. Statistics: the groups and their changes (the round, the measured times, the rule's result),
PS exchanges per group and per server, the overwrite broadcasts, and flat RNA's statistics per rank.
"""
import dataclasses
import logging
import sys
import threading
import time
import typing

import numpy as np
import tensorflow as tf

from hetsync import ops, transport
from hetsync import world
from hetsync.core.config import ProtocolConfig, param
from hetsync.protocols.ps.server import plan_shards
from hetsync.protocols.rna.protocol import SWITCH_INTERVAL_S, RNAConfig, RNAProtocol
from hetsync.protocols.rna.control import CONTROL, TO_CONTROLLER, RoundLoop
from hetsync.protocols.rna.groups import GROUP_CHANNELS, TO_SERVER, GroupController, GroupServer, RNAHError, check_groups, check_groups_fit, host_groups, parse_groups, speed_groups
from hetsync.core.wrapper import protocol_wrapper
from hetsync.protocols.rna.group_rounds import GroupRounds

__all__ = ["HierarchicalRNA", "HierarchicalRNAProtocol", "HierarchicalRNAConfig", "RNAHError", "speed_groups"]

log = logging.getLogger("hetsync")



def _as_rna(name):
    f = RNAConfig.__dataclass_fields__[name]
    return dataclasses.field(default=f.default, metadata=f.metadata)


@dataclasses.dataclass(frozen=True)
class HierarchicalRNAConfig(ProtocolConfig):
    """Hierarchical RNA's parameters (see :func:`HierarchicalRNA`)."""

    owner: typing.ClassVar[str] = "HierarchicalRNA"

    groups: typing.Any = param(
        "auto", "``\"auto\"`` (one group for ``warmup_steps`` steps, then the rule of section 4 on the measured step "
                "times: split while max - min exceeds the mean) or explicit groups, a list of lists of worker ranks "
                "such as ``[[0, 1], [2, 3]]`` (every worker 0..n-1 in exactly one group; CLI: "
                "``groups=[[0,1],[2,3]]``) or ``\"host\"`` (one group per launch host, the names the launcher "
                "gave, :func:`hetsync.world.host_names`: ranks on one host reduce over shared memory, the "
                "links carry only the server exchange). One group is flat RNA.", check=check_groups,
        parse=parse_groups)
    sync_every: int = param(1, "int R >= 1: a group's round initiator pushes to and pulls from the server, then "
                               "broadcasts in the group, every R rounds of that group (section 4 does it every "
                               "round; section 6 'periodically').", ge=1, unit="rounds")
    warmup_steps: int = param(20, "int >= 1: with ``groups=\"auto\"``, the steps (after each worker's first) whose "
                                  "mean wall time is the worker's measured iteration time.", ge=1, unit="steps")
    servers: int = param(1, "int K >= 1, the number of parameter-server ranks: the last K ranks of the launch serve, "
                            "the first size - K train.", label="servers K", ge=1, unit="ranks")
    sharding: typing.Literal["layer", "memory"] = param(
        "memory", "``\"layer\"`` or ``\"memory\"``: how the parameter vector is split over the K servers (as for "
                  "the other PS protocols, SHAT section 4.4).")
    server_rule: typing.Literal["average", "delta"] = param(
        "average", "``\"average\"`` (section 6's model averaging: the server returns the equal-weight mean of each "
                   "group's latest model, so each group's step moves the model 1 / N as far with N groups) or "
                   "``\"delta\"`` (an asynchronous parameter server over the groups, Dean et al. 2012: the server "
                   "adds what a group learnt since its last pull to one model and returns it; the groups' progress "
                   "adds up, as flat RNA's contributions do).")
    probes: int = _as_rna("probes")
    max_staleness: int = _as_rna("max_staleness")
    scale_lr: bool = _as_rna("scale_lr")
    average_every: int = param(10, "int >= 0; with a single group, average the parameters over the group every that "
                                   "many rounds, as flat RNA does (0: never). Unused with several groups: the "
                                   "server exchange and broadcast replace it.", ge=0, unit="rounds")
    drift_every: typing.Optional[int] = _as_rna("drift_every")
    average_at_end: bool = param(True, "bool, average the workers' parameters once when training ends so every rank "
                                       "(servers included) holds the same final model.")
    timeout_s: float = param(120.0, "float seconds (> 0): longest wait for a ready initiator, a controller message, a "
                                    "group member's vector, a server's reply or (on a server) any message from an "
                                    "unfinished worker (workers send a heartbeat every timeout_s / 4).", gt=0,
                             unit="seconds")
    finish_timeout_s: float = _as_rna("finish_timeout_s")
    poll_ms: float = _as_rna("poll_ms")
    seed: int = _as_rna("seed")


class HierarchicalRNAProtocol(GroupRounds, RNAProtocol):
    """Hierarchical RNA (see :func:`HierarchicalRNA`): flat RNA inside groups, a server between groups."""

    name = "rnah"
    #: the group and server averages move the trainable parameters only (flat vectors over them).
    average_state_in_rounds = False
    display_name = "HierarchicalRNA"
    Config = HierarchicalRNAConfig
    # the warm-up timing, the regrouping and the server exchange run between steps (on_train_batch_end)
    capabilities = dataclasses.replace(RNAProtocol.capabilities, max_steps_per_execution=1)

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self.serves = False
        self.groups = None
        self.epoch = 0
        self.changes = []
        self.decision = None
        self._began = False
        self._published = 0
        self._pround = 0
        self._push_seq = 0
        self._leader_rounds = {}

    def server_count(self):
        """Return ``servers`` K (int): the last K ranks serve."""
        return self.cfg.servers

    # -- life cycle -----------------------------------------------------------------------------------
    def build(self):
        """Record the roles, check ``probes`` and explicit groups against the workers, create the statistics.

        Raises:
            ValueError: ``probes`` larger than the number of workers, or explicit groups that do not
                partition the workers 0..n-1 (the message names the bad group and rank).
        """
        super().build()
        size = world.size()
        self.n_workers = self.roles.num_workers
        self.serves = self.roles.is_server
        self.workers = list(range(self.n_workers))
        self.server_ranks = list(range(self.n_workers, size))
        if self.role_error is None:
            if self.cfg.probes > max(self.n_workers, 2):
                raise ValueError(f"HierarchicalRNA: probes={self.cfg.probes} exceeds the {self.n_workers} worker(s); "
                                 f"use 1..{max(self.n_workers, 2)}")
            if self.cfg.groups not in ("auto", "host"):
                check_groups_fit("HierarchicalRNA", self.cfg.groups, self.n_workers, size)
        if self.cfg.groups == "auto":
            self.groups, self.epoch = [list(self.workers)], 0
        elif self.cfg.groups == "host":  # every rank calls the collective here, eagerly, in the same order
            hosts = world.host_names()
            self.groups, self.epoch = host_groups(hosts[:self.n_workers]), 1
            self.changes.append({"epoch": 1, "round": 0, "groups": self.groups, "source": "host",
                                 "hosts": hosts, "times_ms": None})
        else:
            self.groups, self.epoch = [list(g) for g in self.cfg.groups], 1
            self.changes.append({"epoch": 1, "round": 0, "groups": self.groups, "source": "explicit",
                                 "times_ms": None})
        for s in ("rnah_group", "rnah_groups", "rnah_ps_syncs", "rnah_regroups"):
            self.add_stat(s)

    # -- the hook set: a server serves at train begin; workers time their warm-up steps -----------------
    # (``steps_per_execution`` > 1 is refused before, by :meth:`check_fit`: the step times are per step)
    def on_train_begin(self, model, params):
        """A server rank serves until every worker is done (:meth:`serve`), then stops its ``fit`` (one
        more step changes nothing). A worker with ``groups="auto"`` before the groups are formed starts
        timing its warm-up steps.

        Returns:
            True on a server rank (training stops).
        """
        self._warmup_seen, self._warmup_ms = 0, []
        self._measure = not self.serves and self.cfg.groups == "auto" and self.epoch == 0
        if self.serves:
            self.serve()
            return True
        return False

    def on_train_batch_begin(self, batch):
        """Start the step's clock (seconds, ``time.perf_counter``)."""
        self._t_batch = time.perf_counter()

    def on_train_batch_end(self, batch, logs):
        """While measuring: the wall time of steps 2 .. ``warmup_steps`` + 1 (milliseconds, batch begin to
        batch end) is averaged and sent to rank 0 (:meth:`report_time`)."""
        if not getattr(self, "_measure", False):
            return
        dt = (time.perf_counter() - self._t_batch) * 1e3
        self._warmup_seen += 1
        if self._warmup_seen == 1:
            return  # the first step traces and compiles
        self._warmup_ms.append(dt)
        if len(self._warmup_ms) == self.cfg.warmup_steps:
            self._measure = False
            self.report_time(float(np.mean(self._warmup_ms)))

    def _my_group(self):
        for g, group in enumerate(self.groups):
            if self._rank in group:
                return g, list(group)
        raise RNAHError(f"HierarchicalRNA: rank {self._rank} is in no group of {self.groups}")

    def start(self):
        """Train begin, every rank: the dispatcher and the shard plan; a worker also creates the caches and
        starts its communication thread (and a heartbeat thread towards the servers); a server prepares its
        loop (run by the on_train_begin hook).

        Raises:
            ValueError: servers leaving no worker, or more servers than parameters.
        """
        self.check_roles()
        variables = list(getattr(self.optimizer, "_trainable_variables", None) or [])
        if not variables:
            raise RuntimeError("HierarchicalRNA: the optimizer is not built (no trainable variables) at train begin; "
                               "use it through model.compile + model.fit with hetsync.callbacks.standard(opt)")
        sizes = [int(np.prod(v.shape)) for v in variables]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._var_ranges = [(int(offsets[i]), int(offsets[i + 1])) for i in range(len(sizes))]
        self.ranges = plan_shards(sizes, self.cfg.servers, self.cfg.sharding)
        self._p2p = transport.dispatcher()
        self._rank, self._n = world.rank(), world.size()
        self._error = None
        self._final_reason = None
        self._began = True
        self._server_stats = None
        if self.serves:
            self._vars = variables
            k = self._rank - self.n_workers
            lo, hi = self.ranges[k]
            grouped = self.groups if len(self.groups) > 1 else None
            self.server = GroupServer(self._p2p, k, self.flat_weights()[lo:hi], self.workers, grouped, self.epoch,
                                      self.cfg.timeout_s, rule=self.cfg.server_rule)
            return
        self._create_caches()
        self._saved_switch_interval = None
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.done_steps = None
        self._steps_at_start = int(self._iteration.numpy())
        self._local = {"rounds_joined": 0, "contributed_rounds": 0,
                       "staleness": np.zeros(self.cfg.max_staleness + 1, np.int64), "contributors": {},
                       "drift": [], "drift_rel": [], "corrections": 0, "round_ms": [], "ps_ms": [],
                       "pushes": 0, "overwrites": 0, "overwrites_log": [], "rounds_by_epoch": {}}
        self._ctls = []
        gid, members = self._my_group()
        leader = members[0]
        self._gid, self._members = gid, members
        self._ctl = None
        if self._rank == leader:
            decide = self._decide if (self.cfg.groups == "auto" and self.epoch == 0) else None
            self._ctl = self._new_controller(self._leader_rounds.get(leader, 0), members, decide)
        self._loop = RoundLoop(self._p2p, self._rank, self._ctl, self, self.cfg.timeout_s, self.cfg.poll_ms,
                               controller_rank=leader)
        self._set_group_stats()
        self._hb_stop = threading.Event()
        self._hb = threading.Thread(target=self._heartbeat, name=f"hetsync-rnah-hb-{self._rank}", daemon=True)
        self._hb.start()
        self._thread = threading.Thread(target=self._run, name=f"hetsync-rnah-comm-{self._rank}", daemon=True)
        self._thread.start()

    def _new_controller(self, first_round, members, decide=None):
        ctl = GroupController(self.cfg, self.drift_every, self._n, lambda dst, msg: self._p2p.send(dst, CONTROL, msg),
                              first_round, members, len(self.groups), decide=decide)
        self._ctls.append(ctl)
        return ctl

    def _heartbeat(self):
        period = self.cfg.timeout_s / 4.0
        while not self._hb_stop.wait(period):
            try:
                for r in self.server_ranks:
                    self._p2p.send(r, TO_SERVER, None, tag="alive")
            except Exception:  # noqa: BLE001 - the dispatcher's failure surfaces elsewhere
                return

    def _set_group_stats(self):
        self._set_stat("rnah_group", self._gid)
        self._set_stat("rnah_groups", len(self.groups))
        self._set_stat("rnah_regroups", sum(1 for c in self.changes if c["source"] == "auto"))

    def serve(self):
        """On a server rank (called by the on_train_begin hook): serve until every worker is done.
        A failure is kept and raised on every rank by :meth:`stop`."""
        try:
            self._server_stats = self.server.serve()
        except Exception as exc:  # noqa: BLE001 - reported to every rank at stop()
            self._error = f"rank {self._rank}: {exc}"
            self._server_stats = self.server.stats()
            log.error("hetsync %s", self._error)

    # -- the compute step -------------------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        """Flat RNA's step (WriteOp, ReadOp, update) on a worker; nothing on a server rank."""
        if self.serves:
            return tf.no_op()
        return super().apply(grads, variables, local_apply)

    # -- the communication thread ------------------------------------------------------------------------

    # -- grouping (auto) -----------------------------------------------------------------------------------

    # -- the end --------------------------------------------------------------------------------------------
    def stop(self):
        """End of training on every rank: a worker ends its threads, tells the servers it is done and drains
        the group channels (among the workers); then every rank gathers the statistics and errors, raises the
        same :class:`RNAHError` if any rank failed, else (``average_at_end``) averages the workers' models onto
        every rank.

        Raises:
            RNAHError: a worker's communication thread or a server failed (names the ranks); on every rank.
        """
        if not self._began:
            return
        self._began = False
        if self.serves:
            mine = {"rank": self._rank, "role": "server", "error": self._error, "server": self._server_stats}
        else:
            mine = self._stop_worker()
        per_rank = transport.allgather_object(mine, name="hetsync_rnah_totals")
        self._gather(per_rank)
        errors = [(d["rank"], d["error"]) for d in per_rank if d.get("error")]
        if errors:
            raise RNAHError("HierarchicalRNA failed on rank(s) " + ", ".join(str(r) for r, _ in errors) + ": "
                            + "; ".join(sorted({e for _, e in errors})))
        self._final = {}
        if self.cfg.average_at_end:
            self._average_workers()
        self._summary.update(self._final)

    def _stop_worker(self):
        self.done_steps = int(self._iteration.numpy()) - self._steps_at_start
        budget = self.cfg.finish_timeout_s + self.cfg.timeout_s + 10.0
        self._thread.join(budget)
        thread, self._thread = self._thread, None
        if thread.is_alive() and self._error is None:
            self._error = (f"rank {self._rank}: HierarchicalRNA communication thread did not end within {budget:g} s "
                           "after training ended (no final round from its group's controller)")
        self._hb_stop.set()
        self._hb.join(5.0)
        if self._saved_switch_interval is not None and sys.getswitchinterval() == SWITCH_INTERVAL_S:
            sys.setswitchinterval(self._saved_switch_interval)
        for ctl in self._ctls:
            self._leader_rounds[ctl.members[0]] = max(self._leader_rounds.get(ctl.members[0], 0), ctl.round)
        for r in self.server_ranks:
            self._p2p.send(r, TO_SERVER, None, tag="done")
        late = {}
        try:
            self._p2p.flush(timeout_s=self.cfg.timeout_s, channel=TO_SERVER)
            for channel in (CONTROL, TO_CONTROLLER) + GROUP_CHANNELS:
                late[channel] = self._p2p.drain(channel, peers=self.workers, timeout_s=budget + 10.0)
        except transport.TransportTimeout as exc:
            self._error = self._error or f"rank {self._rank}: {exc}"
        st = ops.grad_cache_status(self._cache)
        loc = self._local
        ctls = [{"members": c.members, "rounds": c.local_rounds, "ps_rounds": c.ps_rounds,
                 "initiators": {str(r): c.initiators[r] for r in c.members},
                 "probe_response_ms_median": float(np.median(c.response_ms)) if c.response_ms else None,
                 "final_reason": c.final_reason, "closed_by_regroup": c.closed} for c in self._ctls]
        return {"rank": self._rank, "role": "worker", "error": self._error, "steps": self.done_steps,
                "group": self._gid, "written": st["written"], "dropped": st["dropped"], "taken": st["taken"],
                "fresh_reads": st["fresh_reads"], "undrained_at_end": st["written"] - st["taken"] - st["dropped"],
                "rounds_joined": loc["rounds_joined"], "rounds_by_epoch": {str(k): v for k, v in
                                                                          loc["rounds_by_epoch"].items()},
                "contributed_rounds": loc["contributed_rounds"], "contributors": dict(loc["contributors"]),
                "staleness_histogram": [int(v) for v in loc["staleness"]], "pushes": loc["pushes"],
                "overwrites": loc["overwrites"], "overwrites_log": loc["overwrites_log"],
                "ps_ms_median": float(np.median(loc["ps_ms"])) if loc["ps_ms"] else None,
                "round_ms_median": float(np.median(loc["round_ms"])) if loc["round_ms"] else None,
                "drift_max": max((d for _, d in loc["drift"]), default=None), "parameter_averages": loc["corrections"],
                "controllers": ctls, "final_reason": self._loop.final_reason, "late_messages": late,
                "epoch": self.epoch, "groups": self.groups, "changes": self.changes, "decision": self.decision}

    def _gather(self, per_rank):
        workers = [d for d in per_rank if d["role"] == "worker"]
        servers = [d["server"] for d in per_rank if d["role"] == "server" and d.get("server")]
        first = workers[0]  # rank 0: its controller made the grouping decision; every rank takes its view
        self.epoch, self.groups, self.changes = first["epoch"], first["groups"], first["changes"]
        self.decision = first["decision"]
        decision = self.decision
        rounds = sum(c["rounds"] for w in workers for c in w["controllers"])
        ps_by_group = {}
        for w in workers:
            for e in w["overwrites_log"]:
                if e[3] == w["rank"]:  # counted once, by the initiator
                    key = f"{e[0]}:{e[1]}"
                    ps_by_group[key] = ps_by_group.get(key, 0) + 1
        self._summary = {
            "workers": self.n_workers, "servers": len(self.server_ranks), "sharding": self.cfg.sharding,
            "server_rule": self.cfg.server_rule,
            "shard_ranges": [list(r) for r in self.ranges],
            "groups": self.groups, "num_groups": len(self.groups),
            "group_changes": list(self.changes),
            "auto_decision": decision,
            "regroups": sum(1 for c in self.changes if c["source"] == "auto"),
            "rounds": rounds, "syncs": rounds,
            "rounds_per_group": [{"members": c["members"], "rounds": c["rounds"], "ps_rounds": c["ps_rounds"],
                                  "initiators": c["initiators"], "closed_by_regroup": c["closed_by_regroup"]}
                                 for w in workers for c in w["controllers"]],
            "ps_exchanges_per_group": ps_by_group,
            "ps_exchanges": sum(w["pushes"] for w in workers),
            "overwrites": sum(w["overwrites"] for w in workers),
            "pushes_per_server": [s["pushes"] for s in servers], "pulls_per_server": [s["pulls"] for s in servers],
            "server_clients": sorted({r for s in servers for r in s["clients"]}),
            "per_server": servers,
            "staleness_histogram": np.sum([w["staleness_histogram"] for w in workers], axis=0).astype(int).tolist(),
            "dropped_gradients": sum(w["dropped"] for w in workers),
            "undrained_at_end": sum(w["undrained_at_end"] for w in workers),
            "fresh_fraction": sum(w["fresh_reads"] for w in workers) / max(1, sum(w["steps"] or 0 for w in workers)),
            "drift_max": max((w["drift_max"] for w in workers if w["drift_max"] is not None), default=None),
            "parameter_averages": sum(w["parameter_averages"] for w in workers),
            "per_rank": [{k: v for k, v in w.items() if k != "overwrites_log"} for w in workers],
            "overwrites_log": {str(w["rank"]): w["overwrites_log"] for w in workers},
        }

    def _average_workers(self):
        """w <- mean over the workers, on every rank (servers included); the drift before it is reported.

        The model's float32 non-trainable state (:attr:`state_variables`: BatchNormalization's moving mean and
        variance) rides in the same allreduce and is replaced by the workers' mean too, so every rank leaves
        ``fit`` with the same full model. The drift is that of the trainable parameters only.
        """
        self._vars = self._vars or list(self.optimizer._trainable_variables)
        ids = {id(v) for v in self._vars}
        state = [v for v in self.state_variables if v.dtype == "float32" and id(v) not in ids]
        x = np.concatenate([np.ravel(v.numpy()) for v in self._vars]).astype(np.float32)
        z = np.concatenate([np.ravel(v.numpy()) for v in state] + [np.zeros(0, np.float32)]).astype(np.float32)
        weight = 0.0 if self.serves else 1.0
        # [x_r, z_r, 1] weighted 0 on a server, 1 on a worker: the sum's last entry counts the workers
        s = transport.allreduce_sum([tf.constant((np.concatenate([x, z, [1.0]]) * weight).astype(np.float32))],
                                    name="hetsync_rnah_final_avg")[0].numpy()
        mean = (s[:-1] / s[-1]).astype(np.float32)
        drift = self.parameter_drift(x, mean[:x.size], name="hetsync_rnah_final_drift", active=not self.serves)
        self.set_flat_weights(mean[:x.size])
        off = x.size
        for v in state:
            v.assign(np.reshape(mean[off:off + int(np.prod(v.shape))], v.shape))
            off += int(np.prod(v.shape))
        self._final = {"final_average": True, "drift_before_final_average": drift}

    def flat_weights(self):
        """Return the parameters as one float32 array [P] (trainable variables flattened in order)."""
        return np.concatenate([np.ravel(v.numpy()) for v in self._vars]).astype(np.float32, copy=False)

    def set_flat_weights(self, flat):
        """Assign a float32 array [P] to the trainable variables (the inverse of :meth:`flat_weights`)."""
        for v, (lo, hi) in zip(self._vars, self._var_ranges):
            v.assign(np.reshape(flat[lo:hi], v.shape))

    def summary_stats(self):
        """End-of-run statistics: groups, their changes (``group_changes``, ``auto_decision`` with the measured
        step times), rounds and server exchanges per group, pushes and pulls per server, the server's clients,
        overwrites (with their digests per rank, ``overwrites_log``: [epoch, group, round, initiator, sha1 of the
        parameters after the overwrite, sha1 of the pulled model]), flat RNA's staleness histogram, dropped
        gradients, drift and per-rank totals."""
        return dict(self._summary) if self._summary else super().summary_stats()


HierarchicalRNA = protocol_wrapper(HierarchicalRNAProtocol, """Wrap a Keras 3 optimizer for hierarchical RNA (RNA section 4): flat RNA inside speed groups, a parameter server between groups.

    Workers of similar speed form a group; each group runs flat RNA (sections 3.1-3.3: power-of-two choice of
    the round's initiator among the group, partial reduction of ``[w_i g'_i, w_i]`` over the group, Algorithm
    2); every ``sync_every``-th round of a group its initiator pushes its parameters to the server (the last
    ``servers`` ranks), which keeps the latest model of each group and returns their mean (section 6, "model
    averaging"), and broadcasts the pulled model in its group, where every member overwrites its parameters
    with it. Groups run asynchronously: a slow group never holds a fast one back. ``groups="auto"`` measures
    the step times for ``warmup_steps`` steps (as one group) and splits by the rule of section 4 (split while
    max - min exceeds the mean; times [1, 3, 9, 27] give {0, 1}, {2}, {3}); explicit groups are lists of worker
    ranks. One group is flat RNA (the server is not used). Launch with ``servers`` more ranks than workers;
    the script is unchanged (train on ``opt.hetsync_protocol.fit_data(x, y, b)``, which shards over the
    workers). Needs an MPI launch and :func:`hetsync.callbacks.standard`; float32 parameters. Per-step
    statistics: flat RNA's plus ``rnah_group`` (this rank's group), ``rnah_groups``, ``rnah_ps_syncs``
    (overwrites so far) and ``rnah_regroups``; the summary adds the groups and their changes.

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)``.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``HierarchicalRNA_<optimizer class>``).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument.
        ValueError: an argument out of range; malformed groups (a rank listed twice, an empty group, not a
            list); groups naming a server rank or a rank beyond the launch, or leaving a worker out; ``probes``
            above the number of workers; servers leaving no worker; (at train begin) more servers than
            parameters. All before training; the message names the bad value.
        RuntimeError: hetsync not initialised, or launched under Gloo.
        hetsync.protocols.rna.hierarchical.RNAHError: (at the end of training, on every rank) a group member, an
            initiator or a server did not answer within ``timeout_s``, or a server failed.
    """)
