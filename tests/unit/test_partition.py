"""hetsync.data.shards: SelDP order, label skew, eq. (3) batch sizes, injector draws (single process)."""
import numpy as np
import pytest

from hetsync.data import shards as partition


def test_seldp_order_for_four_ranks_is_the_rotated_circular_queue():
    assert [partition.seldp_order(r, 4) for r in range(4)] == [[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2]]
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\), got 4"):
        partition.seldp_order(4, 4)


def test_seldp_sampler_four_ranks_exact_partitions_disjoint_steps_full_coverage():
    n_samples, world, b = 403, 4, 10
    parts = partition.seldp_partitions(n_samples, world, seed=3)
    assert [len(p) for p in parts] == [100] * 4
    assert len(np.unique(np.concatenate(parts))) == 400  # disjoint, 3 left over
    samplers = [partition.SelDPSampler(n_samples, r, world, b, seed=3) for r in range(world)]
    spp = samplers[0].steps_per_pass
    assert spp == 10
    for r, s in enumerate(samplers):
        # pass p reads DP_((r + p) mod 4): exactly the samples of that partition, each once
        for p in range(2 * world):
            want = parts[(r + p) % world]
            got = np.concatenate([s(t) for t in range(p * spp, (p + 1) * spp)])
            assert s.partition_at(p * spp) == (r + p) % world
            assert sorted(got.tolist()) == sorted(want.tolist())
        # over N passes the rank sees the whole data set
        seen = np.concatenate([s(t) for t in range(world * spp)])
        assert sorted(seen.tolist()) == sorted(np.concatenate(parts).tolist())
    for t in range(3 * world * spp):  # at every step the 4 ranks read 4 disjoint batches
        batch = np.concatenate([s(t) for s in samplers])
        assert len(np.unique(batch)) == world * b
    # a rank's second walk over a partition uses a fresh order; the walk is deterministic
    assert not np.array_equal(samplers[0](0), samplers[0](world * spp))
    assert np.array_equal(samplers[2](17), partition.SelDPSampler(n_samples, 2, world, b, seed=3)(17))
    with pytest.raises(ValueError, match=r"batch size must be in \[1, 100\]"):
        partition.SelDPSampler(n_samples, 0, world, 101)


def test_label_skew_gives_each_rank_exactly_its_labels():
    y = np.random.default_rng(0).integers(0, 10, size=1000)
    for world, k in ((4, 1), (4, 2), (5, 2), (3, 4), (10, 1)):
        parts, labels = partition.label_skew(y, world, k, seed=1)
        assert labels == [sorted((r * k + j) % 10 for j in range(k)) for r in range(world)]
        assert len({len(p) for p in parts}) == 1 and len(parts[0]) > 0
        for r in range(world):
            assert set(np.unique(y[parts[r]]).tolist()) == set(labels[r])
        allidx = np.concatenate(parts)
        assert len(np.unique(allidx)) == len(allidx)  # no sample on two ranks
    with pytest.raises(ValueError, match=r"labels per rank\) must be an int in \[1, 10\], got 11"):
        partition.label_skew(y, 4, 11)
    assert partition.parse_partition("iid") is None and partition.parse_partition("label-skew:3") == 3
    for bad in ("label-skew:0", "label-skew:x", "dirichlet:0.5"):
        with pytest.raises(ValueError, match="partition must be 'iid' or 'label-skew:K'"):
            partition.parse_partition(bad)


def test_eq3_local_batch_and_injection_accounting():
    # b' = b / (1 + alpha beta N)
    assert partition.local_batch_size(32, 0.5, 0.5, 4) == 16
    assert partition.local_batch_size(32, 0.5, 0.5, 16) == 6  # 32 / 5 = 6.4
    assert partition.local_batch_size(32, 0.0, 0.0, 8) == 32
    assert partition.num_injectors(0.5, 4) == 2 and partition.num_injectors(0.3, 4) == 2
    assert partition.num_injectors(1.0, 4) == 4 and partition.num_injectors(0.0, 4) == 0
    assert partition.shared_per_injector(16, 0.5) == 8
    b_local = partition.local_batch_size(32, 0.5, 0.5, 4)
    assert b_local + partition.num_injectors(0.5, 4) * partition.shared_per_injector(b_local, 0.5) == 32
    draws = [tuple(partition.injectors(t, 0.5, 4, seed=1)) for t in range(200)]
    assert all(len(d) == 2 and len(set(d)) == 2 and all(0 <= r < 4 for r in d) for d in draws)
    assert draws == [tuple(partition.injectors(t, 0.5, 4, seed=1)) for t in range(200)]  # same on every rank
    counts = np.bincount(np.concatenate(draws), minlength=4)
    assert counts.min() > 60  # each rank injects about half the steps
    for bad in (-0.1, 1.5, "half"):
        with pytest.raises(ValueError, match="alpha must be a number in \\[0, 1\\]"):
            partition.local_batch_size(32, bad, 0.5, 4)


def test_local_sampler_reshuffles_every_pass():
    s = partition.LocalSampler(np.arange(50) + 100, 8, seed=2, rank=1)
    assert s.steps_per_pass == 6
    first = np.concatenate([s(t) for t in range(6)])
    second = np.concatenate([s(t) for t in range(6, 12)])
    assert len(np.unique(first)) == 48 and set(first) <= set(range(100, 150))
    assert not np.array_equal(first, second)


def test_default_fit_data_gives_full_reshuffled_batches_of_this_ranks_shard():
    """Protocol.fit_data (BSP, RNA, FedAvg, local SGD): floor(shard / b) full batches per epoch."""
    import keras

    import hetsync

    hetsync.init()
    x = np.arange(100, dtype=np.float32).reshape(100, 1)
    y = np.arange(100)
    proto = hetsync.BSP(keras.optimizers.SGD(0.1)).hetsync_protocol
    fit = proto.fit_data(x, y, 32, seed=5)
    assert fit["steps_per_epoch"] == 3 and fit["shuffle"] is False and "batch_size" not in fit
    assert proto.samples_per_epoch == 96
    ds = fit["x"]
    epochs = [[ds[e * 3 + j] for j in range(3)] for e in range(4)]
    left_out = []
    for batches in epochs:
        seen = np.concatenate([bx[:, 0] for bx, _ in batches]).astype(int)
        assert all(len(bx) == len(by) == 32 and np.array_equal(bx[:, 0].astype(int), by) for bx, by in batches)
        assert len(set(seen)) == 96  # no sample twice within an epoch
        left_out.append(frozenset(range(100)) - set(seen))
    assert len(set(left_out)) > 1  # the remainder changes between epochs: nothing is left out for good
    with pytest.raises(ValueError, match="batch size must be in \\[1, 100\\]"):
        proto.fit_data(x, y, 101)
    with pytest.raises(ValueError, match="bsp: batch_size must be an int >= 1 .*got 0"):
        proto.fit_data(x, y, 0)
