"""Data: data sets, per-rank shards and samplers, the sample pool, and data plans.

* :mod:`hetsync.data.datasets`: scikit-learn's digits and MNIST-format (IDX) files, ``shard``;
* :mod:`hetsync.data.shards`: samplers and Keras datasets over a rank's share;
* :mod:`hetsync.data.pool`: the epoch's sample pool (faster ranks take more batches);
* :mod:`hetsync.data.plan`: data plans as values (:class:`hetsync.data.plan.DataPlan`, the shard, server and ``tf.data`` plans).

The names below are the public face (``hetsync.data.load(...)``).
"""
from hetsync.data.datasets import (DATASETS, Dataset, load, load_digits, load_idx_folder, read_idx, shard,
                                   shard_dataset)
from hetsync.errors import DataError

__all__ = ["DATASETS", "Dataset", "DataError", "load", "load_digits", "load_idx_folder", "read_idx", "shard",
           "shard_dataset"]
