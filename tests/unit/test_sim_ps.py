"""The parameter-server timing model (ASP, SHAT, SHAT-root, ENSEMBLE, SSP) against closed forms."""
import math
import time

import numpy as np
import pytest

from hetsync.sim import ps, registry
from hetsync.sim.network import Network
from hetsync.sim.workload import StepTimes, Workload, step_times

B = 32


def _free(ranks):
    """Every rank on its own host, links and copies of infinite rate, no latency: communication costs nothing."""
    return Network((1,) * ranks, (math.inf,) * ranks, alpha_s=0.0, local_alpha_s=0.0, local_bytes_per_s=math.inf)


def _independent_rate(T, host_ms):
    """Samples/s of workers that never wait: each runs its own steps until the first one ran out of draws."""
    ends = np.cumsum(T + host_ms, axis=0)
    horizon = ends[-1].min()
    return B * (ends <= horizon + 1e-9).sum() / (horizon / 1e3)


@pytest.mark.parametrize("protocol", ps.PROTOCOLS)
def test_one_worker_one_server_free_network_is_b_over_step(protocol):
    T = np.random.default_rng(0).uniform(10, 30, size=(120, 1))
    r = ps.simulate(StepTimes(T), _free(2), Workload(4000, B, 5.0), protocol=protocol)
    assert r.samples_per_s == pytest.approx(B * 120 / ((T.sum() + 120 * 5.0) / 1e3), rel=1e-12)
    assert r.steps == [120] and r.wait_s == [0.0] and r.rounds == 120 and r.staleness_mean == 0.0
    assert r.n == 2 and r.workers == 1


def test_one_worker_pays_one_push_and_one_pull_alpha_beta():
    m, rate, alpha = 1_000_000, 1.25e8, 1e-4  # 8 ms per transfer
    net = Network((1, 1), (rate, rate), alpha_s=alpha)
    r = ps.simulate(StepTimes(np.full((50, 1), 20.0)), net, Workload(m, B, 2.0), protocol="asp")
    step_ms = 20.0 + 2.0 + 2 * (alpha * 1e3 + m / rate * 1e3)
    assert r.samples_per_s == pytest.approx(B / (step_ms / 1e3), rel=1e-9)
    assert r.wait_s[0] == pytest.approx(50 * (step_ms - 22.0) / 1e3, rel=1e-9)
    assert r.extra["server_link_in_utilisation"][0] == pytest.approx((m / rate * 1e3) / step_ms, rel=1e-6)
    # pushes and pulls are point-to-point: at half the link's rate each transfer takes twice as long
    half = ps.simulate(StepTimes(np.full((50, 1), 20.0)), Network((1, 1), (rate, rate), alpha_s=alpha,
                                                                   p2p_efficiency=0.5), Workload(m, B, 2.0),
                       protocol="asp")
    assert half.samples_per_s == pytest.approx(B / ((22.0 + 2 * (alpha * 1e3 + 2 * m / rate * 1e3)) / 1e3), rel=1e-9)


def test_many_fast_workers_saturate_one_slow_server_link():
    # 8 workers on fast links, one server behind a slow link: each step moves m bytes into the server (push)
    # and m bytes out (pull); the link is full duplex, so steps/s -> rate / m (a half-duplex link: rate / (2 m))
    n, m, slow = 8, 4_000_000, 1e8
    net = Network((1,) * (n + 1), (1e10,) * n + (slow,), alpha_s=25e-6)
    r = ps.simulate(StepTimes(np.full((60, n), 1.0)), net, Workload(m, B, 0.0), protocol="asp")
    bound = B * slow / m
    assert r.samples_per_s <= bound * 1.0001
    assert r.samples_per_s == pytest.approx(bound, rel=0.01)
    assert r.extra["server_link_utilisation"][0] > 0.99
    assert r.samples_per_s > B * slow / (2 * m) * 1.9
    # staleness: 7 other workers update between a worker's pull and its next push, round robin
    assert r.staleness_mean == pytest.approx(n - 1, abs=0.1)
    assert sum(r.wait_s) > 0.9 * n * r.duration_s


