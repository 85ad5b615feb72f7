"""Hop's and NOTIFY-ACK's cluster timing model (hetsync.sim.hop.simulate_cluster): the vectorized recurrence
against the event models, closed forms without heterogeneity, a deterministic straggler, the token bound, scale."""
import math
import time

import numpy as np
import pytest

from hetsync.protocols.hop import graph as hop_graph
from hetsync.sim import hop, network, registry, workload


def _free(n):
    """A network with no communication cost at all."""
    return network.Network((n,), (math.inf,), alpha_s=0.0, local_alpha_s=0.0, local_bytes_per_s=math.inf)


def _const(n, K, ms):
    return workload.StepTimes(np.full((K, n), float(ms)))


MODES = [("standard", {}), ("backup", {"backup_workers": 1}), ("staleness", {"staleness": 2})]


@pytest.mark.parametrize("mode,kw", MODES)
def test_recurrence_equals_the_rule_event_model_without_communication(mode, kw):
    n, K = 8, 300
    g = hop_graph.build("ring-based", n)
    t = hop.step_times("random", n, K, seed=3)
    old = hop.simulate(g, t, mode=mode, backup_workers=kw.get("backup_workers", 1),
                       staleness=kw.get("staleness", 5), max_ig=4)
    r = hop.simulate_cluster(workload.StepTimes(t), _free(n), workload.Workload(), protocol="hop",
                             graph="ring-based", max_ig=4, **kw)
    assert r.extra["finish_ms"] == old["finish_ms"]
    assert r.extra["max_gap"] == old["max_gap_out"]
    assert r.extra["iterations_per_s"] == pytest.approx(old["iterations_per_s"], rel=1e-12)
    assert r.extra["engine"] == "recurrence"


@pytest.mark.parametrize("mode,kw", MODES)
def test_recurrence_equals_the_heap_event_model_with_communication(mode, kw):
    n, K = 8, 200
    g = hop_graph.build("ring-based", n)
    t = hop.step_times("random", n, K, base_ms=20.0, seed=5)
    links = hop.link_model(g, network.Network.from_spec(n, "4x2", "1gbit"), 407_080)
    rec = hop.recurrence(g, t, links, mode=mode, host_ms=1.5, max_ig=3, **kw)
    ev = hop.event_model(g, t, links, mode=mode, host_ms=1.5, max_ig=3, suppress=False, **kw)
    np.testing.assert_allclose(rec["E"], ev["E"], rtol=1e-12, atol=1e-6)
    np.testing.assert_allclose(rec["S"][:K], ev["S"][:K], rtol=1e-12, atol=1e-6)
    assert rec["max_gap"] == ev["max_gap"] <= 3


@pytest.mark.parametrize("protocol,cfg", [("hop", {}), ("hop", {"backup_workers": 1}), ("hop", {"staleness": 3}),
                                          ("hop", {"backup_workers": 1, "skip": 2}), ("notifyack", {})])
def test_no_heterogeneity_and_a_free_network_give_n_b_over_T(protocol, cfg):
    n, K, T, host, b = 8, 50, 40.0, 2.0, 32
    r = hop.simulate_cluster(_const(n, K, T), _free(n), workload.Workload(batch_size=b, host_ms=host),
                             protocol=protocol, graph="ring-based", **cfg)
    assert r.samples_per_s == pytest.approx(n * b / ((T + host) / 1e3), rel=1e-12)
    assert r.steps == [K] * n and r.rounds == K and r.duration_s == pytest.approx(K * (T + host) / 1e3)
    assert max(r.wait_s) == pytest.approx(0.0, abs=1e-9)


