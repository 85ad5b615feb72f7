"""The one base class every protocol shares, and the Keras 3 optimizer wrapper that calls it.

A protocol decides what happens to ``(grads, variables)`` on each step (:meth:`Protocol.apply`
or the simpler :meth:`Protocol.transform`), may run a communication thread
(:meth:`Protocol.start` / :meth:`Protocol.stop`, called by :class:`hetsync.callbacks.ProtocolHooks`)
and reports statistics. :func:`wrap` turns a user's Keras 3 optimizer into a protocol-aware one by
subclassing its class and overriding ``apply(grads, trainable_variables)``, the hook Keras 3 calls
inside the compiled ``model.fit`` step (GUIDE section 1). Horovod's own Keras layer is not used:
on Keras 3 it averages nothing.
"""
import keras
import numpy as np
import tensorflow as tf

from .. import ops, runtime, slowdown, transport

__all__ = ["Protocol", "wrap", "protocol_of", "average_at_train_end"]


class Protocol:
    """Base class of every hetsync protocol (BSP, RNA, task allocation, SelSync, ...).

    Subclasses set :attr:`name` (the lowercase CLI name) and :attr:`requires_mpi`, then override
    :meth:`transform` (gradients in, gradients out) or :meth:`apply` (full control over the local
    step), plus :meth:`build`, :meth:`start`, :meth:`stop` and :meth:`callbacks` as needed.

    Per-step statistics are float64 scalar variables (:meth:`add_stat`) assigned inside the
    compiled step and read by :class:`hetsync.callbacks.SyncMetrics`. Every protocol has:

    * ``delay_ms``: injected slowdown of this step in milliseconds;
    * ``compute_ms``: compute time of this step up to the gradients, in milliseconds;
    * ``sync_wait_ms``: time spent inside synchronization this step, in milliseconds
      (including ``netdelay`` latency);
    * ``syncs``: cumulative number of synchronizations (collective rounds) this rank joined;
    * ``emulated_ms``: on an emulated device (``device:MS``), the step's emulated duration in
      milliseconds (K x MS x samples / b + extra); 0 otherwise;
    * ``overrun``: 1 if the step's real compute exceeded its emulated duration (the step was not
      shortened, so the emulation is off for it), else 0; ``overruns``: their cumulative count.
    """

    #: lowercase protocol name used by ``--protocol`` and in summaries.
    name = "base"
    #: True if the protocol needs MPI point-to-point messages (fails under ``horovodrun --gloo``).
    requires_mpi = False

    def __init__(self):
        self.optimizer = None
        self._stats = {}
        #: samples this rank processes per epoch (int), set by :meth:`fit_data`; read by SyncMetrics.
        self.samples_per_epoch = None
        #: the run's per-rank batch size b (int samples), set by :meth:`fit_data`: the reference of
        #: the emulated device (``device:MS`` costs MS milliseconds per b samples). None if unknown.
        self.batch_size = None

    # -- life cycle ---------------------------------------------------------------------------
    def attach(self, optimizer):
        """Bind to the wrapped optimizer and create state. Called once by :func:`wrap` (eagerly).

        Raises:
            RuntimeError: hetsync not initialised, or an MPI-only protocol launched under Gloo.
        """
        if not runtime.is_initialized():
            raise RuntimeError(f"hetsync.{type(self).__name__}: call hetsync.init() before wrapping an optimizer")
        if self.requires_mpi:
            runtime.require_mpi(f"protocol {self.name!r}")
        self.optimizer = optimizer
        for stat in ("delay_ms", "compute_ms", "sync_wait_ms", "syncs", "emulated_ms", "overrun", "overruns"):
            self.add_stat(stat)
        self.build()

    def build(self):
        """Create protocol state (variables, resources). Runs eagerly, before any step is traced."""

    def start(self):
        """Start communication threads (called at ``on_train_begin``)."""

    def stop(self):
        """Stop communication threads, drain or count what is in flight (``on_train_end``)."""

    def callbacks(self):
        """Return the list of Keras callbacks this protocol needs besides the common ones."""
        return []

    def fit_data(self, x, y, batch_size, seed=0):
        """Return this rank's ``model.fit`` data arguments for the full training set ``(x, y)``.

        Default: a disjoint, equally long shard per rank (:func:`hetsync.data.shard`), reshuffled
        every epoch, in full batches only (:class:`hetsync.partition.LocalSampler`): each epoch is
        floor(shard / batch_size) steps and the partial last batch is left out (a different
        remainder every epoch, so no sample is left out for good). A partial batch would be a step
        on a few samples with the full learning rate: with the example CNN on digits (7 samples
        left per rank) test accuracy fell from 0.68 to 0.28 after that step, epoch after epoch.
        Protocols with their own data order or per-rank workloads (task allocation, SelSync's
        SelDP) override this.

        Args:
            x: array [N, ...] (all training inputs). y: int array [N]. batch_size: int samples per
            rank per step, at most the shard size. seed: int.

        Returns:
            dict of keyword arguments for ``model.fit``: ``x`` (a ``keras.utils.PyDataset``),
            ``steps_per_epoch`` and ``shuffle=False`` (the sampler shuffles).

        Raises:
            ValueError: ``batch_size`` not an int in [1, shard size].
        """
        from .. import data, partition

        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be an int >= 1 (samples per rank per step), "
                             f"got {batch_size!r}")
        rank = runtime.rank()
        xs, ys = data.shard(x, y, rank, runtime.size(), seed=seed)
        sampler = partition.LocalSampler(np.arange(len(xs)), int(batch_size), seed=seed, rank=rank)
        self.samples_per_epoch = sampler.steps_per_pass * int(batch_size)
        self.batch_size = int(batch_size)
        return {"x": partition.BatchDataset(xs, ys, sampler), "steps_per_epoch": sampler.steps_per_pass,
                "shuffle": False}

    def step_samples(self, batch):
        """Samples this rank trains on in step ``batch`` of the current epoch (int), or None if unknown.

        Read by :class:`hetsync.callbacks.Slowdown` before the step starts, so that an emulated
        device (``device:MS``) charges MS x samples / :attr:`batch_size` milliseconds for it.
        Default: :attr:`batch_size` (every step a full batch). Protocols whose per-step sample
        count differs from b override this (task allocation: w_i micro-batches; SelSync with data
        injection: the local plus the injected samples).

        Args:
            batch: int >= 0, the step's index within the epoch (Keras' ``batch``).
        """
        return self.batch_size

    # -- the step -------------------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        """Apply one step. Default: ``local_apply(self.transform(grads, variables), variables)``.

        Args:
            grads: list of gradient tensors (or None), aligned with ``variables``.
            variables: list of the model's trainable Keras variables.
            local_apply: callable ``(grads, variables)`` running the wrapped optimizer's own update.

        Returns:
            whatever ``local_apply`` returns.
        """
        return local_apply(self.transform(grads, variables), variables)

    def transform(self, grads, variables):
        """Return the gradients to apply locally (default: unchanged)."""
        return grads

    # -- helpers for subclasses -----------------------------------------------------------------
    def synchronize(self, fn, tensors):
        """Run the collective ``fn(tensors)`` with the scenario's network latency, timed.

        Adds ``netdelay`` latency (:func:`hetsync.slowdown.sync_control`) through the compiled
        delay op, adds the wall time from entry to result to ``sync_wait_ms`` and increments
        ``syncs``.

        Args:
            fn: callable list[Tensor] -> list[Tensor], the collective.
            tensors: list of tensors.

        Returns:
            ``fn``'s list of tensors.
        """
        tensors = list(tensors)
        with tf.control_dependencies(tensors):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            tensors, _, _ = ops.delay(tensors, slowdown.sync_control(), name="hetsync_sync_latency")
        out = list(fn(tensors))
        with tf.control_dependencies(out):
            t1 = tf.timestamp()
        self._stats["sync_wait_ms"].assign_add((t1 - t0) * 1e3)
        self._stats["syncs"].assign_add(tf.constant(1.0, tf.float64))
        return out

    def add_stat(self, name, initial=0.0):
        """Create (eagerly) a float64 scalar statistic variable and return it."""
        if name not in self._stats:
            with tf.init_scope():
                self._stats[name] = tf.Variable(float(initial), dtype=tf.float64, trainable=False,
                                                name=f"hetsync_{self.name}_{name}")
        return self._stats[name]

    def step_stats(self):
        """Return ``{name: float}`` of every statistic variable (read eagerly, after a step)."""
        return {k: float(v.numpy()) for k, v in self._stats.items()}

    def summary_stats(self):
        """Return a JSON-serialisable dict of end-of-run statistics (default: last step values)."""
        return {"syncs": int(self._stats["syncs"].numpy())} if self._stats else {}

    def config(self):
        """Return the protocol's arguments as a JSON-serialisable dict (for summaries)."""
        return {}

    # -- called by the wrapper ------------------------------------------------------------------
    def _step(self, grads, variables, local_apply):
        """Inject the scenario's slowdown on the gradients, reset per-step stats, run :meth:`apply`."""
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        dense = [tf.convert_to_tensor(grads[i]) for i in present]
        control = tf.convert_to_tensor(slowdown.step_control())
        delayed, delay_ms, compute_ms = ops.delay(dense, control, name="hetsync_step_delay")
        for i, g in zip(present, delayed):
            grads[i] = g
        emulated = control[3] > 0.0
        target_ms = tf.where(emulated, control[1] * control[3] + control[2], tf.constant(0.0, tf.float64))
        overrun = tf.cast(tf.logical_and(emulated, compute_ms > target_ms), tf.float64)
        self._stats["delay_ms"].assign(delay_ms)
        self._stats["compute_ms"].assign(compute_ms)
        self._stats["emulated_ms"].assign(target_ms)
        self._stats["overrun"].assign(overrun)
        self._stats["overruns"].assign_add(overrun)
        self._stats["sync_wait_ms"].assign(tf.constant(0.0, tf.float64))
        return self.apply(grads, variables, local_apply)