def test_a_server_takes_one_push_at_a_time_and_its_clear_to_send_queues_behind_its_replies():
    # 6 fast workers, one server behind a slow link: the server's receive thread takes one push at a time, so the
    # next push's bytes start once the one before arrived (alpha after its last byte) and, with a link queue, once
    # the server's clear-to-send got out past the reply it is sending: q + m / rate + alpha per push (closed form)
    n, m, slow, alpha = 6, 4_000_000, 1e8, 1e-3
    d_ms = m / slow * 1e3
    times = StepTimes(np.full((80, n), 1.0))

    def net(q):
        return Network((1,) * (n + 1), (1e10,) * n + (slow,), alpha_s=alpha, link_queue_s=(0.0,) * n + (q,))

    plain = ps.simulate(times, net(0.0), Workload(m, B), protocol="asp")
    assert plain.samples_per_s == pytest.approx(B / ((d_ms + alpha * 1e3) / 1e3), rel=0.01)
    queued = ps.simulate(times, net(5e-3), Workload(m, B), protocol="asp")
    assert queued.samples_per_s == pytest.approx(B / ((5.0 + d_ms + alpha * 1e3) / 1e3), rel=0.01)
    # the server's downlink idles while a push's handshake waits: busy d / (q + d + alpha) of the time
    assert queued.extra["server_link_in_utilisation"][0] == pytest.approx(d_ms / (5.0 + d_ms + 1.0), rel=0.02)
    # a lone worker's messages never meet a busy link: the queue costs it nothing
    one = [ps.simulate(StepTimes(np.full((50, 1), 20.0)), Network((1, 1), (slow, slow), alpha_s=alpha,
                                                                   link_queue_s=(q, q)), Workload(m, B),
                       protocol="asp").samples_per_s for q in (0.0, 5e-3)]
    assert one[1] == pytest.approx(one[0], rel=1e-12)
    with pytest.raises(ValueError, match="link_queue_s"):
        Network((1, 1), (slow, slow), link_queue_s=(0.0,))
    with pytest.raises(ValueError, match="link_queue_s"):
        Network((1, 1), (slow, slow), link_queue_s=(0.0, -1.0))


