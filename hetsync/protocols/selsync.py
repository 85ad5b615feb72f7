"""SelSync: selective synchronization driven by the relative change of the gradient norm.

SelSync paper, sections III-A to III-E and Algorithm 1, in the allreduce form the paper names as
equivalent to its parameter server (section III-E, last paragraph). Each step, on rank n:

1. the squared gradient norm ||g_i||^2 is smoothed by an EWMA over the last W steps
   (window W = 25, smoothing factor a = N/100 by default, section III-A):
   E_i = sum_{k<m} (1-a)^k ||g_(i-k)||^2 / sum_{k<m} (1-a)^k, m = min(i+1, W);
2. the relative gradient change is d_i = |E_i - E_(i-1)| / E_(i-1) (eq. 2);
3. the rank's flag is d_i >= delta (the first step always flags: there is no E_(i-1));
   the N flags are summed by a 4-byte allreduce (Algorithm 1, line 14's all-gather of flags);
4. if any flag is set every rank synchronizes: parameter aggregation (PA, default: local step,
   then w <- (1/N) sum_n w_n) or gradient aggregation (GA: g <- (1/N) sum_n g_n, then step)
   (section III-C); otherwise a local SGD step and nothing else crosses the network.

delta = 0 is BSP (every step synchronizes); a delta above every d never synchronizes after the
first step (local SGD). Data: SelDP order by default (section III-D), data injection (alpha,
beta) for non-IID data (section III-E, eq. 3), see :mod:`hetsync.partition`.
"""
import keras
import numpy as np
import tensorflow as tf

from .. import data as hdata
from .. import partition, runtime, transport
from .base import Protocol, average_at_train_end, wrap
from .localsgd import add_sync_stats, average_parameters, payload_bytes, record_step

__all__ = ["SelSync", "SelSyncProtocol", "ewma_reference"]

AGGREGATIONS = ("parameter", "gradient")
DATA_ORDERS = ("seldp", "defdp")


def ewma_reference(sq_norms, window=25, smoothing=0.04):
    """Numpy reference of SelSync's smoothing and eq. (2), for tests and analysis.

    Args:
        sq_norms: sequence of floats ||g_i||^2, i = 0, 1, ... window: int W >= 1.
        smoothing: float a in (0, 1].

    Returns:
        ``(E, d)``: float64 arrays of the same length; d[0] = 0 (the first step has no E_(i-1)).
    """
    x = np.asarray(sq_norms, dtype=np.float64)
    e = np.zeros_like(x)
    for i in range(len(x)):
        m = min(i + 1, window)
        w = (1.0 - smoothing) ** np.arange(m)
        e[i] = np.sum(w * x[i::-1][:m]) / np.sum(w)
    d = np.zeros_like(x)
    d[1:] = np.abs(e[1:] - e[:-1]) / e[:-1]
    return e, d


