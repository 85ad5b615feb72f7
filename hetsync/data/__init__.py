"""Data: data sets, per-rank shards and samplers, the sample pool, and data plans.

* :mod:`hetsync.data.datasets`: scikit-learn's digits and MNIST-format (IDX) files, ``shard``;
* :mod:`hetsync.data.shards`: samplers and Keras datasets over a rank's share;
* :mod:`hetsync.data.pool`: the epoch's sample pool (faster ranks take more batches);
* :mod:`hetsync.data.plan`: data plans as values (:class:`hetsync.data.plan.DataPlan`, the shard, server and ``tf.data`` plans).

The names below are the public face (``hetsync.data.load(...)``).
"""
import os

from hetsync.data.datasets import (DATASETS, Dataset, load, load_digits, load_idx_folder, read_idx, shard,
                                   shard_dataset)
from hetsync.errors import DataError

__all__ = ["DATASETS", "Dataset", "DataError", "load", "load_digits", "load_idx_folder", "read_idx", "shard",
           "shard_dataset", "DATA_DIR_ENV", "data_dir"]

#: the environment variable naming the folder of MNIST's IDX files (the jobs' default ``--data-dir``).
DATA_DIR_ENV = "HETSYNC_DATA_DIR"


def data_dir():
    """Return the folder of MNIST's IDX files that the environment names (:data:`DATA_DIR_ENV`), or None.

    The data location is a setting (a job's ``--data-dir``, ``hetsync-bench --data-dir`` or this
    variable), never a path relative to a checkout, so an installed job or ``hetsync-bench`` runs from
    any working directory. The training job's ``--data-dir`` defaults to this value.

    Args:
        none; reads the environment variable ``HETSYNC_DATA_DIR`` of this process.

    Returns:
        str, the folder path as given (absolute or relative to the working directory; not checked to
        exist: :func:`load` names a missing folder), or None when the variable is unset or empty.

    Raises:
        nothing.
    """
    return os.environ.get(DATA_DIR_ENV) or None
