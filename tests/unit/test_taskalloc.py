"""Task allocation: allocation arithmetic, per-epoch plans, argument validation (single process)."""
import keras
import numpy as np
import pytest

import hetsync
from hetsync.protocols.taskalloc import protocol as ta


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


def test_round_allocation_keeps_the_sum_and_the_minimum():
    assert ta.round_allocation([2.5, 2.5, 1.0], 6).tolist() == [3, 2, 1]  # tie -> lower rank
    assert ta.round_allocation([4.4, 4.4, 4.4, 2.8], 16).tolist() == [5, 4, 4, 3]  # remainders .8, then .4 (rank 0)
    assert ta.round_allocation([9.7, 0.1, 0.2], 10).tolist() == [8, 1, 1]  # lower bound 1 taken from the largest
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        total = int(rng.integers(n, 60))
        ideal = rng.dirichlet(np.ones(n)) * total
        a = ta.round_allocation(ideal, total)
        assert a.sum() == total and a.min() >= 1
        if ideal.min() >= 1:  # no entry lifted to the minimum: plain largest remainder, within one unit
            assert np.all(np.abs(a - ideal) < 1.0)
    with pytest.raises(ValueError, match="total 2 cannot give 3 entries"):
        ta.round_allocation([1, 1, 1], 2)


def test_eq10_moves_work_to_the_faster_ranks():
    # speeds 1,1,1,0.5 at equal w: rank 3 needs twice the compute time for the same work
    w = ta.adapt_allocation([4, 4, 4, 4], [1.0, 1.0, 1.0, 2.0], 28)
    assert w.tolist() == [8, 8, 8, 4]
    # a fixed point: the measured times at w=[8,8,8,4] are equal -> nothing moves
    assert ta.adapt_allocation([8, 8, 8, 4], [2.0, 2.0, 2.0, 2.0], 28).tolist() == [8, 8, 8, 4]
    assert ta.allocation_change([4, 4, 4, 4], [8, 8, 8, 4]) == pytest.approx(12 / 32)
    with pytest.raises(ValueError, match="compute times must be positive"):
        ta.adapt_allocation([1, 1], [1.0, 0.0], 2)


def test_heterogeneity_efficiency_formula():
    # two ranks, 100 samples each, each computing 1 s of a 1 s epoch: E = 1
    assert ta.heterogeneity_efficiency([100, 100], [1.0, 1.0], 1.0) == pytest.approx(1.0)
    # BSP-like: equal shares, rank 1 twice slower: fast one idles half the time -> E = 2 * 100 / (200 + 100) ... = 2/3
    assert ta.heterogeneity_efficiency([100, 100], [1.0, 2.0], 2.0) == pytest.approx((200 / 2.0) / (100 + 50))


@pytest.mark.parametrize("n_samples, b, weights", [(1437, 8, [7, 7, 7, 7]), (1437, 8, [10, 7, 8, 3]),
                                                   (100, 3, [1, 2, 3]), (30, 4, [5, 1]), (7, 2, [1, 1, 1]),
                                                   (13, 1, [3, 2, 1, 6])])
def test_every_sample_once_per_epoch_and_shares_follow_w(n_samples, b, weights):
    counts = ta.plan_rounds(n_samples, b, weights)
    assert counts.sum() == n_samples and counts.min() >= 1
    # the number of rounds only depends on N, C and b (all ranks run the same number of steps)
    skewed = [sum(weights) - len(weights) + 1] + [1] * (len(weights) - 1)
    assert len(counts) == len(ta.plan_rounds(n_samples, b, skewed))
    full = [r for r in counts if r.sum() == sum(weights) * b]
    assert all((r == np.asarray(weights) * b).all() for r in full)
    for epoch in range(3):
        parts = ta.epoch_indices(n_samples, counts, epoch, seed=5)
        got = np.concatenate([p for row in parts for p in row])
        assert sorted(got.tolist()) == list(range(n_samples))  # union is the training set, each once
    a, b_ = ta.epoch_indices(n_samples, counts, 0, 5), ta.epoch_indices(n_samples, counts, 1, 5)
    assert any(not np.array_equal(x, y) for x, y in zip(a[0], b_[0]))  # reshuffled every epoch
    share = counts.sum(axis=0) / n_samples
    assert np.allclose(share, np.asarray(weights) / sum(weights), atol=max(len(weights) / n_samples, 0.06))


