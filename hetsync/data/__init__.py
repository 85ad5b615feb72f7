"""Data: data sets, per-rank shards and samplers, the sample pool, and data plans.

* :mod:`hetsync.data.datasets`: scikit-learn's digits and MNIST-format (IDX) files, ``shard``;
* :mod:`hetsync.data.shards`: samplers and Keras datasets over a rank's share;
* :mod:`hetsync.data.pool`: the epoch's sample pool (faster ranks take more batches);
* :mod:`hetsync.data.plan`: data plans as values (:class:`hetsync.data.plan.DataPlan`, the shard, server and ``tf.data`` plans).

The names below are the public face (``hetsync.data.load(...)``).
"""
from hetsync.data.datasets import (DATASETS, Dataset, load, load_digits, load_idx_folder, read_idx, shard,
                                   shard_dataset)
import os

from hetsync.errors import DataError

__all__ = ["DATASETS", "Dataset", "DataError", "load", "load_digits", "load_idx_folder", "read_idx", "shard",
           "shard_dataset", "DATA_DIR_ENV", "data_dir"]

#: the environment variable naming the folder of MNIST's IDX files (the jobs' default ``--data-dir``).
DATA_DIR_ENV = "HETSYNC_DATA_DIR"


def data_dir():
    """Return the data folder the environment names (:data:`DATA_DIR_ENV`), or None if it is unset or empty.

    Data location is a setting (``--data-dir`` or this variable), never a path inside a checkout, so an
    installed ``hetsync-bench`` or job runs from any directory.

    Returns:
        str folder path (not checked to exist: the loader names a missing folder), or None.
    """
    return os.environ.get(DATA_DIR_ENV) or None
