"""Task allocation's data plan: every rank's batches follow its share w_i of each round.

The data side of :class:`hetsync.protocols.taskalloc.protocol.TaskAllocationProtocol` (a mixin, so the
protocol's data hooks stay its own methods): the per-epoch plans of rounds (:func:`plan_rounds`), the
batches of arrays (:class:`AllocatedData`) or of a user's ``tf.data`` pipeline, each step's sample
count m_i, and the waiting of Keras' prefetching thread for a plan that the epoch's exchange has not
set yet (task allocation paper, section III: per-rank workloads w_i of C micro-batches per round).
"""
import logging

import numpy as np
import tensorflow as tf

from hetsync import transport, world
from hetsync.data import shards as partition
from hetsync.core import checks as _checks
from hetsync.data.plan import DataPlan
from hetsync.protocols.taskalloc.allocation import default_micro_batch, epoch_indices, plan_rounds, round_allocation

log = logging.getLogger("hetsync")

#: adaptive mode without ``weights`` or ``total``: the allocation unit is this many samples (C = n b / unit),
#: so eq. (10) can express any speed ratio down to single samples (with C = 8 n, ``speeds:1,1,1,0.5``
#: rounds to [9, 9, 9, 5] and the slow rank's extra micro-batch caps E at 0.91).
ADAPTIVE_DEFAULT_UNIT = 1


__all__ = ["AllocatedData", "AllocationDataPlan", "ADAPTIVE_DEFAULT_UNIT"]


class AllocatedData(partition.BatchDataset):
    """This rank's batches under the current allocation: item t = its samples of round t mod R
    of epoch t // R (:meth:`TaskAllocationProtocol.step_indices`).

    Infinite (``model.fit`` gets ``steps_per_epoch = R``; R, the rounds per epoch, is the same on
    every rank and in every epoch), so Keras does not restart the data pipeline at every epoch: a
    restart of a finite ``PyDataset`` cost 20-600 ms per epoch on 2 ranks, as much as several
    steps. Keras prefetches items ahead, possibly of the next epoch, whose allocation is only known
    after the epoch's exchange; such a request waits (in the prefetching thread, not the training
    loop) until :meth:`TaskAllocationProtocol.begin_epoch` has set that epoch's plan.

    Args:
        x: array [N, ...]. y: array [N]. protocol: the owning :class:`TaskAllocationProtocol`.
    """

    def __init__(self, x, y, protocol):
        super().__init__(x, y, protocol.step_indices)
        self.protocol = protocol