def test_notifyack_pays_the_exchange_every_iteration_in_closed_form():
    # one host: every message goes through shared memory. Ring(4): rank i sends to its out-neighbours in order
    # (0 -> 1, 3; 1 -> 0, 2; 2 -> 1, 3; 3 -> 0, 2), so ranks 2 and 3 get both updates second, ranks 0 and 1 first:
    # the period is T + host + 2 m / B + alpha, and ranks 0 and 1 end iteration k m / B earlier. The window ends
    # when ranks 0 and 1 end iteration K - 1, with ranks 2 and 3 one step short.
    n, K, T, host, m, b = 4, 40, 10.0, 1.0, 5_000_000, 32
    net = network.Network.from_spec(n, None)
    r = hop.simulate_cluster(_const(n, K, T), net, workload.Workload(m, b, host), protocol="notifyack")
    one = m / net.local_bytes_per_s * 1e3
    period = T + host + 2 * one + net.local_alpha_s * 1e3
    assert r.steps == [K, K, K - 1, K - 1]
    assert r.duration_s == pytest.approx((K * period - one) / 1e3, rel=1e-12)
    assert r.samples_per_s == pytest.approx((4 * K - 2) * b / (K * period - one) * 1e3, rel=1e-12)
    # Hop sends at entry, so the same exchange overlaps the compute: the device sets the pace
    h = hop.simulate_cluster(_const(n, K, T), net, workload.Workload(m, b, host), protocol="hop")
    assert h.samples_per_s == pytest.approx(n * b / (T + host) * 1e3, rel=0.01)


def test_a_slow_shared_link_paces_hop_at_the_senders_occupancy():
    # 2 hosts x 2 ranks, ring(4): each rank sends one update to the other host over a link shared by 2 ranks
    # (B / 2 each) and one within its host; 1 ms of compute, so the sender (m / (B / 2) + m / B_local) sets the pace.
    n, K, m, b = 4, 200, 1_000_000, 32
    net = network.Network.from_spec(n, "2x2", "100mbit")
    links = hop.link_model(hop_graph.build("ring", n), net, m)
    remote = m / (100e6 / 8 / 2) * 1e3
    local = m / net.local_bytes_per_s * 1e3
    assert sorted(links["svc_ms"][0]) == pytest.approx(sorted([remote, local]))
    r = hop.simulate_cluster(_const(n, K, 1.0), net, workload.Workload(m, b), protocol="hop", max_ig=2)
    assert r.samples_per_s == pytest.approx(n * b / (remote + local) * 1e3, rel=0.02)
    # messages that reach 0.6 of the link's rate occupy the sender 1 / 0.6 as long between hosts, not within one
    slow = network.Network.from_spec(n, "2x2", "100mbit", p2p_efficiency=0.6)
    assert sorted(hop.link_model(hop_graph.build("ring", n), slow, m)["svc_ms"][0]) == pytest.approx(
        sorted([remote / 0.6, local]))
    r = hop.simulate_cluster(_const(n, K, 1.0), slow, workload.Workload(m, b), protocol="hop", max_ig=2)
    assert r.samples_per_s == pytest.approx(n * b / (remote / 0.6 + local) * 1e3, rel=0.02)


def test_a_deterministic_straggler_bounds_standard_hop_but_not_backup_workers():
    # ring-based(8), rank 7 four times slower. Standard Hop: E_i(k) >= S_7(k - dist(7 -> i) + 1) and rank 7
    # never waits, so the window lies in [(K - D) T_s, K T_s] (D the diameter) and every rank ends at least
    # K - D steps: n b (K - D) / (K T_s) <= samples/s <= n b K / ((K - D) T_s).
    n, K, base, b = 8, 200, 10.0, 32
    g = hop_graph.build("ring-based", n)
    D = int(g.distances().max())
    st = workload.StepTimes(hop.step_times("deterministic", n, K, base_ms=base))
    Ts = 4 * base
    work = workload.Workload(batch_size=b)
    std = hop.simulate_cluster(st, _free(n), work, graph="ring-based", max_ig=20)
    lo, hi = n * b * (K - D) / (K * Ts) * 1e3, n * b * K / ((K - D) * Ts) * 1e3
    assert lo <= std.samples_per_s <= hi
    # backup workers: the straggler's out-neighbours do not wait for its updates, only (max_ig ahead) its tokens
    bw = hop.simulate_cluster(st, _free(n), work, graph="ring-based", max_ig=20, backup_workers=1)
    assert bw.samples_per_s > hi and bw.extra["max_gap"] == 20
    # skipping: the straggler jumps, so the others stop waiting for its tokens
    sk = hop.simulate_cluster(st, _free(n), work, graph="ring-based", max_ig=20, backup_workers=1, skip=10)
    assert sk.samples_per_s > 2 * hi and sk.extra["iterations_skipped"] > 0 and sk.extra["engine"] == "event"