def test_plan_rounds_merges_a_last_round_smaller_than_the_world():
    counts = ta.plan_rounds(26, 4, [3, 3])  # one full round of 24, then 2 left for 2 ranks: kept
    assert counts.tolist() == [[12, 12], [1, 1]]
    counts = ta.plan_rounds(25, 4, [1, 1, 1])  # 2 full rounds of 12, 1 left for 3 ranks: merged
    assert counts.tolist() == [[4, 4, 4], [5, 4, 4]]
    with pytest.raises(ValueError, match="2 training samples cannot be shared by 3 ranks"):
        ta.plan_rounds(2, 4, [1, 1, 1])


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "dynamic"}, "mode must be one of 'static', 'adaptive', got 'dynamic'"),
    ({"weights": [2, 0]}, r"weights\[1\] = 0 is not an integer >= 1$"),
    ({"weights": [-1]}, r"weights\[0\] = -1 is not an integer >= 1$"),
    ({"weights": [1.5]}, r"weights\[0\] = 1.5 is not an integer >= 1$"),
    ({"weights": [True]}, r"weights\[0\] = True is not an integer >= 1$"),
    ({"weights": "3"}, r"weights must be None \(equal shares\) or a non-empty list of integers >= 1 \(micro-batches "
                       r"per round, one per rank\), got '3'"),
    ({"weights": [1, 2]}, r"2 weights \[1, 2\] given, but the world size is 1"),
    ({"total": 0}, r"total must be None .* or an integer >= 1 \(micro-batches per round over all ranks\), got 0$"),
    ({"total": 2.5}, "total must be None .* or an integer >= 1 .*, got 2.5$"),
    ({"weights": [3], "total": 4}, r"total C=4 but the weights \[3\] sum to 3"),
    ({"threshold": 1.5}, "threshold must be a number in \\[0, 1\\)"),
    ({"patience": 0}, r"patience must be an integer >= 1 \(epochs\), got 0$"),
    ({"micro_batch": 0}, "micro_batch must be None .* or an integer >= 1 .*, got 0$"),
    ({"micro_batch": -4}, "micro_batch must be None .* got -4$"),
    ({"micro_batch": 2.5}, "micro_batch must be None .* got 2.5$"),
    ({"micro_batch": True}, "micro_batch must be None .* got True$"),
    ({"micro_batch": "4"}, "micro_batch must be None .* got '4'$"),
])
def test_bad_arguments_are_refused_before_training(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hetsync.TaskAllocation(keras.optimizers.SGD(0.1), **kwargs)


def test_total_smaller_than_world_size_is_refused(monkeypatch):
    monkeypatch.setattr(hetsync.world, "size", lambda: 4)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    with pytest.raises(ValueError, match="total C=3 is smaller than the world size 4"):
        hetsync.TaskAllocation(keras.optimizers.SGD(0.1), total=3)


def test_fit_data_checks_and_cli_registration(tmp_path):
    opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive")
    proto = opt.hetsync_protocol
    assert proto.total == 1 and proto.weights.tolist() == [1]  # adaptive default: C is set from b by fit_data
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1 .*, got 0"):
        proto.fit_data(np.zeros((10, 2)), np.zeros(10), 0)
    with pytest.raises(ValueError, match="x has 10 samples but y has 9"):
        proto.fit_data(np.zeros((10, 2)), np.zeros(9), 2)
    assert hetsync.protocols.parse_protocol_args(
        "taskalloc", ["mode=adaptive", "weights=[1]", "total=1", "micro_batch=4"]) == {
        "mode": "adaptive", "weights": [1], "total": 1, "micro_batch": 4}
    assert hetsync.protocols.get_wrapper("taskalloc") is hetsync.TaskAllocation


def test_training_without_fit_data_fails_clearly():
    opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.1))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(opt, "mse")
    with pytest.raises(RuntimeError, match="train on the data returned by opt.hetsync_protocol.fit_data"):
        model.fit(np.zeros((4, 2)), np.zeros(4), verbose=0, callbacks=hetsync.callbacks.standard(opt))