def test_memory_sharding_beats_layer_sharding_when_one_layer_holds_most_bytes():
    n, m, slow = 8, 4_000_000, 1e8
    net = Network((1,) * (n + 2), (1e10,) * n + (slow, slow), alpha_s=25e-6)
    times = StepTimes(np.full((60, n), 1.0))
    layers = [int(m * 0.9), m - int(m * 0.9)]  # a big kernel and the rest
    mem = ps.simulate(times, net, Workload(m, B), protocol="shat", servers=2, sharding="memory", layer_bytes=layers)
    lay = ps.simulate(times, net, Workload(m, B), protocol="shat", servers=2, sharding="layer", layer_bytes=layers)
    assert mem.extra["bytes_per_server"] == [m // 2, m // 2]
    assert lay.extra["bytes_per_server"] == layers
    assert mem.samples_per_s == pytest.approx(B * slow / (m / 2), rel=0.01)
    assert lay.samples_per_s == pytest.approx(B * slow / (0.9 * m), rel=0.01)
    assert mem.samples_per_s > 1.7 * lay.samples_per_s
    # without layer sizes the layers are K equal variables: layer-wise equals memory-wise
    eq = ps.simulate(times, net, Workload(m, B), protocol="shat", servers=2, sharding="layer")
    assert eq.samples_per_s == pytest.approx(mem.samples_per_s, rel=1e-12)


def test_plan_shard_bytes_follows_the_implementation_rule():
    assert ps.plan_shard_bytes(40, 3, "memory") == [16, 12, 12]
    assert ps.plan_shard_bytes(100, 2, "layer", [10, 20, 30, 40]) == [30, 70]
    assert ps.plan_shard_bytes(100, 3, "layer", [10, 20, 30, 40]) == [30, 30, 40]


def test_ssp_with_staleness_zero_is_a_barrier_per_step():
    n, K, host = 6, 80, 3.0
    T = step_times("random:4+speeds:1,1,1,1,1.5,2", n, K, step_ms=20.0, seed=3).ms
    r = ps.simulate(StepTimes(T), _free(n + 1), Workload(4000, B, host), protocol="ssp", staleness=0)
    bsp_ms = (T.max(axis=1) + host).sum()
    assert r.samples_per_s == pytest.approx(n * B * K / (bsp_ms / 1e3), rel=1e-12)
    assert r.steps == [K] * n and r.extra["gate_max_lead"] == 0
    np.testing.assert_allclose(r.wait_s, ((T.max(axis=1)[:, None] - T).sum(axis=0)) / 1e3, rtol=1e-9, atol=1e-12)


def test_ssp_bounds_the_lead_and_a_large_bound_is_asp():
    n, K = 4, 200
    T = np.tile([10.0, 10.0, 10.0, 25.0], (K, 1))
    r1 = ps.simulate(StepTimes(T), _free(n + 1), Workload(4000, B), protocol="ssp", staleness=2)
    assert r1.extra["gate_max_lead"] == 2 and r1.extra["gate_held_replies"] > 0
    # steady state: everyone runs at the slow worker's rate, fast ones at most s iterations ahead
    assert r1.samples_per_s == pytest.approx(n * B / 0.025, rel=0.03)
    big = ps.simulate(StepTimes(T), _free(n + 1), Workload(4000, B), protocol="ssp", staleness=10 ** 6)
    asp = ps.simulate(StepTimes(T), _free(n + 1), Workload(4000, B), protocol="asp")
    assert big.samples_per_s == pytest.approx(asp.samples_per_s, rel=1e-12)
    assert big.extra["gate_held_replies"] == 0


@pytest.mark.parametrize("protocol", ["ensemble", "asp", "shat", "shatroot"])
def test_free_network_throughput_is_the_sum_of_the_workers_rates(protocol):
    n, K, host = 5, 300, 2.0
    T = np.tile([10.0, 12.0, 15.0, 20.0, 40.0], (K, 1))
    r = ps.simulate(StepTimes(T), _free(n + 1), Workload(4000, B, host), protocol=protocol)
    assert r.samples_per_s == pytest.approx(_independent_rate(T, host), rel=1e-12)
    assert r.samples_per_s == pytest.approx(B * (1e3 / (T[0] + host)).sum(), rel=0.01)
    assert sum(r.wait_s) == 0.0


def test_ensemble_is_timed_like_asp_because_it_still_pushes_and_pulls():
    n, m = 4, 2_000_000
    net = Network.from_spec(n + 1, f"{n + 1}x1", "1gbit")
    T = step_times("random:3", n, 100, step_ms=20.0, seed=1)
    ens = ps.simulate(T, net, Workload(m, B), protocol="ensemble")
    asp = ps.simulate(T, net, Workload(m, B), protocol="asp")
    assert ens.samples_per_s == pytest.approx(asp.samples_per_s, rel=1e-12)
    assert ens.staleness_mean == 0.0 and asp.staleness_mean > 0
    assert ens.samples_per_s < 0.9 * _independent_rate(T.ms, 0.0)


def test_server_ms_serialises_pushes_at_the_server():
    n = 4
    T = StepTimes(np.full((100, n), 1.0))
    r = ps.simulate(T, _free(n + 1), Workload(4000, B), protocol="asp", server_ms=5.0)
    assert r.samples_per_s == pytest.approx(B / 0.005, rel=0.02)


def test_registry_reaches_the_model_and_shared_host_uses_the_local_path():
    net = Network.from_spec(4, "2x2", "10gbit")  # workers 0, 1 | worker 2 + the server
    T = step_times("device:30", 3, 50)
    r = registry.simulate("shat", T, net, Workload(), servers=1, log_base=2.0, timeout_s=10.0)
    assert r.protocol == "shat" and r.workers == 3 and r.n == 4 and r.rounds > 0
    assert len(r.extra["server_link_utilisation"]) == 1


def test_bad_input_raises_clear_errors():
    T = StepTimes(np.full((10, 3), 10.0))
    net = Network.from_spec(4, "4x1")
    with pytest.raises(ValueError, match=r"3 workers\) and servers=2, so the launch has 5 ranks, but the network "
                                         r"has 4"):
        ps.simulate(T, net, Workload(), servers=2)
    with pytest.raises(ValueError, match="unknown parameter.*staleness.*allowed:.*servers"):
        ps.simulate(T, net, Workload(), protocol="asp", staleness=1)
    with pytest.raises(ValueError, match="unknown parameter.*period"):
        ps.simulate(T, net, Workload(), protocol="ssp", period=4)
    with pytest.raises(ValueError, match="staleness must be an int >= 0"):
        ps.simulate(T, net, Workload(), protocol="ssp", staleness=-1)
    with pytest.raises(ValueError, match="times asp, shat"):
        ps.simulate(T, net, Workload(), protocol="bsp")
    with pytest.raises(ValueError, match="sharding must be 'layer' or 'memory'"):
        ps.simulate(T, net, Workload(), sharding="rows")
    with pytest.raises(ValueError, match="servers must be an int >= 1"):
        ps.simulate(T, Network.from_spec(3, "3x1"), Workload(), servers=0)
    with pytest.raises(ValueError, match="adding up to model_bytes=400"):
        ps.simulate(T, net, Workload(400, 8), sharding="layer", layer_bytes=[100, 100])
    with pytest.raises(ValueError, match="more servers than parameters"):
        ps.plan_shard_bytes(400, 3, "layer", [200, 200])
    with pytest.raises(ValueError, match="server_ms must be"):
        ps.simulate(T, net, Workload(), server_ms=-1.0)


def test_scale_1024_workers_200_steps():
    n = 1024
    T = step_times("random:6", n, 200, seed=2)
    net = Network.from_spec(n + 1, f"{n + 1}x1", "10gbit")
    t0 = time.perf_counter()
    r = ps.simulate(T, net, Workload(), protocol="ssp", staleness=3)
    elapsed = time.perf_counter() - t0
    assert elapsed < 15.0, f"{elapsed:.1f} s"
    assert r.samples_per_s > 0 and r.extra["gate_max_lead"] <= 3 and len(r.steps) == n
