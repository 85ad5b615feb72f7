"""Data partitioning for semi-synchronous training (SelSync paper, sections III-D and III-E).

* **DefDP** (default data partitioning): the training set D is split into N disjoint partitions
  DP_0..DP_(N-1), rank n trains on DP_n only (:func:`hetsync.data.datasets.shard`).
* **SelDP** (SelSync data partitioning, section III-D, Fig. 7b): the same N partitions form a
  circular queue whose head is rotated to the rank: rank n walks DP_n, DP_(n+1), ..., DP_(n-1)
  (indices mod N), so every rank sees all of D while, at any step, the N ranks still read N
  different partitions (:func:`seldp_order`, :class:`SelDPSampler`). One Keras epoch is one
  partition (``floor(|D| / N)`` samples per rank, as DefDP); N epochs walk the whole queue.
* **Label skew** (non-IID, section IV "Data for non-IID training"): each rank holds the samples of
  exactly k labels (:func:`label_skew`).
* **Data injection** (alpha, beta) (section III-E, eq. 3): each step a random subset of
  ``ceil(alpha N)`` ranks (the injectors, identical on every rank: drawn from a shared seed and
  the step index) each share ``round(beta b')`` samples of their batch with every other rank
  over the point-to-point dispatcher (:mod:`hetsync.transport.p2p`); the local batch shrinks to b' = b / (1 + alpha beta N) so that the
  batch each rank trains on stays b (:func:`local_batch_size`, :class:`InjectionDataset`).

All data sources here are infinite ``keras.utils.PyDataset`` objects indexed by the global step
t (Keras keeps one iterator across epochs when ``steps_per_epoch`` is given), so the order is a
pure function of (seed, rank, t) and the injection exchange of step t is tagged with t.
"""
import logging
import math
import threading

import keras
import numpy as np

from hetsync import transport
from hetsync import world
from hetsync.transport import channels

log = logging.getLogger("hetsync")

__all__ = [
    "seldp_partitions", "seldp_order", "SelDPSampler", "LocalSampler", "label_skew", "parse_partition",
    "local_batch_size", "num_injectors", "shared_per_injector", "injectors", "BatchDataset",
    "InjectionDataset", "local_fit_data",
]


def seldp_partitions(n_samples, world_size, seed=0):
    """Split ``range(n_samples)`` into ``world_size`` equal, disjoint partitions DP_0..DP_(N-1).

    The indices are permuted with ``seed`` (identically on every rank) and cut into N chunks of
    ``floor(n_samples / N)``; the at most N - 1 left over are not used (as in DefDP).

    Args:
        n_samples: int >= world_size. world_size: int N >= 1. seed: int.

    Returns:
        list of N int64 arrays of length ``floor(n_samples / N)``.

    Raises:
        ValueError: world_size < 1 or fewer samples than ranks.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if n_samples < world_size:
        raise ValueError(f"cannot partition {n_samples} samples over {world_size} ranks")
    per = n_samples // world_size
    order = np.random.default_rng(seed).permutation(n_samples)[: per * world_size].astype(np.int64)
    return [order[p * per:(p + 1) * per] for p in range(world_size)]


def seldp_order(rank, world_size):
    """Return the SelDP partition order of ``rank``: [n, n+1, ..., n+N-1] mod N (section III-D).

    Example for N = 4: rank 0 -> [0, 1, 2, 3], rank 1 -> [1, 2, 3, 0], rank 3 -> [3, 0, 1, 2].

    Raises:
        ValueError: rank outside [0, world_size).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return [(rank + j) % world_size for j in range(world_size)]


