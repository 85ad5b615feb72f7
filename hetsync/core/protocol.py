"""The one base class every protocol shares, with the mechanisms several protocols use.

A protocol decides what happens to ``(grads, variables)`` on each step (:meth:`Protocol.apply`
or the simpler :meth:`Protocol.transform`), may run a communication thread
(:meth:`Protocol.start` / :meth:`Protocol.stop`, called by :class:`hetsync.callbacks.ProtocolHooks`)
and reports statistics. Its parameters are one frozen dataclass (:attr:`Protocol.Config`, see
:mod:`hetsync.core.config`). The Keras 3 optimizer wrapper that calls it lives in
:mod:`hetsync.core.wrapper`.

Shared mechanisms (here, not in a sibling protocol):

* the present-gradient gather and scatter (:func:`present_gradients`, :func:`scatter_gradients`);
* parameter averaging inside the step (:meth:`Protocol.average_parameters`; SelSync's PA, local
  SGD, FedAvg's masked average), end-of-training averaging (:meth:`Protocol.average_at_train_end`,
  run by :meth:`Protocol.stop` for every protocol whose config has ``average_at_end=True``) and
  the drift measure (:meth:`Protocol.parameter_drift`; RNA, end-of-training);
* the semi-synchronous step statistics (:meth:`Protocol.add_sync_stats`, :meth:`Protocol.record_step`);
* the non-finite guard: every step's gradients are checked before anything leaves the
  rank (:meth:`Protocol._guard_gradients`, per-rank flags in the collectives with
  :meth:`Protocol.nonfinite_flags` / :meth:`Protocol.check_nonfinite_flags`, eager senders with
  :meth:`Protocol.check_finite_arrays`), and the model's non-trainable float state is averaged with
  the parameters (:meth:`Protocol.set_state_variables`).
"""
import dataclasses

import numpy as np
import tensorflow as tf

from hetsync import ops, transport
from hetsync import roles, world
from hetsync.roles import Roles
from hetsync.core import controls
from hetsync.errors import NONFINITE_MARK, NonFiniteError

__all__ = ["Protocol", "NonFiniteError", "present_gradients", "scatter_gradients", "payload_bytes",
           "NONFINITE_MARK"]



