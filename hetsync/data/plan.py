"""Data plans as values: what one rank trains on, and the figures its protocol needs to know.

A data plan decides which samples a rank trains on each epoch. The functions here compute one and
return a :class:`DataPlan`; they write into no protocol. The protocol adopts the plan's figures
(:meth:`hetsync.core.dataplans.DataPlans.adopt`: batch size b, samples per epoch, the sample pool's
client and server) and the user hands the plan to ``model.fit``: a plan is a mapping of
``model.fit`` keyword arguments, so ``model.fit(**plan)`` works as with the dicts of earlier releases.

* :func:`shard_plan`: a disjoint, equally long shard per worker rank, reshuffled every epoch, full
  batches only (DefDP; BSP's and most protocols' default).
* :func:`server_plan`: a parameter-server rank's single batch (it trains on nothing).
* :func:`dataset_plan`: a user's ``tf.data`` pipeline, batched with equal steps per epoch.
* :func:`hetsync.data.pool.plan`: the epoch's sample pool (work conservation; RNA's default).
"""
import collections.abc
import dataclasses

import numpy as np

__all__ = ["DataPlan", "shard_plan", "server_plan", "dataset_plan", "check_batch_size"]


@dataclasses.dataclass(frozen=True)
class DataPlan(collections.abc.MutableMapping):
    """One rank's data plan: ``model.fit`` arguments and the figures the protocol adopts.

    A mapping over :attr:`fit_args`, so ``model.fit(**plan)`` and ``plan["x"]`` work; a script may
    change a ``model.fit`` argument as in a dict (``plan["steps_per_epoch"] = 1``), the figures the
    protocol adopted stay as planned.

    Attributes:
        fit_args: dict of ``model.fit`` keyword arguments (``x``, and ``y``, ``batch_size``,
            ``steps_per_epoch``, ``shuffle`` as the plan needs).
        batch_size: int b, samples per rank per step (the emulated device's reference), or None.
        samples_per_epoch: int samples this rank processes per epoch (0 on a parameter-server rank;
            on the sample pool it is known per epoch, :attr:`pool` reports it), or None.
        pool: the sample pool's :class:`hetsync.data.pool.PoolClient`, or None.
        pool_server: the :class:`hetsync.data.pool.PoolServer` on the rank that serves the pool, or None.
    """

    fit_args: dict
    batch_size: int = None
    samples_per_epoch: int = None
    pool: object = None
    pool_server: object = None

    def __getitem__(self, key):
        return self.fit_args[key]

    def __setitem__(self, key, value):
        self.fit_args[key] = value

    def __delitem__(self, key):
        del self.fit_args[key]

    def __iter__(self):
        return iter(self.fit_args)

    def __len__(self):
        return len(self.fit_args)


def check_batch_size(batch_size, name, upper=None):
    """Return ``batch_size`` as an int after checking it.

    Args:
        batch_size: the value to check (int samples per rank per step).
        name: str prefix of the message (the protocol's name).
        upper: int or None, the largest allowed value.

    Raises:
        ValueError: not an int (bools refused) or outside [1, upper]; the message names the value.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1 \
            or (upper is not None and batch_size > upper):
        allowed = ">= 1" if upper is None else f"in [1, {upper}]"
        raise ValueError(f"{name}: batch_size must be an int {allowed} (samples per rank per step), got {batch_size!r}")
    return int(batch_size)


def shard_plan(x, y, batch_size, rank, num_workers, seed=0):
    """Worker ``rank``'s fixed shard, reshuffled every epoch, in full batches only (DefDP).

    A disjoint, equally long shard per worker (:func:`hetsync.data.datasets.shard`), drawn by a
    :class:`hetsync.data.shards.LocalSampler`: each epoch is floor(shard / b) steps and the partial
    last batch is left out (a different remainder every epoch, so no sample is left out for good).

    Args:
        x: array [N, ...] (all training inputs). y: int array [N]. batch_size: int b >= 1 samples.
        rank: int worker rank in [0, num_workers). num_workers: int >= 1. seed: int.

    Returns:
        :class:`DataPlan` with ``x`` (a ``keras.utils.PyDataset``), ``steps_per_epoch``,
        ``shuffle=False``; ``samples_per_epoch`` = steps x b.

    Raises:
        ValueError: ``batch_size`` larger than the shard (from the sampler).
    """
    from hetsync.data import datasets, shards

    b = int(batch_size)
    xs, ys = datasets.shard(x, y, rank, num_workers, seed=seed)
    sampler = shards.LocalSampler(np.arange(len(xs)), b, seed=seed, rank=rank)
    return DataPlan({"x": shards.BatchDataset(xs, ys, sampler), "steps_per_epoch": sampler.steps_per_pass,
                     "shuffle": False}, batch_size=b, samples_per_epoch=sampler.steps_per_pass * b)


def server_plan(x, y, batch_size):
    """A parameter-server rank's plan: one batch of ``x``, one step (the server trains on nothing;
    its ``fit`` serves until every worker finished).

    Args:
        x: array [N, ...]. y: int array [N]. batch_size: int >= 1 samples (clipped to N).

    Returns:
        :class:`DataPlan` (``steps_per_epoch=1``, ``samples_per_epoch=0``).
    """
    from hetsync.data import shards

    b = max(1, min(int(batch_size), len(x)))
    sampler = shards.LocalSampler(np.arange(b), b)
    return DataPlan({"x": shards.BatchDataset(x[:b], y[:b], sampler), "steps_per_epoch": 1, "shuffle": False},
                    batch_size=int(batch_size), samples_per_epoch=0)


def dataset_plan(dataset, batch_size, steps_per_epoch, server=False):
    """A rank's part of a user's ``tf.data`` pipeline: batched, the partial last batch dropped, repeated.

    Args:
        dataset: ``tf.data.Dataset`` of single (unbatched) examples, this rank's share.
        batch_size: int b >= 1 samples per step. steps_per_epoch: int >= 1 (the same on every worker).
        server: bool, a parameter-server rank (one batch, one step, ``samples_per_epoch=0``).

    Returns:
        :class:`DataPlan` with a batched ``tf.data.Dataset``, ``steps_per_epoch``, ``shuffle=False``.
    """
    import tensorflow as tf

    b = int(batch_size)
    if server:
        ds = dataset.take(1).repeat(b).batch(b, drop_remainder=True)
        return DataPlan({"x": ds, "steps_per_epoch": 1, "shuffle": False}, batch_size=b, samples_per_epoch=0)
    ds = dataset.repeat().batch(b, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return DataPlan({"x": ds, "steps_per_epoch": int(steps_per_epoch), "shuffle": False}, batch_size=b,
                    samples_per_epoch=int(steps_per_epoch) * b)
