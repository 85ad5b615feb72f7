"""Work conservation: an epoch is a pool of training samples that ranks draw batches from.

For the protocols whose ranks do not step together (RNA today; see the documentation's "Work conservation
(sample pool)"), a fixed share per rank makes every rank wait for the slowest one's share. With the
pool, each epoch is one seeded permutation of the N training samples; a rank asks for its next
batch, gets the next ``b`` indices of the permutation, trains on them and asks again, until the
pool answers "empty", which ends that rank's epoch. Faster ranks therefore process more batches,
and every sample is used exactly once per epoch.

Design
------
* :class:`PoolState`: the pure bookkeeping (no MPI): per epoch the permutation
  (:func:`epoch_order`), the position of the next batch, the samples handed out per rank, a count
  per sample index (a repeated or never-handed-out index is counted, never silent), and the
  clients' confirmations of what they received.
* :class:`PoolServer`: one rank (rank 0) serves the pool from the point-to-point dispatcher's
  receive thread (:meth:`hetsync.transport.Dispatcher.route` on channel :data:`REQUEST`), so a
  server rank whose trainer is busy in a step, or stalled, still answers at once. Replies go on
  channel :data:`REPLY`, tagged with the request's sequence number.
* :class:`PoolClient`: every rank (the server rank too, through messages to itself) asks for its
  next batch with a timeout (:class:`PoolError` names the rank, the server and the epoch).
* :func:`plan`: the data plan (``model.fit`` arguments). The batches reach Keras through a
  ``tf.data.Dataset.from_generator`` (explicit output signature, so Keras never peeks a batch, and
  no prefetch: a batch is claimed only when the training step takes it, so every claimed batch is
  trained on). Keras 3.15 infers an unknown epoch length from the first epoch and would cut later,
  longer epochs at that length; :class:`_PoolAdapter` therefore declares an upper bound,
  ceil(N / b) + 1 batches, which a rank never reaches, so each epoch ends when the generator sees
  "empty" (Keras then warns once "Your input ran out of data", which is expected; the warning is
  filtered). tf.data's autotuning is off for this dataset (:func:`without_autotune`): with it, destroying
  each epoch's iterator stalled ranks for seconds at epoch boundaries.

Batches: full batches of ``b`` samples; the remainder r = N mod b is *added to the last batch of
the epoch* (b + r samples, one step) rather than served as a tiny batch of r samples (a step on a
few samples with the full learning rate hurts accuracy, see :meth:`hetsync.protocols.Protocol.fit_data`).
With N < b the epoch is one batch of N samples.

Accounting: the server counts the samples it handed out per epoch (total and per rank) and each
index's count; at the end of its epoch every client confirms the indices it received (and trained
on: without prefetch, a batch the generator yielded was taken by a step). :meth:`PoolState.report`
gives, per epoch, ``handed_out`` (== N when the epoch completed), ``repeated``, ``missing``
(never handed out, e.g. training stopped early) and ``unconfirmed`` (handed out but not confirmed
by the rank that got it: lost). Protocols put it in ``summary_stats()["pool"]`` on the server rank.
"""
import collections
import threading
import time
import warnings

import numpy as np
from hetsync import world
from hetsync.errors import PoolError
from hetsync.transport import channels

__all__ = ["PoolState", "PoolServer", "PoolClient", "PoolError", "epoch_order", "plan", "REQUEST", "REPLY",
           "DATA_PLANS", "DEFAULT_TIMEOUT_S", "check_data_plan", "without_autotune"]

#: channel of requests (``("claim", epoch, seq)``, ``("confirm", epoch, indices)``) to the pool server.
REQUEST = channels.POOL_REQUEST
#: channel of the server's replies ``(epoch, seq, indices or None, batches of the epoch handed out so far)``,
#: tagged with ``seq``.
REPLY = channels.POOL_REPLY
#: the data plans a protocol with a ``data_plan`` field accepts.
DATA_PLANS = ("pool", "shard")
#: default seconds a rank waits for the pool server's reply.
DEFAULT_TIMEOUT_S = 120.0

warnings.filterwarnings("ignore", message="Your input ran out of data")


