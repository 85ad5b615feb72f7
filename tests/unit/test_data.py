"""Data loaders: digits, IDX files (real MNIST and corrupt ones), split and shards."""
import gzip

import numpy as np
import pytest

from hetsync.data import datasets as data


def _write_idx(path, arr, code=0x08, compress=True):
    header = bytes([0, 0, code, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    payload = header + arr.tobytes()
    if compress:
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        with open(path, "wb") as f:
            f.write(payload)


def test_digits_split_is_stratified_and_scaled():
    ds = data.load("digits", seed=0)
    assert ds.input_shape == (8, 8, 1)
    assert ds.num_classes == 10
    assert len(ds.x_train) + len(ds.x_test) == 1797
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    train_share = np.bincount(ds.y_train) / len(ds.y_train)
    test_share = np.bincount(ds.y_test) / len(ds.y_test)
    assert np.max(np.abs(train_share - test_share)) < 0.01


def test_real_mnist_idx_files(mnist_dir):
    x, y = data.load_idx_folder(mnist_dir)
    assert x.shape == (10000, 28, 28, 1) and y.shape == (10000,)
    assert list(np.bincount(y)) == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    ds = data.load("mnist-idx", mnist_dir, test_fraction=0.2, seed=0)
    assert len(ds.x_train) == 8000 and len(ds.x_test) == 2000


def test_idx_roundtrip_plain_and_gzip(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.idx.gz", arr)
    _write_idx(tmp_path / "b.idx", arr, compress=False)
    np.testing.assert_array_equal(data.read_idx(str(tmp_path / "a.idx.gz")), arr)
    np.testing.assert_array_equal(data.read_idx(str(tmp_path / "b.idx")), arr)


def test_corrupt_idx_files_name_the_file(tmp_path):
    arr = np.zeros((4, 2, 2), np.uint8)
    truncated = tmp_path / "trunc-images-idx3-ubyte"
    _write_idx(truncated, arr, compress=False)
    truncated.write_bytes(truncated.read_bytes()[:-3])
    with pytest.raises(data.DataError, match="trunc-images.*holds 13 bytes"):
        data.read_idx(str(truncated))
    bad_magic = tmp_path / "magic.idx"
    bad_magic.write_bytes(b"\x12\x34\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(data.DataError, match="magic.idx is not an IDX file"):
        data.read_idx(str(bad_magic))
    bad_gz = tmp_path / "x-images-idx3-ubyte.gz"
    bad_gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(data.DataError, match="cannot read IDX file .*x-images-idx3-ubyte.gz"):
        data.read_idx(str(bad_gz))
    with pytest.raises(data.DataError, match="IDX file not found: .*nope"):
        data.read_idx(str(tmp_path / "nope"))


def test_folder_errors(tmp_path):
    with pytest.raises(data.DataError, match="data folder not found"):
        data.load_idx_folder(str(tmp_path / "missing"))
    _write_idx(tmp_path / "t-images-idx3-ubyte.gz", np.zeros((3, 2, 2), np.uint8))
    with pytest.raises(data.DataError, match="no \\*labels-idx"):
        data.load_idx_folder(str(tmp_path))
    _write_idx(tmp_path / "t-labels-idx1-ubyte.gz", np.zeros((2,), np.uint8))
    with pytest.raises(data.DataError, match="2 labels for 3 images"):
        data.load_idx_folder(str(tmp_path))
    with pytest.raises(ValueError, match="unknown dataset 'cifar'"):
        data.load("cifar")
    with pytest.raises(ValueError, match="needs data_dir"):
        data.load("mnist-idx")


def test_shards_are_disjoint_equal_and_cover_all_but_remainder():
    x = np.arange(103)
    y = np.arange(103)
    shards = [data.shard(x, y, r, 4, seed=3) for r in range(4)]
    sizes = {len(s[0]) for s in shards}
    assert sizes == {25}
    union = np.concatenate([s[0] for s in shards])
    assert len(np.unique(union)) == 100
    for xs, ys in shards:
        np.testing.assert_array_equal(xs, ys)
    with pytest.raises(ValueError, match="rank must be in"):
        data.shard(x, y, 4, 4)