class LocalSampler:
    """Batches of a fixed local index set, reshuffled every pass: step t -> indices.

    Pass p = t // steps_per_pass uses ``default_rng([seed, 7, rank, p]).permutation`` of the
    local indices; step t takes batch ``t % steps_per_pass`` of it (the partial last batch is
    dropped so every step has exactly ``batch_size`` samples).

    Args:
        indices: int array [M] of sample indices. batch_size: int b' in [1, M]. seed, rank: int.

    Raises:
        ValueError: batch_size outside [1, M].
    """

    def __init__(self, indices, batch_size, seed=0, rank=0):
        self.indices = np.asarray(indices, dtype=np.int64)
        if not 1 <= batch_size <= len(self.indices):
            raise ValueError(f"batch size must be in [1, {len(self.indices)}] (the local sample count), got {batch_size}")
        self.batch_size, self.seed, self.rank = int(batch_size), int(seed), int(rank)
        #: batches per pass over the local indices (int).
        self.steps_per_pass = len(self.indices) // self.batch_size

    def __call__(self, t):
        """Return the int64 index array [b'] of global step t (int >= 0)."""
        p, j = divmod(int(t), self.steps_per_pass)
        perm = np.random.default_rng([self.seed, 7, self.rank, p]).permutation(len(self.indices))
        return self.indices[perm[j * self.batch_size:(j + 1) * self.batch_size]]


