"""Hop: decentralized training over a graph, with compiled update and token queues.

Luo, Lin, Zhuo, Qian, "Hop: Heterogeneity-aware Decentralized Training" (ASPLOS '19), sections
3-6; ``docs/protocols/hop.md`` re-derives the garbled equations and resolves the open points. This
module holds the update rule and the iteration bookkeeping; the graphs are in
:mod:`hetsync.protocols.hop.graph`, the queues are compiled ops (:func:`hetsync.ops.hop_update_queue_create`,
:func:`hetsync.ops.hop_token_queue_create`), the messages go through the point-to-point layer
(:mod:`hetsync.transport.p2p`, channels ``hop.update`` and ``hop.token``, routed by its receive
thread straight into the compiled queues).

Worker i, iteration k (the parallel approach, Figure 4; the protocol's hooks between steps run the
parts between compiled steps):

1. **Enter k** (batch begin): insert one token ``[k]`` into TokenQ(i -> j) for every in-neighbour
   j (Figure 7 lines 8-10; a message to j), then **Send** the parameters x_{k,i} tagged (k, i) to
   every out-neighbour whose iteration (the newest token it sent) is not past k (section 6.2(b)),
   and into i's own update queue (the self-loop). With staleness s, an out-neighbour up to s
   iterations ahead still gets the update (it can use it); only one further ahead does not.
2. **Compute** (the compiled step): the gradient at x_{k,i}; on an emulated device it is padded.
3. **Recv + Reduce + Apply** (the compiled step, :meth:`HopProtocol.apply`):
   * standard (Figure 4): dequeue the |N_in(i)| updates tagged k (self included) and take their mean,
     eq. (1) with W_ji = 1 / |N_in(i)|;
   * backup workers (Figure 8): dequeue at least |N_in(i)| - N_buw updates tagged k, plus every
     other one already there, and take the mean of what was received; late updates (tag < k) are
     discarded by the queue and counted;
   * bounded staleness (eq. 2, with the corrected rule of docs/protocols/hop.md): the newest update of
     each in-neighbour taken in this iteration, blocking only while a neighbour's newest update ever
     received is older than k - s, reduced with weights Iter(u) - (k - s) + 1 (updates older than
     k - s weigh 0);
   then x_{k+1,i} = temp + (the wrapped optimizer's update from the gradient at x_{k,i}).
4. **Leave k** (batch end): take one token from TokenQ(j -> i) of every out-neighbour j (blocking:
   the iteration gap Iter(i) - Iter(j) stays <= ``max_ig``, Theorem 2). With ``skip``, a straggler
   behind all its out-neighbours jumps (section 5; docs/protocols/hop.md, skipping): to
   k = min(k0 + skip, min_j Iter(j)), after averaging its parameters with the in-neighbours'
   iteration-(k-1) updates, taking and inserting k - k0 tokens.

Self-loops are left out of the token sets (docs/protocols/hop.md: a self token queue never blocks and
would cap the skip bound at 0). Training ends on every rank after the same number of Hop
iterations (epochs x steps per epoch); a rank that skips runs fewer steps and stops early
(``model.stop_training``). ``stop`` drains both channels with every rank, counts the updates left
unread, gathers the statistics and, with ``average_at_end``, averages the parameters once (drift
reported before it), as RNA and SelSync do.
"""
import dataclasses
import logging
import time
import typing

import numpy as np
import tensorflow as tf

from hetsync import ops, transport
from hetsync import world
from hetsync.protocols.hop import graph as hop_graph
from hetsync.core.protocol import Capabilities, Protocol
from hetsync.core.config import ProtocolConfig, param
from hetsync.core.wrapper import protocol_wrapper
from hetsync.errors import HopError
from hetsync.transport import channels

__all__ = ["Hop", "HopProtocol", "HopConfig", "HopError", "UPDATE", "TOKEN", "staleness_weights",
           "staleness_reduce"]

log = logging.getLogger("hetsync")

#: point-to-point channel of the parameter updates (tag: the iteration; object: list of arrays).
UPDATE = channels.HOP_UPDATE
#: point-to-point channel of the tokens (object: ``(count, iteration)``).
TOKEN = channels.HOP_TOKEN
#: point-to-point channel of an early stop: ``(rank, iteration, total)`` closes every queue on the receiver.
ABORT = channels.HOP_ABORT
#: gap histogram range: Iter(j) - Iter(i) clipped to [-GAP_RANGE, GAP_RANGE].
GAP_RANGE = 16


