"""The task allocation timing model against closed forms."""
import math
import time

import numpy as np
import pytest

from hetsync.sim import bsp, registry, taskalloc
from hetsync.sim.network import Network
from hetsync.sim.workload import Workload, step_times

INF = math.inf


def _bytes_free(n, hosts=2):
    per = n // hosts
    return Network((per,) * hosts, (INF,) * hosts, alpha_s=25e-6, local_bytes_per_s=INF, overhead_s=0.5e-3)


def _free(n):
    return Network((n,), (INF,), alpha_s=0.0, local_alpha_s=0.0, local_bytes_per_s=INF, overhead_s=0.0)


@pytest.mark.parametrize("mode", ["static", "adaptive"])
def test_homogeneous_cluster_is_bsp(mode):
    t = step_times("device:40", 4, 200)
    w = Workload(host_ms=1.0)
    net = _bytes_free(4)
    r = taskalloc.simulate(t, net, w, mode=mode)
    ref = bsp.simulate(t, net, w)
    assert r.samples_per_s == pytest.approx(ref.samples_per_s, rel=1e-12)
    assert r.extra["batches"] == [32] * 4 and r.rounds == 200
    # a shaped link: the allreduce also carries m_i and the [n] flags (20 bytes more)
    shaped = Network.from_spec(4, "4x1", link="1gbit")
    assert taskalloc.simulate(t, shaped, w, mode=mode).samples_per_s == pytest.approx(
        bsp.simulate(t, shaped, w).samples_per_s, rel=1e-4)


def test_adaptive_allocation_on_fixed_speeds_reaches_the_sum_of_rates():
    n, b = 4, 32
    t = step_times("speeds:1,1,1,0.5", n, 200)
    w = Workload(batch_size=b)
    rates = 3.5 * b / 40.0 * 1e3
    r = taskalloc.simulate(t, _free(n), w, mode="adaptive")
    # C = n b = 128 single samples, eq. (10) with the speeds 0.8 : 0.8 : 0.8 : 0.4 samples/ms, largest remainders
    assert r.extra["batches"] == [37, 37, 36, 18] and r.extra["micro_batch"] == 1 and r.extra["stable"]
    # the round lasts max(37 x 40 / 32, 18 x 80 / 32) = 46.25 ms for 128 samples: within rounding of the rates
    assert r.samples_per_s == pytest.approx(128 / 46.25e-3, rel=1e-12)
    assert r.samples_per_s == pytest.approx(rates, rel=0.02)
    assert r.extra["first_epoch_samples_per_s"] == pytest.approx(n * b / 80e-3)
    # the exact weights 2 : 2 : 2 : 1 (micro-batches of 18 samples) balance the round exactly
    exact = taskalloc.simulate(t, _free(n), w, weights=[2, 2, 2, 1])
    assert exact.extra["batches"] == [36, 36, 36, 18]
    assert exact.samples_per_s == pytest.approx(rates, rel=1e-12)


def test_static_weights_closed_form_with_network_and_epoch_exchange():
    n, b, K = 4, 32, 200
    t = step_times("speeds:1,1,1,0.5+netdelay:3", n, K)
    net, w = Network.from_spec(n, "2x2", link="1gbit"), Workload(batch_size=b, host_ms=2.0)
    N = 10 * 4 * 24  # 4 ranks x 3 micro-batches of 8 samples: 96 samples per round, 10 rounds per epoch
    r = taskalloc.simulate(t, net, w, weights=[3, 3, 3, 3], micro_batch=8, samples_per_epoch=N)
    comm = net.allreduce_s(w.model_bytes + 4 + 4 * n) * 1e3 + 3.0
    epoch = r.extra["epoch_exchange_ms"]
    assert r.extra["rounds_per_epoch"] == 10 and epoch > 0
    step = 24 * 80.0 / b + 2.0 + comm  # the slow rank's 24 samples
    assert r.duration_s == pytest.approx((K * step + (K // 10) * epoch) / 1e3, rel=1e-12)
    assert r.samples_per_s == pytest.approx(K * 96 / r.duration_s, rel=1e-12)


def test_random_slowdowns_cannot_be_allocated_away():
    n, b, K = 8, 32, 400
    t = step_times("random:6", n, K, seed=4)
    net, w = Network.from_spec(n, "4x2"), Workload(batch_size=b)
    rates = (b / t.mean_ms()).sum() * 1e3
    r = taskalloc.simulate(t, net, w, mode="adaptive")
    ref = bsp.simulate(t, net, w)
    # the median speed ignores the occasional slow step: (nearly) equal shares, BSP's pace
    assert max(r.extra["batches"]) - min(r.extra["batches"]) <= 2
    assert r.samples_per_s == pytest.approx(ref.samples_per_s, rel=0.05)
    assert r.samples_per_s < 0.6 * rates


def test_registry_and_bad_configuration():
    t = step_times("device:40", 4, 20)
    net, w = Network.from_spec(4, "2x2"), Workload()
    assert registry.simulate("taskalloc", t, net, w, mode="adaptive").protocol == "taskalloc"
    with pytest.raises(ValueError, match=r"unknown timing parameter\(s\) period; allowed: micro_batch, mode, "
                                         r"patience, samples_per_epoch, threshold, total, weights"):
        taskalloc.simulate(t, net, w, period=2)
    with pytest.raises(ValueError, match="mode must be 'static' or 'adaptive'"):
        taskalloc.simulate(t, net, w, mode="dynamic")
    with pytest.raises(ValueError, match="weights must be 4 ints >= 1"):
        taskalloc.simulate(t, net, w, weights=[1, 2])
    with pytest.raises(ValueError, match=r"total C=5 but the weights \[1, 1, 1, 1\] sum to 4"):
        taskalloc.simulate(t, net, w, weights=[1, 1, 1, 1], total=5)
    with pytest.raises(ValueError, match="total C=3 is smaller than the world size 4"):
        taskalloc.simulate(t, net, w, total=3)
    with pytest.raises(ValueError, match=r"threshold must be a float in \[0, 1\)"):
        taskalloc.simulate(t, net, w, threshold=1.0)
    with pytest.raises(ValueError, match="samples_per_epoch must be an int >= the world size 4"):
        taskalloc.simulate(t, net, w, samples_per_epoch=3)
    with pytest.raises(ValueError, match="step times are for 4 ranks but the network has 8"):
        taskalloc.simulate(t, Network.from_spec(8, "4x2"), w)


def test_1024_ranks_200_steps_is_fast():
    n, K = 1024, 200
    t = step_times("random:6", n, K)
    net, w = Network.from_spec(n, "128x8"), Workload()
    for cfg in ({}, {"mode": "adaptive"}, {"mode": "adaptive", "total": 4 * n}):
        t0 = time.perf_counter()
        r = taskalloc.simulate(t, net, w, **cfg)
        elapsed = time.perf_counter() - t0
        assert elapsed < 15.0, (cfg, elapsed)
        assert r.samples_per_s > 0 and len(r.extra["batches"]) == n
        assert np.sum(r.extra["weights"]) == r.extra["total"]