class _ProtocolOptimizer:
    """Mixin placed before the user's optimizer class; routes ``apply`` through the protocol."""

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        base_apply = super().apply
        return self.hetsync_protocol._step(list(grads), variables, lambda g, v: base_apply(g, v))


def average_at_train_end(protocol, name):
    """Average the trainable parameters over all ranks once, eagerly, when training ends.

    w <- (1/N) sum_n w_n, so every rank leaves ``fit`` with the same model (local steps since the
    last synchronization are kept in the average, not discarded). Called from a protocol's
    ``stop`` on every rank (RNA, SelSync, local SGD); not counted as a step (LSSR is unchanged) nor delayed by ``netdelay``.

    Args:
        protocol: the protocol (its optimizer must be built). name: collective-name prefix (str).

    Returns:
        dict ``{"final_average": True, "drift_before_final_average": float}``: the largest L2
        distance ||w_n - w_mean|| over ranks before the average (0.0 if they were already equal).

    Raises:
        RuntimeError: the optimizer has no trainable variables (not built).
    """
    variables = list(getattr(protocol.optimizer, "_trainable_variables", None) or [])
    if not variables:
        raise RuntimeError(f"{protocol.name}: no trainable variables to average at train end (optimizer not built)")
    values = [tf.convert_to_tensor(v.value) for v in variables]
    means = transport.allreduce_mean(values, name=f"{name}_final_avg")
    dist = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(a - m, tf.float64))) for a, m in zip(values, means)]))
    drift = float(tf.reduce_max(transport.allgather(tf.reshape(dist, [1]), name=f"{name}_final_drift")).numpy())
    for v, m in zip(variables, means):
        v.assign(m)
    return {"final_average": True, "drift_before_final_average": drift}


