"""The RNA initiator simulator (section 8.4, Figure 10) against closed forms."""
import numpy as np
import pytest

from hetsync.sim import rna_initiator as sim


@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_restart_model_matches_the_order_statistic_closed_form(d):
    t = sim.simulate_restart(ranks=100, probes=d, low_ms=10, high_ms=50, iterations=20000, seed=1)
    # median of min of d U[10, 50] draws: 10 + 40 (1 - 0.5^(1/d))
    assert abs(np.median(t) - (10 + 40 * (1 - 0.5 ** (1 / d)))) < 0.6
    assert t.min() >= 10 and t.max() <= 50


def test_more_probes_answer_sooner_and_probe_cost_is_added():
    med = [np.median(sim.simulate_continuous(100, d, 10, 50, 5000, seed=2)) for d in (1, 2, 3, 4)]
    assert med == sorted(med, reverse=True) and med[0] > 1.5 * med[1]
    base = sim.simulate_restart(100, 2, 10, 50, 1000, seed=3)
    costly = sim.simulate_restart(100, 2, 10, 50, 1000, probe_cost_ms=1.5, seed=3)
    np.testing.assert_allclose(costly - base, 3.0)


def test_bad_arguments_and_cli(capsys):
    with pytest.raises(ValueError, match=r"probes must be an int in \[1, ranks=4\], got 5"):
        sim.simulate_restart(ranks=4, probes=5)
    with pytest.raises(ValueError, match="need 0 <= low_ms <= high_ms"):
        sim.simulate_continuous(low_ms=50, high_ms=10)
    assert sim.main(["--iterations", "200", "--probes", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "paper median ms" in out and "100 ranks, task times U[10, 50] ms" in out
    assert out.count("restart") == 2 and out.count("continuous") == 2