def check_data_plan(owner, value):
    """Return ``value`` if it is a data plan in :data:`DATA_PLANS`.

    Args:
        owner: str protocol display name for the message. value: the ``data_plan`` argument.

    Raises:
        ValueError: anything else (names the value and the allowed ones).
    """
    if not isinstance(value, str) or value not in DATA_PLANS:
        raise ValueError(f"{owner}: data_plan must be one of {DATA_PLANS}, got {value!r}")
    return value


def epoch_order(n, epoch, seed):
    """The epoch's sample order: a permutation of ``range(n)`` seeded by ``(seed, epoch)``.

    Args:
        n: int >= 1 samples. epoch: int >= 0. seed: int >= 0.

    Returns:
        int64 array [n], a permutation.
    """
    return np.random.default_rng([int(seed), int(epoch)]).permutation(int(n)).astype(np.int64)


class PoolState:
    """The pool's bookkeeping on the server rank (pure logic, thread-safe; no MPI).

    Args:
        n: int >= 1, training samples N. batch_size: int >= 1, samples b per batch.
        ranks: iterable of int ranks that draw from the pool (each confirms every epoch).
        seed: int >= 0, seeds :func:`epoch_order`.

    Raises:
        ValueError: bad ``n``, ``batch_size``, ``ranks`` or ``seed``.
    """

    def __init__(self, n, batch_size, ranks, seed=0):
        for name, value, low in (("n", n, 1), ("batch_size", batch_size, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"PoolState: {name} must be an int >= {low}, got {value!r}")
        self.n, self.b, self.seed = int(n), int(batch_size), int(seed)
        self.ranks = sorted({int(r) for r in ranks})
        if not self.ranks:
            raise ValueError(f"PoolState: ranks must name at least one rank, got {ranks!r}")
        self._lock = threading.Condition()
        self._epochs = {}

    def _epoch(self, epoch):
        e = self._epochs.get(epoch)
        if e is None:
            e = {"order": epoch_order(self.n, epoch, self.seed), "pos": 0, "count": np.zeros(self.n, np.int64),
                 "per_rank": dict.fromkeys(self.ranks, 0), "batches": dict.fromkeys(self.ranks, 0),
                 "given": {r: [] for r in self.ranks}, "confirmed": {},
                 "handed_batches": 0}
            self._epochs[epoch] = e
        return e

    def batch_bounds(self, pos):
        """Return ``(start, stop)`` of the batch starting at ``pos`` (the last batch takes the
        remainder N mod b; see the module notes), or None when ``pos`` >= N."""
        if pos >= self.n:
            return None
        stop = pos + self.b
        if self.n - stop < self.b:  # what would be left is less than a full batch: take it now
            stop = self.n
        return pos, stop

    def claim(self, rank, epoch):
        """Hand rank ``rank`` its next batch of epoch ``epoch``.

        Args:
            rank: int, one of :attr:`ranks`. epoch: int >= 0.

        Returns:
            int64 array [b] (or [b + N mod b] for the epoch's last batch) of sample indices, or None
            if the epoch's pool is empty.

        Raises:
            PoolError: unknown rank, or a negative epoch.
        """
        if rank not in self.ranks or epoch < 0:
            raise PoolError(f"pool: claim from rank {rank} for epoch {epoch}; ranks {self.ranks}, epochs >= 0")
        with self._lock:
            e = self._epoch(epoch)
            bounds = self.batch_bounds(e["pos"])
            if bounds is None:
                return None
            idx = e["order"][bounds[0]:bounds[1]]
            e["pos"] = bounds[1]
            np.add.at(e["count"], idx, 1)
            e["per_rank"][rank] += len(idx)
            e["batches"][rank] += 1
            e["given"][rank].append(idx)
            e["handed_batches"] += 1
            return idx

    def handed_batches(self, epoch):
        """Return the number of batches of epoch ``epoch`` handed out so far (int; the pool's global
        progress, which schedules local SGD's and FedAvg's averaging rounds)."""
        with self._lock:
            return self._epoch(epoch)["handed_batches"]

    @property
    def batches_per_epoch(self):
        """The number of batches B of every epoch (int): max(1, N // b) (the remainder joins the last)."""
        return max(1, self.n // self.b)

    def confirm(self, rank, epoch, indices):
        """Record that rank ``rank`` received (and trained on) ``indices`` in epoch ``epoch``.

        Args:
            rank: int. epoch: int. indices: int array [k] (all the rank's indices of the epoch).

        Raises:
            PoolError: unknown rank or a second confirmation of the same epoch by the same rank.
        """
        if rank not in self.ranks:
            raise PoolError(f"pool: confirmation from rank {rank}, not one of {self.ranks}")
        with self._lock:
            e = self._epoch(epoch)
            if rank in e["confirmed"]:
                raise PoolError(f"pool: rank {rank} confirmed epoch {epoch} twice")
            e["confirmed"][rank] = np.asarray(indices, np.int64)
            self._lock.notify_all()

    def wait_confirmed(self, timeout_s):
        """Wait up to ``timeout_s`` seconds until every rank confirmed every epoch started; return
        True if they all did (False: the report counts the missing ones as unconfirmed). ``timeout_s`` is
        multiplied by the run's dilation D (:func:`hetsync.world.dilated`)."""
        deadline = time.monotonic() + world.dilated(timeout_s)
        with self._lock:
            while True:
                if all(len(e["confirmed"]) == len(self.ranks) for e in self._epochs.values()):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)

    def report(self):
        """Per-epoch accounting (JSON-serialisable).

        Returns:
            dict: ``n``, ``batch_size``, ``epochs`` (list, one dict per epoch started:
            ``handed_out`` samples, ``repeated`` (extra hand-outs of an index), ``missing`` (indices
            never handed out), ``per_rank_samples`` and ``per_rank_batches`` ({rank: int}),
            ``confirmed_ranks``, ``unconfirmed`` (samples handed out but not confirmed by their rank,
            i.e. lost) and ``mismatched`` (confirmed samples that differ from what was handed out)),
            and totals ``lost``, ``repeated``, ``missing`` over the epochs.
        """
        out = {"n": self.n, "batch_size": self.b, "epochs": []}
        with self._lock:
            for epoch in sorted(self._epochs):
                e = self._epochs[epoch]
                unconfirmed = mismatched = 0
                for r in self.ranks:
                    given = np.sort(np.concatenate(e["given"][r])) if e["given"][r] else np.zeros(0, np.int64)
                    got = e["confirmed"].get(r)
                    if got is None:
                        unconfirmed += len(given)
                        continue
                    got = np.sort(got)
                    if len(got) != len(given) or not np.array_equal(got, given):
                        mismatched += int(np.setxor1d(got, given).size)
                        unconfirmed += max(0, len(given) - len(got))
                out["epochs"].append({
                    "epoch": epoch, "handed_out": int(e["count"].sum()),
                    "repeated": int(np.maximum(e["count"] - 1, 0).sum()), "missing": int((e["count"] == 0).sum()),
                    "per_rank_samples": {str(r): int(v) for r, v in e["per_rank"].items()},
                    "per_rank_batches": {str(r): int(v) for r, v in e["batches"].items()},
                    "confirmed_ranks": sorted(int(r) for r in e["confirmed"]), "unconfirmed": unconfirmed,
                    "mismatched": mismatched})
        for k, src in (("lost", "unconfirmed"), ("repeated", "repeated"), ("missing", "missing"),
                       ("mismatched", "mismatched")):
            out[k] = sum(e[src] for e in out["epochs"])
        return out


class PoolServer:
    """Serve a :class:`PoolState` on the dispatcher's receive thread (channel :data:`REQUEST`).

    Args:
        dispatcher: this rank's :class:`hetsync.transport.Dispatcher`. state: a :class:`PoolState`.

    A request ``("claim", epoch, seq)`` is answered with ``(epoch, seq, indices or None, handed)`` on
    :data:`REPLY` (tag ``seq``); ``("confirm", epoch, indices)`` is recorded. Anything else is a
    :class:`PoolError`, which fails the receive thread (every waiter then sees it).
    """

    #: the pool server serving on each dispatcher (id -> PoolServer): a new pool (a second model's
    #: fit in the same process) replaces the one before it.
    _active = {}

    def __init__(self, dispatcher, state):
        self.dispatcher, self.state = dispatcher, state
        previous = PoolServer._active.get(id(dispatcher))
        if previous is not None:
            previous.close()
        dispatcher.route(REQUEST, self._handle)
        PoolServer._active[id(dispatcher)] = self

    def _handle(self, message):
        kind = message.obj[0]
        if kind == "claim":
            _, epoch, seq = message.obj
            idx = self.state.claim(message.source, int(epoch))
            progress = self.state.handed_batches(int(epoch))
            self.dispatcher.send(message.source, REPLY, (epoch, seq, idx, progress), tag=seq)
        elif kind == "confirm":
            _, epoch, indices = message.obj
            self.state.confirm(message.source, int(epoch), indices)
        else:
            raise PoolError(f"pool server: unknown request {message.obj!r} from rank {message.source}")

    def close(self):
        """Stop serving (queue the channel's messages again). Idempotent."""
        if PoolServer._active.get(id(self.dispatcher)) is self:
            del PoolServer._active[id(self.dispatcher)]
            self.dispatcher.unroute(REQUEST)


class PoolClient:
    """A rank's side of the pool: claim the next batch, confirm the epoch.

    Args:
        dispatcher: this rank's Dispatcher. server: int rank serving the pool.
        timeout_s: float seconds > 0 to wait for each reply.

    Attributes:
        epoch: int, the pool epoch this client draws from next (advances when it sees "empty").
        epochs: list of dicts ``{"epoch", "samples", "batches"}``, one per completed epoch.
        progress: ``(epoch, batches handed out in it so far)`` from the latest reply (global progress,
            over all ranks), ``(0, 0)`` before the first.
        batches_per_epoch: int B, batches in every epoch (set by :func:`plan`), or None.
    """

    def __init__(self, dispatcher, server, timeout_s=DEFAULT_TIMEOUT_S):
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"PoolClient: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.dispatcher, self.server, self.timeout_s = dispatcher, int(server), float(timeout_s)
        self.epoch, self._seq = 0, 0
        self.progress = (0, 0)
        self.batches_per_epoch = None
        #: with ``track_progress`` True, the progress ``(epoch, handed)`` of every batch handed to Keras,
        #: oldest first (Keras may pull a batch ahead: the consumer pops one per step it ran).
        self.track_progress = False
        self.batch_progress = collections.deque()
        self._received = []
        self.epochs = []
        #: samples this rank drew in the last epoch that ended (int; 0 before the first).
        self.samples_last_epoch = 0

    def track_batches(self):
        """From now on, record the global progress ``(epoch, handed)`` of every batch handed out
        (:attr:`batch_progress`, oldest first; the consumer pops one per step it ran)."""
        self.track_progress = True

    def claim(self):
        """Return the next batch's indices (int64 array) of the current epoch, or None if it is empty.

        Raises:
            PoolError: no reply within ``timeout_s`` (names this rank, the server and the epoch).
        """
        from hetsync import transport

        self._seq += 1
        seq = self._seq
        self.dispatcher.send(self.server, REQUEST, ("claim", self.epoch, seq))
        try:
            msg = self.dispatcher.recv(REPLY, source=self.server, tag=seq, timeout_s=self.timeout_s)
        except transport.TransportTimeout as exc:
            raise PoolError(f"rank {self.dispatcher.rank}: no batch from the pool server (rank {self.server}) for "
                            f"epoch {self.epoch} within {self.timeout_s:g} s: {exc}") from exc
        epoch, _, idx, handed = msg.obj
        self.progress = (epoch, int(handed))
        if epoch != self.epoch:
            raise PoolError(f"rank {self.dispatcher.rank}: pool reply for epoch {epoch}, expected {self.epoch}")
        if idx is not None:
            self._received.append(idx)
            if self.track_progress:
                self.batch_progress.append(self.progress)
        return idx

    def end_epoch(self):
        """Confirm the epoch's indices to the server, record it and move to the next epoch.

        Returns:
            int, the samples this rank drew in the epoch that ended.
        """
        got = np.concatenate(self._received) if self._received else np.zeros(0, np.int64)
        self.dispatcher.send(self.server, REQUEST, ("confirm", self.epoch, got))
        self.epochs.append({"epoch": self.epoch, "samples": int(len(got)), "batches": len(self._received)})
        self.samples_last_epoch = int(len(got))
        self._received = []
        self.epoch += 1
        return int(len(got))


def _pool_adapter(dataset, max_batches):
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

    class _PoolAdapter(TFDatasetAdapter):
        """A tf.data adapter declaring an upper bound on the epoch's batches (see the module notes)."""

        #: marks ``model.fit`` input drawn from the pool (checked by hetsync.callbacks.checkpoint)
        hetsync_pool = True

        @property
        def num_batches(self):
            return max_batches

    # Every pool epoch ends before the declared bound, by design; Keras would warn each epoch that the
    # input "ran out of data". That one message is silenced (the pool's own report counts every sample).
    warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)
    return _PoolAdapter(dataset)


