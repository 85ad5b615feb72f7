"""The local SGD / FedAvg / SelSync timing model against closed forms."""
import math
import time

import numpy as np
import pytest

from hetsync.sim import bsp, local, registry
from hetsync.sim.network import Network
from hetsync.sim.workload import StepTimes, Workload, step_times

INF = math.inf


def _bytes_free(n, hosts=2):
    """A network whose bytes cost nothing but whose messages and collectives still cost latency."""
    per = n // hosts
    return Network((per,) * hosts, (INF,) * hosts, alpha_s=25e-6, local_bytes_per_s=INF, overhead_s=0.5e-3)


def _free(n):
    return Network((n,), (INF,), alpha_s=0.0, local_alpha_s=0.0, local_bytes_per_s=INF, overhead_s=0.0)


def test_localsgd_period_one_on_shards_is_bsp():
    t = step_times("speeds:1,1,1,0.5+random:3", 4, 200, seed=3)
    w = Workload(host_ms=1.5)
    net = _bytes_free(4)
    ref = bsp.simulate(t, net, w)
    r = local.simulate(t, net, w, protocol="localsgd", period=1, data_plan="shard")
    assert r.samples_per_s == pytest.approx(ref.samples_per_s, rel=1e-12)
    assert r.duration_s == pytest.approx(ref.duration_s, rel=1e-12) and r.rounds == 200
    assert r.wait_s == pytest.approx(ref.wait_s, rel=1e-9)
    # on a shaped link the average also carries the [n] non-finite flags: 16 bytes more than BSP's gradient
    shaped = Network.from_spec(4, "2x2", link="1gbit")
    r2 = local.simulate(t, shaped, w, protocol="localsgd", period=1, data_plan="shard")
    assert r2.samples_per_s == pytest.approx(bsp.simulate(t, shaped, w).samples_per_s, rel=1e-4)


@pytest.mark.parametrize("H", [1, 4, 8])
def test_localsgd_shard_on_fixed_speeds_period_is_slowest_sum_plus_allreduce(H):
    n, K, b = 4, 200, 32
    t = step_times("speeds:1,1,1,0.5+netdelay:5", n, K)
    w = Workload(batch_size=b, host_ms=2.0)
    net = Network.from_spec(n, "4x1", link="1gbit")
    r = local.simulate(t, net, w, protocol="localsgd", period=H, data_plan="shard")
    comm = net.allreduce_s(w.model_bytes + 4 * n) * 1e3 + 5.0
    period = H * (80.0 + 2.0) + comm
    assert r.duration_s == pytest.approx(K / H * period / 1e3, rel=1e-12)
    assert r.samples_per_s == pytest.approx(n * b * H / (period / 1e3), rel=1e-12)
    assert r.rounds == K // H and r.steps == [K] * n
    # the fast ranks wait H * 40 ms per period, the slow one only the allreduce
    assert r.wait_s[0] == pytest.approx(K / H * (H * 40.0 + comm) / 1e3)
    assert r.wait_s[3] == pytest.approx(K / H * comm / 1e3)


def test_large_period_on_random_slowdowns_approaches_sum_of_rates():
    n, K, b = 8, 1000, 32
    t = step_times("random:6", n, K, seed=1)
    net = Network.from_spec(n, "4x2")
    w = Workload(batch_size=b)
    rates = (b / t.mean_ms()).sum() * 1e3
    ratio = {H: local.simulate(t, net, w, protocol="localsgd", period=H, data_plan="shard").samples_per_s / rates
             for H in (1, 8, K)}
    assert ratio[1] < 0.5  # a barrier every step: the max of 8 ranks' steps
    assert ratio[1] < ratio[8] < ratio[K]
    assert ratio[K] > 0.9