@pytest.mark.parametrize("cfg", [{"backup_workers": 1}, {"staleness": 4}, {"backup_workers": 1, "skip": 3}])
def test_the_iteration_gap_to_out_neighbours_stays_within_max_ig(cfg):
    n, K = 8, 300
    st = workload.step_times("device:20+random:6", n, K, seed=2)
    net = network.Network.from_spec(n, "4x2", "1gbit")
    r = hop.simulate_cluster(st, net, workload.Workload(), graph="ring-based", max_ig=3, **cfg)
    assert 1 <= r.extra["max_gap"] <= 3


def test_the_registry_runs_both_protocols_and_netdelay_is_not_added():
    n = 8
    st = workload.step_times("device:40+random:6+netdelay:50", n, 60, seed=1)
    net = network.Network.from_spec(n, "4x2", "10gbit")
    hop_r = registry.simulate("hop", st, net, workload.Workload(), graph="ring-based", backup_workers=1)
    na = registry.simulate("notifyack", st, net, workload.Workload(), graph="ring-based")
    assert hop_r.protocol == "hop" and na.protocol == "notifyack"
    assert hop_r.samples_per_s > na.samples_per_s > 0
    assert hop_r.extra["sync_latency_ms_ignored"] == 50.0
    assert len(hop_r.steps) == len(hop_r.wait_s) == n and hop_r.contributors_per_round <= 4


def test_bad_configurations_raise_clear_errors():
    n = 8
    st, net, w = _const(n, 5, 10.0), _free(n), workload.Workload()
    with pytest.raises(ValueError, match="unknown parameter.*period.*allowed: graph, backup_workers"):
        hop.simulate_cluster(st, net, w, period=3)
    with pytest.raises(ValueError, match="notifyack timing model: unknown parameter.*backup_workers"):
        hop.simulate_cluster(st, net, w, protocol="notifyack", backup_workers=1)
    with pytest.raises(ValueError, match="skip=2 needs backup_workers"):
        hop.simulate_cluster(st, net, w, skip=2)
    with pytest.raises(ValueError, match="skip <= max_ig=5"):
        hop.simulate_cluster(st, net, w, backup_workers=1, skip=6, max_ig=5)
    with pytest.raises(ValueError, match="not both"):
        hop.simulate_cluster(st, net, w, backup_workers=1, staleness=2)
    with pytest.raises(ValueError, match=r"must be < \|N_in\(i\)\|"):
        hop.simulate_cluster(st, net, w, backup_workers=3)  # ring: |N_in| = 3
    with pytest.raises(ValueError, match="max_ig must be an int >= 1"):
        hop.simulate_cluster(st, net, w, max_ig=0)
    with pytest.raises(ValueError, match="ring-based' needs an even number"):
        hop.simulate_cluster(_const(5, 5, 10.0), _free(5), w, graph="ring-based")
    with pytest.raises(ValueError, match="n = 8, the network"):
        hop.simulate_cluster(_const(4, 5, 10.0), net, w)
    with pytest.raises(ValueError, match="protocol must be"):
        hop.simulate_cluster(st, net, w, protocol="gossip")


@pytest.mark.parametrize("cfg", [{}, {"backup_workers": 1}])
def test_1024_ranks_and_200_iterations_take_under_15_seconds(cfg):
    n, K = 1024, 200
    st = workload.step_times("device:40+random:6", n, K, seed=0)
    net = network.Network.from_spec(n, "128x8", "10gbit")
    t0 = time.perf_counter()
    r = hop.simulate_cluster(st, net, workload.Workload(), graph="ring-based", **cfg)
    assert time.perf_counter() - t0 < 15.0
    assert r.samples_per_s > 0 and len(r.steps) == n and r.extra["max_gap"] <= 5