def test_single_process_static_training_runs_one_step_per_round():
    ds = hetsync.data.load("digits", seed=0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])
    opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.2), weights=[4])
    model.compile(opt, "sparse_categorical_crossentropy")
    # b = 64 on one rank: BSP's global batch of 64 samples, 4 micro-batches of 16
    hist = model.fit(**opt.hetsync_protocol.fit_data(ds.x_train, ds.y_train, 64), epochs=2, verbose=0,
                     callbacks=hetsync.callbacks.standard(opt))
    s = opt.hetsync_protocol.summary_stats()
    assert s["micro_batch"] == 16 and s["global_batch"] == 64 and s["batch_size"] == 64
    rounds = int(np.ceil(len(ds.x_train) / 64))
    assert s["rounds_per_epoch"] == rounds and s["syncs"] == 2 * rounds and int(opt.iterations.numpy()) == 2 * rounds
    assert [e["samples"] for e in s["epochs"]] == [[len(ds.x_train)]] * 2
    assert hist.history["loss"][1] < hist.history["loss"][0]


def test_adaptive_reallocates_then_freezes_once_the_change_stays_below_the_threshold(monkeypatch):
    """end_epoch on a simulated 4-rank world: eq. (10), the threshold and the patience rule."""
    monkeypatch.setattr(hetsync.world, "size", lambda: 4)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", total=28, threshold=0.05, patience=2)
    proto = opt.hetsync_protocol
    proto.fit_data(np.zeros((1000, 2)), np.zeros(1000), 35)  # 4 x 35 = 140 samples per round: micro-batch 5
    assert proto.micro_batch == 5
    speeds = {"now": [100.0, 100.0, 100.0, 50.0]}

    def fake_allgather_object(mine, name):  # four ranks: this one's record with each rank's w and speed
        assert name == "hetsync_taskalloc_epoch"
        return [dict(mine, w=int(proto.weights[i]), speed=speeds["now"][i]) for i in range(4)]

    monkeypatch.setattr(hetsync.transport, "allgather_object", fake_allgather_object)
    steady = (100, 1.0, 1.0)
    h = proto.end_epoch(0, 1.0, 0.1, 1.2, 100.0, steady)
    assert h["w"] == [7, 7, 7, 7] and h["next_w"] == [8, 8, 8, 4] and h["change"] == pytest.approx(6 / 56)
    assert h["gain"] == pytest.approx(1 - (4 / 50) / (7 / 50))  # the round was 7/50, now max(8/100, 4/50)
    proto.begin_epoch(1)
    assert proto.weights.tolist() == [8, 8, 8, 4] and proto.samples_per_epoch == int(proto.counts[:, 0].sum())
    speeds["now"] = [108.0, 100.0, 92.0, 50.0]  # noise: eq. (10) gives [9, 8, 7, 4], a round 4.2% shorter
    h = proto.end_epoch(1, 1.0, 0.1, 1.2, 100.0, steady)
    assert h["next_w"] == [8, 8, 8, 4] and h["gain"] == pytest.approx(1 - (9 / 108) / (8 / 92)) and not h["stable"]
    proto.begin_epoch(2)
    h = proto.end_epoch(2, 1.0, 0.1, 1.2, 100.0, steady)
    assert h["stable"] and proto.stable  # two epochs in a row below the threshold: frozen
    speeds["now"] = [100.0, 100.0, 100.0, 10.0]  # frozen: no more reallocation
    proto.begin_epoch(3)
    h = proto.end_epoch(3, 1.0, 0.1, 1.2, 100.0, steady)
    assert h["next_w"] == [8, 8, 8, 4] and h["change"] is None
    s = proto.summary_stats()
    assert s["stable_epoch"] == 2 and [e["w"] for e in s["epochs"]] == [[7, 7, 7, 7]] + [[8, 8, 8, 4]] * 3


