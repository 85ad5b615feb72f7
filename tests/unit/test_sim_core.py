"""The simulator's shared parts (network, step times, BSP, RNA, time to target): closed-form cases."""
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest

from hetsync.sim import bsp, network, registry, rna, target, workload


def test_ring_allreduce_time_is_the_alpha_beta_formula():
    net = network.Network.from_spec(8, hosts="4x2", link="10gbit", latency_ms=0.1, overhead_ms=1.0)
    m = 7_500_000
    beta = 10e9 / 8
    want = 1e-3 + 2 * 7 * 1e-4 + 2 * 7 / 8 * m / beta
    assert net.allreduce_s(m) == pytest.approx(want, rel=1e-12)
    # the slowest link sets the ring's bandwidth; one rank pays nothing
    slow = network.Network.from_spec(8, hosts="4x2", link="10gbit", host_links=["h2=2.5gbit"], latency_ms=0.1,
                                     overhead_ms=1.0)
    assert slow.allreduce_s(m) == pytest.approx(1e-3 + 2 * 7 * 1e-4 + 2 * 7 / 8 * m / (2.5e9 / 8), rel=1e-12)
    assert net.allreduce_s(m, ranks=[3]) == 0.0
    # within one host: shared memory
    assert net.p2p_s(1000, 0, 1) == pytest.approx(net.local_alpha_s + 1000 / net.local_bytes_per_s)
    assert net.p2p_s(1000, 0, 2) == pytest.approx(1e-4 + 1000 / beta)


def test_point_to_point_messages_between_hosts_reach_the_efficiency_times_the_rate():
    net = network.Network.from_spec(8, hosts="4x2", link="10gbit", latency_ms=0.1, overhead_ms=1.0,
                                    p2p_efficiency=0.5)
    full = network.Network.from_spec(8, hosts="4x2", link="10gbit", latency_ms=0.1, overhead_ms=1.0)
    beta = 10e9 / 8
    assert net.p2p_s(1000, 0, 2) == pytest.approx(1e-4 + 1000 / (0.5 * beta))
    assert net.p2p_s(1000, 0, 1) == full.p2p_s(1000, 0, 1)  # shared memory within a host
    assert net.allreduce_s(7_500_000) == full.allreduce_s(7_500_000)  # collectives keep the full rate
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p2p_efficiency"):
            network.Network.from_spec(4, hosts="2x2", p2p_efficiency=bad)


def test_hosts_syntax_and_bad_input():
    assert network.parse_hosts("h0:2,h1:2,h2:1") == (2, 2, 1)
    assert network.parse_hosts("3x4") == (4, 4, 4)
    assert network.parse_hosts(None, 5) == (5,)
    with pytest.raises(ValueError, match="np is 5"):
        network.parse_hosts("2x2", 5)
    with pytest.raises(ValueError, match="h0, h1"):
        network.parse_hosts("a:2,b:2")
    with pytest.raises(ValueError, match="does not parse"):
        network.Network.from_spec(4, hosts="2x2", link="fast")
    with pytest.raises(ValueError, match="no host 'h7'"):
        network.Network.from_spec(4, hosts="2x2", host_links=["h7=1gbit"])


def test_step_times_follow_the_scenario():
    t = workload.step_times("device:40+speeds:1,1,1,0.5", 4, 10)
    assert np.all(t.ms[:, :3] == 40.0) and np.all(t.ms[:, 3] == 80.0)
    r = workload.step_times("device:40+random:6", 8, 20000, seed=3)
    assert set(np.unique(r.ms)) == {40.0, 240.0}
    assert (r.ms == 240.0).mean() == pytest.approx(1 / 8, abs=0.01)
    u = workload.step_times("uniform:0:50+netdelay:20", 2, 1000, step_ms=10)
    assert u.ms.min() >= 10 and u.ms.max() <= 60 and u.sync_latency_ms == 20.0
    with pytest.raises(ValueError, match="faults"):
        workload.step_times("device:40+kill:1:5", 4, 10)
    with pytest.raises(ValueError):
        workload.step_times("device:40+speeds:1,2", 4, 10)


