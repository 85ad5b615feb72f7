"""The alpha-beta microbenchmark's fit and the analytic E with communication (hetsync.bench.alphabeta), without
launches: message sizes, the line through timed points, the network model recovered from synthetic timings of a
known network at a time dilation, and BSP's closed-form E on it."""
import json
import math

import pytest

from hetsync.bench import alphabeta
from hetsync.emulation.cluster import spec as cluster_spec
from hetsync.emulation.cluster.spec import ClusterSpec
from hetsync.sim import network


def test_sizes_are_the_powers_of_four_below_the_gradient_and_the_gradient_itself():
    assert alphabeta.sizes_up_to(64) == [4, 16, 64]
    assert alphabeta.sizes_up_to(7_454_760)[-2:] == [4 ** 11, 7_454_760]
    assert alphabeta.sizes_up_to(100) == [4, 16, 64, 100]
    assert alphabeta.sizes_up_to(1023) == [4, 16, 64, 256, 1020]  # whole float32 values
    for bad in (10, 63.0, True, None):
        with pytest.raises(ValueError, match="max_bytes"):
            alphabeta.sizes_up_to(bad)


def test_the_line_through_exact_points_is_recovered_and_flat_times_are_refused():
    sizes = [4, 64, 1024, 65536, 262144, 1 << 20]
    fit = alphabeta.fit_line(sizes, [0.002 + 3e-8 * m for m in sizes])
    assert fit["c0_s"] == pytest.approx(0.002, rel=1e-9) and fit["c1_s_per_byte"] == pytest.approx(3e-8, rel=1e-9)
    assert fit["max_rel_error"] < 1e-9 and fit["top_rel_error"] < 1e-9
    with pytest.raises(ValueError, match="do not grow"):
        alphabeta.fit_line(sizes, [0.01, 0.009, 0.008, 0.007, 0.006, 0.005])
    with pytest.raises(ValueError, match="at least 3 points"):
        alphabeta.fit_line([4, 8], [0.1, 0.2])
    with pytest.raises(ValueError, match="span at least 16x"):
        alphabeta.fit_line([1024, 2048, 4096], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="seconds > 0"):
        alphabeta.fit_line(sizes, [0.1, 0.0, 0.2, 0.3, 0.4, 0.5])


def test_a_token_bucket_burst_does_not_set_the_rate():
    """Measured on 2 hosts at 100 Mbit/s (12.5 MB/s): the mid-sized messages ride the bucket's burst at twice the
    link's rate; the rate comes from the largest, the fixed cost from the smallest."""
    sizes = [4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576]
    p2p_ms = [0.838, 0.762, 0.879, 0.6, 0.989, 0.764, 0.757, 2.541, 13.723, 90.177]
    fit = alphabeta.fit_line(sizes, [t / 1e3 for t in p2p_ms])
    # the line through the largest message: 93% of the set rate, where the 64 KB message went at 26 MB/s
    assert 1 / fit["c1_s_per_byte"] == pytest.approx(1_048_576 / (0.090177 - fit["c0_s"]))
    assert 1 / fit["c1_s_per_byte"] == pytest.approx(11.7e6, rel=0.01) and fit["top_rel_error"] < 1e-9
    assert fit["c0_s"] == pytest.approx(0.00084, rel=0.02)  # the median of the messages up to 1 KB, less c1 m
    assert fit["max_rel_error"] > 0.5  # the burst's 64 KB message, reported


def _timings(net, sizes, d, peer):
    """Wall seconds on a cluster dilated by D whose network, in the emulated cluster's time, is ``net``: every
    figure D times longer."""
    return [{"bytes": m, "allreduce_s": d * net.allreduce_s(m), "p2p_s": d * net.p2p_s(m, 0, peer)} for m in sizes]


