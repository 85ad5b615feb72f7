"""Hop's timing model (hetsync.sim.hop): closed forms and the gap bounds of Theorem 2, section 4.4 and section 5."""
import pytest

from hetsync.protocols.hop import graph as hop_graph
from hetsync.sim import hop as sim


def test_without_heterogeneity_every_mode_runs_at_the_device_speed():
    g = hop_graph.build("ring-based", 8)
    t = sim.step_times("none", 8, 50, base_ms=40.0)
    for kw in ({}, {"mode": "backup"}, {"mode": "staleness"}):
        r = sim.simulate(g, t, **kw)
        assert r["iterations_per_s"] == pytest.approx(25.0) and r["steps"] == [50] * 8


def test_a_deterministic_straggler_paces_everyone_unless_it_skips():
    g = hop_graph.build("ring", 4)
    t = sim.step_times("deterministic", 4, 120, base_ms=10.0)  # rank 3: 40 ms per iteration
    for kw in ({}, {"mode": "backup"}, {"mode": "staleness", "staleness": 2}):
        r = sim.simulate(g, t, max_ig=3, **kw)
        assert r["iterations_per_s"] == pytest.approx(1000.0 / 40.0 * 120 / 120, rel=0.05)
    r = sim.simulate(g, t, mode="backup", max_ig=3, skip=3)
    assert r["steps"][3] < 120 and r["steps"][:3] == [120] * 3
    assert r["iterations_per_s"] > 2 * 25.0


@pytest.mark.parametrize("mode,bound", [("standard", 1), ("backup", 4), ("staleness", 3)])
def test_gap_to_out_neighbours_stays_within_the_bound(mode, bound):
    g = hop_graph.build("ring", 6)
    t = sim.step_times("random", 6, 300, seed=1)
    r = sim.simulate(g, t, mode=mode, max_ig=4, staleness=2)
    assert r["max_gap_out"] <= bound  # standard: 1; tokens: max_ig; staleness s: s + 1


def test_bad_arguments():
    g = hop_graph.build("ring", 4)
    with pytest.raises(ValueError, match="skip needs backup or staleness"):
        sim.simulate(g, sim.step_times("none", 4, 5), skip=2)
    with pytest.raises(ValueError, match="scenario must be"):
        sim.step_times("bursty", 4, 5)