def test_bsp_efficiency_under_fixed_speeds_is_n_min_over_sum():
    speeds = [1.0, 1.0, 0.5, 0.25]
    n, b = 4, 32
    t = workload.step_times("device:40+speeds:" + ",".join(map(str, speeds)), n, 100)
    free = network.Network((n,), (math.inf,), local_alpha_s=0.0, local_bytes_per_s=math.inf, overhead_s=0.0)
    r = bsp.simulate(t, free, workload.Workload(batch_size=b))
    solo = sum(b / (40.0 * max(speeds) / v) * 1e3 for v in speeds)  # each rank alone, samples/s
    assert r.samples_per_s / solo == pytest.approx(n * min(speeds) / sum(speeds), rel=1e-12)
    assert r.wait_s[0] == pytest.approx(100 * (160 - 40) / 1e3)


def test_rna_without_heterogeneity_runs_bsps_step_count():
    n, K = 4, 200
    t = workload.step_times("device:40", n, K)
    net = network.Network.from_spec(n)
    w = workload.Workload(host_ms=1.0)
    r = rna.simulate(t, net, w)
    b = bsp.simulate(t, net, w)
    assert r.steps == [K] * n == b.steps
    # compute never waits: exactly the sum of the ranks' own rates
    assert r.samples_per_s == pytest.approx(n * 32 / 41e-3)
    assert r.samples_per_s > b.samples_per_s


def test_rna_rounds_take_what_is_pending_and_drop_beyond_max_staleness():
    # one rank 10x faster than the other: the round waits for nothing, the fast rank piles up steps
    t = workload.StepTimes(np.column_stack([np.full(400, 4.0), np.full(400, 40.0)]))
    slow_net = network.Network((2,), (math.inf,), local_alpha_s=0.0, local_bytes_per_s=1e6, overhead_s=0.0)
    w = workload.Workload(model_bytes=100_000, batch_size=1)
    r = rna.simulate(t, slow_net, w, max_staleness=2, average_every=0)
    # each round's allreduce takes 2 * 1/2 * 100 kB / 1 MB/s = 100 ms: about 25 fast steps per round, 3 kept
    assert r.extra["dropped"] > 0.8 * sum(r.steps[:1])
    assert 1.0 <= r.contributors_per_round <= 2.0


def test_rna_waiting_for_its_round_pays_one_round_per_step_and_never_a_stragglers_step():
    # equal devices, no latency: every round takes all n gradients, so a step lasts T + host + the round
    n, K, T, host, red = 4, 50, 10.0, 1.0, 2.0
    loop = rna.wait_loop(np.full((K, n), T), host, lambda r: red)
    assert loop["horizon_ms"] == pytest.approx(K * (T + host) + (K - 1) * red)
    assert loop["rounds"] == K - 1 and (loop["contributors"] == n).all()
    assert loop["wait_ms"] == pytest.approx([(K - 1) * red] * n)
    # a rank 3x slower: each rank's period is its own step plus one round; the fast one never waits for it
    loop = rna.wait_loop(np.tile([10.0, 30.0], (20, 1)), 0.0, lambda r: 2.0)
    assert loop["ends"][:3, 0].tolist() == [10.0, 22.0, 34.0] and loop["ends"][:3, 1].tolist() == [30.0, 62.0, 94.0]
    # two message latencies between the first write and the round's start
    loop = rna.wait_loop(np.full((3, 2), 10.0), 0.0, lambda r: 2.0, alpha_ms=0.5)
    assert loop["ends"][:, 0].tolist() == [10.0, 23.0, 36.0]