def test_predicted_gain_is_the_relative_shortening_of_the_slowest_ranks_round():
    assert ta.predicted_gain([8, 8, 8, 8], [10, 10, 8, 4], [100, 100, 100, 50]) == pytest.approx(1 - 0.1 / 0.16)
    assert ta.predicted_gain([10, 10, 8, 4], [8, 8, 8, 8], [100, 100, 100, 50]) == pytest.approx(1 - 0.16 / 0.1)
    assert ta.predicted_gain([4, 4], [4, 4], [1.0, 3.0]) == 0.0
    for bad in ([100, 0, 100, 50], [100, 100, 50]):
        with pytest.raises(ValueError, match="positive speeds"):
            ta.predicted_gain([8, 8, 8, 8], [8, 8, 8, 8], bad)


def test_adaptive_adopts_a_small_move_that_unloads_the_bottleneck(monkeypatch):
    """One micro-batch off the slow rank moves 1/32 of the global batch (below a 0.05 threshold on the
    fraction moved) but shortens the round by 20%: it is adopted."""
    monkeypatch.setattr(hetsync.world, "size", lambda: 4)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", weights=[9, 10, 8, 5], threshold=0.05)
    proto = opt.hetsync_protocol
    proto.fit_data(np.zeros((1000, 2)), np.zeros(1000), 40)  # 4 x 40 = 160 samples = 32 micro-batches of 5
    speeds = [9800.0, 10200.0, 8100.0, 3900.0]  # eq. (10): C v / sum v = [9.8, 10.2, 8.1, 3.9]

    def fake_allgather_object(mine, name):
        return [dict(mine, w=int(proto.weights[i]), speed=speeds[i]) for i in range(4)]

    monkeypatch.setattr(hetsync.transport, "allgather_object", fake_allgather_object)
    h = proto.end_epoch(0, 1.0, 0.1, 1.2, 100.0, (100, 1.0, 1.0))
    assert h["next_w"] == [10, 10, 8, 4] and h["change"] == pytest.approx(1 / 32)
    assert h["gain"] == pytest.approx(1 - (4 / 3900) / (5 / 3900))
    proto.begin_epoch(1)
    assert proto.weights.tolist() == h["next_w"]


def test_speed_is_pooled_over_the_epochs_of_one_allocation_and_reset_when_it_changes(monkeypatch):
    """The hooks' v_i: median of m_i / step time over every step since w last changed (first step
    of each epoch left out), on a fake clock."""
    monkeypatch.setattr(hetsync.world, "size", lambda: 4)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="static", weights=[8, 8, 8, 8])
    proto = opt.hetsync_protocol
    proto.fit_data(np.zeros((1000, 2)), np.zeros(1000), 40)  # micro-batches of 5
    clock = {"t": 0.0}
    monkeypatch.setattr(ta.time, "perf_counter", lambda: clock["t"])
    speeds = []
    monkeypatch.setattr(proto, "end_epoch", lambda epoch, compute, wait, wall, speed, steady: speeds.append(speed))
    assert proto.callbacks() == []  # the hooks do it
    cb = proto
    cb.on_train_begin(None, {})
    rates = []
    for epoch, dt, w in ((0, 0.01, None), (1, 0.03, None), (2, 0.02, [10, 8, 8, 6])):
        if w is not None:  # a reallocation: the pool starts again
            proto._pending, rates = np.asarray(w, np.int64), []
        cb.on_epoch_begin(epoch)
        for batch in range(proto.rounds):
            cb.on_train_batch_begin(batch)
            assert cb._m == proto.step_samples(batch) == proto.counts[batch, 0]
            clock["t"] += dt
            cb.on_train_batch_end(batch, {})
        rates += [proto.counts[k, 0] / dt for k in range(1, proto.rounds)]
        cb.on_epoch_end(epoch, {})
        assert speeds[-1] == pytest.approx(float(np.median(rates)))
    assert proto.rounds > 2 and speeds[1] != pytest.approx(speeds[0])  # epoch 1 pooled with epoch 0
    cb.on_train_end(None)


