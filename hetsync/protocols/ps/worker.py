"""Parameter-server protocols: roles, the worker's push/pull, and how a server rank runs inside ``model.fit``.

The last K ranks of the launch (``servers=K``) serve parameters; ranks 0 .. n - 1 are the n workers
(:func:`hetsync.world.num_workers`, :func:`hetsync.world.is_server`). The user's script is the
same on every rank and changes no more than for the other protocols:

* wrapping the optimizer sets the roles (:meth:`PSProtocol.server_count`, :func:`hetsync.world.set_servers`);
  ``opt.hetsync_protocol.fit_data`` (and :func:`hetsync.data.shards.local_fit_data`) shard the data over
  the workers only and give a server rank one batch;
* at ``on_train_begin`` (the protocol's hook, forwarded by :class:`hetsync.callbacks.ProtocolHooks`) every rank takes
  rank 0's initial weights (one broadcast) and plans the shards (:func:`hetsync.protocols.ps.server.plan_shards`).
  A **server rank then serves inside its** ``fit``: the hook runs the server loop
  (:class:`hetsync.protocols.ps.server.ParameterServer`) until every worker said it is done, and sets
  ``model.stop_training``, so the server's ``fit`` runs one step that changes no weight and returns;
* each worker step (the compiled step, :meth:`PSProtocol.apply`) computes the gradient on the local
  model, keeps a flat copy, and applies the local step (unless alpha is always 1); between steps
  (:meth:`PSProtocol.exchange`) the worker pushes each server its shard of the gradient, waits for the
  servers' replies (w~ shard and c_i), and mixes per shard w <- (1 - alpha(c_i)) w + alpha(c_i) w~
  (SHAT eq. 3; the subclass gives alpha);
* at ``on_train_end`` (:meth:`PSProtocol.stop`, every rank) the workers tell the servers they are done,
  every rank gathers the statistics and the global model, and every rank leaves ``fit`` holding w~
  (ENSEMBLE: each worker keeps its local model).

So after ``fit`` every rank, servers included, continues the script (collectives such as
``SyncMetrics``' gather work as usual). A collective in a user callback's ``on_train_begin`` placed
after the standard callbacks would wait for the servers, which are serving: keep collectives out of
``on_train_begin`` or put such callbacks before :func:`hetsync.callbacks.standard`.
"""
import dataclasses
import time
import typing

import numpy as np
import tensorflow as tf

from hetsync import transport
from hetsync import world
from hetsync.core.protocol import Capabilities, Protocol
from hetsync.core.config import ProtocolConfig, param
from hetsync.protocols.ps.server import ERROR, PULL, PUSH, ParameterServer, PSError, explicit_momentum, plan_shards

__all__ = ["PSConfig", "PSProtocol", "PSError", "ALPHA_BINS"]

#: the summary keeps each server's arrival order only for runs of at most this many pushes.
MAX_ORDER = 20000
#: alpha histogram bins (per worker): [0, 0.1), ..., [0.9, 1.0), exactly 1.0.
ALPHA_BINS = 11