def test_the_network_is_recovered_from_timings_of_a_known_network_at_a_dilation():
    d = 60.0
    truth = network.Network.from_spec(8, hosts="4x2", link="10gbit", latency_ms=0.05, overhead_ms=1.5,
                                      p2p_efficiency=0.6)
    # what an efficiency below the set rate looks like: the collective reaches 80% of 10 Gbit/s
    truth = network.Network(truth.slots, tuple(0.8 * r for r in truth.link_bytes_per_s), alpha_s=truth.alpha_s,
                            overhead_s=truth.overhead_s, p2p_efficiency=0.6)
    sizes = alphabeta.sizes_up_to(7_454_760)
    fit = alphabeta.fit_measurements(_timings(truth, sizes, d, peer=2), 8)
    net = alphabeta.network_from_fit(fit, 8, "h0:2,h1:2,h2:2,h3:2", "10gbit", dilation=d)
    assert net.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert net.overhead_s == pytest.approx(truth.overhead_s, rel=1e-6)
    assert net.link_bytes_per_s == pytest.approx(truth.link_bytes_per_s, rel=1e-6)
    assert net.p2p_efficiency == pytest.approx(0.6, rel=1e-6)
    for m in (4, 4096, 7_454_760):
        assert net.allreduce_s(m) == pytest.approx(truth.allreduce_s(m), rel=1e-6)
        assert net.p2p_s(m, 0, 2) == pytest.approx(truth.p2p_s(m, 0, 2), rel=1e-6)
    # a collective that reaches half of what point-to-point messages do
    truth = network.Network(truth.slots, truth.link_bytes_per_s, alpha_s=truth.alpha_s, overhead_s=truth.overhead_s,
                            collective_efficiency=0.5)
    net = alphabeta.network_from_fit(alphabeta.fit_measurements(_timings(truth, sizes, d, peer=2), 8), 8,
                                     "h0:2,h1:2,h2:2,h3:2", "10gbit", dilation=d)
    assert net.collective_efficiency == pytest.approx(0.5) and net.p2p_efficiency == 1.0
    for m in (4, 4096, 7_454_760):
        assert net.allreduce_s(m) == pytest.approx(truth.allreduce_s(m), rel=1e-6)
        assert net.p2p_s(m, 0, 2) == pytest.approx(truth.p2p_s(m, 0, 2), rel=1e-6)


def test_a_collective_cheaper_than_a_point_to_point_message_keeps_its_measured_fixed_cost():
    """hetsync's transport pickles each message and answers from a receive thread: on the cluster at D = 40 a
    point-to-point message cost 30 ms and a whole small allreduce over 8 ranks 21 ms. The ring's step latency is
    then bounded by the allreduce's intercept, so the model's allreduce keeps the measured one."""
    d = 40.0
    base = network.Network.from_spec(8, hosts="4x2", link="10gbit")
    truth = network.Network(base.slots, base.link_bytes_per_s, alpha_s=0.8e-3, overhead_s=0.3e-3,
                            collective_alpha_s=0.02e-3)
    assert truth.ring()[0] == 0.02e-3 and truth.path(0, 2)[0] == 0.8e-3
    fit = alphabeta.fit_measurements(_timings(truth, alphabeta.sizes_up_to(7_454_760), d, peer=2), 8)
    assert fit["alpha_s"] == pytest.approx(d * 0.8e-3, rel=1e-6)
    assert fit["collective_alpha_s"] == pytest.approx(d * (0.3e-3 + 14 * 0.02e-3) / 14, rel=1e-6)
    assert fit["overhead_s"] == pytest.approx(0.0, abs=1e-12)
    net = alphabeta.network_from_fit(fit, 8, "4x2", "10gbit", dilation=d)
    for m in (4, 4096, 7_454_760):
        assert net.allreduce_s(m) == pytest.approx(truth.allreduce_s(m), rel=1e-6)
        assert net.p2p_s(m, 0, 2) == pytest.approx(truth.p2p_s(m, 0, 2), rel=1e-6)
    # a fit recorded before the two latencies were told apart reads as one latency for both
    old = {k: v for k, v in fit.items() if k != "collective_alpha_s"}
    assert alphabeta.network_from_fit(old, 8, "4x2", "10gbit", dilation=d).ring()[0] == pytest.approx(0.8e-3)
    with pytest.raises(ValueError, match="collective_alpha_s"):
        network.Network(base.slots, base.link_bytes_per_s, collective_alpha_s=-1.0)