class SelDPSampler:
    """SelDP batches of one rank: step t -> indices into the full training set (section III-D).

    Pass p = t // steps_per_partition reads partition ``seldp_order(rank, N)[p % N]`` (that is
    DP_((rank + p) mod N)), shuffled with ``default_rng([seed, partition, p // N])`` (so the N
    ranks reading a partition in different passes each get their own order) and cut into batches
    of ``batch_size`` (partial last batch dropped). At every step the N ranks read N different
    partitions, so their batches are disjoint; over N passes each rank sees every partition.

    Args:
        n_samples: int |D|. rank: int n. world_size: int N. batch_size: int b' (samples per step).
        seed: int (the same on every rank).

    Raises:
        ValueError: bad rank, fewer samples than ranks, or a batch larger than one partition.
    """

    def __init__(self, n_samples, rank, world_size, batch_size, seed=0):
        self.partitions = seldp_partitions(n_samples, world_size, seed)
        self.order = seldp_order(rank, world_size)
        per = len(self.partitions[0])
        if not 1 <= batch_size <= per:
            raise ValueError(f"batch size must be in [1, {per}] (one SelDP partition of {n_samples} samples over "
                             f"{world_size} ranks), got {batch_size}")
        self.rank, self.world_size, self.batch_size, self.seed = rank, world_size, int(batch_size), int(seed)
        #: batches per partition = per Keras epoch (int).
        self.steps_per_pass = per // self.batch_size

    def partition_at(self, t):
        """Return the partition id (int in [0, N)) this rank reads at global step t."""
        return self.order[(int(t) // self.steps_per_pass) % self.world_size]

    def __call__(self, t):
        """Return the int64 index array [b'] (into the full training set) of global step t."""
        p, j = divmod(int(t), self.steps_per_pass)
        part = self.order[p % self.world_size]
        perm = np.random.default_rng([self.seed, part, p // self.world_size]).permutation(len(self.partitions[part]))
        return self.partitions[part][perm[j * self.batch_size:(j + 1) * self.batch_size]]


def label_skew(y, world_size, k, seed=0):
    """Non-IID label-skew partition: rank n holds the samples of exactly k labels.

    Rank n's labels are ``classes[(n k + j) mod C]`` for j = 0..k-1, where ``classes`` are the
    sorted distinct labels of ``y`` (C of them). A label held by m ranks has its samples
    shuffled with ``seed`` and dealt round-robin among them. All ranks are then cut to the
    length of the shortest so that every rank runs the same number of steps. When N k < C some
    labels are held by no rank and are not trained on (the paper's setting, 10 ranks with 1 label
    each of 10 classes, covers all labels).

    Args:
        y: int array [M] of labels. world_size: int N >= 1. k: int in [1, C]. seed: int.

    Returns:
        ``(parts, labels)``: list of N int64 index arrays of equal length, and list of N sorted
        lists of the labels each rank holds.

    Raises:
        ValueError: k outside [1, C], or a rank would hold no sample.
    """
    y = np.asarray(y)
    classes = np.unique(y)
    c = len(classes)
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= c:
        raise ValueError(f"label-skew k (labels per rank) must be an int in [1, {c}], got {k!r}")
    labels = [sorted(int(classes[(n * k + j) % c]) for j in range(k)) for n in range(world_size)]
    holders = {}
    for n, labs in enumerate(labels):
        for lab in labs:
            holders.setdefault(lab, []).append(n)
    rng = np.random.default_rng(seed)
    parts = [[] for _ in range(world_size)]
    for lab in sorted(holders):
        idx = rng.permutation(np.flatnonzero(y == lab))
        ranks = holders[lab]
        for i, n in enumerate(ranks):
            parts[n].append(idx[i::len(ranks)])
    parts = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    m = min(len(p) for p in parts)
    if m == 0:
        raise ValueError(f"label-skew with k={k} over {world_size} ranks leaves a rank without samples")
    parts = [np.sort(np.random.default_rng([seed, n]).permutation(p)[:m]) for n, p in enumerate(parts)]
    return parts, labels


def parse_partition(spec):
    """Parse a partition spec: ``"iid"`` -> None, ``"label-skew:K"`` -> K (int >= 1).

    Raises:
        ValueError: anything else (the message lists what is allowed).
    """
    if spec in (None, "iid"):
        return None
    name, _, arg = str(spec).partition(":")
    if name == "label-skew":
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k >= 1:
            return k
    raise ValueError(f"partition must be 'iid' or 'label-skew:K' with K >= 1 labels per rank, got {spec!r}")


def local_batch_size(b, alpha, beta, world_size):
    """Eq. (3): the local batch b' = b / (1 + alpha beta N), rounded to the nearest int (>= 1).

    Args:
        b: int batch size per rank (samples). alpha: float in [0, 1], fraction of ranks injecting
        per step. beta: float in [0, 1], fraction of b' each injector shares. world_size: int N.

    Raises:
        ValueError: alpha or beta outside [0, 1], or b < 1.
    """
    _check_injection(alpha, beta)
    if b < 1:
        raise ValueError(f"batch size must be >= 1, got {b}")
    return max(1, int(round(b / (1.0 + alpha * beta * world_size))))


def num_injectors(alpha, world_size):
    """Number of injecting ranks per step, ``ceil(alpha N)`` (section III-E: ceil(alpha K))."""
    _check_injection(alpha, 0.0)
    return int(math.ceil(alpha * world_size - 1e-9))


def shared_per_injector(b_local, beta):
    """Samples each injector shares per step, ``round(beta b')`` (int)."""
    _check_injection(0.0, beta)
    return int(round(beta * b_local))


def injectors(t, alpha, world_size, seed=0):
    """Return the sorted int array of injecting ranks at global step t (identical on every rank).

    Drawn with ``default_rng([seed, 11, t]).choice(N, ceil(alpha N), replace=False)``.
    """
    k = num_injectors(alpha, world_size)
    return np.sort(np.random.default_rng([seed, 11, int(t)]).choice(world_size, k, replace=False))


def _check_injection(alpha, beta):
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"data injection {name} must be a number in [0, 1], got {v!r}")


class BatchDataset(keras.utils.PyDataset):
    """Infinite PyDataset: item t is ``(x[sampler(t)], y[sampler(t)])``.

    Use with ``model.fit(..., steps_per_epoch=S)`` so that t is the global step across epochs.
    :attr:`offset` shifts it: Keras' item i is global step ``i + offset`` (set by
    :class:`hetsync.callbacks.checkpoint.BackupAndRestore` on a resume, so the first batch read is the saved
    global step's; 0 otherwise).

    Args:
        x: array [M, ...]. y: array [M]. sampler: callable int t -> int index array [b'].
    """

    def __init__(self, x, y, sampler):
        super().__init__()
        self.x, self.y, self.sampler = x, y, sampler
        #: int >= 0, global steps already trained before this fit (resume).
        self.offset = 0

    @property
    def num_batches(self):
        return None

    def __getitem__(self, t):
        idx = self.sampler(int(t) + self.offset)
        return self.x[idx], self.y[idx]


class InjectionDataset(BatchDataset):
    """Data injection (alpha, beta) of section III-E over the point-to-point dispatcher.

    At global step t every rank draws its own b' samples with ``sampler(t)``. The injectors
    (:func:`injectors`, identical on all ranks) each send the first ``s = round(beta b')`` of
    them to every other rank (:meth:`hetsync.transport.Dispatcher.send` on channel
    :attr:`CHANNEL`, tag t); every rank then receives the s samples of each other injector (every
    receive has a timeout). Item t is this rank's b' samples followed by the pool of all
    injectors' shared samples in rank order (an injector's own shared samples thus appear twice in
    its batch), so every rank trains on exactly b' + ceil(alpha N) s samples, about b (eq. 3).
    Items are cached, so Keras' peeking at the first items does not repeat an exchange.

    Counters (python ints, read by :class:`hetsync.protocols.local.selsync.SelSyncProtocol`):
    ``sent_samples``, ``sent_bytes``, ``sent_messages``, ``received_samples``, ``received_bytes``,
    ``received_messages``, ``exchanges``, ``unread_messages`` (injected batches that arrived for
    steps this rank never trained on, e.g. Keras' prefetching past the last step; counted by
    :meth:`close`) and ``dropped_sends`` (sends not completed when :meth:`close` gave up).
    Summed over ranks, sent = received + unread messages.

    Args:
        x: array [M, ...] (the rank's local data). y: array [M]. sampler: callable t -> [b'] indices.
        alpha, beta: floats in [0, 1]. seed: int (shared by all ranks). timeout_s: float seconds
        each receive may wait (and :meth:`close` waits for the other ranks).

    Raises:
        RuntimeError: launched under Gloo (needs MPI point-to-point).
        ValueError: alpha or beta outside [0, 1], or timeout_s not positive.
    """

    #: the dispatcher channel of injected samples.
    CHANNEL = channels.SELSYNC_INJECT

    def __init__(self, x, y, sampler, alpha, beta, seed=0, timeout_s=120.0):
        super().__init__(x, y, sampler)
        _check_injection(alpha, beta)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"data injection timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.alpha, self.beta, self.seed, self.timeout_s = float(alpha), float(beta), int(seed), float(timeout_s)
        self.rank, self.world_size = world.rank(), world.size()
        self._p2p = transport.dispatcher() if self.world_size > 1 else None
        self._cache = {}
        self._lock = threading.Lock()
        self._closed = False
        self.sent_samples = self.sent_bytes = self.sent_messages = 0
        self.received_samples = self.received_bytes = self.received_messages = 0
        self.exchanges = self.unread_messages = self.dropped_sends = 0

    def __getitem__(self, t):
        t = int(t) + self.offset
        with self._lock:
            if t in self._cache:
                return self._cache[t]
            if self._closed:
                raise RuntimeError(f"rank {self.rank}: data injection was closed; step {t} was requested after it")
            batch = self._exchange(t)
            self._cache[t] = batch
            for old in [k for k in self._cache if k < t - 64]:
                del self._cache[old]
            return batch

    def _exchange(self, t):
        idx = self.sampler(t)
        xs, ys = self.x[idx], self.y[idx]
        s = shared_per_injector(len(idx), self.beta)
        chosen = injectors(t, self.alpha, self.world_size, self.seed)
        pool_x, pool_y = [], []
        if self.rank in chosen and s > 0:
            payload = (t, self.rank, xs[:s], ys[:s])
            nbytes = xs[:s].nbytes + ys[:s].nbytes
            for dest in range(self.world_size):
                if dest != self.rank:
                    self._p2p.send(dest, self.CHANNEL, payload, tag=t)
                    self.sent_samples += s
                    self.sent_bytes += nbytes
                    self.sent_messages += 1
        for src in (int(c) for c in chosen):
            if s == 0:
                break
            if src == self.rank:
                pool_x.append(xs[:s])
                pool_y.append(ys[:s])
                continue
            step, sender, rx, ry = self._recv(src, t)
            if step != t or sender != src or len(rx) != s:
                raise RuntimeError(f"rank {self.rank}: data injection of step {t} expected {s} samples from rank {src}, "
                                   f"got {len(rx)} samples of step {step} from rank {sender}")
            self.received_samples += len(rx)
            self.received_bytes += rx.nbytes + ry.nbytes
            self.received_messages += 1
            pool_x.append(rx)
            pool_y.append(ry)
        self.exchanges += 1
        if pool_x:
            xs, ys = np.concatenate([xs] + pool_x), np.concatenate([ys] + pool_y)
        return xs, ys

    def _recv(self, src, t):
        """Wait up to ``timeout_s`` for step t's samples from rank src; :meth:`close` ends the wait within one
        wait slice (:meth:`hetsync.transport.p2p.Dispatcher.recv_or_fail`)."""
        def still_open():
            if self._closed:
                raise RuntimeError(f"rank {self.rank}: data injection closed while waiting for step {t} from rank {src}")

        return self._p2p.recv_or_fail(
            self.CHANNEL, source=src, tag=t, timeout_s=self.timeout_s, check=still_open,
            late=f"rank {self.rank}: timed out after {self.timeout_s:g} s waiting for injected samples of step {t} "
                 f"from rank {src}")

    def close(self, timeout_s=None):
        """End the injection traffic; every rank must call it (SelSync's ``stop`` does).

        Stops serving new steps, then drains the channel with every rank
        (:meth:`hetsync.transport.Dispatcher.drain`): the injected batches that arrived for steps
        this rank never trained on are counted as ``unread_messages``. Sends of this rank still
        not completed after that are counted as ``dropped_sends``.

        Args:
            timeout_s: float seconds to wait for the other ranks' end of traffic and for this
                rank's sends (default: the dataset's ``timeout_s``).

        Returns:
            int, ``dropped_sends``.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        self._closed = True
        with self._lock:  # an exchange in progress ends (or fails on _closed) before the drain
            p2p, self._p2p = self._p2p, None
        if p2p is None:  # a world of one rank, or closed before
            return self.dropped_sends
        try:
            self.unread_messages += p2p.drain(self.CHANNEL, timeout_s=timeout_s)
        except transport.TransportTimeout as exc:
            log.warning("hetsync %s; the injected samples still queued are counted when the process ends", exc)
        try:
            p2p.flush(timeout_s, channel=self.CHANNEL)
        except transport.TransportTimeout as exc:
            self.dropped_sends += len(exc.pending)
        return self.dropped_sends

    def stats(self):
        """Return the counters as a dict of ints (keys ``inject_*``, see the class docstring)."""
        return {"inject_sent_samples": self.sent_samples, "inject_sent_bytes": self.sent_bytes,
                "inject_sent_messages": self.sent_messages, "inject_received_samples": self.received_samples,
                "inject_received_bytes": self.received_bytes, "inject_received_messages": self.received_messages,
                "inject_exchanges": self.exchanges, "inject_unread_messages": self.unread_messages,
                "inject_dropped_sends": self.dropped_sends}


def local_fit_data(protocol, x, y, batch_size, seed=0, partition="iid"):
    """Return this rank's data plan for any protocol under a partition spec.

    ``"iid"`` calls ``protocol.fit_data(x, y, batch_size, seed)`` (DefDP, SelDP, ...).
    Data go to the workers only (``protocol.roles.num_workers``); a parameter-server rank gets
    ``protocol.server_fit_data``. ``"label-skew:K"`` gives worker n the samples of :func:`label_skew` ``(y, N, K, seed)[0][n]``
    and calls ``protocol.fit_local_data`` if the protocol has it (SelSync: data injection),
    else a plain per-epoch shuffled ``(x, y, batch_size)`` plan that the protocol adopts
    (``protocol.adopt``: its samples per epoch and batch size).

    Args:
        protocol: a :class:`hetsync.protocols.Protocol`. x: array [M, ...]. y: int array [M].
        batch_size: int b. seed: int. partition: str spec (see :func:`parse_partition`).

    Returns:
        :class:`hetsync.data.plan.DataPlan` (a mapping of ``model.fit`` keyword arguments).

    Raises:
        ValueError: bad partition spec or k.
    """
    from hetsync.data.plan import DataPlan

    k = parse_partition(partition)
    if k is None:
        return protocol.fit_data(x, y, batch_size, seed=seed)
    protocol.check_roles()
    if protocol.roles.is_server:
        return protocol.server_fit_data(x, y, batch_size)
    parts, _ = label_skew(y, protocol.roles.num_workers, k, seed=seed)
    mine = parts[protocol.roles.worker_rank]
    if hasattr(protocol, "fit_local_data"):
        return protocol.fit_local_data(x[mine], y[mine], batch_size, seed=seed)
    return protocol.adopt(DataPlan({"x": x[mine], "y": y[mine], "batch_size": batch_size, "shuffle": True},
                                   batch_size=int(batch_size), samples_per_epoch=len(mine)))