def test_rna_with_a_wait_lag_overlaps_the_round_with_the_next_step():
    # equal devices, no latency, lag 1: step k + 1 starts at max(write k, publication of step k - 1's round).
    # Round r takes every rank's step r (written at r (T + h) when the round is shorter than a step) and is
    # published `red` later: the compute never waits and each round carries one gradient per rank.
    n, K, T, host, red = 3, 40, 10.0, 1.0, 4.0
    loop = rna.wait_loop(np.full((K, n), T), host, lambda r: red, lag=1)
    assert loop["ends"][:, 0].tolist() == [(k + 1) * (T + host) for k in range(K)]
    assert loop["wait_ms"] == pytest.approx([0.0] * n) and (loop["contributors"] == n).all()
    # a round longer than a step: lag 1 holds each step until the round of the step before is out,
    # so every period is one round (T + h < red), against T + h + red with lag 0
    red = 25.0
    lag1 = rna.wait_loop(np.full((K, n), T), host, lambda r: red, lag=1)
    lag0 = rna.wait_loop(np.full((K, n), T), host, lambda r: red)
    assert lag0["horizon_ms"] == pytest.approx(K * (T + host) + (K - 1) * red)
    period = np.diff(lag1["ends"][K // 2:, 0])
    assert period == pytest.approx(np.full(period.size, red))  # steady state: one round per step
    assert lag1["horizon_ms"] < 0.75 * lag0["horizon_ms"]
    assert (lag1["contributors"] <= 2 * n).all() and (lag1["contributing_ranks"] <= n).all()
    # through the registry: the lag is counted as staleness, never more than wait_lag gradients late
    t = workload.step_times("device:10", n, K)
    net = network.Network((n,), (math.inf,), alpha_s=0.0, local_alpha_s=0.0, local_bytes_per_s=1e9, overhead_s=0.0)
    w = workload.Workload(model_bytes=4_000_000, host_ms=0.0)  # a round (about 5 ms) shorter than a step
    lagged = registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round=True, wait_lag="1")
    assert lagged.samples_per_s == pytest.approx(n * 32 / 10e-3) and lagged.staleness_mean == 0.0
    w = workload.Workload(model_bytes=40_000_000, host_ms=0.0)  # a round (about 53 ms) longer than a step
    red_ms = net.allreduce_s(40_000_004) * 1e3
    waited = registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round=True)
    lagged = registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round=True, wait_lag="1")
    assert waited.samples_per_s == pytest.approx(n * 32 * K / ((K * 10.0 + (K - 1) * red_ms) / 1e3))
    # lag 1: step k >= 2 starts when step k - 2's round is out, one round after the previous one: write k at
    # 2 T + (k - 1) red; each round takes one gradient per rank (applied a step late), so no pending pile-up
    assert lagged.duration_s * 1e3 == pytest.approx(2 * 10.0 + (K - 2) * red_ms)
    assert lagged.samples_per_s > 1.15 * waited.samples_per_s and lagged.staleness_mean == 0.0
    for bad, message in ((1, "needs wait_for_round=true"), ("-1", "wait_lag must be an int >= 0"),
                         (1.5, "wait_lag must be an int >= 0")):
        with pytest.raises(ValueError, match=message):
            registry.simulate("rna", t, net, w, update_rule="samples", wait_lag=bad)
    with pytest.raises(ValueError, match="exceeds max_staleness=4"):
        registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round=True, wait_lag=5)
    with pytest.raises(ValueError, match="lag must be an int >= 0"):
        rna.wait_loop(np.full((3, 2), 1.0), 0.0, lambda r: 1.0, lag=-1)