@dataclasses.dataclass(frozen=True)
class HopConfig(ProtocolConfig):
    """Hop's parameters (see :func:`Hop`)."""

    owner: typing.ClassVar[str] = "Hop"

    graph: str = param("ring", "str, the communication graph: ring, ring-based, double-ring, complete, gateway:SIZES, "
                               "chain:SIZES or edges:EDGES such as edges:0-1,1-2,2-3,3-0 "
                               "(:mod:`hetsync.protocols.hop.graph`; self-loops are implicit).")
    backup_workers: int = param(0, "int N_buw >= 0, updates a worker does not wait for (Figure 8); must be "
                                   "< ``|N_in(i)|`` (self-loop included) on every rank.", label="backup_workers N_buw",
                                ge=0, unit="updates")
    staleness: typing.Optional[int] = param(
        None, "int s >= 0, bounded staleness (eq. 2): use each in-neighbour's newest update while it is no older "
              "than s iterations; None: off.", label="staleness s", ge=0, unit="iterations", none="off")
    max_ig: int = param(5, "int >= 1, the largest iteration gap Iter(i) - Iter(j) to an out-neighbour j, kept by the "
                           "token queues (Figure 7, Theorem 2); the update queue has max_ig + 1 rotating slots.",
                        label="max_ig", ge=1, unit="iterations")
    skip: typing.Optional[int] = param(
        None, "int J_max >= 1, the largest jump of a straggler in iterations, k - k0 <= J_max (section 5); needs "
              "backup_workers >= 1 or staleness, and J_max <= max_ig; None: no skipping.", label="skip J_max", ge=1,
        unit="iterations", none="no skipping")
    skip_trigger: int = param(2, "int >= 1, jump only when at least this many iterations behind every "
                                 "out-neighbour (section 5's user trigger).", ge=1, unit="iterations")
    average_at_end: bool = param(True, "bool, average the parameters once when training ends so every rank holds "
                                       "the same final model (the drift before it is reported).")
    timeout_s: float = param(120.0, "float seconds (> 0): the longest wait for an update, a token or the other "
                                    "ranks at the end.", gt=0, unit="seconds")

    def validate(self):
        if self.skip is not None:
            if self.backup_workers == 0 and self.staleness is None:
                raise ValueError(f"Hop: skip={self.skip} needs backup_workers >= 1 or a staleness bound: in standard "
                                 "mode a worker is never more than one iteration behind an out-neighbour, so it "
                                 "could never jump (section 5)")
            if self.skip > self.max_ig:
                raise ValueError(f"Hop: skip J_max={self.skip} exceeds max_ig={self.max_ig}: a jump of J takes J "
                                 f"tokens, at most max_ig are ever available; use skip <= {self.max_ig} or raise max_ig")
        if self.staleness is not None and self.backup_workers:
            raise ValueError(f"Hop: give either backup_workers (={self.backup_workers}) or staleness "
                             f"(={self.staleness}), not both (the hybrid is not implemented)")
        try:
            hop_graph.check_syntax(self.graph)
        except ValueError as exc:
            raise ValueError(f"Hop: {exc}") from None


def staleness_weights(iters, found, k, s):
    """Eq. (2)'s weights: Iter(u_i) - (k - s) + 1 for an update taken this iteration and no older than k - s, else 0.

    Args:
        iters: int64 [n], the iteration each update was generated in. found: bool [n], the update was
            taken in this iteration. k: int64 scalar, the current iteration. s: int >= 0, the bound.

    Returns:
        int64 [n]; s = 5, k = 10 and updates of iterations 10, 8, 5, 4 weigh 6, 4, 1, 0.
    """
    iters = tf.convert_to_tensor(iters, tf.int64)
    k = tf.cast(k, tf.int64)
    usable = tf.logical_and(tf.convert_to_tensor(found, tf.bool), iters >= k - s)
    return tf.where(usable, iters - (k - s) + 1, tf.zeros_like(iters))