def test_pool_conserves_work_between_rounds():
    n, K, b = 4, 200, 32
    t = step_times("speeds:1,1,1,0.5", n, K)
    w = Workload(batch_size=b)
    rates = 3.5 * b / 40.0 * 1e3
    # no round due in an epoch (B = 160 batches < H n = 4000): every rank runs at its own pace
    r = local.simulate(t, _free(n), w, protocol="localsgd", period=1000, samples_per_epoch=160 * b)
    assert r.extra["rounds_per_epoch"] == 0 and r.rounds == 0
    assert r.samples_per_s == pytest.approx(rates, rel=1e-12) and r.steps == [200, 200, 200, 100]
    # with rounds the pool still beats fixed shares: fast ranks take more batches between barriers
    net = Network.from_spec(n, "4x1")
    pool = local.simulate(t, net, w, protocol="localsgd", period=8)
    shard = local.simulate(t, net, w, protocol="localsgd", period=8, data_plan="shard")
    assert pool.rounds > 10 and pool.steps[0] > pool.steps[3] * 1.5
    assert pool.samples_per_s > 1.4 * shard.samples_per_s and pool.samples_per_s < rates


def test_pool_round_is_joined_after_the_step_that_claimed_its_batch():
    # 2 equal ranks of 10 ms, H = 1, B = 4 batches per epoch: R = 2 rounds, due at batches 2 and 4.
    # t=0: rank 0 claims batch 1, rank 1 batch 2 (round 1 due) -> rank 1 waits at round 1 from 10;
    # t=10: rank 0 claims batch 3 (claimed after the threshold), joins round 1 at 20;
    # t=20: rank 0 claims batch 4 (round 2 due), rank 1 finds the pool empty and waits; release at 30.
    # Every epoch: 30 ms, rank 0 three steps, rank 1 one step and 20 ms waiting. Rank 0's 10th draw ends at 100.
    n, b = 2, 32
    T = np.full((10, n), 10.0)
    r = local.simulate(StepTimes(T), _free(n), Workload(batch_size=b), protocol="localsgd", period=1,
                       samples_per_epoch=4 * b)
    assert r.extra["rounds_per_epoch"] == 2 and r.extra["batches_per_epoch"] == 4
    assert r.duration_s == pytest.approx(0.1) and r.steps == [10, 4] and r.rounds == 6
    assert r.samples_per_s == pytest.approx(14 * b / 0.1)
    assert r.wait_s == pytest.approx([0.0, 0.06])


@pytest.mark.parametrize("plan", ["shard", "pool"])
def test_fedavg_with_fraction_one_is_localsgd_with_the_equivalent_period(plan):
    n, b, H, per_epoch = 4, 32, 4, 10
    N = n * b * H * per_epoch  # shard: 40 steps per epoch, 10 aggregations = every 4 steps; pool: 10 rounds
    t = step_times("speeds:1,1,1,0.5+random:4", n, 200, seed=2)
    net, w = Network.from_spec(n, "2x2"), Workload(batch_size=b, host_ms=1.0)
    ls = local.simulate(t, net, w, protocol="localsgd", period=H, data_plan=plan, samples_per_epoch=N)
    fa = local.simulate(t, net, w, protocol="fedavg", fraction=1.0, syncs_per_epoch=float(per_epoch),
                        data_plan=plan, samples_per_epoch=N)
    assert fa.samples_per_s == pytest.approx(ls.samples_per_s, rel=1e-12)
    assert fa.rounds == ls.rounds > 0 and fa.steps == ls.steps
    # a fraction changes who is averaged, not who waits: the masked allreduce is a barrier for all ranks
    half = local.simulate(t, net, w, protocol="fedavg", fraction=0.5, syncs_per_epoch=float(per_epoch),
                          data_plan=plan, samples_per_epoch=N)
    assert half.contributors_per_round == 2.0 and half.extra["payload_bytes"] == fa.extra["payload_bytes"] + 4
    assert half.samples_per_s == pytest.approx(fa.samples_per_s, rel=1e-3)