def test_rna_with_the_wait_through_the_registry_and_its_refusals():
    n, K = 4, 100
    t = workload.step_times("device:40", n, K)
    net = network.Network((n,), (math.inf,), alpha_s=0.0, local_alpha_s=0.0, local_bytes_per_s=1e9, overhead_s=0.0)
    w = workload.Workload(model_bytes=4_000_000, host_ms=0.0)
    red_ms = net.allreduce_s(4_000_004) * 1e3  # a round allreduces the gradient and its weight
    r = registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round="true")
    assert r.samples_per_s == pytest.approx(n * 32 * K / ((K * 40.0 + (K - 1) * red_ms) / 1e3))
    assert r.contributors_per_round == n and r.staleness_mean == 0.0 and r.extra["dropped"] == 0
    free = registry.simulate("rna", t, net, w, update_rule="samples")  # without the wait compute never waits
    assert free.samples_per_s == pytest.approx(n * 32 / 40e-3) and free.samples_per_s > r.samples_per_s
    with pytest.raises(ValueError, match="needs update_rule='samples'"):
        registry.simulate("rna", t, net, w, wait_for_round=True)
    with pytest.raises(ValueError, match="update_rule must be"):
        registry.simulate("rna", t, net, w, update_rule="bsp")
    # the spellings a protocol's configuration reads as a bool
    for yes in (True, "yes", "1", "True"):
        assert registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round=yes).samples_per_s == \
            pytest.approx(r.samples_per_s)
    for no in (False, "no", "0", "false"):
        assert registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round=no).samples_per_s == \
            pytest.approx(free.samples_per_s)
    with pytest.raises(ValueError, match="wait_for_round must be true or false"):
        registry.simulate("rna", t, net, w, update_rule="samples", wait_for_round="maybe")
    with pytest.raises(ValueError, match="finite milliseconds"):
        rna.wait_loop(np.array([[1.0, np.nan]]), 0.0, lambda r: 1.0)
    with pytest.raises(ValueError, match="round_ms"):
        rna.wait_loop(np.full((3, 2), 1.0), 0.0, lambda r: float("nan"))


def test_hierarchical_rna_groups_by_host():
    net = network.Network.from_spec(8, hosts="h0:2,h1:2,h2:2,h3:1,h4:1", link="10gbit")
    t = workload.step_times("device:10+random:6", 6, 200, seed=1)
    r = registry.simulate("rnah", t, net, workload.Workload(model_bytes=7_454_760), groups="host", servers=2)
    assert r.extra["groups"] == [[0, 1], [2, 3], [4, 5]]
    assert r.workers == 6
    with pytest.raises(ValueError, match="exactly once"):
        registry.simulate("rnah", t, net, workload.Workload(), groups=[[0, 1], [2]], servers=2)


def test_registry_refuses_unknown_protocols_and_parameters():
    t = workload.step_times("device:40", 4, 10)
    net = network.Network.from_spec(4)
    with pytest.raises(ValueError, match="known: "):
        registry.simulate("nosuch", t, net, workload.Workload())
    with pytest.raises(ValueError, match="allowed: "):
        registry.simulate("rna", t, net, workload.Workload(), period=3)
    assert "bsp" in registry.names() and len(registry.names()) == 14


def test_time_to_target_table_is_the_recorded_results():
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [os.path.join(root, "docs", "results", f) for f in ("full.json", "cluster.json")]
    paths += [os.path.join(root, "docs", "simulator", f) for f in ("advisor_calibration.json",
                                                                  "advisor_calibration_np8.json")]
    assert target.estimate_from_results(paths) == target.TABLE
    sp, se, src = target.speedup_vs_bsp("rna", 2000.0, 1000.0)
    assert (se, src) == (target.TABLE["rna"]["se"], "measured") and sp == pytest.approx(2 * se)
    assert target.lookup("taskalloc") == (target.TABLE["taskalloc"]["se"], "measured")
    assert target.TABLE["taskalloc"]["se"] < 1  # its samples counted: below BSP's
    assert target.lookup("taskalloc", {"taskalloc": {"se": 1.13, "cells": []}}) == (1.0, "measured")  # above 1: 1
    assert target.lookup("rnah") == (target.TABLE["rna"]["se"], "as rna")
    assert target.lookup("ssp")[1] == "assumed (lowest measured)"
    assert target.lookup("ssp")[0] == min(e["se"] for e in target.TABLE.values())
    for p in ("rna", "localsgd", "fedavg", "taskalloc", "hop"):  # both calibrations: each world size its own cells
        assert [target.lookup(p, n=n)[1] for n in (4, 8)] == ["measured at 4 ranks", "measured at 8 ranks"]