def test_a_mixed_network_keeps_its_slow_host_and_the_slower_kind_of_message_gets_the_fraction():
    fit = {"alpha_s": 1e-4, "overhead_s": 2e-3, "ring_bytes_per_s": 2.5e9 / 8 / 60, "p2p_bytes_per_s": 2.5e9 / 8 / 120}
    net = alphabeta.network_from_fit(fit, 8, "h0:2,h1:2,h2:2,h3:1,h4:1", "10gbit", host_links=(("h2", "2.5gbit"),),
                                     dilation=60.0)
    assert net.link_bytes_per_s[2] == pytest.approx(2.5e9 / 8) and net.link_bytes_per_s[0] == pytest.approx(1.25e9)
    assert (net.p2p_efficiency, net.collective_efficiency) == (pytest.approx(0.5), 1.0)
    assert net.alpha_s == pytest.approx(1e-4 / 60)
    # point-to-point faster than the collective (measured on 2 hosts at 100 Mbit/s): the links carry the faster
    fit["p2p_bytes_per_s"] = 2.5e9 / 8 / 30
    net = alphabeta.network_from_fit(fit, 8, "h0:2,h1:2,h2:2,h3:1,h4:1", "10gbit", host_links=(("h2", "2.5gbit"),),
                                     dilation=60.0)
    assert net.link_bytes_per_s[2] == pytest.approx(2 * 2.5e9 / 8)
    assert (net.p2p_efficiency, net.collective_efficiency) == (1.0, pytest.approx(0.5))
    assert net.ring()[1] == pytest.approx(2.5e9 / 8) and net.p2p_path(0, 4)[1] == pytest.approx(2 * 2.5e9 / 8)
    # each link's buffer as the cluster's token bucket holds it (50 ms and the burst at the shaped rate, wall), in the
    # emulated cluster's time: 10 Gbit/s / 60 = 166.7 Mbit/s, burst 128 KiB; h2 at 2.5 Gbit/s / 60 = 41.7 Mbit/s
    fast_q = (0.050 + 128 * 1024 * 8 / (10e9 / 60)) / 60
    slow_q = (0.050 + 128 * 1024 * 8 / (2.5e9 / 60)) / 60
    assert net.link_queue_s == pytest.approx((fast_q, fast_q, slow_q, fast_q, fast_q))
    assert net.describe()["link_queue_ms"][2] == pytest.approx(slow_q * 1e3)
    assert cluster_spec.queue_delay_s(math.inf) == 0.0  # an unshaped link has no token bucket
    with pytest.raises(ValueError, match="rate"):
        cluster_spec.queue_delay_s(0.0)
    with pytest.raises(ValueError, match="dilation"):
        alphabeta.network_from_fit(fit, 8, "4x2", "10gbit", dilation=0.5)


def test_bsp_analytic_e_on_a_homogeneous_device_is_device_time_over_device_time_plus_the_allreduce():
    net = network.Network.from_spec(8, hosts="4x2", link="1gbit")
    grad = 4 * 1_863_690
    e = alphabeta.analytic_efficiency("bsp", {}, "device:40", 8, net, grad, 32)
    assert e == pytest.approx(40.0 / (40.0 + net.allreduce_s(grad) * 1e3), rel=1e-9)
    # servers train nothing: a parameter server's E is over its 6 workers, and layer-wise sharding is slower
    mem = alphabeta.analytic_efficiency("shat", {"servers": "2", "sharding": "memory"}, "device:40", 8, net, grad, 32)
    layer = alphabeta.analytic_efficiency("shat", {"servers": "2", "sharding": "layer"}, "device:40", 8, net, grad, 32,
                                          variable_bytes=[4 * 802_816 + 4 * 1024 + 4 * 1_048_576, 4 * 1024,
                                                          4 * 10_240, 40])
    assert 0 < layer < mem <= 1.0
    # hierarchical RNA's server rule changes what is learnt, not when messages go: the same timing either way
    rnah = {"groups": "host", "servers": "2"}
    assert alphabeta.analytic_efficiency("rnah", dict(rnah, server_rule="delta"), "device:40", 8, net, grad, 32) == \
        alphabeta.analytic_efficiency("rnah", rnah, "device:40", 8, net, grad, 32)
    with pytest.raises(ValueError):
        alphabeta.analytic_efficiency("nosuch", {}, "device:40", 8, net, grad, 32)


def test_a_run_is_compared_with_the_model_and_a_summary_without_gradient_size_says_why(tmp_path):
    spec = ClusterSpec(hosts=4, slots=2, link="1gbit", dilation=10.0)
    fit = {"alpha_s": 0.0, "overhead_s": 0.0, "ring_bytes_per_s": 1e9 / 8 / 10, "p2p_bytes_per_s": None}
    doc = {"fit": fit}
    (tmp_path / "summary.json").write_text(json.dumps({"scenario": "device:40", "world_size": 8, "batch_size": 32,
                                                       "gradient_bytes": 400_000}))
    out = alphabeta.model_figures(doc, spec, "bsp", {}, str(tmp_path), 0.5)
    ar_ms = 2 * 7 / 8 * 400_000 / (1e9 / 8) * 1e3
    assert out["efficiency_model"] == pytest.approx(40 / (40 + ar_ms))
    assert out["efficiency_model_gap"] == pytest.approx(0.5 / out["efficiency_model"] - 1)
    (tmp_path / "summary.json").write_text(json.dumps({"scenario": "device:40", "world_size": 8, "batch_size": 32}))
    out = alphabeta.model_figures(doc, spec, "bsp", {}, str(tmp_path), 0.5)
    assert out["efficiency_model"] is None and "gradient_bytes" in out["efficiency_model_error"]