class AllocationDataPlan:
    """The data-plan side of :class:`hetsync.protocols.taskalloc.protocol.TaskAllocationProtocol` (a mixin)."""

    def fit_data(self, x, y, batch_size, seed=0):
        """Return ``model.fit`` data kwargs: a :class:`AllocatedData` of this rank's rounds.

        ``batch_size`` is the run's per-rank batch size b, as for BSP. The micro-batch size is the
        ``micro_batch`` argument if given (global batch C x micro_batch samples per round), else
        :func:`default_micro_batch` ``(n, b, C)`` = n b / C rounded (at least 1): the global batch
        is BSP's, n x b samples, exactly when C divides n b and C x micro_batch (close to n b)
        otherwise. Sets :attr:`batch_size`, :attr:`micro_batch` and :attr:`samples_per_epoch`.

        Args:
            x: array [N, ...], the full training set (every rank passes the same one). y: int
                array [N]. batch_size: int b >= 1, samples per rank per step as in BSP (the
                reference of the emulated device, ``device:MS`` = MS ms per b samples). seed: int,
                seeds the per-epoch permutation.

        Returns:
            the adopted :class:`hetsync.data.plan.DataPlan` ``{"x": AllocatedData, "steps_per_epoch": R,
            "shuffle": False}`` (the data set shuffles per epoch itself; R rounds per epoch).

        Raises:
            ValueError: ``batch_size`` not a positive int, ``x`` and ``y`` of different lengths,
                or fewer samples than ranks.
        """
        b = _checks.check_int("TaskAllocation", "batch_size", batch_size, ge=1,
                              unit="samples per rank per step, as for BSP")
        if len(x) != len(y):
            raise ValueError(f"TaskAllocation.fit_data: x has {len(x)} samples but y has {len(y)}")
        self._set_batch(b)
        self.seed, self.n_samples = int(seed), len(x)
        self._stream = None
        self._data = AllocatedData(x, y, self)
        self._plan(0, reset=True)
        return self.adopt(DataPlan({"x": self._data, "steps_per_epoch": self.rounds, "shuffle": False},
                                   batch_size=self.batch_size, samples_per_epoch=self.samples_per_epoch))

    def _set_batch(self, b):
        """Set C (adaptive default), :attr:`batch_size` and :attr:`micro_batch` for the run's per-rank batch b."""
        n = world.size()
        if self._auto_total:
            unit = self.cfg.micro_batch if self.cfg.micro_batch is not None else ADAPTIVE_DEFAULT_UNIT
            total = max(n, (n * b) // unit)
            if total != self.total:  # first fit (or a new batch size): equal shares of the new C
                self.total = int(total)
                self.weights = round_allocation([total / n] * n, total)
                self._stats["w"].assign(float(self.weights[world.rank()]))
        mb = self.cfg.micro_batch if self.cfg.micro_batch is not None else default_micro_batch(n, b, self.total)
        self.batch_size, self.micro_batch = b, mb
        if self.cfg.micro_batch is None and self.global_batch != n * b and world.rank() == 0:
            log.info("taskalloc: C=%d micro-batches do not divide BSP's global batch %d x %d = %d samples; "
                     "micro-batch %d samples, global batch %d samples per round", self.total, n, b, n * b, mb,
                     self.global_batch)

    def fit_dataset(self, dataset, batch_size, steps_per_epoch=None):
        """Return ``model.fit`` data kwargs that batch a user's per-rank ``tf.data`` pipeline by w_i.

        ``dataset`` is this rank's *unbatched* data (e.g. ``ds.shard(hetsync.size(), hetsync.rank())``).
        Each step (one round) this rank takes the next w_i micro-batches of :attr:`micro_batch`
        samples from it, w_i x micro_batch samples as one batch, where w_i is the allocation of the
        step's epoch: under ``adaptive`` a new w from the exchange at an epoch's end applies from
        the next epoch's first batch on. The batches come from a Python generator
        (``tf.data.Dataset.from_generator``) over the user's dataset cut into micro-batches
        (``dataset.repeat().batch(micro_batch, drop_remainder=True)``); a request for a batch of an
        epoch whose allocation is not set yet (Keras prefetches ahead) waits for it, as
        :class:`AllocatedData` does, at most ``data_timeout_s``.

        Data: the user's dataset is repeated, so a rank with a larger share simply goes through its
        own data faster (unlike :meth:`fit_data`, which reshards the whole training set by w_i every
        epoch so each sample is used once per epoch). Rounds per epoch R: ``steps_per_epoch`` if
        given, else floor(sum over ranks of the dataset lengths / global batch) (one allgather).
        Requirements (checked): ``steps_per_execution=1`` (as for every task-allocation run),
        elements whose first dimension can be concatenated (tensors, or tuples/dicts of tensors).

        Args:
            dataset: ``tf.data.Dataset`` of single examples (this rank's share).
            batch_size: int b >= 1, the run's per-rank batch size in samples, as for BSP and
                :meth:`fit_data` (sets C and the micro-batch the same way).
            steps_per_epoch: int R >= 1 (rounds per epoch, the same on every rank), or None.

        Returns:
            ``{"x": tf.data.Dataset, "steps_per_epoch": R, "shuffle": False}`` (infinite; Keras keeps one iterator
            for the whole fit).

        Raises:
            TypeError: ``dataset`` not a ``tf.data.Dataset``.
            ValueError: bad ``batch_size`` or ``steps_per_epoch``; unknown length without
                ``steps_per_epoch``; fewer samples than one global batch; ranks passing different
                ``steps_per_epoch``.
        """
        b = self._check_fit_dataset(dataset, batch_size, steps_per_epoch)
        self._set_batch(b)
        if steps_per_epoch is None:
            per_rank = self._cardinalities(dataset)
            rounds = sum(per_rank) // self.global_batch
            if rounds < 1:
                raise ValueError(f"TaskAllocation: fit_dataset: {sum(per_rank)} samples over all ranks (per rank "
                                 f"{per_rank}) are fewer than one round's global batch of {self.global_batch}")
        else:
            rounds = int(steps_per_epoch)
            agreed = transport.allgather_object(rounds, name="hetsync_taskalloc_stream_rounds")
            if len(set(agreed)) != 1:
                raise ValueError(f"TaskAllocation: fit_dataset: the ranks passed different steps_per_epoch {agreed}")
        self.seed, self.n_samples = 0, rounds * self.global_batch
        self._stream = {"rounds": rounds, "yielded": []}
        self._data = None
        self._plan(0, reset=True)
        mb = self.micro_batch
        micro = dataset.repeat().batch(mb, drop_remainder=True)
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec([None] + list(t.shape[1:]), t.dtype), micro.element_spec)
        stream = self._stream

        def batches():
            it = iter(micro)
            t = 0
            while True:
                m = self.stream_samples(t)
                if m is None:  # the fit ended: stop the pipeline
                    return
                parts = [next(it) for _ in range(max(1, m // mb))]
                stream["yielded"].append(m)
                yield tf.nest.map_structure(lambda *xs: tf.concat(xs, 0).numpy(), *parts)
                t += 1

        ds = tf.data.Dataset.from_generator(batches, output_signature=spec)
        return self.adopt(DataPlan({"x": ds.prefetch(1), "steps_per_epoch": rounds, "shuffle": False},
                                   batch_size=self.batch_size, samples_per_epoch=self.samples_per_epoch))

    def stream_samples(self, t):
        """Samples of this rank at global step ``t`` of a :meth:`fit_dataset` run (int w_i x
        micro_batch of step t's epoch), waiting for that epoch's allocation; None once the fit ended.

        Raises:
            RuntimeError: the epoch's allocation did not come within ``data_timeout_s`` seconds.
        """
        with self._plan_cv:
            rounds = self.rounds
        epoch, r = divmod(int(t), rounds)
        count = self.indices_for(epoch, r)
        return None if count is None else int(count)

    def _plan(self, epoch, reset=False):
        """Plan ``epoch`` under the current weights: computed first, then published atomically under
        ``_plan_cv`` (Keras' prefetching thread reads the plans while holding it).

        With ``probe_rounds`` K (the first epoch of the first fit): rounds 0 .. K-1 are published now and
        the rest of the epoch only when :meth:`_plan_rest` has the probe's allocation (requests for those
        rounds wait, as for an epoch not planned yet). A run resumed inside the probe's epoch, after the
        probe, plans that epoch as it ran: its first K rounds under the allocation before the probe, the
        rest under the current one.
        """
        counts = self._round_counts(self.weights)
        limit = None
        probe = self._probe
        if probe is not None and probe["epoch"] == epoch and not self.history:  # resumed inside the probe's epoch
            counts = self._split_counts(probe["w"], probe["rounds"])
        elif self._probe_due(epoch, len(counts)):
            limit = int(self.cfg.probe_rounds)
        self._publish(epoch, counts, limit, keep=None if reset else epoch - 1)

    def _publish(self, epoch, counts, limit=None, keep=-1):
        """Make ``counts`` (int64 [R, n]) the plan of ``epoch`` under ``_plan_cv`` and wake waiting requests:
        rounds from ``limit`` on stay unpublished (None: all published); the plans of epochs from ``keep`` on
        are kept (None: none)."""
        indices = counts if self._stream is not None else epoch_indices(self.n_samples, counts, epoch, self.seed)
        mine = int(counts[:, world.rank()].sum())
        with self._plan_cv:
            self.counts, self.rounds, self.epoch, self._indices = counts, len(counts), epoch, indices
            self.samples_per_epoch = mine
            self._plans = {} if keep is None else {e: p for e, p in self._plans.items() if e >= keep}
            self._plans[epoch] = indices
            self._ready = {epoch: limit} if limit is not None else {}
            self._plan_cv.notify_all()

    def _round_counts(self, weights):
        """int64 [R, n]: samples of each rank in each round of an epoch under ``weights``."""
        if self._stream is not None:  # fit_dataset: every round w_i micro-batches; the plan is the counts
            return np.tile(np.asarray(weights, np.int64) * int(self.micro_batch), (self._stream["rounds"], 1))
        return plan_rounds(self.n_samples, self.micro_batch, weights)

    def _split_counts(self, head_weights, k):
        """int64 [R, n]: the first ``k`` rounds under ``head_weights``, the others under the current
        weights; R and every round's size are those of an epoch under one allocation (the allocations
        share C, and the first k rounds are full)."""
        head = self._round_counts(head_weights)[:k]
        if self._stream is not None:
            tail = self._round_counts(self.weights)[k:]
        else:
            tail = plan_rounds(self.n_samples - int(head.sum()), self.micro_batch, self.weights)
        counts = np.concatenate([head, tail]).astype(np.int64)
        assert counts.sum(axis=1).tolist() == self._round_counts(self.weights).sum(axis=1).tolist(), counts
        return counts

    def _plan_rest(self, epoch, head_weights):
        """Publish the rest of ``epoch`` after the probe: its first ``probe_rounds`` rounds stay as they
        were served (``head_weights``), the others follow the current weights; waiting requests go on."""
        self._publish(epoch, self._split_counts(head_weights, int(self.cfg.probe_rounds)), keep=epoch)

    def step_samples(self, batch):
        """Samples this rank trains on in step ``batch`` of the current epoch: its share of round
        ``batch``, ``counts[batch, rank]`` (w_i x :attr:`micro_batch` in a full round, fewer in the
        last, partial one).

        This is what the emulated device (a scenario ``device:MS``, which charges MS milliseconds
        per :attr:`batch_size` samples) uses to cost the step, read by
        :class:`hetsync.callbacks.Slowdown` before the step starts; the protocol's own hook
        feeds it to the compiled step as m_i.

        Args:
            batch: int >= 0, the step's index within the current epoch (Keras' ``batch``).

        Returns:
            int samples (0 for a step past the epoch's rounds), or None before :meth:`fit_data`.
        """
        with self._plan_cv:
            counts, rounds = self.counts, self.rounds
        if counts is None:
            return None
        return int(counts[batch, world.rank()]) if batch < rounds else 0

    def indices_of_round(self, r):
        """Sample indices (int64 array) of this rank in round ``r`` of the current epoch."""
        return self._indices[r][world.rank()]

    def indices_for(self, epoch, r):
        """Sample indices (int64 array) of this rank in round ``r`` of ``epoch``, waiting for its plan.

        Called from Keras' prefetching thread. A request for an epoch not planned yet waits until
        :meth:`begin_epoch` plans it, and one for a round after the first epoch's probe rounds until the
        probe's allocation is set (``probe_rounds``), at most :attr:`data_timeout_s` seconds.

        Returns:
            int64 array, or None once training has ended (a request from a finished pipeline).

        Raises:
            RuntimeError: the epoch's plan did not come within ``data_timeout_s`` seconds.
        """
        def planned():
            return epoch in self._plans and r < (self._ready.get(epoch) or r + 1)

        with self._plan_cv:
            self._plan_cv.wait_for(lambda: planned() or self._closed, self.data_timeout_s)
            if planned():
                return self._plans[epoch][r][world.rank()]
            if self._closed:
                return None
        raise RuntimeError(f"TaskAllocation: rank {world.rank()}: the data of round {r} of epoch {epoch} was requested "
                           f"but its allocation was not set within data_timeout_s={self.data_timeout_s:g} s (the "
                           "exchange of the previous epoch, or of the first epoch's probe rounds, did not finish)")

    def step_indices(self, t):
        """Sample indices (int64 array) of this rank at global step ``t`` (int >= 0): round t mod R of
        epoch t // R, waiting for that epoch's plan (:meth:`indices_for`); one sample after the fit
        has ended (a request from a finished pipeline, never trained on).

        Raises:
            RuntimeError: the epoch's plan did not come within ``data_timeout_s`` seconds.
        """
        with self._plan_cv:
            rounds = self.rounds
        epoch, r = divmod(int(t), rounds)
        idx = self.indices_for(epoch, r)
        return np.arange(1) if idx is None else idx

    def begin_fit(self):
        """Serve data requests for future epochs by waiting for their plans (called at train begin)."""
        with self._plan_cv:
            self._closed = False

    def end_fit(self):
        """Training ended: release waiting data requests and re-plan epoch 0 for a later ``fit``."""
        with self._plan_cv:
            self._closed = True
            self._plan_cv.notify_all()
        if self._data is not None or self._stream is not None:
            self._plan(0, reset=True)