def test_a_world_size_with_enough_cells_of_its_own_uses_their_median():
    cells = [{"cell": "np4:mnist/a[check]", "se": 0.6, "how": "samples"},
             {"cell": "np4:mnist/b[check]", "se": 0.7, "how": "samples"},
             {"cell": "np8:mnist/a[check]", "se": 0.9, "how": "samples"},
             {"cell": "np8:mnist/b[check]", "se": 0.8, "how": "samples"},
             {"cell": "np8:mnist/c", "se": 0.2, "how": "from time"}]
    table = {"fedavg": {"se": 0.7, "cells": cells}}
    assert target.cell_ranks("np8:mnist/device:40+random:6[check]") == 8 and target.cell_ranks("digits/x") is None
    # two cells measured in samples at 8 ranks are too few: the median over every cell
    assert target.lookup("fedavg", table, n=8) == (0.7, "measured")
    cells.append({"cell": "np8:mnist/d[check]", "se": 0.85, "how": "samples"})
    assert target.lookup("fedavg", table, n=8) == (0.85, "measured at 8 ranks")  # 0.8, 0.85, 0.9
    assert target.lookup("fedavg", table, n=4) == (0.7, "measured")
    assert target.lookup("fedavg", table) == (0.7, "measured")
    sp, se, src = target.speedup_vs_bsp("fedavg", 2000.0, 1000.0, table, n=8)
    assert (sp, se, src) == (pytest.approx(1.7), 0.85, "measured at 8 ranks")


def test_cells_that_counted_samples_set_the_efficiency_over_estimates_from_time(tmp_path):
    rows = [  # cell a: samples counted (SE 1000 / 2000 = 0.5); cell b: only times (SE (100 x 10) / (200 x 4) = 1.25)
        {"cell": "a", "protocol": "bsp", "samples_to_target": 1000, "samples_per_s": 100.0, "time_to_target_s": 10.0},
        {"cell": "a", "protocol": "rna", "samples_to_target": 2000, "samples_per_s": 200.0, "time_to_target_s": 10.0},
        {"cell": "b", "protocol": "bsp", "samples_per_s": 100.0, "time_to_target_s": 10.0},
        {"cell": "b", "protocol": "rna", "samples_per_s": 200.0, "time_to_target_s": 4.0},
        {"cell": "b", "protocol": "ssp", "samples_per_s": 200.0, "time_to_target_s": 4.0}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"rows": rows}))
    table = target.estimate_from_results([str(path)])
    assert [c["how"] for c in table["rna"]["cells"]] == ["samples", "from time"]
    assert table["rna"]["cells"][1]["se"] == 1.25 and table["rna"]["se"] == 0.5  # the time estimate is not counted
    assert table["ssp"]["se"] == 1.25  # no cell counted samples: the estimates from time are all there is


def test_every_model_runs_1024_ranks_quickly():
    n = 1024
    t = workload.step_times("device:40+random:6", n, 100, seed=2)
    net = network.Network.from_spec(n, hosts="512x2", link="10gbit")
    w = workload.Workload()
    for p in ("bsp", "rna", "localsgd", "fedavg", "selsync", "taskalloc", "hop"):
        t0 = time.perf_counter()
        r = registry.simulate(p, t, net, w)
        assert r.samples_per_s > 0
        assert time.perf_counter() - t0 < 20.0, p


def test_simulator_loads_no_tensorflow():
    code = ("import sys, hetsync.sim.registry, hetsync.sim.rna, hetsync.sim.ps, hetsync.sim.local, "
            "hetsync.sim.taskalloc, hetsync.sim.hop, hetsync.advise.predict; "
            "assert 'tensorflow' not in sys.modules and 'horovod' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
