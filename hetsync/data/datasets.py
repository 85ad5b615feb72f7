"""Data sets for examples, tests and benchmarks: embedded ``digits`` and MNIST-format IDX files.

* ``digits``: scikit-learn's real handwritten digits (1,797 images of 8 x 8, 10 classes), shipped
  with scikit-learn, so it works offline.
* ``mnist-idx``: any MNIST-format IDX pair (``*-images-idx3-ubyte[.gz]`` and
  ``*-labels-idx1-ubyte[.gz]``) in a folder, e.g. the MNIST test set (``t10k-images-idx3-ubyte.gz``, ``t10k-labels-idx1-ubyte.gz``).

Both give float32 images scaled to [0, 1] with a channel axis ([N, H, W, 1]) and int64 labels,
split into train and test with a stratified, seeded split; :func:`shard` gives each rank a
disjoint, equally long part of the training set, :func:`shard_dataset` a worker's part of a user's
``tf.data`` pipeline.
"""
import dataclasses
import glob
import gzip
import os

import numpy as np
from hetsync.errors import DataError

__all__ = ["Dataset", "load", "load_digits", "load_idx_folder", "read_idx", "shard", "shard_dataset", "DataError",
           "DATASETS"]

DATASETS = ("digits", "mnist-idx")


@dataclasses.dataclass
class Dataset:
    """A train/test split.

    Attributes:
        name: str. x_train, x_test: float32 arrays [N, H, W, 1] in [0, 1].
        y_train, y_test: int64 arrays [N]. num_classes: int.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self):
        """Shape of one example, e.g. (8, 8, 1)."""
        return tuple(self.x_train.shape[1:])


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path):
    """Read one IDX file (optionally gzip-compressed) into a numpy array.

    Format: 2 zero bytes, a type byte (0x08 uint8 ... 0x0E float64), a byte with the number of
    dimensions d, d big-endian uint32 sizes, then the data in C order.

    Args:
        path: str, file path (``.gz`` is decompressed).

    Returns:
        numpy array of the file's shape and dtype.

    Raises:
        DataError: missing file, bad gzip stream, bad magic number, unknown type code, or a data
            section whose length does not match the header (the message names the file).
    """
    if not os.path.isfile(path):
        raise DataError(f"IDX file not found: {path}")
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path} is not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise DataError(f"{path}: unknown IDX type code 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"{path}: header says shape {shape} ({expected} bytes of data) "
                        f"but the file holds {len(raw) - header} bytes")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def _find(folder, kind):
    hits = sorted(glob.glob(os.path.join(folder, f"*{kind}-idx*-ubyte*")))
    if not hits:
        raise DataError(f"no *{kind}-idx*-ubyte[.gz] file in {folder}")
    return hits[0]


def load_idx_folder(folder):
    """Read an MNIST-format image/label pair from ``folder``.

    Returns:
        ``(x, y)``: float32 [N, H, W, 1] in [0, 1] and int64 [N].

    Raises:
        DataError: folder or files missing or corrupt, or image and label counts differ.
    """
    if not os.path.isdir(folder):
        raise DataError(f"data folder not found: {folder}")
    images_path, labels_path = _find(folder, "images"), _find(folder, "labels")
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3:
        raise DataError(f"{images_path}: expected images of shape [N, H, W], got {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"{labels_path}: {labels.shape[0] if labels.ndim else 0} labels for {len(images)} images in {images_path}")
    x = (images.astype(np.float32) / 255.0)[..., None]
    return x, labels.astype(np.int64)


def load_digits():
    """Return scikit-learn's digits as ``(x, y)``: float32 [1797, 8, 8, 1] in [0, 1], int64 [1797]."""
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    return (d.images.astype(np.float32) / 16.0)[..., None], d.target.astype(np.int64)


def load(name="digits", data_dir=None, test_fraction=0.2, seed=0):
    """Load a data set and split it into train and test, stratified by label.

    Args:
        name: ``"digits"`` or ``"mnist-idx"``.
        data_dir: str folder of the IDX files (required for ``mnist-idx``).
        test_fraction: float in (0, 1), share of the samples kept for testing.
        seed: int, seeds the split.

    Returns:
        Dataset.

    Raises:
        ValueError: unknown name, bad test_fraction, or ``mnist-idx`` without ``data_dir``.
        DataError: missing or corrupt files.
    """
    from sklearn.model_selection import train_test_split

    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if name == "digits":
        x, y = load_digits()
    else:
        if not data_dir:
            raise ValueError("dataset 'mnist-idx' needs data_dir, the folder with the IDX files "
                             "(for example the folder holding t10k-images-idx3-ubyte.gz)")
        x, y = load_idx_folder(data_dir)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return Dataset(name, x_tr, y_tr, x_te, y_te, int(y.max()) + 1)


def shard(x, y, rank, world_size, seed=0):
    """Return this rank's disjoint shard of ``(x, y)``; all shards have the same length.

    The samples are permuted with ``seed`` (identically on every rank), the first
    ``world_size * floor(N / world_size)`` are dealt round-robin, and the at most
    ``world_size - 1`` left over are not used, so every rank runs the same number of steps.

    Args:
        x: array [N, ...]. y: array [N]. rank: int in [0, world_size). world_size: int >= 1.
        seed: int.

    Returns:
        ``(x_shard, y_shard)`` with ``floor(N / world_size)`` samples each.

    Raises:
        ValueError: rank outside [0, world_size), or fewer samples than ranks.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    n = len(x)
    if n < world_size:
        raise ValueError(f"cannot shard {n} samples over {world_size} ranks")
    per = n // world_size
    order = np.random.default_rng(seed).permutation(n)[: per * world_size]
    mine = order[rank::world_size]
    return x[mine], y[mine]


def shard_dataset(dataset):
    """Return this rank's share of a user's ``tf.data.Dataset``: its part among the *workers*.

    ``dataset.shard(n, i)`` with n = :func:`hetsync.num_workers` and i = :func:`hetsync.worker_rank`,
    so under a parameter-server protocol (whose last K ranks serve and train on nothing) every
    sample goes to a worker; without servers this is ``dataset.shard(hetsync.size(),
    hetsync.rank())``, horovod's usual line. A server rank gets worker 0's share (the protocol's
    ``fit_dataset`` takes one batch of it, which the server never trains on). Call it after wrapping
    the optimizer: wrapping a parameter-server protocol sets the roles.

    Args:
        dataset: ``tf.data.Dataset`` (any element structure; unbatched if it then goes to
            ``Protocol.fit_dataset``).

    Returns:
        ``tf.data.Dataset``: every n-th element, from this worker's index on.

    Raises:
        TypeError: ``dataset`` has no ``shard`` method (not a ``tf.data.Dataset``).
        RuntimeError: hetsync is not initialised (:func:`hetsync.init`).
        ValueError: no worker rank (every rank serves).
    """
    from hetsync import roles, world

    if not hasattr(dataset, "shard"):
        raise TypeError(f"shard_dataset takes a tf.data.Dataset, got {type(dataset).__name__}")
    if roles.num_workers() < 1:
        raise ValueError(f"shard_dataset: no worker rank to shard over ({world.size()} ranks, "
                         f"{roles.num_servers()} servers)")
    index = roles.worker_rank()
    return dataset.shard(roles.num_workers(), 0 if index is None else index)
