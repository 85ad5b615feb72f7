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
beta) for non-IID data (section III-E, eq. 3), see :mod:`hetsync.data.shards`.
"""
import dataclasses
import typing

import numpy as np
import tensorflow as tf

from hetsync.data import datasets as hdata
from hetsync import transport
from hetsync.data import shards as partition
from hetsync.data.plan import DataPlan
from hetsync import world
from hetsync.core.protocol import Capabilities, Protocol, payload_bytes, present_gradients, scatter_gradients
from hetsync.core.config import ProtocolConfig, param
from hetsync.core.wrapper import protocol_wrapper

__all__ = ["SelSync", "SelSyncProtocol", "SelSyncConfig", "ewma_reference"]

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


@dataclasses.dataclass(frozen=True)
class SelSyncConfig(ProtocolConfig):
    """SelSync's parameters (see :func:`SelSync`)."""

    owner: typing.ClassVar[str] = "SelSync"

    delta: float = param(0.3, "float >= 0, threshold on the relative gradient change d (eq. 2); 0 = BSP, a very "
                              "large (or infinite) delta = local SGD after the first step.", ge=0, allow_inf=True,
                         unit="threshold on the relative gradient change")
    aggregation: typing.Literal["parameter", "gradient"] = param(
        "parameter", "``\"parameter\"`` (PA, default: local step, then the parameters are averaged) or "
                     "``\"gradient\"`` (GA: averaged gradients, then the step) (section III-C).")
    ewma_window: int = param(25, "int W >= 1, steps in the smoothing window (paper: 25, section III-A).", ge=1,
                             unit="steps")
    smoothing: typing.Optional[float] = param(
        None, "float a in (0, 1], EWMA smoothing factor; None = N/100 (paper, section III-A).", gt=0, le=1,
        none="N/100")
    data_order: typing.Literal["seldp", "defdp"] = param(
        "seldp", "``\"seldp\"`` (each rank walks all partitions starting at its own, section III-D) or "
                 "``\"defdp\"`` (the usual disjoint shard).")
    alpha: float = param(0.0, "float in [0, 1], fraction of ranks injecting per step (section III-E).", ge=0, le=1,
                         unit="fraction of ranks injecting per step")
    beta: float = param(0.0, "float in [0, 1], fraction of b' each injector shares.", ge=0, le=1,
                        unit="fraction of the local batch each injector shares")
    inject_timeout_s: float = param(120.0, "float seconds (> 0) a rank waits for injected samples before failing.",
                                    gt=0, unit="seconds")
    average_at_end: bool = param(
        True, "bool, average the parameters once when training ends "
              "(:meth:`hetsync.core.protocol.Protocol.average_at_train_end`), so every rank holds the same final "
              "model although the last steps were local; the drift before it is reported as "
              "``drift_before_final_average``. Not counted as a step (LSSR unchanged).")