def staleness_reduce(values, weights):
    """Eq. (2)'s reduce: sum_i w_i u_i / sum_i w_i.

    Args:
        values: list of float32 tensors [n, ...] (row i = update u_i). weights: int64 or float [n],
            :func:`staleness_weights` (the worker's own update of iteration k weighs s + 1, so the sum is > 0).

    Returns:
        list of float32 tensors [...], one per component.
    """
    wf = tf.cast(weights, tf.float32)
    total = tf.reduce_sum(wf)
    return [tf.tensordot(wf, v, axes=1) / total for v in values]


class HopProtocol(Protocol):
    """Decentralized training over a graph with update and token queues (see :func:`Hop`)."""

    name = "hop"
    display_name = "Hop"
    Config = HopConfig
    capabilities = Capabilities(requires_mpi=True, max_steps_per_execution=1)
    #: Hop's sends (batch begin) and token takes (batch end) run between every two steps.

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self.graph = None
        self._queue = self._tokens = None
        self._summary = {}
        self._vars = None
        self._started = False

    # -- life cycle ------------------------------------------------------------------------------
    def build(self):
        """Build the graph for this world size and check the backup workers against every in-degree.

        Raises:
            ValueError: a graph that does not exist for the world size, or N_buw >= ``|N_in(i)|`` on some rank.
        """
        n = world.size()
        self.graph = hop_graph.build(self.cfg.graph, n)
        self.rank = world.rank()
        backup = getattr(self.cfg, "backup_workers", 0)
        bad = [i for i in range(n) if backup and backup >= self.graph.n_in(i)]
        if bad:
            raise ValueError(f"Hop: backup_workers={backup} must be < |N_in(i)| (self-loop included) "
                             f"on every rank; graph {self.cfg.graph!r} on {n} workers has |N_in| = "
                             f"{[self.graph.n_in(i) for i in bad]} at rank(s) {bad}")
        for s in ("hop_iteration", "hop_updates_reduced", "hop_update_wait_ms", "hop_update_wait_total_ms",
                  "hop_token_wait_ms", "hop_iterations_skipped", "hop_weight_sum"):
            self.add_stat(s)
        with tf.init_scope():
            self._k = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_hop_iteration")
            s = getattr(self.cfg, "staleness", None)
            self._weight_hist = tf.Variable(tf.zeros([(s or 0) + 3], tf.int64), trainable=False,
                                            name="hetsync_hop_weights") if s is not None else None
        self.in_neighbours = self.graph.in_neighbours[self.rank]
        self.out_neighbours = self.graph.out_neighbours[self.rank]
        self._out_index = {j: t for t, j in enumerate(self.out_neighbours)}

    # -- the hook set: Hop's bookkeeping between compiled steps ----------------------------------------
    def on_train_begin(self, model, params):
        """Build the optimizer if Keras has not, and begin training for steps x epochs iterations, less
        ``params["start_step"]`` (the fit's steps run before Hop took over, by :func:`hetsync.Auto`'s switch).

        Raises:
            ValueError: the ranks do not train the same number of iterations (``steps_per_execution``
                > 1 is refused before, by :meth:`check_fit`: Hop's sends and token takes run between
                every two steps).
        """
        opt = model.optimizer
        if not opt.built and model.trainable_variables:
            opt.build(model.trainable_variables)
        steps, epochs = params.get("steps"), params.get("epochs")
        self.begin_training(steps * epochs - int(params.get("start_step", 0)) if steps else None)

    def on_train_batch_begin(self, batch):
        """Enter the step's iteration (take tokens, send the parameters)."""
        self.enter_iteration()

    def on_train_batch_end(self, batch, logs):
        """Leave the step's iteration; True (stop training on this rank) when its iterations are done
        (a skipping straggler runs fewer steps than the others)."""
        return bool(self.leave_iteration())

    def _variables(self):
        variables = list(getattr(self.optimizer, "_trainable_variables", None) or [])
        if not variables:
            raise RuntimeError("Hop: the optimizer is not built (no trainable variables) at train begin; use it "
                               "through model.compile + model.fit with hetsync.callbacks.standard(opt)")
        for v in variables:
            if v.dtype != "float32":
                raise TypeError(f"Hop: updates are float32; variable {v.path} is {v.dtype}")
        return variables

    def start(self):
        """Nothing yet: the on_train_begin hook sets up, once the optimizer is built (:meth:`begin_training`)."""

    def _setup(self):
        """Create the queues and route the channels into them."""
        self._vars = self._variables()
        self._p2p = transport.dispatcher()
        timeout_ms = world.dilated(self.cfg.timeout_s) * 1e3  # wall time of this run (times the dilation D)
        self._timeout_ms = timeout_ms
        self._queue = ops.hop_update_queue_create([tf.float32] * len(self._vars), [tuple(v.shape) for v in self._vars],
                                                  num_slots=self.num_slots())
        self._tokens = ops.hop_token_queue_create(len(self.out_neighbours), self.initial_tokens()) \
            if self.out_neighbours else None
        self._p2p.route(UPDATE, self._on_update)
        self._p2p.route(TOKEN, self._on_token)
        self._p2p.route(ABORT, self._on_abort)
        self._local = {"sends": 0, "sends_suppressed": 0, "update_wait_ms": 0.0, "token_wait_ms": 0.0, "jumps": 0,
                       "skipped": 0, "steps": 0, "gap_hist": np.zeros(2 * GAP_RANGE + 1, np.int64),
                       "max_gap_behind": 0, "reduced": 0, "invariant_violations": 0}
        self._pending_tokens = 1
        self.iteration = 0
        self.total_iterations = None
        self._started = True

    def num_slots(self):
        """Rotating slots of the update queue (int): max_ig + 1 (section 6.1)."""
        return self.cfg.max_ig + 1

    def initial_tokens(self):
        """Tokens each out-neighbour's counter starts with (int). Worker i holds one counter per
        out-neighbour j, the tokens j granted it; Figure 7 puts max_ig - 1 tokens in each queue and one
        more when j enters each iteration, k = 0 included."""
        return self.cfg.max_ig - 1

    # -- receive thread handlers (the point-to-point layer's thread) -------------------------------------
    def _on_update(self, message):
        ops.hop_update_queue_enqueue(self._queue, message.obj, int(message.tag), int(message.source))

    def _on_token(self, message):
        count, iteration = message.obj
        ops.hop_token_put(self._tokens, self._out_index[message.source], int(count), int(iteration))

    def _on_abort(self, message):
        rank, iteration, total = message.obj
        reason = (f"Hop: rank {rank} stopped training at iteration {iteration} of {total}; every rank must run every "
                  "iteration (its neighbours wait for its updates and tokens), so training stops on every rank")
        ops.hop_update_queue_close(self._queue, reason)
        if self._tokens is not None:
            ops.hop_token_cancel(self._tokens, reason)

    # -- between steps (the hook set) -----------------------------------------------------------------------
    def begin_training(self, total_iterations):
        """Check that every rank runs the same number of Hop iterations (one allgather).

        Args:
            total_iterations: int >= 1, epochs x steps per epoch of this rank's fit.

        Raises:
            ValueError: the ranks disagree (the message lists them) or the count is unknown.
        """
        if total_iterations is None or total_iterations < 1:
            raise ValueError(f"Hop needs a known number of steps per epoch (got {total_iterations!r}); pass "
                             "steps_per_epoch to model.fit or a dataset with a known length")
        everyone = transport.allgather_object(int(total_iterations), name="hetsync_hop_total")
        if len(set(everyone)) != 1:
            raise ValueError(f"Hop: every rank must train the same number of iterations (epochs x steps per epoch); "
                             f"got {dict(enumerate(everyone))}")
        self._setup()
        self.total_iterations = int(total_iterations)

    def enter_iteration(self):
        """Enter iteration k: insert tokens for the in-neighbours, send x_k to the out-neighbours (eager)."""
        k = self.iteration
        for j in self.in_neighbours:
            self._p2p.send(j, TOKEN, (self._pending_tokens, k))
        arrays = [v.numpy() for v in self._vars]
        self.check_finite_arrays(arrays, "parameters", k)  # never sent
        newest = ops.hop_token_size(self._tokens)[1].numpy() if self._tokens is not None else []
        # Section 6.2(b): no update to a receiver that can no longer use it, one already past iteration k
        # (backup workers), or past k + s (staleness s: it takes updates of iterations >= its own - s).
        useful_until = k + (self.cfg.staleness or 0)
        for t, j in enumerate(self.out_neighbours):
            if newest[t] > useful_until:
                self._local["sends_suppressed"] += 1
                continue
            self._p2p.send(j, UPDATE, arrays, tag=k)
            self._local["sends"] += 1
        ops.hop_update_queue_enqueue(self._queue, arrays, k, self.rank)
        self._k.assign(k)

    def leave_iteration(self):
        """Leave iteration k: choose the next iteration (skipping if allowed), take its tokens (eager).

        Returns:
            bool, True once this rank has run its last iteration (the callback stops training).

        Raises:
            HopError: a token did not arrive within ``timeout_s`` (the message names the out-neighbour).
        """
        k0 = self.iteration
        self._local["steps"] += 1
        if self._tokens is not None:
            counts, newest = (t.numpy().astype(np.int64) for t in ops.hop_token_size(self._tokens))
            # size(j -> i) = Iter(j) - Iter(i) + max_ig before i takes its tokens (Theorem 2's invariant),
            # with Iter(j) the newest iteration j announced and Iter(i) = k0 the tokens i took so far
            gaps = counts - self.cfg.max_ig
            self._local["invariant_violations"] += int(np.sum(gaps != newest - k0))
            np.add.at(self._local["gap_hist"], np.clip(gaps, -GAP_RANGE, GAP_RANGE) + GAP_RANGE, 1)
            self._local["max_gap_behind"] = max(self._local["max_gap_behind"], int(gaps.min()))
        if k0 + 1 >= self.total_iterations:
            self.iteration = self.total_iterations
            return True
        target = k0 + 1
        if self.cfg.skip is not None and self._tokens is not None:
            behind = int(gaps.min())
            if behind >= self.cfg.skip_trigger:
                target = min(k0 + self.cfg.skip, k0 + behind, self.total_iterations - 1)
        if target > k0 + 1:
            self._jump(target)
        t0 = time.perf_counter()
        for t, j in enumerate(self.out_neighbours):
            try:
                ops.hop_token_take(self._tokens, t, count=target - k0, timeout_ms=self._timeout_ms)
            except tf.errors.DeadlineExceededError:
                raise HopError(f"rank {self.rank}: no token from out-neighbour rank {j} within {self.cfg.timeout_s:g} s "
                               f"to enter iteration {target} (max_ig={self.cfg.max_ig}); rank {j} stalled or died") \
                    from None
        waited = (time.perf_counter() - t0) * 1e3
        self._local["token_wait_ms"] += waited
        self._stats["hop_token_wait_ms"].assign(waited)
        self._pending_tokens = target - k0
        self.iteration = target
        return False

    def _jump(self, target):
        """Section 5: average x with the in-neighbours' iteration-(target - 1) updates, then skip to target."""
        k0, prev = self.iteration, target - 1
        others = [j for j in self.in_neighbours]
        if self.cfg.staleness is None:
            need = max(0, len(others) - self.cfg.backup_workers)
            values, _, _ = ops.hop_update_queue_dequeue(self._queue, need, iteration=prev, timeout_ms=self._timeout_ms,
                                                        greedy=True)
            received = [v.numpy() for v in values]
            count = int(received[0].shape[0]) if received else 0
            sums = [r.sum(axis=0) for r in received]
        else:
            values, iters, found = ops.hop_update_queue_dequeue_newest(
                self._queue, others, prev - self.cfg.staleness, timeout_ms=self._timeout_ms)
            mask = found.numpy() & (iters.numpy() >= prev - self.cfg.staleness)
            count = int(mask.sum())
            sums = [v.numpy()[mask].sum(axis=0) for v in values]
        if count:
            for v, s in zip(self._vars, sums):
                v.assign((v.numpy() + s) / (count + 1))
        self._local["jumps"] += 1
        self._local["skipped"] += target - k0 - 1
        self._stats["hop_iterations_skipped"].assign(float(self._local["skipped"]))

    # -- the compiled step ---------------------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        """Recv, Reduce, then Apply: x_{k+1} = temp + (the wrapped optimizer's step from the gradient at x_k)."""
        if self._queue is None:
            raise RuntimeError("Hop: the step ran before train begin; pass hetsync.callbacks.standard(opt) to "
                               "model.fit")
        k = self._k.read_value()
        with tf.control_dependencies([g for g in grads if g is not None]):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            if self.cfg.staleness is None:
                need = self.graph.n_in(self.rank) - self.cfg.backup_workers
                values, iters, _ = ops.hop_update_queue_dequeue(self._queue, need, iteration=k,
                                                                timeout_ms=self._timeout_ms,
                                                                greedy=self.cfg.backup_workers > 0)
                count = tf.cast(tf.shape(iters)[0], tf.float32)
                temp = [tf.reduce_sum(v, axis=0) / count for v in values]
                weight_sum = count
            else:
                s = self.cfg.staleness
                ids = sorted(self.in_neighbours + [self.rank])
                values, iters, found = ops.hop_update_queue_dequeue_newest(self._queue, ids, k - s,
                                                                           timeout_ms=self._timeout_ms)
                weights = staleness_weights(iters, found, k, s)
                temp = staleness_reduce(values, weights)
                weight_sum = tf.cast(tf.reduce_sum(weights), tf.float32)
                count = tf.reduce_sum(tf.cast(weights > 0, tf.float32))
                used = tf.cast(tf.boolean_mask(tf.minimum(weights, s + 2), weights > 0), tf.int32)
                self._weight_hist.assign_add(tf.math.bincount(used, minlength=s + 3, maxlength=s + 3, dtype=tf.int64))
        with tf.control_dependencies(temp):
            t1 = tf.timestamp()
        st = self._stats
        st["hop_update_wait_ms"].assign((t1 - t0) * 1e3)
        st["hop_update_wait_total_ms"].assign_add((t1 - t0) * 1e3)
        st["hop_updates_reduced"].assign(tf.cast(count, tf.float64))
        st["hop_weight_sum"].assign(tf.cast(weight_sum, tf.float64))
        st["hop_iteration"].assign(tf.cast(k, tf.float64))
        st["syncs"].assign_add(tf.constant(1.0, tf.float64))
        st["sync_wait_ms"].assign((t1 - t0) * 1e3)
        assigns = [v.assign(t) for v, t in zip(variables, temp)]
        with tf.control_dependencies(assigns):
            return local_apply(grads, variables)

    # -- the end ----------------------------------------------------------------------------------------------
    def stop(self):
        """Drain both channels with every rank, gather the statistics, then average (``average_at_end``).

        Raises:
            HopError: a rank failed to drain in time (raised on every rank that saw it).
        """
        if not self._started:
            return
        self._started = False
        if self.total_iterations is not None and self.iteration < self.total_iterations:
            # An early stop (an error in a callback, EarlyStopping on this rank only): the neighbours
            # would wait for updates that never come. Close every rank's queues so that they fail at once.
            for j in range(self._p2p.size):
                if j != self.rank:
                    self._p2p.send(j, ABORT, (self.rank, self.iteration, self.total_iterations))
            try:
                self._p2p.flush(timeout_s=self.cfg.timeout_s, channel=ABORT)
            finally:
                for channel in (UPDATE, TOKEN, ABORT):
                    self._p2p.unroute(channel)
            raise HopError(f"Hop: rank {self.rank} stopped training at iteration {self.iteration} of "
                           f"{self.total_iterations}; every rank must run every iteration, so the other ranks were "
                           "told to stop")
        error = None
        late = {}
        for channel in (UPDATE, TOKEN):
            try:
                late[channel] = self._p2p.drain(channel, timeout_s=self.cfg.timeout_s)
            except transport.TransportTimeout as exc:
                error = error or f"rank {self.rank}: {exc}"
        for channel in (UPDATE, TOKEN, ABORT):
            self._p2p.unroute(channel)
        q = ops.hop_update_queue_counters(self._queue)
        tokens = ops.hop_token_size(self._tokens)[0].numpy().tolist() \
            if self._tokens is not None else []
        loc = self._local
        mine = {"rank": self.rank, "steps": loc["steps"], "iterations": self.iteration, "error": error,
                "sends": loc["sends"], "sends_suppressed": loc["sends_suppressed"],
                "late_updates_dropped": int(q["discarded_stale"] + q["discarded_superseded"] + q["size"]),
                "discarded_stale": int(q["discarded_stale"]), "discarded_superseded": int(q["discarded_superseded"]),
                "left_in_queue": int(q["size"]), "dropped_closed": int(q["dropped_closed"]),
                "enqueued": int(q["enqueued"]), "dequeued": int(q["dequeued"]),
                "update_wait_ms": float(self._stats["hop_update_wait_total_ms"].numpy()),
                "token_wait_ms": loc["token_wait_ms"], "jumps": loc["jumps"], "iterations_skipped": loc["skipped"],
                "tokens_at_end": tokens, "gap_histogram": loc["gap_hist"].tolist(),
                "token_invariant_violations": loc["invariant_violations"],
                "weight_histogram": self._weight_hist.numpy().tolist() if self._weight_hist is not None else None}
        per_rank = transport.allgather_object(mine, name="hetsync_hop_totals")
        errors = [(d["rank"], d["error"]) for d in per_rank if d["error"]]
        self._summary = {
            "graph": self.graph.name, "spectral_gap": hop_graph.spectral_gap(self.graph),
            "spectral_gap_paper": hop_graph.spectral_gap(self.graph, "paper"),
            "syncs": int(self._stats["syncs"].numpy()),
            "iterations": max(d["iterations"] for d in per_rank),
            "late_updates_dropped": sum(d["late_updates_dropped"] for d in per_rank),
            "sends_suppressed": sum(d["sends_suppressed"] for d in per_rank),
            "iterations_skipped": sum(d["iterations_skipped"] for d in per_rank),
            "jumps": sum(d["jumps"] for d in per_rank),
            "update_wait_ms_total": sum(d["update_wait_ms"] for d in per_rank),
            "token_wait_ms_total": sum(d["token_wait_ms"] for d in per_rank),
            "gap_histogram": {str(g - GAP_RANGE): int(c) for g, c in
                              enumerate(np.sum([d["gap_histogram"] for d in per_rank], axis=0)) if c},
            "per_rank": per_rank,
        }
        if self._weight_hist is not None:
            hist = np.sum([d["weight_histogram"] for d in per_rank], axis=0).tolist()
            s = self.cfg.staleness
            self._summary["staleness_weight_histogram"] = {
                (str(w) if w <= s + 1 else f">{s + 1}"): int(c)
                for w, c in enumerate(hist) if w > 0 and c}
        if errors:
            raise HopError("Hop failed on rank(s) " + ", ".join(str(r) for r, _ in errors) + ": "
                           + "; ".join(sorted({e for _, e in errors})))
        super().stop()
        self._summary.update(self._final)

    def summary_stats(self):
        """End-of-run statistics: graph and spectral gap, iteration-gap histogram, time blocked on updates and
        tokens (ms), late updates dropped, sends suppressed, jumps and iterations skipped, staleness weights,
        per-rank totals, and the final average's drift."""
        return dict(self._summary) if self._summary else super().summary_stats()


