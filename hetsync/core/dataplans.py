"""A protocol's data plan: what each rank trains on, as ``model.fit`` arguments.

The default plans (fixed equal shards, the sample pool, a user's ``tf.data`` pipeline, a
parameter-server rank's single batch) come from :mod:`hetsync.data.plan` as
:class:`hetsync.data.plan.DataPlan` values; the protocol adopts a plan's figures (batch size b,
samples per epoch, the pool's client and server) and hands its ``model.fit`` arguments to the user.
Protocols with their own data order or per-rank workloads (task allocation, SelSync's data
injection) override the hooks. A mixin of :class:`hetsync.core.protocol.Protocol`.
"""
import numpy as np
import tensorflow as tf

from hetsync import transport, world


class DataPlans:
    """The data-plan hooks of :class:`hetsync.core.protocol.Protocol` (a mixin; see the module docstring)."""

    #: the run's per-rank batch size b (int samples), from the adopted plan: the reference of the
    #: emulated device (``device:MS`` costs MS milliseconds per b samples). None if unknown.
    batch_size = None
    #: the sample pool's client and server (:mod:`hetsync.data.pool`), from a plan with ``data_plan="pool"``.
    pool = pool_server = None
    _samples_per_epoch = None

    @property
    def samples_per_epoch(self):
        """Samples this rank processes per epoch (int, or None if no plan was adopted); on the
        sample pool, the samples it drew in the epoch that ended last. Read by SyncMetrics."""
        if self.pool is not None:
            return self.pool.samples_last_epoch
        return self._samples_per_epoch

    @samples_per_epoch.setter
    def samples_per_epoch(self, value):
        self._samples_per_epoch = value

    def adopt(self, plan):
        """Take a data plan's figures as this protocol's and return the plan.

        Sets :attr:`batch_size`, :attr:`samples_per_epoch`, :attr:`pool` and :attr:`pool_server`
        from ``plan``; a pool server of an earlier plan is closed first (a second ``fit_data``
        replaces the pool).

        Args:
            plan: a :class:`hetsync.data.plan.DataPlan`.

        Returns:
            ``plan`` (hand it to ``model.fit(**plan)``).

        Raises:
            TypeError: ``plan`` is not a DataPlan.
        """
        from hetsync.data.plan import DataPlan

        if not isinstance(plan, DataPlan):
            raise TypeError(f"{self.name}: adopt takes a hetsync.data.plan.DataPlan, got {type(plan).__name__}")
        if self.pool_server is not None and self.pool_server is not plan.pool_server:
            self.pool_server.close()
        self.batch_size = plan.batch_size
        self.samples_per_epoch = plan.samples_per_epoch
        self.pool, self.pool_server = plan.pool, plan.pool_server
        return plan

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
        draws its batches from the epoch's sample pool instead (:func:`hetsync.data.pool.plan`:
        faster ranks take more batches, every sample once per epoch, no ``steps_per_epoch``).

        Args:
            x: array [N, ...] (all training inputs). y: int array [N]. batch_size: int samples per
            rank per step, at most the shard size. seed: int.

        Returns:
            the adopted :class:`hetsync.data.plan.DataPlan`, a mapping of ``model.fit`` keyword
            arguments: ``x`` (a ``keras.utils.PyDataset``), ``steps_per_epoch`` and ``shuffle=False``
            (the sampler shuffles); ``model.fit(**plan)``.

        Raises:
            ValueError: ``batch_size`` not an int in [1, shard size], or no worker left (servers >= ranks).
            RuntimeError: ``data_plan="pool"`` under ``horovodrun --gloo`` (the pool needs MPI
                point-to-point; the message names ``data_plan='shard'``).
        """
        from hetsync.data import plan

        plan.check_batch_size(batch_size, self.name)
        self.check_roles()
        use_pool = getattr(self.cfg, "data_plan", "shard") == "pool"  # work conservation: hetsync.data.pool
        if use_pool:
            world.require_mpi(f"{self.display_name} with data_plan='pool' (the sample pool; pass "
                                "data_plan='shard' for fixed per-rank shares under Gloo)")
            transport.dispatcher()  # collective on first use: servers too
        if self.roles.is_server:
            return self.server_fit_data(x, y, batch_size)
        if use_pool:  # served by worker 0 (rank 0) to the workers 0 .. n - 1
            from hetsync.data import pool

            return self.adopt(pool.plan(x, y, batch_size, seed=seed, server=0, ranks=range(self.roles.num_workers),
                                        timeout_s=getattr(self.cfg, "timeout_s", pool.DEFAULT_TIMEOUT_S),
                                        name=self.name))
        return self.adopt(plan.shard_plan(x, y, batch_size, self.roles.worker_rank, self.roles.num_workers, seed=seed))

    def server_fit_data(self, x, y, batch_size):
        """``model.fit`` arguments on a parameter-server rank: one batch of ``x`` (the server trains on
        nothing: its ``fit`` serves until every worker finished, then stops after one step that
        changes no weight). Sets :attr:`samples_per_epoch` to 0.

        Args:
            x: array [N, ...]. y: int array [N]. batch_size: int >= 1 samples (clipped to N).

        Returns:
            the adopted :class:`hetsync.data.plan.DataPlan` (``x``, ``steps_per_epoch=1``, ``shuffle=False``).
        """
        from hetsync.data import plan

        return self.adopt(plan.server_plan(x, y, batch_size))

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
            the adopted :class:`hetsync.data.plan.DataPlan`, a mapping of ``model.fit`` keyword
            arguments: ``x`` (a batched, repeated ``tf.data.Dataset``),
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
        from hetsync.data import plan

        return self.adopt(plan.dataset_plan(dataset, b, steps_per_epoch, server=self.roles.is_server))

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