class SelSyncProtocol(Protocol):
    """Selective synchronization (see :func:`SelSync`)."""

    #: the per-step flag exchange carries the non-finite flags.
    capabilities = Capabilities(nonfinite_in_collective=True)

    name = "selsync"
    display_name = "SelSync"
    Config = SelSyncConfig

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self.injecting = self.cfg.alpha > 0 and self.cfg.beta > 0
        # data injection uses point-to-point messages
        self.capabilities = dataclasses.replace(type(self).capabilities, requires_mpi=self.injecting)
        #: the EWMA smoothing factor in use (float; N/100 when the config says None), set by :meth:`build`.
        self.smoothing = None
        self.dataset = None
        self.batch_size_local = self.batch_size_effective = None
        #: where the data came from: data_order for fit_data, "local" for fit_local_data (non-IID).
        self.data_source = None
        self._inject_per_rank = None

    # -- state ------------------------------------------------------------------------------------
    def build(self):
        """Resolve the smoothing factor, create the statistics and the EWMA window variables."""
        n = world.size()
        self.smoothing = self.cfg.smoothing if self.cfg.smoothing is not None else min(1.0, n / 100.0)
        self.add_sync_stats()
        for stat in ("d", "flag", "flags_set", "ewma", "grad_sq_norm", "flag_exchanges", "inject_sent_bytes",
                     "inject_received_samples"):
            self.add_stat(stat)
        with tf.init_scope():
            self._window = tf.Variable(tf.zeros([self.cfg.ewma_window], tf.float64), trainable=False,
                                       name="hetsync_selsync_window")
            self._seen = tf.Variable(0, dtype=tf.int64, trainable=False, name="hetsync_selsync_seen")
        self._weights = tf.constant((1.0 - self.smoothing) ** np.arange(self.cfg.ewma_window), tf.float64)

    def on_train_batch_end(self, batch, logs):
        """With data injection: copy its counters into the step statistics
        (``inject_sent_bytes``, ``inject_received_samples``)."""
        ds = self.dataset
        if isinstance(ds, partition.InjectionDataset):
            self._stats["inject_sent_bytes"].assign(float(ds.sent_bytes))
            self._stats["inject_received_samples"].assign(float(ds.received_samples))

    def stop(self):
        """End the data injection (drained and counted on every rank, then gathered), then the base's
        end-of-training average."""
        if isinstance(self.dataset, partition.InjectionDataset):
            self.dataset.close()
            self._inject_per_rank = transport.allgather_object(self.dataset.stats(), name="hetsync_selsync_inject")
        super().stop()

    def summary_stats(self):
        """End-of-run statistics: the sync figures, ``flag_exchanges``, the resolved data settings
        (``smoothing``, ``batch_size_local``, ``batch_size_effective``, ``data_source``), this rank's
        injection counters (``inject_*``) and every rank's (``inject_per_rank``), the final average."""
        out = dict(self.sync_summary(), flag_exchanges=int(self.step_stats()["flag_exchanges"]),
                   smoothing=self.smoothing, batch_size_local=self.batch_size_local,
                   batch_size_effective=self.batch_size_effective, data_source=self.data_source)
        if isinstance(self.dataset, partition.InjectionDataset):
            out.update(self.dataset.stats())
            if self._inject_per_rank is not None:
                out["inject_per_rank"] = self._inject_per_rank
        out.update(self._final)
        return out

    # -- data ---------------------------------------------------------------------------------------
    def _local_batch(self, batch_size):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"SelSync: batch_size must be an int >= 1, got {batch_size!r}")
        n = world.size()
        self.batch_size = int(batch_size)
        if not self.injecting:
            self.batch_size_local = self.batch_size_effective = int(batch_size)
            return int(batch_size)
        b_local = partition.local_batch_size(int(batch_size), self.cfg.alpha, self.cfg.beta, n)
        s = partition.shared_per_injector(b_local, self.cfg.beta)
        self.batch_size_local = b_local
        self.batch_size_effective = b_local + partition.num_injectors(self.cfg.alpha, n) * s
        return b_local

    def _dataset(self, x, y, sampler, seed):
        if self.injecting:
            self.dataset = partition.InjectionDataset(x, y, sampler, self.cfg.alpha, self.cfg.beta, seed=seed,
                                                      timeout_s=self.cfg.inject_timeout_s)
        else:
            self.dataset = partition.BatchDataset(x, y, sampler)
        return self.adopt(DataPlan({"x": self.dataset, "steps_per_epoch": sampler.steps_per_pass, "shuffle": False},
                                   batch_size=self.batch_size,
                                   samples_per_epoch=sampler.steps_per_pass * self.batch_size_effective))

    def fit_data(self, x, y, batch_size, seed=0):
        """This rank's data for IID training: SelDP (default) or DefDP, with optional injection.

        SelDP: :class:`hetsync.data.shards.SelDPSampler` (one Keras epoch = one partition of
        floor(|D| / N) samples; rank n reads DP_((n + epoch) mod N)). DefDP: the disjoint shard
        of :func:`hetsync.data.datasets.shard`. With injection (alpha, beta > 0) the local batch is b' of
        eq. (3) and batches carry the injected samples (:class:`hetsync.data.shards.InjectionDataset`).

        Args:
            x: array [M, ...]. y: int array [M]. batch_size: int b (samples per rank per step).
            seed: int, the same on every rank.

        Returns:
            the adopted :class:`hetsync.data.plan.DataPlan` (``x`` a PyDataset, ``steps_per_epoch``), or for
            DefDP without injection the base class's plan.

        Raises:
            ValueError: bad batch size (including a batch larger than a partition).
        """
        b_local = self._local_batch(batch_size)
        self.data_source = self.cfg.data_order
        n, r = world.size(), world.rank()
        if self.cfg.data_order == "seldp":
            return self._dataset(x, y, partition.SelDPSampler(len(x), r, n, b_local, seed=seed), seed)
        if not self.injecting:
            return super().fit_data(x, y, batch_size, seed=seed)
        xs, ys = hdata.shard(x, y, r, n, seed=seed)
        return self._dataset(xs, ys, partition.LocalSampler(np.arange(len(xs)), b_local, seed=seed, rank=r), seed)

    def fit_local_data(self, x, y, batch_size, seed=0):
        """This rank's data when the data is already local (non-IID, e.g. label skew).

        Each rank reshuffles its own samples every pass (:class:`hetsync.data.shards.LocalSampler`);
        with injection (alpha, beta > 0) the local batch is b' and batches carry injected samples.

        Args: as :meth:`fit_data`, with ``x``, ``y`` this rank's own samples (equal counts on all ranks).
        Returns: ``model.fit`` kwargs. Raises: ValueError: bad batch size.
        """
        b_local = self._local_batch(batch_size)
        self.data_source = "local"
        sampler = partition.LocalSampler(np.arange(len(x)), b_local, seed=seed, rank=world.rank())
        return self._dataset(x, y, sampler, seed)

    def fit_dataset(self, dataset, batch_size, steps_per_epoch=None):
        """A user's ``tf.data`` pipeline (:meth:`hetsync.protocols.Protocol.fit_dataset`); the data
        order is then the user's (``data_source`` ``"user"``), not SelDP.

        Raises:
            ValueError: with data injection (alpha, beta > 0), which needs the protocol's own data
                (:meth:`fit_data` or :meth:`fit_local_data`); and as the base method.
        """
        if self.injecting:
            raise ValueError("SelSync: data injection (alpha, beta > 0) exchanges samples of the protocol's own "
                             "data; train on opt.hetsync_protocol.fit_data(x, y, b) or fit_local_data(...), or set "
                             "alpha=0 to train on your own tf.data pipeline")
        out = super().fit_dataset(dataset, batch_size, steps_per_epoch)
        self.batch_size_local = self.batch_size_effective = self.batch_size
        self.data_source = "user"
        return out

    def adopt(self, plan):
        """Take a data plan made elsewhere (:func:`hetsync.Auto` hands over the plan it trained on): without
        injection, its batch size is b = b' (see :meth:`hetsync.core.dataplans.DataPlans.adopt`);
        ``data_source`` is then ``"adopted"``."""
        plan = super().adopt(plan)
        if self.batch_size_effective is None and not self.injecting:
            self.batch_size_local = self.batch_size_effective = plan.batch_size
            self.data_source = self.data_source or "adopted"
        return plan

    def check_fit(self, model):
        """The base checks, and data injection only on the protocol's own data.

        Raises:
            ValueError: data injection (alpha, beta > 0) without :meth:`fit_data` /
                :meth:`fit_local_data` (the injection would silently not happen).
        """
        super().check_fit(model)
        if self.injecting and self.dataset is None:
            raise ValueError("SelSync: data injection (alpha, beta > 0) needs the protocol's own data: "
                             "model.fit(**opt.hetsync_protocol.fit_data(x, y, b), ...) or fit_local_data(...); "
                             "with your own data set alpha=0")

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
        m = tf.minimum(seen + 1, self.cfg.ewma_window)
        w = self._weights * tf.cast(tf.range(self.cfg.ewma_window, dtype=tf.int64) < m, tf.float64)
        e = tf.reduce_sum(w * window) / tf.reduce_sum(w)
        prev = self._stats["ewma"].read_value()
        first = tf.equal(seen, 0)
        d = tf.where(first, tf.constant(0.0, tf.float64),
                     tf.where(prev > 0, tf.abs(e - prev) / tf.where(prev > 0, prev, 1.0),
                              tf.where(e > 0, tf.constant(np.inf, tf.float64), 0.0)))
        with tf.control_dependencies([self._window.assign(window), self._seen.assign_add(1)]):
            return tf.identity(d), e, sq, first

    def apply(self, grads, variables, local_apply):
        """One step of Algorithm 1: the flag exchange, then a synchronized (PA or GA) or a local step."""
        st = self._stats
        d, e, sq, first = self.relative_change(grads)
        flag = tf.logical_or(first, d >= self.cfg.delta)
        # The flag exchange also carries the [N] non-finite flags: every rank stops here,
        # in the same step, if any rank's gradients were not finite (they were replaced by zeros).
        exchanged = transport.allreduce_sum([tf.reshape(tf.cast(flag, tf.float32), [1]), self.nonfinite_flags(self._step_bad)],
                                            name="hetsync_selsync_flag")
        with tf.control_dependencies([self.check_nonfinite_flags(exchanged[1], "the SelSync flag exchange")]):
            flags_set = tf.identity(exchanged[0][0])
        synced = flags_set > 0.5
        bookkeeping = [st["d"].assign(d), st["ewma"].assign(e), st["grad_sq_norm"].assign(sq),
                       st["flag"].assign(tf.cast(flag, tf.float64)), st["flags_set"].assign(tf.cast(flags_set, tf.float64)),
                       st["flag_exchanges"].assign_add(1.0)]
        flag_bytes = 4.0
        if self.cfg.aggregation == "gradient":
            present, dense = present_gradients(grads)
            nbytes = float(payload_bytes(dense))

            def ga_sync():
                return self.synchronize(lambda ts: transport.allreduce_mean(ts, name="hetsync_selsync_ga"), dense)

            new = tf.cond(synced, ga_sync, lambda: [tf.identity(g) for g in dense])
            result = local_apply(scatter_gradients(grads, present, new), variables)
        else:
            result = local_apply(grads, variables)
            nbytes = float(payload_bytes([tf.convert_to_tensor(v.value) for v in variables]))

            def pa_sync():
                with tf.control_dependencies(self.average_parameters(variables, name="hetsync_selsync_pa")):
                    return tf.constant(True)

            tf.cond(synced, pa_sync, lambda: tf.constant(False))
        sent = tf.where(synced, tf.constant(nbytes + flag_bytes, tf.float64), tf.constant(flag_bytes, tf.float64))
        with tf.control_dependencies(bookkeeping + self.record_step(synced, sent)):
            tf.no_op()
        return result


SelSync = protocol_wrapper(SelSyncProtocol, """Wrap a Keras 3 optimizer for SelSync: synchronize only when the gradients change a lot.

    Each step, each rank smooths its squared gradient norm ||g_i||^2 (sum over all gradient
    tensors, float64) with an EWMA over the last ``ewma_window`` steps and computes the relative
    change ``d_i = |E_i - E_(i-1)| / E_(i-1)`` (eq. 2). Its flag is d_i >= delta; one 4-byte
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
    share round(beta b') samples with every other rank (point-to-point channel
    ``selsync.inject``); the local batch is
    b' = b / (1 + alpha beta N) (eq. 3). Needs an MPI launch when alpha, beta > 0.

    Args:
        optimizer: a Keras 3 optimizer instance.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``SelSync_<optimizer class>``).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument. ValueError: any argument outside
        the ranges above. RuntimeError: not initialised, or injection requested under Gloo.
    """)