def test_data_for_the_next_epoch_waits_for_its_plan_times_out_clearly_and_is_released_at_the_end():
    import threading
    import time

    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), weights=[2]).hetsync_protocol
    proto.build()
    x, y = np.arange(40, dtype=np.float32)[:, None], np.arange(40)
    fit = proto.fit_data(x, y, 8)  # one rank, b = 8: 2 micro-batches of 4 per round
    data = fit["x"]
    assert fit["steps_per_epoch"] == proto.rounds == 5 and data.num_batches is None
    epoch0 = sorted(int(v) for t in range(5) for v in data[t][0][:, 0])
    assert epoch0 == list(range(40))  # items 0..4: epoch 0, every sample once
    proto.begin_fit()
    proto.data_timeout_s = 0.2
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="data of round 0 of epoch 1 was requested but its allocation was not "
                                           "set within data_timeout_s=0.2 s"):
        data[5]
    assert time.monotonic() - t0 >= 0.2
    # a request for epoch 1 waits until begin_epoch(1) plans it, then gets epoch 1's permutation
    proto.data_timeout_s = 30.0
    got = []
    waiter = threading.Thread(target=lambda: got.append(data[5]))
    waiter.start()
    time.sleep(0.2)
    assert not got
    proto.begin_epoch(1)
    waiter.join(10)
    assert got and np.array_equal(got[0][0][:, 0].astype(int), proto.indices_of_round(0))
    # after the fit, requests for unplanned epochs return at once (never trained on)
    proto.end_fit()
    assert proto.indices_for(7, 0) is None


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_default_micro_batch_keeps_bsps_global_batch(n):
    # C = 8 n, b = 32: micro-batches of 4, global batch n x 32 (BSP's); adaptive default C = n b: one sample
    assert ta.default_micro_batch(n, 32, 8 * n) == 4
    assert ta.default_micro_batch(n, 32, 32 * n) == 1
    # static default C = n: the micro-batch is b
    assert ta.default_micro_batch(n, 32, n) == 32
    for b in (1, 5, 32, 100):
        for c in (n, 2 * n, 8 * n, 3 * n + 1):
            mb = ta.default_micro_batch(n, b, c)
            assert mb >= 1 and isinstance(mb, int)
            if (n * b) % c == 0:
                assert c * mb == n * b
            elif n * b >= c:  # nearest multiple of C: within C / 2 samples of BSP's n b
                assert abs(c * mb - n * b) <= c / 2


def test_default_micro_batch_rounds_and_refuses_bad_values():
    assert ta.default_micro_batch(4, 8, 28) == 1  # 32 / 28 = 1.14: global batch 28
    assert ta.default_micro_batch(2, 5, 4) == 3  # 10 / 4 = 2.5: halves round up, global batch 12
    assert ta.default_micro_batch(1, 1, 8) == 1  # below one sample: at least 1, global batch C = 8
    for args, name, value in (((0, 32, 8), "n", "0"), ((4, 0, 8), "batch_size", "0"), ((4, 32, 2.0), "total", "2.0"),
                              ((4, True, 8), "batch_size", "True"), ((4, 32, -1), "total", "-1")):
        with pytest.raises(ValueError, match=f"default_micro_batch: {name} must be an integer >= 1, got {value}$"):
            ta.default_micro_batch(*args)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_default_adaptive_allocation_has_bsps_global_batch(monkeypatch, n):
    """The issue's case: adaptive by default, b = 32: C = 32 n single-sample micro-batches, n x 32 samples
    per round (BSP's global batch), fine enough for any speed ratio; micro_batch=4 gives C = 8 n."""
    monkeypatch.setattr(hetsync.world, "size", lambda: n)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive").hetsync_protocol
    fit = proto.fit_data(np.zeros((1000, 2)), np.zeros(1000), 32)
    assert proto.total == 32 * n and proto.micro_batch == 1 and proto.batch_size == 32
    assert proto.global_batch == n * 32 and proto.weights.tolist() == [32] * n
    full = proto.counts[:-1]  # every round but the last, partial one holds BSP's global batch
    assert len(full) and np.all(full.sum(axis=1) == n * 32) and np.all(full == proto.weights)
    assert proto.counts.sum() == 1000 and fit["steps_per_epoch"] == proto.rounds == int(np.ceil(1000 / (n * 32)))
    s = proto.summary_stats()
    assert (s["micro_batch"], s["global_batch"], s["batch_size"], s["total"]) == (1, n * 32, 32, 32 * n)
    assert proto.config()["micro_batch"] is None
    coarse = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", micro_batch=4).hetsync_protocol
    coarse.fit_data(np.zeros((1000, 2)), np.zeros(1000), 32)
    assert (coarse.total, coarse.micro_batch, coarse.global_batch) == (8 * n, 4, n * 32)