def wrap(optimizer, protocol):
    """Return a copy of a Keras 3 optimizer whose every step goes through ``protocol``.

    The copy is an instance of a subclass of the optimizer's own class (built with
    ``from_config(optimizer.get_config())``), so learning rate, schedules and slots behave as
    the user configured them. The protocol is reachable as ``optimizer.hetsync_protocol``.

    Args:
        optimizer: a ``keras.optimizers.Optimizer`` instance (Keras 3), not yet used.
        protocol: a :class:`Protocol` instance.

    Returns:
        keras.optimizers.Optimizer.

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance (for example a string, a
            class, a learning rate or a schedule).
        ValueError: the optimizer is already wrapped by a hetsync protocol.
        RuntimeError: hetsync not initialised, or an MPI-only protocol under Gloo.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"hetsync.{type(protocol).__name__.replace('Protocol', '')} wraps a Keras 3 optimizer instance such as "
            f"keras.optimizers.SGD(learning_rate=0.1); got {type(optimizer).__name__}: {optimizer!r}"
        )
    if getattr(optimizer, "hetsync_protocol", None) is not None:
        raise ValueError(f"optimizer is already wrapped by hetsync protocol {optimizer.hetsync_protocol.name!r}")
    base = type(optimizer)
    cls = type(base.__name__, (_ProtocolOptimizer, base), {"__module__": base.__module__})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped.hetsync_protocol = protocol
    protocol.attach(wrapped)
    return wrapped


def protocol_of(optimizer):
    """Return the :class:`Protocol` of a wrapped optimizer.

    Raises:
        TypeError: ``optimizer`` was not wrapped by a hetsync protocol.
    """
    proto = getattr(optimizer, "hetsync_protocol", None)
    if proto is None:
        raise TypeError(f"{optimizer!r} is not a hetsync-wrapped optimizer; wrap it with e.g. hetsync.BSP(optimizer)")
    return proto