class SelSyncProtocol(Protocol):
    """Selective synchronization (see :func:`SelSync`)."""

    name = "selsync"

    def __init__(self, delta=0.3, aggregation="parameter", ewma_window=25, smoothing=None, data_order="seldp",
                 alpha=0.0, beta=0.0, inject_timeout_s=120.0, average_at_end=True):
        super().__init__()
        if not isinstance(average_at_end, bool):
            raise ValueError(f"SelSync: average_at_end must be True or False, got {average_at_end!r}")
        self.average_at_end = average_at_end
        self._final = {}
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not delta >= 0:
            raise ValueError(f"SelSync: delta must be a number >= 0 (threshold on the relative gradient change), "
                             f"got {delta!r}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"SelSync: aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if isinstance(ewma_window, bool) or not isinstance(ewma_window, int) or ewma_window < 1:
            raise ValueError(f"SelSync: ewma_window must be an int >= 1 (steps), got {ewma_window!r}")
        if smoothing is not None and (isinstance(smoothing, bool) or not isinstance(smoothing, (int, float))
                                      or not 0 < smoothing <= 1):
            raise ValueError(f"SelSync: smoothing must be None (N/100) or a number in (0, 1], got {smoothing!r}")
        if data_order not in DATA_ORDERS:
            raise ValueError(f"SelSync: data_order must be one of {DATA_ORDERS}, got {data_order!r}")
        partition._check_injection(alpha, beta)
        if not isinstance(inject_timeout_s, (int, float)) or inject_timeout_s <= 0:
            raise ValueError(f"SelSync: inject_timeout_s must be a positive number of seconds, got {inject_timeout_s!r}")
        self.delta, self.aggregation, self.ewma_window = float(delta), aggregation, ewma_window
        self._smoothing_arg, self.data_order = smoothing, data_order
        self.alpha, self.beta, self.inject_timeout_s = float(alpha), float(beta), float(inject_timeout_s)
        self.injecting = self.alpha > 0 and self.beta > 0
        self.requires_mpi = self.injecting  # data injection uses mpi4py point-to-point
        self.dataset = None
        self.batch_size_local = self.batch_size_effective = None
        #: where the data came from: data_order for fit_data, "local" for fit_local_data (non-IID).
        self.data_source = None

    def config(self):
        return {"delta": self.delta, "aggregation": self.aggregation, "ewma_window": self.ewma_window,
                "smoothing": self.smoothing, "data_order": self.data_order, "alpha": self.alpha, "beta": self.beta,
                "batch_size_local": self.batch_size_local, "batch_size_effective": self.batch_size_effective,
                "data_source": self.data_source, "average_at_end": self.average_at_end}

    # -- state ------------------------------------------------------------------------------------
    def build(self):
        n = runtime.size()
        self.smoothing = float(self._smoothing_arg) if self._smoothing_arg is not None else min(1.0, n / 100.0)
        add_sync_stats(self)
        for stat in ("d", "flag", "flags_set", "ewma", "grad_sq_norm", "flag_exchanges", "inject_sent_bytes",
                     "inject_received_samples"):
            self.add_stat(stat)
        with tf.init_scope():
            self._window = tf.Variable(tf.zeros([self.ewma_window], tf.float64), trainable=False,
                                       name="hetsync_selsync_window")
            self._seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_selsync_seen")
        self._weights = tf.constant((1.0 - self.smoothing) ** np.arange(self.ewma_window), tf.float64)

    def callbacks(self):
        return [_InjectionStats(self)] if self.injecting else []

    def stop(self):
        if isinstance(self.dataset, partition.InjectionDataset):
            self.dataset.close()
        if self.average_at_end:
            self._final = average_at_train_end(self, "hetsync_selsync")

    def summary_stats(self):
        st = self.step_stats()
        out = {"syncs": int(st["syncs"]), "sync_steps": int(st["sync_steps"]), "local_steps": int(st["local_steps"]),
               "lssr": st["lssr"], "bytes_sent": int(st["bytes_sent"]), "flag_exchanges": int(st["flag_exchanges"])}
        if isinstance(self.dataset, partition.InjectionDataset):
            out.update(self.dataset.stats())
        out.update(self._final)
        return out

    # -- data ---------------------------------------------------------------------------------------
    def _local_batch(self, batch_size):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"SelSync: batch_size must be an int >= 1, got {batch_size!r}")
        n = runtime.size()
        self.batch_size = int(batch_size)
        if not self.injecting:
            self.batch_size_local = self.batch_size_effective = int(batch_size)
            return int(batch_size)
        b_local = partition.local_batch_size(int(batch_size), self.alpha, self.beta, n)
        s = partition.shared_per_injector(b_local, self.beta)
        self.batch_size_local = b_local
        self.batch_size_effective = b_local + partition.num_injectors(self.alpha, n) * s
        return b_local

    def _dataset(self, x, y, sampler, seed):
        if self.injecting:
            self.dataset = partition.InjectionDataset(x, y, sampler, self.alpha, self.beta, seed=seed,
                                                      timeout_s=self.inject_timeout_s)
        else:
            self.dataset = partition.BatchDataset(x, y, sampler)
        self.samples_per_epoch = sampler.steps_per_pass * self.batch_size_effective
        return {"x": self.dataset, "steps_per_epoch": sampler.steps_per_pass, "shuffle": False}

    def fit_data(self, x, y, batch_size, seed=0):
        """This rank's data for IID training: SelDP (default) or DefDP, with optional injection.

        SelDP: :class:`hetsync.partition.SelDPSampler` (one Keras epoch = one partition of
        floor(|D| / N) samples; rank n reads DP_((n + epoch) mod N)). DefDP: the disjoint shard
        of :func:`hetsync.data.shard`. With injection (alpha, beta > 0) the local batch is b' of
        eq. (3) and batches carry the injected samples (:class:`hetsync.partition.InjectionDataset`).

        Args:
            x: array [M, ...]. y: int array [M]. batch_size: int b (samples per rank per step).
            seed: int, the same on every rank.

        Returns:
            dict of ``model.fit`` kwargs (``x`` a PyDataset, ``steps_per_epoch``), or for DefDP
            without injection the base class's arrays.

        Raises:
            ValueError: bad batch size (including a batch larger than a partition).
        """
        b_local = self._local_batch(batch_size)
        self.data_source = self.data_order
        n, r = runtime.size(), runtime.rank()
        if self.data_order == "seldp":
            return self._dataset(x, y, partition.SelDPSampler(len(x), r, n, b_local, seed=seed), seed)
        if not self.injecting:
            return super().fit_data(x, y, batch_size, seed=seed)
        xs, ys = hdata.shard(x, y, r, n, seed=seed)
        return self._dataset(xs, ys, partition.LocalSampler(np.arange(len(xs)), b_local, seed=seed, rank=r), seed)

    def fit_local_data(self, x, y, batch_size, seed=0):
        """This rank's data when the data is already local (non-IID, e.g. label skew).

        Each rank reshuffles its own samples every pass (:class:`hetsync.partition.LocalSampler`);
        with injection (alpha, beta > 0) the local batch is b' and batches carry injected samples.

        Args: as :meth:`fit_data`, with ``x``, ``y`` this rank's own samples (equal counts on all ranks).
        Returns: ``model.fit`` kwargs. Raises: ValueError: bad batch size.
        """
        b_local = self._local_batch(batch_size)
        self.data_source = "local"
        sampler = partition.LocalSampler(np.arange(len(x)), b_local, seed=seed, rank=runtime.rank())
        return self._dataset(x, y, sampler, seed)

    def step_samples(self, batch):
        """Samples of one step: b' local plus the injected ones (b without injection), see
        :meth:`hetsync.protocols.Protocol.step_samples`."""
        return self.batch_size_effective

    # -- the step -----------------------------------------------------------------------------------
    def relative_change(self, grads):
        """Update the EWMA with ||g_i||^2 and return ``(d_i, E_i, ||g_i||^2, first)`` (float64 tensors,
        ``first`` a bool: this is the first step). Implements section III-A and eq. (2)."""
        sq = tf.add_n([tf.reduce_sum(tf.square(tf.cast(tf.convert_to_tensor(g), tf.float64)))
                       for g in grads if g is not None])
        seen = self._seen.read_value()
        window = tf.concat([tf.reshape(sq, [1]), self._window.read_value()[:-1]], 0)
        m = tf.minimum(seen + 1, self.ewma_window)
        w = self._weights * tf.cast(tf.range(self.ewma_window, dtype=tf.int64) < m, tf.float64)
        e = tf.reduce_sum(w * window) / tf.reduce_sum(w)
        prev = self._stats["ewma"].read_value()
        first = tf.equal(seen, 0)
        d = tf.where(first, tf.constant(0.0, tf.float64),
                     tf.where(prev > 0, tf.abs(e - prev) / tf.where(prev > 0, prev, 1.0),
                              tf.where(e > 0, tf.constant(np.inf, tf.float64), 0.0)))
        with tf.control_dependencies([self._window.assign(window), self._seen.assign_add(1)]):
            return tf.identity(d), e, sq, first

    def apply(self, grads, variables, local_apply):
        st = self._stats
        d, e, sq, first = self.relative_change(grads)
        flag = tf.logical_or(first, d >= self.delta)
        flags_set = transport.allreduce_sum([tf.reshape(tf.cast(flag, tf.float32), [1])], name="hetsync_selsync_flag")[0][0]
        synced = flags_set > 0.5
        bookkeeping = [st["d"].assign(d), st["ewma"].assign(e), st["grad_sq_norm"].assign(sq),
                       st["flag"].assign(tf.cast(flag, tf.float64)), st["flags_set"].assign(tf.cast(flags_set, tf.float64)),
                       st["flag_exchanges"].assign_add(1.0)]
        flag_bytes = 4.0
        present = [i for i, g in enumerate(grads) if g is not None]
        if self.aggregation == "gradient":
            dense = [tf.convert_to_tensor(grads[i]) for i in present]
            nbytes = float(payload_bytes(dense))

            def ga_sync():
                return self.synchronize(lambda ts: transport.allreduce_mean(ts, name="hetsync_selsync_ga"), dense)

            new = tf.cond(synced, ga_sync, lambda: [tf.identity(g) for g in dense])
            out = list(grads)
            for i, g in zip(present, new):
                out[i] = g
            result = local_apply(out, variables)
        else:
            result = local_apply(grads, variables)
            nbytes = float(payload_bytes([tf.convert_to_tensor(v.value) for v in variables]))

            def pa_sync():
                with tf.control_dependencies(average_parameters(self, variables, name="hetsync_selsync_pa")):
                    return tf.constant(True)

            tf.cond(synced, pa_sync, lambda: tf.constant(False))
        sent = tf.where(synced, tf.constant(nbytes + flag_bytes, tf.float64), tf.constant(flag_bytes, tf.float64))
        with tf.control_dependencies(bookkeeping + record_step(self, synced, sent)):
            tf.no_op()
        return result