def test_adaptive_default_expresses_a_two_to_one_speed_ratio():
    """With single-sample units eq. (10) reaches E ~ 0.99 under speeds:1,1,1,0.5; with C = 8 n it cannot
    beat 0.91 (the slow rank's one extra micro-batch sets the round time)."""
    v = np.array([1.0, 1.0, 1.0, 0.5])
    for total, best_e in ((4 * 32, 0.98), (32, 0.91)):
        w = ta.adapt_allocation(np.full(4, total // 4), (total // 4) / v, total)
        e = (total / v.sum()) / np.max(w / v)  # ideal round time over the allocation's round time
        assert e >= best_e and (total != 32 or e < 0.92), (total, w, e)


def test_explicit_micro_batch_gives_c_micro_batches_of_that_size(monkeypatch):
    monkeypatch.setattr(hetsync.world, "size", lambda: 4)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    # adaptive, micro_batch alone: the unit of the allocation, C = n b / 16 = 8, BSP's global batch
    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", micro_batch=16).hetsync_protocol
    proto.fit_data(np.zeros((2000, 2)), np.zeros(2000), 32)
    assert (proto.total, proto.micro_batch, proto.global_batch) == (8, 16, 128)
    # with an explicit C the global batch is C x micro_batch: "a larger C stays available"
    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", total=32,
                                   micro_batch=16).hetsync_protocol
    proto.fit_data(np.zeros((2000, 2)), np.zeros(2000), 32)
    assert proto.total == 32 and proto.micro_batch == 16 and proto.global_batch == 32 * 16  # 4x BSP's 4 x 32
    assert np.all(proto.counts[:-1] == proto.weights * 16) and proto.counts.sum() == 2000
    assert proto.config()["micro_batch"] == 16 and proto.summary_stats()["global_batch"] == 512
    # static with explicit weights: C = sum(w) micro-batches of the given size, whatever b
    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), weights=[3, 1, 1, 1], micro_batch=2).hetsync_protocol
    proto.fit_data(np.zeros((100, 2)), np.zeros(100), 64)
    assert proto.global_batch == 12 and proto.counts[0].tolist() == [6, 2, 2, 2]


def test_step_samples_are_the_counts_of_the_current_plan(monkeypatch):
    monkeypatch.setattr(hetsync.world, "size", lambda: 2)
    rank = {"r": 0}
    monkeypatch.setattr(hetsync.world, "rank", lambda: rank["r"])
    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", weights=[3, 1]).hetsync_protocol
    assert proto.step_samples(0) is None  # no plan before fit_data
    proto.fit_data(np.zeros((50, 2)), np.zeros(50), 4)  # 2 x 4 = 8 samples per round: micro-batch 2
    assert proto.counts.tolist() == [[6, 2]] * 6 + [[1, 1]]
    for r in (0, 1):
        rank["r"] = r
        assert [proto.step_samples(t) for t in range(proto.rounds)] == proto.counts[:, r].tolist()
        assert proto.step_samples(proto.rounds) == 0 and proto.step_samples(proto.rounds + 3) == 0
        assert isinstance(proto.step_samples(0), int)
    rank["r"] = 0
    proto._pending = np.asarray([2, 2], np.int64)  # a reallocation: the next epoch's steps follow it
    proto.begin_epoch(1)
    assert [proto.step_samples(t) for t in range(proto.rounds)] == [4] * 6 + [1]