@dataclasses.dataclass(frozen=True)
class PSConfig(ProtocolConfig):
    """The parameters every parameter-server protocol has (servers, sharding, timeout)."""

    owner: typing.ClassVar[str] = "PS"

    servers: int = param(1, "int K >= 1, the number of parameter-server ranks: the last K ranks of the launch "
                            "serve, the first size - K train (at least one must train).", label="servers K", ge=1,
                         unit="ranks")
    sharding: typing.Literal["layer", "memory"] = param(
        "memory", "``\"layer\"`` (whole variables, contiguous blocks, variable counts per server differ by <= 1) or "
                  "``\"memory\"`` (the flat parameter vector cut into K chunks differing by <= 1 element; large "
                  "variables split) (SHAT section 4.4).")
    timeout_s: float = param(120.0, "float seconds (> 0): the longest a worker waits for a server's reply and a "
                                    "server waits for a message from an unfinished worker before a clear error.",
                             gt=0, unit="seconds")
    stale_lr: typing.Literal["constant", "inverse"] = param(
        "constant", "str, the servers' learning rate for a push: ``\"constant\"`` (the worker's eta, SHAT "
                    "Algorithm 1 line 21) or ``\"inverse\"`` (eta / c_i where the push's staleness c_i, the updates "
                    "by other workers since this worker's previous push, is >= 1: staleness-aware asynchronous "
                    "SGD, Zhang et al., IJCAI 2016).")
    server_momentum: float = param(
        0.0, "float mu in [0, 1), the servers' heavy-ball momentum: u <- mu u + g, w~ <- w~ - eta u per push "
             "(0: plain SGD, SHAT Algorithm 1 line 21; the wrapped optimizer's own momentum only acts on the local "
             "steps of SHAT, SHAT-root and ENSEMBLE).", ge=0, lt=1)
    momentum_correction: typing.Literal["none", "asynchrony"] = param(
        "none", "str, ``\"none\"`` (the servers apply ``server_momentum`` as given) or ``\"asynchrony\"``: they "
                "apply max(0, mu - (1 - 1/n)) for n workers, since asynchrony of n workers adds an implicit "
                "momentum 1 - 1/n (Mitliagkas, Zhang, Hadjis and Re, \"Asynchrony begets momentum\", Allerton 2016).")
    data_plan: typing.Literal["pool", "shard"] = param(
        "pool", "str, how ``fit_data`` feeds the workers: ``\"pool\"`` (default; work conservation: each "
                "epoch is a pool of the N samples served by worker 0, faster workers draw more batches, every sample "
                "once per epoch, :mod:`hetsync.data.pool`; under SSP the gate still holds a fast worker within s "
                "iterations of the slowest unfinished one) or ``\"shard\"`` (a fixed equal share per worker).")