def _records(run_dir, rank, emulated_ms, t0=1.0, step_ms=None):
    """A rank's step records: a compiling first step (not padded), then steps of the given emulated ms, each
    ``step_ms`` long on the rank's clock (default: its emulated ms)."""
    recs, t = [{"step": 0, "wall_s": t0, "emulated_ms": 0.0}], t0
    for k, ms in enumerate(emulated_ms, 1):
        t += (step_ms[k - 1] if step_ms else ms) / 1e3
        recs.append({"step": k, "wall_s": t, "emulated_ms": ms})
    (run_dir / f"rank{rank}.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def test_the_drawn_times_are_the_runs_own_padded_steps_in_its_window_repeated(tmp_path):
    _records(tmp_path, 0, [400.0, 2400.0, 400.0, 400.0])
    _records(tmp_path, 1, [400.0, 400.0, 400.0])
    times = alphabeta.drawn_times(str(tmp_path), 2, 40.0, steps=7)
    # each rank's first K = 3 padded steps (the fewest), in emulated milliseconds (over D = 40), repeated to >= 7
    assert times.ms.shape == (9, 2) and times.spec == "drawn"
    assert times.ms[:3, 0].tolist() == [10.0, 60.0, 10.0] and times.ms[3:6, 0].tolist() == [10.0, 60.0, 10.0]
    assert (times.ms[:, 1] == 10.0).all()
    # only the steps that ended inside the window: rank 0's at 3.8 and 4.2 s, rank 1's at 1.8 and 2.2 s
    times = alphabeta.drawn_times(str(tmp_path), 2, 40.0, steps=2, window=(1.5, 4.3))
    assert times.ms[:, 0].tolist() == [60.0, 10.0] and times.ms[:, 1].tolist() == [10.0, 10.0]
    with pytest.raises(ValueError, match="rank 0 .* 0 padded steps"):
        alphabeta.drawn_times(str(tmp_path), 2, 40.0, window=(100.0, 200.0))


def test_the_gap_on_the_runs_own_draws_leaves_out_the_luck_of_its_draws(tmp_path):
    """BSP on 2 ranks of one host (no network cost): every step lasts the slower rank's draw. A run whose draws
    were luckier than the scenario's expectation has an E above the expected-draw model, and no gap on its own."""
    spec = ClusterSpec(hosts=1, slots=2, link="1gbit", dilation=1.0)
    fit = {"alpha_s": 0.0, "overhead_s": 0.0, "ring_bytes_per_s": 1e15, "p2p_bytes_per_s": None}
    (tmp_path / "summary.json").write_text(json.dumps({
        "scenario": "device:10+random:6", "world_size": 2, "batch_size": 32, "gradient_bytes": 4, "dilation": 1.0,
        "per_rank": [{"rank": r, "steps": 41, "samples": 41 * 32} for r in (0, 1)]}))
    draws = [60.0 if k % 4 == 3 else 10.0 for k in range(40)]  # rank 0: 1 slow step in 4; expected: 1 in 2 a rank
    _records(tmp_path, 0, draws)
    _records(tmp_path, 1, [10.0] * 40, step_ms=draws)  # BSP: rank 1's steps last as long as rank 0's
    from hetsync.bench import efficiency

    sps = efficiency.run_rates(str(tmp_path))["samples_per_s"]  # what the run measures in its window
    assert sps == pytest.approx(2 * 32 / (sum(draws[3:]) / 37 / 1e3), rel=0.05)
    e = efficiency.efficiency(sps, efficiency.analytic_solo("device:10+random:6", 2, 32))  # E analytic
    out = alphabeta.model_figures({"fit": fit}, spec, "bsp", {}, str(tmp_path), e, measured_sps=sps)
    assert out["efficiency_model_gap_drawn"] == pytest.approx(0.0, abs=0.02)
    # against the expected draws (a slow step in 3 of 4: 47.5 ms against the 22.5 ms drawn) it looks twice as good
    assert out["efficiency_model_gap"] == pytest.approx(47.5 / 22.5 - 1, rel=0.1)
    assert alphabeta.model_figures({"fit": fit}, spec, "bsp", {}, str(tmp_path), e)["efficiency_model_gap_drawn"] \
        is None