Hop = protocol_wrapper(HopProtocol, """Wrap a Keras 3 optimizer for Hop: decentralized training over a graph (Hop sections 3-6).

    Each rank sends its parameters to its out-neighbours every iteration, computes its gradient,
    waits for its in-neighbours' updates of the same iteration (all of them; all but
    ``backup_workers``; or, with ``staleness``, each one's newest within s iterations), averages
    them with its own (eq. 1; eq. 2's iteration weights with staleness) and applies its gradient to
    the average. Token queues keep every rank within ``max_ig`` iterations of its out-neighbours; with
    ``skip`` a straggler jumps ahead. No collective runs during training (only at the end, for the
    statistics and the final average). Needs an MPI launch and :func:`hetsync.callbacks.standard`.
    Parameters must be float32. Statistics: ``hop_update_wait_ms``, ``hop_token_wait_ms``,
    ``hop_updates_reduced``, ``hop_iterations_skipped`` per step; the summary adds the iteration gap
    histogram, late updates dropped, sends suppressed and the staleness weights used.

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.05, momentum=0.9)``.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``Hop_<optimizer class>``, a subclass of the given one).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument.
        ValueError: an argument out of range, an unknown graph or one that does not exist for the world
            size, backup_workers >= ``|N_in|`` on some rank, skip without backup workers or staleness.
        RuntimeError: hetsync not initialised, or launched under Gloo (Hop needs MPI).
    """)
