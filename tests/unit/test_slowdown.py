"""The slowdown spec parser and the scenarios' draws."""
import numpy as np
import pytest

from hetsync.emulation import scenario as sd


def test_parses_each_scenario():
    assert sd.parse_spec("none").components == ()
    assert sd.parse_spec("").components == ()
    assert sd.parse_spec(None).spec == "none"
    assert sd.parse_spec("random:6").components == (sd.RandomSlowdown(6.0),)
    assert sd.parse_spec("deterministic:2:4").components == (sd.DeterministicSlowdown(2, 4.0),)
    assert sd.parse_spec("uniform:0:50").components == (sd.UniformDelay(0.0, 50.0),)
    assert sd.parse_spec("speeds:1,1,1,0.5").components == (sd.Speeds((1.0, 1.0, 1.0, 0.5)),)
    assert sd.parse_spec("netdelay:50").sync_latency_ms == 50.0


def test_combined_specs_multiply_factors_and_add_delays():
    s = sd.parse_spec("deterministic:1:4 + speeds:1,0.5 + uniform:10:10 + netdelay:5")
    rng = s.rng(0, 1)
    assert s.draw(rng, 1, 2) == (8.0, 10.0)
    assert s.draw(s.rng(0, 0), 0, 2) == (1.0, 10.0)
    assert s.sync_latency_ms == 5.0


@pytest.mark.parametrize("spec, message", [
    ("slow:3", "unknown slowdown scenario 'slow'"),
    ("random", "takes 1 argument"),
    ("random:6:2", "takes 1 argument"),
    ("random:0.5", "K must be >= 1"),
    ("random:abc", "K must be a number"),
    ("deterministic:1.5:4", "RANK must be an integer"),
    ("uniform:50:10", "need A <= B"),
    ("uniform:-1:10", "A must be >= 0"),
    ("speeds:1,0,1", "speeds must be > 0"),
    ("netdelay:-5", "MS must be >= 0"),
    ("random:6+", "empty part"),
])
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        sd.parse_spec(spec)


def test_world_size_mismatch_is_rejected():
    with pytest.raises(ValueError, match="gives 3 speeds, but the world size is 4"):
        sd.parse_spec("speeds:1,1,0.5").validate(4)
    with pytest.raises(ValueError, match="names rank 4, but the world has ranks 0..3"):
        sd.parse_spec("deterministic:4:2").validate(4)
    sd.parse_spec("speeds:1,1,1,0.5+deterministic:3:2").validate(4)


def test_draws_are_reproducible_per_rank_and_differ_between_ranks():
    s = sd.parse_spec("random:6+uniform:0:50")
    a = [s.draw(rng, 0, 4) for rng in [s.rng(7, 0)] for _ in range(50)]
    rng = s.rng(7, 0)
    b = [s.draw(rng, 0, 4) for _ in range(50)]
    rng1 = s.rng(7, 1)
    c = [s.draw(rng1, 1, 4) for _ in range(50)]
    assert a[:1] == b[:1]
    rng = s.rng(7, 0)
    assert [s.draw(rng, 0, 4) for _ in range(50)] == b
    assert b != c


def test_random_slows_with_probability_one_over_n():
    s = sd.parse_spec("random:6")
    rng = s.rng(0, 0)
    factors = np.array([s.draw(rng, 0, 4)[0] for _ in range(20000)])
    assert set(np.unique(factors)) == {1.0, 6.0}
    assert abs(np.mean(factors == 6.0) - 0.25) < 0.015
    assert s.expected_factor(0, 4) == pytest.approx(1 + 5 / 4)


def test_uniform_draws_stay_in_range():
    s = sd.parse_spec("uniform:10:30")
    rng = s.rng(1, 2)
    extras = np.array([s.draw(rng, 2, 4)[1] for _ in range(5000)])
    assert extras.min() >= 10 and extras.max() <= 30
    assert abs(extras.mean() - 20) < 0.5


def test_a_part_restricted_to_ranks_acts_on_those_ranks_only():
    # RNA section 8.1's mixed heterogeneity: half the ranks 0-50 ms, half 50-100 ms per step
    s = sd.parse_spec("device:40+uniform:0:50@0,1+uniform:50:100@2-3")
    assert s.components[1] == sd.OnRanks(sd.UniformDelay(0.0, 50.0), (0, 1))
    assert s.components[2] == sd.OnRanks(sd.UniformDelay(50.0, 100.0), (2, 3))
    s.validate(4)
    for rank, (lo, hi) in [(0, (0, 50)), (1, (0, 50)), (2, (50, 100)), (3, (50, 100))]:
        rng = s.rng(0, rank)
        draws = [s.draw(rng, rank, 4) for _ in range(200)]
        assert all(f == 1.0 and lo <= e <= hi for f, e in draws)
        assert s.expected_extra_ms(rank, 4) == (lo + hi) / 2
        assert s.expected_step_ms(rank, 4) == 40 + (lo + hi) / 2
    k = sd.parse_spec("random:6@1+deterministic:0:3@0")
    assert k.expected_factor(1, 4) == pytest.approx(1 + 5 / 4) and k.expected_factor(0, 4) == 3.0
    assert k.expected_factor(2, 4) == 1.0 and k.draw(k.rng(0, 2), 2, 4) == (1.0, 0.0)


@pytest.mark.parametrize("spec, message", [
    ("uniform:0:50@0,x", "RANKS after '@' must be ranks or A-B ranges"),
    ("uniform:0:50@3-1", "bad rank range '3-1'"),
    ("uniform:0:50@1,1", "listed twice"),
    ("device:40@0", "only random, deterministic, uniform and speeds"),
    ("netdelay:5@0", "only random, deterministic, uniform and speeds"),
    ("uniform:0:50@", "RANKS after '@'"),
])
def test_bad_rank_restrictions_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        sd.parse_spec(spec)


def test_a_rank_restriction_beyond_the_world_is_rejected():
    with pytest.raises(ValueError, match=r"names rank\(s\) \[4\], but the world has ranks 0..3"):
        sd.parse_spec("uniform:50:100@2-4").validate(4)