def _loss_scaling(optimizer):
    """True if ``optimizer`` is a Keras ``LossScaleOptimizer`` (dynamic loss scaling)."""
    import keras

    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def all_finite(tensors):
    """Return a bool scalar tensor: every element of every tensor in ``tensors`` is finite.

    Args:
        tensors: list of float tensors or ``tf.IndexedSlices`` (their values are checked); may be empty (True).
    """
    checks = [tf.reduce_all(tf.math.is_finite(t.values if isinstance(t, tf.IndexedSlices) else t))
              for t in tensors if t is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def present_gradients(grads):
    """Gather the gradients that exist: ``(indices, dense)``.

    Args:
        grads: list of gradient tensors, ``tf.IndexedSlices`` or None (one per variable).

    Returns:
        ``(indices, dense)``: list of the int positions of the non-None gradients and the list of
        those gradients as dense tensors (IndexedSlices converted), same order.
    """
    indices = [i for i, g in enumerate(grads) if g is not None]
    return indices, [tf.convert_to_tensor(grads[i]) for i in indices]


def scatter_gradients(grads, indices, values):
    """Put ``values`` back at ``indices`` of a copy of ``grads`` (the inverse of :func:`present_gradients`).

    Args:
        grads: list (length n). indices: list of int positions. values: list, same length as indices.

    Returns:
        a new list of length n.
    """
    out = list(grads)
    for i, g in zip(indices, values):
        out[i] = g
    return out


def payload_bytes(tensors):
    """Return the total size in bytes (python int) of a list of tensors with static shapes."""
    return int(sum(t.shape.num_elements() * t.dtype.size for t in tensors))


class Protocol:
    """Base class of every hetsync protocol (BSP, RNA, task allocation, SelSync, ...).

    Subclasses set :attr:`name` (the lowercase CLI name), :attr:`display_name`, :attr:`Config`
    (their frozen configuration dataclass) and :attr:`requires_mpi`, then override
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
    * ``nonfinite_dropped``: cumulative number of non-finite gradient sets or parameter sets this
      rank held back instead of sending (each one then stops training, see :meth:`_guard_gradients`).

    Non-finite guard: every step checks its gradients before anything leaves the rank.
    A non-finite gradient (NaN or inf, also from a non-finite loss) is never sent: it is counted
    in ``nonfinite_dropped`` and training stops with an error naming the rank, the step
    (the optimizer's ``iterations`` before the step) and the protocol. Protocols with
    :attr:`nonfinite_in_collective` fold a per-rank flag into their own collective, so every rank
    stops in the same synchronization naming the source rank(s); the others stop on the failing
    rank (its process exits non-zero and ``mpirun`` ends the job). Parameters are checked the same
    way before every parameter average (:meth:`average_parameters`, :meth:`average_at_train_end`)
    and, by the point-to-point protocols, before they are sent (:meth:`check_finite_arrays`).

    Args:
        config: an instance of :attr:`Config` (or None: build it from ``kwargs``, all defaults
            without them).
        **kwargs: fields of :attr:`Config` (with ``config``: replace those fields).

    Raises:
        ValueError: a bad configuration value (before training).
        TypeError: a ``config`` of another class, or arguments for a protocol without ``Config``.
    """

    #: lowercase protocol name used by ``--protocol`` and in summaries.
    name = "base"
    #: the wrapper's name (e.g. ``"RNA"``): names the wrapped optimizer class (``RNA_SGD``) and messages.
    display_name = "Protocol"
    #: True if the protocol needs MPI point-to-point messages (fails under ``horovodrun --gloo``).
    requires_mpi = False
    #: the protocol's configuration dataclass (a :class:`hetsync.core.config.ProtocolConfig`), or None.
    Config = None

    def __init__(self, config=None, **kwargs):
        if self.Config is None:
            if config is not None or kwargs:
                raise TypeError(f"{type(self).__name__} has no configuration; got {config!r}, {kwargs!r}")
        elif config is None:
            config = self.Config(**kwargs)
        elif not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(config).__name__}")
        elif kwargs:
            config = dataclasses.replace(config, **kwargs)
        #: the frozen configuration (an instance of :attr:`Config`), or None.
        self.cfg = config
        self.optimizer = None
        self._stats = {}
        self._final = {}
        #: samples this rank processes per epoch (int), set by :meth:`fit_data`; read by SyncMetrics.
        self.samples_per_epoch = None
        #: a ValueError for a launch too small for the protocol's servers (raised by :meth:`check_roles`), or None.
        self.role_error = None
        #: this protocol's :class:`hetsync.roles.Roles` (workers and servers), made by :meth:`attach`.
        self.roles = None
        #: the run's per-rank batch size b (int samples), set by :meth:`fit_data`: the reference of
        #: the emulated device (``device:MS`` costs MS milliseconds per b samples). None if unknown.
        self.batch_size = None
        #: the sample pool's client and server (:mod:`hetsync.data.pool`), set by ``fit_data`` under ``data_plan="pool"``.
        self.pool = self.pool_server = None

    # -- life cycle ---------------------------------------------------------------------------
    def attach(self, optimizer):
        """Bind to the wrapped optimizer and create state. Called once by the wrapper (eagerly).

        Raises:
            RuntimeError: hetsync not initialised, or an MPI-only protocol launched under Gloo.
        """
        if not world.is_initialized():
            raise RuntimeError(f"hetsync.{self.display_name}: call hetsync.init() before wrapping an optimizer")
        if self.requires_mpi:
            world.require_mpi(f"protocol {self.name!r}")
        try:
            self.roles = Roles.of_world(self.server_count())
        except ValueError as exc:
            # Wrapping only configures: a launch too small for the servers fails when the roles are
            # first used (fit_data, train begin), before any step.
            self.role_error = ValueError(f"{self.display_name}: {exc}")
            self.roles = Roles.of_world(0)
        roles.set_current(self.roles)
        self.optimizer = optimizer
        for stat in ("delay_ms", "compute_ms", "sync_wait_ms", "syncs", "emulated_ms", "overrun", "overruns",
                     "nonfinite_dropped"):
            self.add_stat(stat)
        self.build()

    def server_count(self):
        """Return the number K of parameter-server ranks this protocol uses (int; 0 here, the
        parameter-server protocols return their ``servers`` argument). :meth:`attach` makes
        :attr:`roles` from it (:class:`hetsync.roles.Roles`, which raises ValueError if it leaves no worker)."""
        return 0

    def check_roles(self):
        """Raise the ValueError of a launch too small for the protocol's servers (no worker left), if any.

        Raises:
            ValueError: ``servers`` >= the number of ranks (the message names both).
        """
        if self.role_error is not None:
            raise self.role_error

    def build(self):
        """Create protocol state (variables, resources). Runs eagerly, before any step is traced."""

    def start(self):
        """Start communication threads (called at ``on_train_begin``)."""

    def stop(self):
        """End of training (``on_train_end``, every rank): with ``average_at_end=True`` in the
        config, average the parameters once (:meth:`average_at_train_end`). Protocols with threads
        stop them first and drain or count what is in flight."""
        if getattr(self.cfg, "average_at_end", False):
            self.average_at_train_end()

    def callbacks(self):
        """Return the list of Keras callbacks this protocol needs besides the common ones."""
        return []

    #: True for protocols whose communication thread issues horovod collectives while training
    #: (RNA): other eager collectives during ``fit`` must then avoid horovod (see
    #: :class:`hetsync.callbacks.MetricAverage`).
    collectives_in_thread = False

    #: largest ``steps_per_execution`` of ``model.compile`` the protocol supports (int), or None for
    #: any. With k > 1 Keras runs k steps inside one compiled call and calls the batch callbacks
    #: once per call; a protocol whose callback feeds every step (task allocation's m_i) needs 1.
    max_steps_per_execution = None

    #: True for protocols whose every step runs one collective that carries the non-finite flags
    #: of :meth:`nonfinite_flags` (BSP, SelSync, task allocation): a bad rank then sends zeros in
    #: place of its gradients and every rank stops after that collective. False: the bad rank stops
    #: before its step does anything (nothing enters a cache, a queue or a message).
    nonfinite_in_collective = False

    def check_fit(self, model):
        """Check the model's training set-up against the protocol at train begin (before any step).

        Called by :class:`hetsync.callbacks.ProtocolHooks`. Checks that the model trains with this
        protocol's optimizer (not a ``keras.optimizers.LossScaleOptimizer`` wrapped *around* it)
        and that ``steps_per_execution`` is at most :attr:`max_steps_per_execution`.

        Args:
            model: the ``keras.Model`` being fit.

        Raises:
            ValueError: either check fails (the message names the value and what is allowed).
        """
        opt = getattr(model, "optimizer", None)
        inner = getattr(opt, "inner_optimizer", None)
        if opt is not self.optimizer and inner is self.optimizer:
            raise ValueError(
                f"{self.display_name}: the model's optimizer is a {type(opt).__name__} around the "
                f"hetsync-wrapped {type(self.optimizer).__name__}; wrap the other way round, "
                f"hetsync.{self.display_name}(keras.optimizers.LossScaleOptimizer(base_optimizer)) (Keras adds a "
                "LossScaleOptimizer itself under the mixed_float16 policy unless the optimizer already is one)")
        self.set_state_variables(model)
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        if self.max_steps_per_execution is not None and spe > self.max_steps_per_execution:
            raise ValueError(
                f"{self.display_name}: model.compile(steps_per_execution={spe}) is not supported; this protocol "
                f"allows steps_per_execution <= {self.max_steps_per_execution} (its callback sets every step's "
                "workload); compile with steps_per_execution=1")

    def set_state_variables(self, model):
        """Record the model's non-trainable floating-point variables (:attr:`state_variables`).

        These are the layers' state that no gradient updates, e.g. BatchNormalization's moving mean
        and variance; :meth:`average_parameters` and :meth:`average_at_train_end` average them with
        the trainable parameters, so every rank ends with the same full model. Integer or
        boolean non-trainable variables (counters, seed-generator states) are not averaged: an
        average of them means nothing, and they are left as each rank has them. Called by
        :meth:`check_fit` at train begin (so by :class:`hetsync.callbacks.ProtocolHooks`).

        Args:
            model: a ``keras.Model`` (its ``non_trainable_variables`` are read; the optimizer's own
                variables are not among them).

        Returns:
            list of the recorded Keras variables (float dtypes only).
        """
        state = []
        for v in getattr(model, "non_trainable_variables", None) or []:
            if tf.as_dtype(v.dtype).is_floating:
                state.append(v)
        self.state_variables = state
        return state

    # the compiled step's non-finite flag and step index while a step is being traced (else None)
    _step_bad = _step_it = None

    #: the model's non-trainable float variables (e.g. BatchNormalization statistics), set at train
    #: begin by :meth:`set_state_variables`; averaged with the parameters.
    state_variables = ()

    def fit_data(self, x, y, batch_size, seed=0):
        """Return this rank's ``model.fit`` data arguments for the full training set ``(x, y)``.

        Default: a disjoint, equally long shard per worker rank (:func:`hetsync.data.datasets.shard` over
        :func:`hetsync.world.num_workers` workers; a parameter-server rank gets
        :meth:`server_fit_data`), reshuffled
        every epoch, in full batches only (:class:`hetsync.data.shards.LocalSampler`): each epoch is
        floor(shard / batch_size) steps and the partial last batch is left out (a different
        remainder every epoch, so no sample is left out for good). A partial batch would be a step
        on a few samples with the full learning rate: with the example CNN on digits (7 samples
        left per rank) test accuracy fell from 0.68 to 0.28 after that step, epoch after epoch.
        Protocols with their own data order or per-rank workloads (task allocation, SelSync's
        SelDP) override this. A protocol whose config has ``data_plan="pool"`` (RNA's default)
        draws its batches from the epoch's sample pool instead (:func:`hetsync.data.pool.fit_data`:
        faster ranks take more batches, every sample once per epoch, no ``steps_per_epoch``).

        Args:
            x: array [N, ...] (all training inputs). y: int array [N]. batch_size: int samples per
            rank per step, at most the shard size. seed: int.

        Returns:
            dict of keyword arguments for ``model.fit``: ``x`` (a ``keras.utils.PyDataset``),
            ``steps_per_epoch`` and ``shuffle=False`` (the sampler shuffles).

        Raises:
            ValueError: ``batch_size`` not an int in [1, shard size], or no worker left (servers >= ranks).
            RuntimeError: ``data_plan="pool"`` under ``horovodrun --gloo`` (the pool needs MPI
                point-to-point; the message names ``data_plan='shard'``).
        """
        from hetsync.data import datasets as data
        from hetsync.data import shards as partition

        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be an int >= 1 (samples per rank per step), "
                             f"got {batch_size!r}")
        self.check_roles()
        use_pool = getattr(self.cfg, "data_plan", "shard") == "pool"  # work conservation: hetsync.data.pool
        if use_pool:
            world.require_mpi(f"{self.display_name} with data_plan='pool' (the sample pool; pass "
                                "data_plan='shard' for fixed per-rank shares under Gloo)")
            transport.dispatcher()  # collective on first use: servers too
        if self.roles.is_server:
            return self.server_fit_data(x, y, batch_size)
        if use_pool:  # served by worker 0 (rank 0) to the workers 0 .. n - 1
            from hetsync.data import pool as pool

            return pool.fit_data(self, x, y, batch_size, seed=seed, server=0, ranks=range(self.roles.num_workers),
                                 timeout_s=getattr(self.cfg, "timeout_s", pool.DEFAULT_TIMEOUT_S))
        rank = self.roles.worker_rank
        xs, ys = data.shard(x, y, rank, self.roles.num_workers, seed=seed)
        sampler = partition.LocalSampler(np.arange(len(xs)), int(batch_size), seed=seed, rank=rank)
        self.samples_per_epoch = sampler.steps_per_pass * int(batch_size)
        self.batch_size = int(batch_size)
        return {"x": partition.BatchDataset(xs, ys, sampler), "steps_per_epoch": sampler.steps_per_pass,
                "shuffle": False}

    def server_fit_data(self, x, y, batch_size):
        """``model.fit`` arguments on a parameter-server rank: one batch of ``x`` (the server trains on
        nothing: its ``fit`` serves until every worker finished, then stops after one step that
        changes no weight). Sets :attr:`samples_per_epoch` to 0.

        Args:
            x: array [N, ...]. y: int array [N]. batch_size: int >= 1 samples (clipped to N).

        Returns:
            dict of ``model.fit`` keyword arguments (``x``, ``steps_per_epoch=1``, ``shuffle=False``).
        """
        from hetsync.data import shards as partition

        b = max(1, min(int(batch_size), len(x)))
        sampler = partition.LocalSampler(np.arange(b), b)
        self.samples_per_epoch = 0
        self.batch_size = int(batch_size)
        return {"x": partition.BatchDataset(x[:b], y[:b], sampler), "steps_per_epoch": 1, "shuffle": False}

    def fit_dataset(self, dataset, batch_size, steps_per_epoch=None):
        """Return ``model.fit`` data arguments for this rank's part of a user's ``tf.data`` pipeline.

        The path for a user's own input pipeline (the alternative to :meth:`fit_data`, which takes
        the whole training set as arrays). ``dataset`` is this rank's *unbatched* data, for example
        ``tf.data.Dataset.from_tensor_slices((x, y)).shard(hetsync.size(), hetsync.rank())
        .shuffle(4096)`` (elements ``(x, y)`` or any structure Keras accepts); the protocol batches
        it. Default (BSP, RNA, SelSync without data injection, FedAvg, local SGD, Hop, the
        parameter-server protocols): batches of ``batch_size`` samples, the partial last one
        dropped, repeated, with the same number of steps per epoch on every worker rank (the
        smallest worker's, so a collective never waits for a rank that has finished its epoch).
        A parameter-server rank gets one batch (one step, it trains on nothing; shard with
        :func:`hetsync.data.datasets.shard_dataset` so that every sample goes to a worker). Task allocation
        overrides this (its batches follow w_i).

        A batched ``tf.data.Dataset`` or NumPy arrays can also go to ``model.fit`` directly, as
        without hetsync, for every protocol but task allocation; then every rank must run the same
        number of steps per epoch (give ``steps_per_epoch`` if the shards differ in length).

        Args:
            dataset: ``tf.data.Dataset`` of single examples (this rank's share).
            batch_size: int b >= 1, samples per rank per step.
            steps_per_epoch: int >= 1, or None to derive it from the datasets' lengths
                (``min over ranks of floor(cardinality / b)``; one allgather). Needed when the
                length is unknown (e.g. after ``filter``).

        Returns:
            dict of ``model.fit`` keyword arguments: ``x`` (a batched, repeated ``tf.data.Dataset``),
            ``steps_per_epoch`` and ``shuffle=False`` (the pipeline shuffles, if the user's does).

        Raises:
            TypeError: ``dataset`` is not a ``tf.data.Dataset``.
            ValueError: bad ``batch_size`` or ``steps_per_epoch``; a rank's data shorter than one
                batch; an unknown or infinite length without ``steps_per_epoch``; no worker left
                (``servers`` >= ranks).
        """
        b = self._check_fit_dataset(dataset, batch_size, steps_per_epoch)
        self.check_roles()
        if steps_per_epoch is None:
            # every rank takes part in the allgather; the workers' lengths set the steps
            per_rank = self._cardinalities(dataset)[:self.roles.num_workers]
            steps_per_epoch = min(c // b for c in per_rank)
            if steps_per_epoch < 1:
                raise ValueError(f"{self.name}: fit_dataset: a rank holds fewer samples than one batch of {b} "
                                 f"(samples per worker rank: {per_rank})")
        self.batch_size = b
        if self.roles.is_server:
            # a parameter-server rank serves inside its fit and trains on nothing: one batch, one step
            self.samples_per_epoch = 0
            ds = dataset.take(1).repeat(b).batch(b, drop_remainder=True)
            return {"x": ds, "steps_per_epoch": 1, "shuffle": False}
        self.samples_per_epoch = int(steps_per_epoch) * b
        ds = dataset.repeat().batch(b, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        return {"x": ds, "steps_per_epoch": int(steps_per_epoch), "shuffle": False}

    def _check_fit_dataset(self, dataset, batch_size, steps_per_epoch):
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"{self.name}: fit_dataset takes a tf.data.Dataset of single (unbatched) examples, "
                            f"got {type(dataset).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"{self.name}: fit_dataset: batch_size must be an int >= 1 (samples per rank per step), "
                             f"got {batch_size!r}")
        if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool)
                                            or not isinstance(steps_per_epoch, (int, np.integer))
                                            or steps_per_epoch < 1):
            raise ValueError(f"{self.name}: fit_dataset: steps_per_epoch must be None or an int >= 1, "
                             f"got {steps_per_epoch!r}")
        return int(batch_size)

    def _cardinalities(self, dataset):
        """Every rank's dataset length (list of ints, one allgather). Raises ValueError if unknown."""
        card = int(dataset.cardinality().numpy())
        per_rank = [int(c) for c in transport.allgather_object(card, name=f"hetsync_{self.name}_cardinality")]
        if any(c < 0 for c in per_rank):
            raise ValueError(f"{self.name}: fit_dataset: the dataset length is unknown or infinite on some rank "
                             f"(tf.data cardinality per rank: {per_rank}; -1 unknown, -2 infinite); "
                             "pass steps_per_epoch")
        return per_rank

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

    # -- shared mechanisms -----------------------------------------------------------------------
    def synchronize(self, fn, tensors):
        """Run the collective ``fn(tensors)`` with the scenario's network latency, timed.

        Adds ``netdelay`` latency (:func:`hetsync.core.controls.sync_control`) through the compiled
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
            tensors, _, _ = ops.delay(tensors, controls.sync_control(), name="hetsync_sync_latency")
        out = list(fn(tensors))
        with tf.control_dependencies(out):
            t1 = tf.timestamp()
        self._stats["sync_wait_ms"].assign_add((t1 - t0) * 1e3)
        self._stats["syncs"].assign_add(tf.constant(1.0, tf.float64))
        return out

    def average_parameters(self, variables, weight=None, name=None):
        """Average the parameters over ranks (parameter aggregation) and assign the result, timed.

        With ``weight`` None, w <- (1/N) sum_n w_n (one fused averaged allreduce; SelSync's PA,
        section III-C; local SGD). With a float32 scalar ``weight`` (1 for ranks taking part, 0
        for the others; FedAvg's random fraction C), w <- sum_n weight_n w_n / sum_n weight_n on
        *every* rank, by one masked fused allreduce-sum. Runs inside :meth:`synchronize`
        (netdelay latency, ``sync_wait_ms``, ``syncs``). Usable inside the compiled step.

        The model's non-trainable float state (:attr:`state_variables`, e.g. BatchNormalization's
        moving statistics) is averaged with ``variables`` in the same collective.
        Non-finite guard: a rank whose values are not all finite (or whose step's gradients were
        not, :meth:`_guard_gradients`) sends zeros in their place and sets its flag in a [N]
        float32 vector carried by the same collective; if any flag is set, every rank raises
        (``InvalidArgumentError`` starting with :data:`NONFINITE_MARK`, naming the rank(s) and the
        step) before assigning anything. The flag vector (4 N bytes) is not counted in ``bytes_sent``.

        Args:
            variables: list of Keras variables (float). weight: None or float32 scalar tensor.
            name: op-name prefix (default ``hetsync_<name>_avg``).

        Returns:
            list of the assign ops.
        """
        name = name or f"hetsync_{self.name}_avg"
        variables = self._with_state(variables)
        values = [tf.convert_to_tensor(v.value) for v in variables]
        local_bad = tf.logical_not(all_finite(values))
        step_bad = getattr(self, "_step_bad", None)
        bad = local_bad if step_bad is None else tf.logical_or(local_bad, step_bad)
        counted = self._stats["nonfinite_dropped"].assign_add(tf.cast(local_bad, tf.float64))
        with tf.control_dependencies([counted]):
            values = self._zeros_if(bad, values)
        flags = self.nonfinite_flags(bad)
        if weight is None:
            out = self.synchronize(lambda ts: transport.allreduce_mean(ts, name=name), values + [flags])
            avg = out[:-1]
        else:
            masked = [v * tf.cast(weight, v.dtype) for v in values] + [tf.reshape(tf.cast(weight, tf.float32), [1])]
            out = self.synchronize(lambda ts: transport.allreduce_sum(ts, name=name), masked + [flags])
            summed = out[:-1]
            count = summed[-1][0]
            avg = [s / tf.cast(count, s.dtype) for s in summed[:-1]]
        check = self.check_nonfinite_flags(out[-1], "the parameter average")
        with tf.control_dependencies([check]):
            return [v.assign(a) for v, a in zip(variables, avg)]

    def _with_state(self, variables):
        """``variables`` followed by the :attr:`state_variables` not already among them (list)."""
        variables = list(variables)
        ids = {id(v) for v in variables}
        return variables + [v for v in self.state_variables if id(v) not in ids]

    @staticmethod
    def _zeros_if(bad, tensors):
        """``tensors`` (list of dense tensors), or zeros of the same shapes where ``bad`` (bool scalar) holds."""
        if not tensors:
            return []
        return list(tf.cond(bad, lambda: [tf.zeros_like(t) for t in tensors], lambda: [tf.identity(t) for t in tensors]))

    def nonfinite_flags(self, bad):
        """Return this rank's non-finite flag vector: float32 [N] (N = world size), 1 at this rank's
        index if ``bad`` (bool scalar tensor) holds, else zeros. Summed or averaged by a collective, a
        positive entry names a rank that held back non-finite values (:meth:`check_nonfinite_flags`).
        ``bad`` None (outside a guarded step) means False."""
        if bad is None:
            bad = tf.constant(False)
        return tf.one_hot(world.rank(), world.size(), dtype=tf.float32) * tf.cast(bad, tf.float32)

    def _step_index(self):
        """The optimizer's ``iterations`` (int64 scalar tensor): the 0-based index of the current step."""
        if getattr(self, "_step_it", None) is not None:
            return self._step_it  # read at the start of the step, before the optimizer's increment
        it = getattr(self.optimizer, "iterations", None)
        return tf.constant(-1, tf.int64) if it is None else tf.cast(tf.convert_to_tensor(it), tf.int64)

    def check_nonfinite_flags(self, flags, where):
        """Return an assert op that raises on this rank if any rank's flag is set (compiled step).

        Args:
            flags: float32 [N], the sum or mean over ranks of :meth:`nonfinite_flags`.
            where: str, the collective that carried them (for the message).

        Raises (when the op runs):
            tf.errors.InvalidArgumentError: some flag > 0; the message starts with
                :data:`NONFINITE_MARK` and names the rank(s), the step and the protocol.
        """
        bad = flags > 0
        msg = tf.strings.format(
            NONFINITE_MARK + ": non-finite values on rank(s) {} at step {} (protocol " + self.display_name
            + "), reported in " + where + "; none was sent, training stops on every rank",
            (tf.reshape(tf.where(bad), [-1]), self._step_index()))
        return tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [msg])

    def check_finite_arrays(self, arrays, what, step):
        """Raise before sending if any of ``arrays`` holds a NaN or inf (eager, point-to-point senders).

        Counts the held-back set in ``nonfinite_dropped`` first. Used by the protocols that send
        parameters or gradients between steps (Hop, NOTIFY-ACK, the parameter-server workers).

        Args:
            arrays: list of NumPy float arrays about to be sent. what: str, what they are (message).
            step: int, the step or iteration they belong to (message).

        Raises:
            NonFiniteError: some element is not finite (the message names the rank, the step, the
                protocol and what was not sent).
        """
        if all(np.isfinite(a).all() for a in arrays):
            return
        self._stats["nonfinite_dropped"].assign_add(1.0)
        raise NonFiniteError(f"{NONFINITE_MARK}: non-finite {what} on rank {world.rank()} at step {step} "
                             f"(protocol {self.display_name}); not sent (nonfinite_dropped="
                             f"{int(self._stats['nonfinite_dropped'].numpy())}), training stops")

    def parameter_drift(self, values, mean, name, active=True):
        """The drift: the largest L2 distance ||x_r - mean|| of a rank's parameters from the mean (eager).

        Every rank calls it with its own flat parameters; ranks with ``active=False`` (e.g. RNA
        ranks that finished) do not count. One :func:`hetsync.transport.allgather_object`.

        Args:
            values, mean: float arrays of the same shape (this rank's parameters, the mean over ranks).
            name: str collective name (the same on every rank). active: bool.

        Returns:
            float, max over active ranks (-1.0 if none is active).
        """
        dist = float(np.linalg.norm(np.asarray(values, np.float64) - np.asarray(mean, np.float64))) if active else -1.0
        return float(max(transport.allgather_object(dist, name=name)))

    def average_at_train_end(self, trainable=True):
        """Average the parameters over all ranks once, eagerly, when training ends.

        w <- (1/N) sum_n w_n, so every rank leaves ``fit`` with the same model (local steps since
        the last synchronization are kept in the average, not discarded). Run by :meth:`stop` on
        every rank when the config has ``average_at_end=True`` (RNA, SelSync, local SGD, FedAvg,
        Hop, NOTIFY-ACK); not counted as a step (LSSR is unchanged) nor delayed by ``netdelay``.
        The model's non-trainable float state (:attr:`state_variables`, BatchNormalization's moving
        statistics) is averaged in the same collective. Records ``final_average`` and
        ``drift_before_final_average`` (:meth:`parameter_drift` of the trainable parameters before
        the average; 0.0 if the ranks were equal) for :meth:`summary_stats`.

        Non-finite guard: a rank whose values are not all finite sends zeros and its flag instead;
        then every rank raises :class:`NonFiniteError` naming the rank(s) and assigns nothing.

        Args:
            trainable: bool; False averages only :attr:`state_variables` (BSP, whose trainable
                parameters are already identical) and records nothing.

        Returns:
            dict ``{"final_average": True, "drift_before_final_average": float}`` (``{}`` with
            ``trainable=False``).

        Raises:
            RuntimeError: the optimizer has no trainable variables (not built).
            NonFiniteError: some rank's parameters or state are not finite (raised on every rank).
        """
        trained = list(getattr(self.optimizer, "_trainable_variables", None) or []) if trainable else []
        if trainable and not trained:
            raise RuntimeError(f"{self.name}: no trainable variables to average at train end (optimizer not built)")
        variables = self._with_state(trained)
        if not variables:
            return {}
        values = [np.asarray(v.numpy()) for v in variables]
        bad = not all(np.isfinite(a).all() for a in values)
        if bad:
            self._stats["nonfinite_dropped"].assign_add(1.0)
            values = [np.zeros_like(a) for a in values]
        flags = np.zeros(world.size(), np.float32)
        flags[world.rank()] = float(bad)
        out = transport.allreduce_mean([tf.constant(a) for a in values] + [tf.constant(flags)],
                                       name=f"hetsync_{self.name}_final_avg" + ("" if trainable else "_state"))
        means, flags = out[:-1], np.asarray(out[-1])
        if (flags > 0).any():
            raise NonFiniteError(
                f"{NONFINITE_MARK}: non-finite parameters on rank(s) {np.flatnonzero(flags > 0).tolist()} at the end of "
                f"training (protocol {self.display_name}, step {int(self._step_index().numpy())}); not sent, no "
                "final average")
        if not trainable:
            for v, m in zip(variables, means):
                v.assign(m)
            return {}
        k = len(trained)
        flat = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in values[:k]])
        flat_mean = np.concatenate([np.ravel(np.asarray(m, np.float64)) for m in means[:k]])
        drift = self.parameter_drift(flat, flat_mean, name=f"hetsync_{self.name}_final_drift")
        for v, m in zip(variables, means):
            v.assign(m)
        self._final = {"final_average": True, "drift_before_final_average": drift}
        return dict(self._final)

    def add_sync_stats(self):
        """Create the per-step statistics every semi-synchronous protocol reports (all float64):

        * ``sync``: 1 if this step synchronized (parameters or gradients crossed the network), else 0;
        * ``sync_steps`` / ``local_steps``: cumulative counts of synchronous / local-only steps;
        * ``lssr``: local-to-synchronous step ratio, local / (local + sync) steps (SelSync eq. 4);
        * ``bytes_sent``: cumulative payload bytes this rank handed to collectives (parameters or
          gradients, plus any flag exchange), not counting the transport's own framing.
        """
        for name in ("sync", "sync_steps", "local_steps", "lssr", "bytes_sent"):
            self.add_stat(name)

    def record_step(self, synced, nbytes):
        """Update the statistics of :meth:`add_sync_stats` inside the compiled step.

        Args:
            synced: bool scalar tensor, whether this step synchronized.
            nbytes: float64 scalar tensor, payload bytes this rank sent this step.

        Returns:
            list of the assign ops (use as control dependencies).
        """
        s = self._stats
        one = tf.cast(synced, tf.float64)
        assigns = [s["sync"].assign(one), s["sync_steps"].assign_add(one), s["local_steps"].assign_add(1.0 - one),
                   s["bytes_sent"].assign_add(tf.cast(nbytes, tf.float64))]
        with tf.control_dependencies(assigns):
            total = s["sync_steps"].read_value() + s["local_steps"].read_value()
            assigns.append(s["lssr"].assign(s["local_steps"].read_value() / tf.maximum(total, 1.0)))
        return assigns

    def sync_summary(self):
        """The end-of-run figures of :meth:`add_sync_stats` (dict of ints and ``lssr``, float)."""
        st = self.step_stats()
        return {"syncs": int(st["syncs"]), "sync_steps": int(st["sync_steps"]), "local_steps": int(st["local_steps"]),
                "lssr": st["lssr"], "bytes_sent": int(st["bytes_sent"])}

    # -- statistics -------------------------------------------------------------------------------
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
        """Return a JSON-serialisable dict of end-of-run statistics (default: ``syncs``, and the
        end-of-training average's figures if it ran)."""
        out = {"syncs": int(self._stats["syncs"].numpy())} if self._stats else {}
        out.update(self._final)
        return self.with_pool_stats(out)

    def with_pool_stats(self, out):
        """Return ``out`` (dict) with ``out["pool"]`` set to :func:`hetsync.data.pool.summary` when this rank
        used the sample pool (``data_plan="pool"``); ``out`` unchanged otherwise. For
        ``summary_stats`` overrides that build their own dict."""
        if getattr(self, "pool", None) is not None:
            from hetsync.data import pool as pool

            out["pool"] = pool.summary(self)
        return out

    def config(self):
        """Return the protocol's configuration as a JSON-serialisable dict (:func:`dataclasses.asdict`
        of :attr:`cfg`; ``{}`` without one): exactly the wrapper's arguments, so the wrapper
        called with them builds an equal protocol (``summary.json``, saved models)."""
        return self.cfg.as_dict() if self.cfg is not None else {}

    # -- called by the wrapper ------------------------------------------------------------------
    def _step(self, grads, variables, local_apply):
        """Inject the scenario's slowdown on the gradients, reset per-step stats, run :meth:`apply`."""
        grads = list(grads)
        present, dense = present_gradients(grads)
        control = tf.convert_to_tensor(controls.step_control())
        delayed, delay_ms, compute_ms = ops.delay(dense, control, name="hetsync_step_delay")
        grads = scatter_gradients(grads, present, delayed)
        emulated = control[3] > 0.0
        target_ms = tf.where(emulated, control[1] * control[3] + control[2], tf.constant(0.0, tf.float64))
        overrun = tf.cast(tf.logical_and(emulated, compute_ms > target_ms), tf.float64)
        self._stats["delay_ms"].assign(delay_ms)
        self._stats["compute_ms"].assign(compute_ms)
        self._stats["emulated_ms"].assign(target_ms)
        self._stats["overrun"].assign(overrun)
        self._stats["overruns"].assign_add(overrun)
        self._stats["sync_wait_ms"].assign(tf.constant(0.0, tf.float64))
        grads = self._guard_gradients(grads)
        try:
            result = self.apply(grads, variables, local_apply)
            if self.nonfinite_in_collective and self._step_bad is not None:
                # a step whose collective did not carry the flag still stops on the bad rank
                with tf.control_dependencies([r for r in tf.nest.flatten(result) if r is not None]):
                    tf.debugging.Assert(tf.logical_not(self._step_bad), [self._nonfinite_message()])
            return result
        finally:
            self._step_bad = self._step_it = None

    def _nonfinite_message(self):
        return tf.strings.format(
            NONFINITE_MARK + ": non-finite gradient on rank " + str(world.rank()) + " at step {} (protocol "
            + self.display_name + "); this step's gradients were not sent (nonfinite_dropped={}), training stops",
            (self._step_index(), tf.cast(self._stats["nonfinite_dropped"].read_value(), tf.int64)))

    def _guard_gradients(self, grads):
        """The non-finite guard of the compiled step, before :meth:`apply` sends anything.

        Not under dynamic loss scaling (the wrapped optimizer is a ``keras.optimizers.LossScaleOptimizer``):
        there an overflowing step is expected, skipped and the scale halved, so the gradients go on
        unchecked. Otherwise it checks every present gradient (one reduce per tensor). If any element is NaN or inf, the
        step's gradients are held back and counted (``nonfinite_dropped`` += 1), then:

        * protocols with :attr:`nonfinite_in_collective`: the gradients are replaced by zeros, the
          step runs and its collective carries this rank's flag (:meth:`nonfinite_flags`); every
          rank then raises (:meth:`check_nonfinite_flags`), naming this rank and the step;
        * the others: the step raises here, before the protocol writes, queues or sends anything.

        Args:
            grads: list of gradient tensors (or None), one per trainable variable.

        Returns:
            the gradients to hand to :meth:`apply` (list, same structure).

        Raises (in the compiled step):
            tf.errors.InvalidArgumentError: a non-finite gradient (the message starts with
                :data:`NONFINITE_MARK` and names the rank, the step and the protocol).
        """
        self._step_bad = self._step_it = None
        if _loss_scaling(self.optimizer):
            # dynamic loss scaling expects overflowing steps: LossScaleOptimizer skips them and halves
            # its scale (under BSP on every rank alike, the average carries the inf); no guard then
            return grads
        self._step_it = tf.identity(self._step_index())
        bad = tf.logical_not(all_finite(grads))
        counted = self._stats["nonfinite_dropped"].assign_add(tf.cast(bad, tf.float64))
        self._step_bad = bad
        present, dense = present_gradients(grads)
        if self.nonfinite_in_collective:
            with tf.control_dependencies([counted]):
                return scatter_gradients(grads, present, self._zeros_if(bad, dense))
        with tf.control_dependencies([counted]):
            check = tf.debugging.Assert(tf.logical_not(bad), [self._nonfinite_message()])
        with tf.control_dependencies([check]):
            return scatter_gradients(grads, present, [tf.identity(g) for g in dense])

    # -- checkpoint and resume ---------------------------------------------------------
    def state(self):
        """Return the protocol's resumable state as a JSON-serialisable dict (checkpoints).

        Default: every statistic variable (:meth:`add_stat`: counters such as ``syncs``,
        ``sync_steps``, ``lssr``, ``bytes_sent``, ``overruns``) and every ``tf.Variable`` attribute
        of the protocol (step counters, EWMA windows, clocks: local SGD's and FedAvg's global step,
        which also fixes FedAvg's random draw; SelSync's window; RNA's and Hop's iteration), as
        ``{"stats": {name: float}, "variables": {attr: {"dtype": str, "value": nested list}}}``.
        Protocols with Python-side state (task allocation's allocation, RNA's controller RNG) add
        it. Read eagerly between steps, by :class:`hetsync.callbacks.checkpoint.BackupAndRestore`.
        """
        variables = {k: {"dtype": v.dtype.name, "value": np.asarray(v.numpy()).tolist()}
                     for k, v in sorted(vars(self).items()) if isinstance(v, tf.Variable)}
        return {"stats": self.step_stats(), "variables": variables}

    def load_state(self, state):
        """Restore :meth:`state`'s dict (eagerly, before the first step of a resumed fit).

        Args:
            state: dict from :meth:`state` of the same protocol and configuration.

        Raises:
            ValueError: a statistic or variable in ``state`` that this protocol does not have, or of
                another shape (the message names it).
        """
        for name, value in state.get("stats", {}).items():
            if name not in self._stats:
                raise ValueError(f"{self.name}: the saved state has a statistic {name!r} this protocol does not have")
            self._stats[name].assign(float(value))
        for attr, saved in state.get("variables", {}).items():
            var = getattr(self, attr, None)
            if not isinstance(var, tf.Variable):
                raise ValueError(f"{self.name}: the saved state has a variable {attr!r} this protocol does not have")
            value = np.asarray(saved["value"], dtype=saved["dtype"])
            if tuple(value.shape) != tuple(var.shape):
                raise ValueError(f"{self.name}: saved variable {attr!r} has shape {value.shape}, the protocol's "
                                 f"{tuple(var.shape)}")
            var.assign(value)