class PSProtocol(Protocol):
    """Base of the parameter-server protocols (SHAT family, SSP): roles, sharding, push/pull, mixing.

    Subclasses set :attr:`local_step` (apply the wrapped optimizer's step locally), :attr:`staleness_bound`
    (None, or SSP's s) and :meth:`alpha` (the mixing weight from a counter c_i).
    """

    # the push, the pull and the mixing run between every two steps (the on_train_batch_end hook), so a
    # compiled loop of k > 1 steps would push one gradient in k
    capabilities = Capabilities(requires_mpi=True, max_steps_per_execution=1)
    #: apply the wrapped optimizer's step to the local model (False where alpha is always 1: it is overwritten).
    local_step = True

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self._vars = None
        self._summary = {}
        self.ranges = None
        self.step = 0
        self.last_global = None
        self.local_models = None
        self._began = False

    # -- configuration -----------------------------------------------------------------------------
    def server_count(self):
        """Return ``servers`` K (int): the last K ranks serve parameters."""
        return self.cfg.servers

    @property
    def staleness_bound(self):
        """SSP's staleness bound s (int), or None for protocols without a gate."""
        return None

    def alpha(self, c):
        """Return ``(alpha, clipped)``: the mixing weight in [0, 1] for counter c (int >= 0) and whether it
        was clipped. Subclasses override (SHAT eq. 4); the default is 1 (take the global model)."""
        return 1.0, False

    def build(self):
        """Record the roles and create the per-step statistics (eagerly)."""
        self.n_workers = self.roles.num_workers
        self.serves = self.roles.is_server
        self.workers = list(range(self.n_workers))
        self.server_ranks = list(range(self.n_workers, world.size()))
        for s in ("ps_alpha", "ps_c", "ps_alpha_mean", "ps_alpha_clips", "ps_wait_ms", "ps_pushes", "ps_step"):
            self.add_stat(s)

    # -- the hook set: between compiled steps (``steps_per_execution`` > 1 is refused by
    # :meth:`check_fit`, :attr:`capabilities` allow 1: the exchange runs between every two steps)
    def on_train_begin(self, model, params):
        """Build the optimizer if Keras has not, then :meth:`begin` (shards and the server loop).

        Returns:
            True on a server rank (it served until every worker finished: training stops).
        """
        opt = model.optimizer
        if not opt.built and model.trainable_variables:
            opt.build(model.trainable_variables)
        return bool(self.begin())

    def on_train_batch_end(self, batch, logs):
        """On a worker: push, pull and mix (:meth:`exchange`)."""
        if not self.serves:
            self.exchange()

    # -- train begin ----------------------------------------------------------------------------------
    def _variables(self):
        variables = list(getattr(self.optimizer, "_trainable_variables", None) or [])
        if not variables:
            raise RuntimeError(f"{self.display_name}: the optimizer is not built (no trainable variables) at train "
                               "begin; use it through model.compile + model.fit with hetsync.callbacks.standard(opt)")
        for v in variables:
            if v.dtype != "float32":
                raise TypeError(f"{self.display_name}: the servers hold float32 parameters; variable {v.path} is "
                                f"{v.dtype}")
        return variables

    def flat_weights(self):
        """Return the local model as one float32 array [P] (variables flattened in order)."""
        return np.concatenate([np.ravel(v.numpy()) for v in self._vars]).astype(np.float32, copy=False)

    def set_flat_weights(self, flat):
        """Assign a float32 array [P] to the trainable variables (the inverse of :meth:`flat_weights`)."""
        for v, (lo, hi) in zip(self._vars, self._var_ranges):
            v.assign(np.reshape(flat[lo:hi], v.shape))

    def begin(self):
        """Train begin on every rank: rank 0's weights everywhere, the shard plan; a server rank then serves.

        Returns:
            bool, True on a server rank once every worker finished (its ``fit`` should stop).

        Raises:
            ValueError: no worker left (servers >= ranks), or more servers than parameters (the message
                names the sharding).
            PSError: the server loop failed (a worker silent for ``timeout_s``, ...).
        """
        self.check_roles()
        self._vars = self._variables()
        sizes = [int(np.prod(v.shape)) for v in self._vars]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._var_ranges = [(int(offsets[i]), int(offsets[i + 1])) for i in range(len(sizes))]
        self.num_params = int(offsets[-1])
        self.ranges = plan_shards(sizes, self.cfg.servers, self.cfg.sharding)
        # The global model starts as rank 0's initial weights (also what BroadcastInitialVariables did).
        transport.broadcast_variables(self._vars, 0, name=f"hetsync_{self.name}_w0")
        self._p2p = transport.dispatcher()
        self.step = 0
        self._began = True
        self._local = {"wait_ms": 0.0, "clips": 0, "alpha_hist": np.zeros(ALPHA_BINS, np.int64), "alpha_sum": 0.0,
                       "c_sum": [0] * self.cfg.servers, "replies": [0] * self.cfg.servers, "error": None}
        if not self.serves:
            with tf.init_scope():
                self._grad = tf.Variable(tf.zeros([self.num_params], tf.float32), trainable=False,
                                         name=f"hetsync_{self.name}_flat_grad")
                self._lr = tf.Variable(0.0, dtype=tf.float64, trainable=False, name=f"hetsync_{self.name}_lr")
            return False
        k = world.rank() - self.n_workers
        lo, hi = self.ranges[k]
        self.server = ParameterServer(self._p2p, k, self.flat_weights()[lo:hi], self.workers,
                                      staleness=self.staleness_bound, timeout_s=self.cfg.timeout_s,
                                      stale_lr=self.cfg.stale_lr,
                                      momentum=explicit_momentum(self.cfg.server_momentum, self.n_workers,
                                                                 self.cfg.momentum_correction))
        self._server_stats = self.server.serve()
        return True

    # -- the compiled step (workers) -----------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        """Keep a flat float32 copy of the gradient [P] and its learning rate, then the local step (or none).

        On a server rank the step changes nothing (it runs once, after serving). The gradient is computed
        on the local model w^i (Algorithm 1 line 4); the push and the mixing happen between steps.
        """
        if self.serves:
            return tf.no_op()
        if not self._began:
            raise RuntimeError(f"{self.display_name}: the step ran before train begin; pass "
                               "hetsync.callbacks.standard(opt) to model.fit")
        flat = tf.concat([tf.reshape(tf.zeros_like(v.value) if g is None else tf.convert_to_tensor(g), [-1])
                          for g, v in zip(grads, variables)], axis=0)
        ops = [self._grad.assign(tf.cast(flat, tf.float32)),
               self._lr.assign(tf.cast(self.optimizer.learning_rate, tf.float64))]
        with tf.control_dependencies(ops):
            if self.local_step:
                return local_apply(grads, variables)
            return self.optimizer.iterations.assign_add(1)

    # -- between steps (workers) ----------------------------------------------------------------------------
    def exchange(self):
        """Push this step's gradient shards, wait for every server's reply, mix (eager, after each step).

        Algorithm 1 lines 5-8: each server k gets g[lo_k:hi_k] and the step's learning rate; its reply is
        (w~ shard, c_i^k); per shard w <- (1 - alpha(c)) w + alpha(c) w~ (alpha 1: w = w~ exactly; 0: w kept).

        Raises:
            PSError: a server did not reply within ``timeout_s`` (dead or stalled; the message names it),
                or a server reported a failure.
        """
        t = self.step
        g = self._grad.numpy()
        self.check_finite_arrays([g], "gradient", t)  # never pushed
        eta = float(self._lr.numpy())
        sent_at = time.time()
        t0 = time.monotonic()
        for k, (lo, hi) in enumerate(self.ranges):
            self._p2p.send(self.server_ranks[k], PUSH, (eta, g[lo:hi], sent_at), tag=t)
        replies = [self._await(k, t, t0) for k in range(len(self.ranges))]
        waited = (time.monotonic() - t0) * 1e3
        w = self.flat_weights().copy()
        glob = np.empty_like(w)
        alphas, cs = [], []
        mixed = False
        for k, ((lo, hi), (shard, c)) in enumerate(zip(self.ranges, replies)):
            a, clipped = self.alpha(int(c))
            glob[lo:hi] = shard
            if a >= 1.0:
                w[lo:hi] = shard
                mixed = True
            elif a > 0.0:
                w[lo:hi] = np.float32(1.0 - a) * w[lo:hi] + np.float32(a) * shard
                mixed = True
            alphas.append(a)
            cs.append(int(c))
            self._local["clips"] += int(clipped)
            self._local["c_sum"][k] += int(c)
            self._local["replies"][k] += 1
        if mixed:
            self.set_flat_weights(w)
        self.last_global = glob
        self.step += 1
        loc = self._local
        loc["wait_ms"] += waited
        loc["alpha_sum"] += alphas[0]
        loc["alpha_hist"][min(int(alphas[0] * 10), ALPHA_BINS - 1) if alphas[0] < 1.0 else ALPHA_BINS - 1] += 1
        st = self._stats
        st["ps_alpha"].assign(alphas[0])
        st["ps_c"].assign(float(cs[0]))
        st["ps_alpha_mean"].assign(float(np.mean(alphas)))
        st["ps_alpha_clips"].assign(float(loc["clips"]))
        st["ps_wait_ms"].assign(waited)
        st["sync_wait_ms"].assign(waited)
        st["syncs"].assign_add(1.0)
        st["ps_pushes"].assign(float(self.step * len(self.ranges)))
        st["ps_step"].assign(float(t))

    def _await(self, k, t, t0):
        """Server k's reply to the push of iteration t (pushed at ``t0``, ``time.monotonic`` seconds); a
        server's failure report raises at once, no reply within ``timeout_s`` raises :class:`PSError`."""
        server, me = self.server_ranks[k], self._p2p.rank
        return self._p2p.recv_or_fail(
            PULL, server, tag=t, timeout_s=max(0.0, t0 + self.cfg.timeout_s - time.monotonic()), fail_channel=ERROR,
            error=PSError,
            late=(f"{self.display_name}: worker rank {me}: no reply from parameter server {k} (rank {server}) to the "
                  f"push of iteration {t} within {self.cfg.timeout_s:g} s: the server died or stalled"),
            failed=lambda src, obj: f"{self.display_name}: worker rank {me}: parameter server rank {src} failed: {obj}")

    # -- the end (every rank) -------------------------------------------------------------------------------
    def stop(self):
        """Workers tell the servers they are done; every rank gathers the statistics and the global model w~.

        Every rank leaves ``fit`` with w~ (the servers' shards joined), except under ENSEMBLE
        (:attr:`keeps_local_model`), where each worker keeps its local model and the statistics report how
        far the local models are from their mean.

        Raises:
            PSError: a worker or server failed (raised on every rank, naming the ranks).
        """
        if not self._began:
            return
        self._began = False
        if not self.serves:
            for r in self.server_ranks:
                self._p2p.send(r, PUSH, None, tag="done")
            try:
                self._p2p.flush(timeout_s=self.cfg.timeout_s, channel=PUSH)
            except transport.TransportTimeout as exc:
                self._local["error"] = f"rank {world.rank()}: {exc}"
        loc = self._local
        mine = {"rank": world.rank(), "role": "server" if self.serves else "worker", "error": loc["error"]}
        if self.serves:
            mine["server"] = self._server_stats
            mine["server_order"] = self.server.order
            shard = (self.ranges[self.server.index], self.server.w)
        else:
            mine.update({"steps": self.step, "wait_ms": loc["wait_ms"], "alpha_clips": loc["clips"],
                         "alpha_mean": loc["alpha_sum"] / max(1, self.step),
                         "alpha_histogram": loc["alpha_hist"].tolist(),
                         "c_sum": list(loc["c_sum"]), "replies": list(loc["replies"])})
            shard = None
        per_rank = transport.allgather_object(mine, name=f"hetsync_{self.name}_stats")
        shards = transport.allgather_object(shard, name=f"hetsync_{self.name}_model")
        glob = np.empty(self.num_params, np.float32)
        for item in shards:
            if item is not None:
                (lo, hi), w = item
                glob[lo:hi] = w
        self.global_model = glob
        self._gather_summary(per_rank)
        errors = [(d["rank"], d["error"]) for d in per_rank if d.get("error")]
        if errors:
            raise PSError(f"{self.display_name} failed on rank(s) " + ", ".join(str(r) for r, _ in errors) + ": "
                          + "; ".join(sorted({e for _, e in errors})))
        self.finish(glob)

    def finish(self, glob):
        """Leave ``fit`` holding the global model w~ (float32 [P]) on every rank. ENSEMBLE overrides."""
        self.set_flat_weights(glob)

    def _gather_summary(self, per_rank):
        servers = [d["server"] for d in per_rank if d["role"] == "server"]
        workers = [d for d in per_rank if d["role"] == "worker"]
        n = self.n_workers
        self._summary = {
            "workers": n, "servers": len(servers), "sharding": self.cfg.sharding,
            "shard_ranges": [list(r) for r in self.ranges], "num_params": self.num_params,
            "shard_elements": [hi - lo for lo, hi in self.ranges],
            "pushes_per_server": [s["pushes"] for s in servers], "pulls_per_server": [s["pulls"] for s in servers],
            "queue_wait_ms_per_server": [s["queue_wait_ms"] for s in servers],
            "alpha_mean_per_worker": [w["alpha_mean"] for w in workers],
            "alpha_clips": sum(w["alpha_clips"] for w in workers),
            "alpha_histogram": np.sum([w["alpha_histogram"] for w in workers], axis=0).tolist() if workers else [],
            "worker_wait_ms_total": sum(w["wait_ms"] for w in workers),
            "syncs": int(self._stats["syncs"].numpy()),
            "per_server": servers, "per_worker": workers,
            # the arrival order (worker rank, iteration) at every server, for runs of up to MAX_ORDER pushes
            "server_order": [d.get("server_order") if len(d.get("server_order") or ()) <= MAX_ORDER else None
                             for d in per_rank if d["role"] == "server"],
        }
        # Conservation (Algorithm 1): per server, sum of the returned c + sum of the final counters = (n - 1) x updates
        self._summary["counter_check"] = [
            {"server": s["server"], "returned_c": sum(w["c_sum"][s["server"]] for w in workers),
             "final_counters": sum(s["final_counters"].values()), "expected": (n - 1) * s["updates"]}
            for s in servers]
        if self.staleness_bound is not None:
            self._summary["gate_max_lead"] = max((s["gate_max_lead"] for s in servers), default=0)
            self._summary["gate_held_replies"] = sum(s["gate_held_replies"] for s in servers)
            # SSP's staleness histogram: at each reply (the start of iteration t + 1), t + 1 - min clock, over servers
            hist = {}
            for s in servers:
                for lead, count in s["gate_lead_histogram"].items():
                    hist[lead] = hist.get(lead, 0) + count
            self._summary["staleness_histogram"] = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))

    def summary_stats(self):
        """End-of-run statistics: roles, shards, pushes and pulls per server, server queue wait (ms), alpha
        per worker (mean, histogram, clips), the counter conservation check, per-server and per-worker
        details (SSP: the gate's largest lead, held replies and the staleness histogram: iteration started minus
        the slowest clock, per reply, summed over servers)."""
        if not self._summary:
            return super().summary_stats()
        return self.with_pool_stats(dict(self._summary))