class _InjectionStats(keras.callbacks.Callback):
    """Copy the data-injection counters into SelSync's per-step statistics after each batch."""

    def __init__(self, protocol):
        super().__init__()
        self.protocol = protocol

    def on_train_batch_end(self, batch, logs=None):
        ds = self.protocol.dataset
        if isinstance(ds, partition.InjectionDataset):
            self.protocol._stats["inject_sent_bytes"].assign(float(ds.sent_bytes))
            self.protocol._stats["inject_received_samples"].assign(float(ds.received_samples))


def SelSync(optimizer, delta=0.3, aggregation="parameter", ewma_window=25, smoothing=None, data_order="seldp",
            alpha=0.0, beta=0.0, inject_timeout_s=120.0, average_at_end=True):
    """Wrap a Keras 3 optimizer for SelSync: synchronize only when the gradients change a lot.

    Each step, each rank smooths its squared gradient norm ||g_i||^2 (sum over all gradient
    tensors, float64) with an EWMA over the last ``ewma_window`` steps and computes the relative
    change d_i = |E_i - E_(i-1)| / E_(i-1) (eq. 2). Its flag is d_i >= delta; one 4-byte
    allreduce sums the N flags; if any is set all ranks synchronize, else each takes a local SGD
    step and nothing else is sent. Synchronization is parameter aggregation (local step, then
    w <- (1/N) sum_n w_n; weights are identical on all ranks afterwards) or gradient aggregation
    ((1/N) sum_n g_n, then the step; identical to BSP at delta = 0). The first step always
    synchronizes. Optimizer slots (momentum) stay local. The 4-byte flag exchange is not delayed
    by a ``netdelay`` scenario (it models the model-sized collective; the paper measures the flag
    exchange at 2-4 ms, section III-E).

    Statistics (per step, SyncMetrics): ``d``, ``flag`` (this rank), ``flags_set`` (ranks that
    flagged), ``ewma`` (E_i), ``grad_sq_norm``, ``sync``, ``sync_steps``, ``local_steps``, ``lssr``
    (eq. 4), ``bytes_sent`` (collective payload bytes, cumulative), ``flag_exchanges``, and with
    injection ``inject_sent_bytes``, ``inject_received_samples``.

    Data (:meth:`SelSyncProtocol.fit_data`): ``data_order="seldp"`` (section III-D, default) or
    ``"defdp"``; non-IID local data through :meth:`SelSyncProtocol.fit_local_data`. Data injection
    (alpha, beta) (section III-E): each step ceil(alpha N) ranks, drawn identically on all ranks,
    share round(beta b') samples with every other rank over mpi4py; the local batch is
    b' = b / (1 + alpha beta N) (eq. 3). Needs an MPI launch when alpha, beta > 0.

    Args:
        optimizer: a Keras 3 optimizer instance.
        delta: float >= 0, threshold on d (0 = BSP).
        aggregation: ``"parameter"`` (PA, default) or ``"gradient"`` (GA).
        ewma_window: int W >= 1, steps in the smoothing window (paper: 25).
        smoothing: float a in (0, 1], EWMA smoothing factor; None = N/100 (paper, section III-A).
        data_order: ``"seldp"`` or ``"defdp"``.
        alpha: float in [0, 1], fraction of ranks injecting per step. beta: float in [0, 1],
            fraction of b' each injector shares.
        inject_timeout_s: float seconds a rank waits for injected samples before failing.
        average_at_end: bool, average the parameters once when training ends
            (:func:`hetsync.protocols.base.average_at_train_end`), so every rank holds the same
            final model although the last steps were local; the drift before it is reported as
            ``drift_before_final_average``. Not counted as a step (LSSR unchanged).

    Returns:
        keras.optimizers.Optimizer.

    Raises:
        TypeError: not a Keras 3 optimizer. ValueError: any argument outside the ranges above.
        RuntimeError: not initialised, or injection requested under Gloo.
    """
    return wrap(optimizer, SelSyncProtocol(delta=delta, aggregation=aggregation, ewma_window=ewma_window,
                                           smoothing=smoothing, data_order=data_order, alpha=alpha, beta=beta,
                                           inject_timeout_s=inject_timeout_s, average_at_end=average_at_end))