def without_autotune(dataset):
    """``dataset`` with tf.data's autotuning switched off (``tf.data.Options().autotune.enabled = False``).

    Keras makes a new iterator over the pool's dataset every epoch, and the previous epoch's iterator is
    destroyed when the next epoch's first batch is taken. With autotuning on, that destruction waits for the
    iterator's autotuning thread, whose period grows while it has nothing to tune: measured on the emulated
    cluster (4 ranks, ``device:40``, MNIST), a quarter to a half of the epoch boundaries of RNA and local SGD
    stalled a rank for 0.5 to 5 s before its first step, and local SGD's averaging made every rank wait for it
    (40% of a 110 s run). The pool's dataset has no parallel map, prefetch or cache to tune.

    Args:
        dataset: a ``tf.data.Dataset``.

    Returns:
        the same dataset with the options applied (a ``tf.data.Dataset``).
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def plan(x, y, batch_size, seed=0, server=0, ranks=None, timeout_s=DEFAULT_TIMEOUT_S, name="pool"):
    """The data plan drawing this rank's batches from the epoch's sample pool.

    Collective: every rank in ``ranks`` calls it (it creates the dispatcher on first use); the
    ``server`` rank also starts serving. The returned plan carries the :class:`PoolClient` (its
    ``samples_last_epoch`` is the samples this rank drew in the epoch that ended) and, on the
    serving rank, the :class:`PoolServer`; a protocol adopting a second plan closes the first's server.

    Args:
        x: array [N, ...]. y: array [N]. batch_size: int b >= 1 samples per step (at most N).
        seed: int >= 0, seeds each epoch's permutation. server: int rank serving the pool.
        ranks: list of int ranks drawing from it (None: every rank). timeout_s: float seconds a
        rank waits for a reply. name: str, the protocol's name (for messages).

    Returns:
        :class:`hetsync.data.plan.DataPlan` with ``x`` (a Keras data adapter; no
        ``steps_per_epoch``: epochs end when the pool is empty), ``batch_size``,
        ``samples_per_epoch=0`` (known per epoch), ``pool`` and ``pool_server``.

    Raises:
        ValueError: bad ``batch_size`` (not an int in [1, N]), lengths of ``x`` and ``y`` differ.
    """
    import tensorflow as tf

    from hetsync import transport
    from hetsync import world
    from hetsync.data.plan import DataPlan, check_batch_size

    n = len(x)
    if len(y) != n:
        raise ValueError(f"pool: x has {n} samples but y has {len(y)}")
    b = check_batch_size(batch_size, name, upper=n)
    ranks = list(range(world.size())) if ranks is None else list(ranks)
    d = transport.dispatcher()
    state = PoolState(n, b, ranks, seed=seed)
    pool_server = PoolServer(d, state) if d.rank == server else None
    client = PoolClient(d, server, timeout_s)
    client.batches_per_epoch = state.batches_per_epoch
    x, y = np.asarray(x), np.asarray(y)

    def generate():
        while True:
            idx = client.claim()
            if idx is None:
                client.end_epoch()
                return
            yield x[idx], y[idx]

    signature = (tf.TensorSpec((None,) + x.shape[1:], tf.as_dtype(x.dtype)),
                 tf.TensorSpec((None,) + y.shape[1:], tf.as_dtype(y.dtype)))
    dataset = without_autotune(tf.data.Dataset.from_generator(generate, output_signature=signature))
    max_batches = -(-n // b) + 1
    return DataPlan({"x": _pool_adapter(dataset, max_batches)}, batch_size=b, samples_per_epoch=0, pool=client,
                    pool_server=pool_server)


def summary(protocol, timeout_s=10.0):
    """The pool figures for ``protocol.summary_stats()``: this rank's per-epoch samples and, on the
    server rank, the :meth:`PoolState.report` (after waiting up to ``timeout_s`` seconds for the
    last confirmations). Returns {} if the protocol did not use the pool."""
    client = getattr(protocol, "pool", None)
    if client is None:
        return {}
    out = {"rank_epochs": list(client.epochs)}
    server = getattr(protocol, "pool_server", None)
    if server is not None:
        server.state.wait_confirmed(timeout_s)
        out.update(server.state.report())
    return out