def test_selsync_flag_exchange_is_a_barrier_every_step():
    n, K, b = 4, 300, 32
    t = step_times("speeds:1,1,1,0.5+netdelay:7", n, K)
    net, w = Network.from_spec(n, "4x1"), Workload(batch_size=b)
    flag = net.allreduce_s(4 + 4 * n) * 1e3
    avg = net.allreduce_s(w.model_bytes + 4 * n) * 1e3 + 7.0
    r = local.simulate(t, net, w, protocol="selsync", sync_fraction=0.2, seed=5)
    syncs = r.rounds
    assert syncs == round(r.extra["sync_fraction"] * K) and 30 < syncs < 90
    assert r.duration_s == pytest.approx((K * (80.0 + flag) + syncs * avg) / 1e3, rel=1e-12)
    # no synchronization but the first step: still the slow rank's pace (the flag allreduce)
    never = local.simulate(t, net, w, protocol="selsync", delta=math.inf)
    assert never.rounds == 1
    assert never.samples_per_s == pytest.approx(n * b * K / ((K * (80.0 + flag) + avg) / 1e3), rel=1e-12)
    # delta 0 synchronizes every step; gradient aggregation sends no flag vector with the gradients
    bspish = local.simulate(t, net, w, protocol="selsync", delta=0.0, aggregation="gradient")
    ga = net.allreduce_s(w.model_bytes) * 1e3 + 7.0
    assert bspish.rounds == K and bspish.duration_s == pytest.approx(K * (80.0 + flag + ga) / 1e3, rel=1e-12)
    # the default fraction is the measured LSSR at delta 0.3: 0.5 % of the steps
    assert local.simulate(t, net, w, protocol="selsync").extra["sync_fraction_given"] == 0.005
    assert local.selsync_sync_fraction(0.1) == pytest.approx(0.069) and local.selsync_sync_fraction(0) == 1.0


def test_registry_reaches_the_three_protocols():
    t = step_times("device:40", 4, 50)
    net, w = Network.from_spec(4, "2x2"), Workload()
    for name in ("localsgd", "fedavg", "selsync"):
        r = registry.simulate(name, t, net, w)
        assert r.protocol == name and r.workers == 4 and r.samples_per_s > 0


def test_bad_configuration_is_refused_with_the_allowed_names():
    t = step_times("device:40", 4, 20)
    net, w = Network.from_spec(4, "2x2"), Workload()
    with pytest.raises(ValueError, match=r"unknown timing parameter\(s\) backup_workers; allowed: average_at_end, "
                                         r"data_plan, period, samples_per_epoch"):
        local.simulate(t, net, w, protocol="localsgd", backup_workers=1)
    with pytest.raises(ValueError, match="allowed: .*fraction.*syncs_per_epoch"):
        local.simulate(t, net, w, protocol="fedavg", period=3)
    with pytest.raises(ValueError, match="models protocols fedavg, localsgd, selsync"):
        local.simulate(t, net, w, protocol="bsp")
    with pytest.raises(ValueError, match="period must be an int H >= 1"):
        local.simulate(t, net, w, protocol="localsgd", period=0)
    with pytest.raises(ValueError, match="data_plan must be 'pool' or 'shard'"):
        local.simulate(t, net, w, protocol="localsgd", data_plan="stream")
    with pytest.raises(ValueError, match=r"fraction must be a float C in \(0, 1\]"):
        local.simulate(t, net, w, protocol="fedavg", fraction=0.0)
    with pytest.raises(ValueError, match=r"sync_fraction must be a float in \[0, 1\]"):
        local.simulate(t, net, w, protocol="selsync", sync_fraction=1.5)
    with pytest.raises(ValueError, match="delta=0.0 fixes the sync fraction"):
        local.simulate(t, net, w, protocol="selsync", delta=0.0, sync_fraction=0.5)
    with pytest.raises(ValueError, match="data injection"):
        local.simulate(t, net, w, protocol="selsync", alpha=0.5, beta=0.5)
    with pytest.raises(ValueError, match="no full batch"):
        local.simulate(t, net, w, protocol="fedavg", data_plan="shard", samples_per_epoch=100)
    with pytest.raises(ValueError, match="step times are for 4 ranks but the network has 8"):
        local.simulate(t, Network.from_spec(8, "4x2"), w, protocol="localsgd")


def test_1024_ranks_200_steps_is_fast():
    n, K = 1024, 200
    t = step_times("random:6", n, K)
    net, w = Network.from_spec(n, "128x8"), Workload()
    for name, cfg in (("localsgd", {}), ("localsgd", {"data_plan": "shard"}), ("fedavg", {"syncs_per_epoch": 4.0}),
                      ("selsync", {})):
        t0 = time.perf_counter()
        r = local.simulate(t, net, w, protocol=name, **cfg)
        elapsed = time.perf_counter() - t0
        assert elapsed < 15.0, (name, cfg, elapsed)
        assert r.samples_per_s > 0 and len(r.steps) == n