def test_the_plan_is_published_under_its_lock():
    """A reader holding _plan_cv (Keras' prefetching thread) never sees a half-updated plan."""
    import threading

    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), weights=[2]).hetsync_protocol
    proto.fit_data(np.arange(40, dtype=np.float32)[:, None], np.arange(40), 8)
    before = (proto.counts, proto._indices, proto.epoch, proto.rounds, proto.samples_per_epoch)
    with proto._plan_cv:
        worker = threading.Thread(target=proto.begin_epoch, args=(1,))
        worker.start()
        worker.join(1.0)  # begin_epoch computes the plan, then blocks on the lock we hold
        assert worker.is_alive()
        assert proto.counts is before[0] and proto._indices is before[1]
        assert (proto.epoch, proto.rounds, proto.samples_per_epoch) == before[2:]
        assert 1 not in proto._plans
    worker.join(10)
    assert not worker.is_alive() and proto.epoch == 1 and proto._indices is proto._plans[1]
    assert proto._indices is not before[1]


def _one_unit_at_a_time(ideal, total, minimum):
    """The definition of the largest-remainder rule, one unit per step (the reference for the fast rounding)."""
    x = np.asarray(ideal, dtype=np.float64)
    a = np.maximum(minimum, np.floor(x)).astype(np.int64)
    while a.sum() < total:
        a[int(np.argmax(x - a))] += 1
    while a.sum() > total:
        a[int(np.argmin(np.where(a > minimum, x - (a - 1), np.inf)))] -= 1
    return a


def test_fast_rounding_equals_the_one_unit_rule_including_ties():
    from hetsync.protocols.taskalloc.allocation import round_allocation

    rng = np.random.default_rng(7)
    for trial in range(1500):
        n, minimum = int(rng.integers(1, 9)), int(rng.integers(0, 3))
        ideal = np.round(rng.uniform(0, 40, n) * rng.choice([1.0, 0.05], n), int(rng.integers(0, 3)))
        total = int(rng.integers(n * minimum, n * minimum + 150))
        np.testing.assert_array_equal(round_allocation(ideal, total, minimum),
                                      _one_unit_at_a_time(ideal, total, minimum), err_msg=f"{ideal} {total} {minimum}")


def test_the_first_epochs_probe_reallocates_its_remaining_rounds_and_every_sample_stays_once(monkeypatch):
    """probe_rounds K: rounds K.. of epoch 0 wait for the probe; the probe's eq. (10) on the speeds of rounds
    1 .. K-1 (a fake clock: rank 3 half as fast) sets the rest of the epoch; every sample is served once."""
    import threading

    monkeypatch.setattr(hetsync.world, "size", lambda: 4)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    opt = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", total=32, probe_rounds=3)
    proto = opt.hetsync_protocol
    x = np.arange(1000, dtype=np.float32)[:, None]
    data = proto.fit_data(x, np.zeros(1000), 40)["x"]  # 4 x 40 = 160 samples per round: micro-batch 5
    assert proto.rounds == 7 and proto.counts[:3].tolist() == [[40] * 4] * 3
    speeds = [400.0, 400.0, 400.0, 200.0]  # samples/s: eq. (10) gives 32 v / sum v = [9.14, 9.14, 9.14, 4.57]
    calls = []

    def fake_allgather_object(mine, name):
        calls.append(name)
        return [dict(mine, speed=speeds[i]) for i in range(4)]

    monkeypatch.setattr(hetsync.transport, "allgather_object", fake_allgather_object)
    clock = {"t": 0.0}
    monkeypatch.setattr(ta.time, "perf_counter", lambda: clock["t"])
    proto.on_train_begin(None, {})
    proto.on_epoch_begin(0)
    served = [data[t][0][:, 0].astype(int).tolist() for t in range(3)]
    got = []
    waiter = threading.Thread(target=lambda: got.append(data[3][0][:, 0].astype(int).tolist()))
    waiter.start()
    for batch in range(3):
        proto.on_train_batch_begin(batch)
        clock["t"] += 0.1  # 40 samples in 0.1 s on rank 0: 400 samples/s
        if batch < 2:
            assert not got  # round 3 is not planned before the probe
        proto.on_train_batch_end(batch, {})
    waiter.join(10)
    assert calls == ["hetsync_taskalloc_probe"] and got
    probe = proto.summary_stats()["probe"]
    assert probe["w"] == [8, 8, 8, 8] and probe["next_w"] == [9, 9, 9, 5] and probe["rounds"] == 3
    assert probe["speed_samples_per_s"] == speeds and probe["gain"] == pytest.approx(1 - (5 / 200) / (8 / 200))
    assert proto.weights.tolist() == [9, 9, 9, 5] and proto._stats["w"].numpy() == 9.0
    # rounds 0-2 as served, rounds 3.. under the new w; the round sizes (and so Keras' step count) are unchanged
    assert proto.counts[:3].tolist() == [[40] * 4] * 3 and proto.counts[3:6].tolist() == [[45, 45, 45, 25]] * 3
    assert proto.counts.sum(axis=1).tolist() == [160] * 6 + [40] and proto.samples_per_epoch == proto.counts[:, 0].sum()
    assert [proto.step_samples(b) for b in range(7)] == proto.counts[:, 0].tolist()
    assert got[0] == proto.indices_of_round(3).tolist() and len(got[0]) == 45
    ids = [i for r in range(7) for rank in range(4) for i in proto._indices[r][rank].tolist()]
    assert sorted(ids) == list(range(1000))  # every sample of the epoch once, across the probe
    assert served == [proto.indices_of_round(r).tolist() for r in range(3)]
    # the probe runs once: a later epoch is planned whole, and the state carries the record
    proto.on_epoch_begin(1)
    assert proto._ready == {} and proto.counts[0].tolist() == [45, 45, 45, 25]
    state = proto.state()
    assert state["allocation"]["probe"] == probe
    proto.on_train_end(None)


def test_probe_rounds_is_refused_without_adaptive_and_skipped_when_the_epoch_is_too_short(monkeypatch):
    with pytest.raises(ValueError, match=r"probe_rounds=4 .*mode=\"adaptive\".*got mode='static'"):
        hetsync.TaskAllocation(keras.optimizers.SGD(0.1), probe_rounds=4)
    with pytest.raises(ValueError, match="probe_rounds"):
        hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", probe_rounds=1)
    monkeypatch.setattr(hetsync.world, "size", lambda: 2)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", probe_rounds=6).hetsync_protocol
    proto.fit_data(np.zeros((50, 2)), np.zeros(50), 4)  # 7 rounds: 6 probe rounds would leave one
    assert proto.rounds == 7 and proto._ready == {}


def test_the_speed_sample_is_the_time_up_to_the_gradients_when_the_step_op_timed_it(monkeypatch):
    """m_i / (compute_ms + delay_ms) when the step's start is known; the host work after the gradients (here
    30 ms of a 100 ms step, no time in the allreduce) is left out. Without it: m_i / (step - allreduce)."""
    monkeypatch.setattr(hetsync.world, "size", lambda: 1)
    monkeypatch.setattr(hetsync.world, "rank", lambda: 0)
    proto = hetsync.TaskAllocation(keras.optimizers.SGD(0.1), mode="adaptive", weights=[4]).hetsync_protocol
    proto.fit_data(np.zeros((200, 2)), np.zeros(200), 20)  # one rank: 4 micro-batches of 5 per round
    clock = {"t": 0.0}
    monkeypatch.setattr(ta.time, "perf_counter", lambda: clock["t"])
    proto.on_train_begin(None, {})
    proto.on_epoch_begin(0)
    for batch, (compute_ms, delay_ms) in enumerate([(0.0, 0.0), (0.0, 0.0), (5.0, 65.0)]):
        proto.on_train_batch_begin(batch)
        proto._stats["compute_ms"].assign(compute_ms)
        proto._stats["delay_ms"].assign(delay_ms)
        clock["t"] += 0.1
        proto.on_train_batch_end(batch, {})
    assert proto._rates == [pytest.approx(20 / 0.1), pytest.approx(20 / 0.07)]  # batch 0 is not a sample
    proto.on_train_end(None)
