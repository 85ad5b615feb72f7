"""Fault injection in the scenario language: pause, stall and kill parts, parsed and real runs."""
import pytest
from hetsync import emulation as sd
from hetsync.emulation import faults as emulation_faults


def test_parses_faults():
    s = sd.parse_spec("pause:1:2:3 + stall:0:1.5:0.25 + kill:2:0 + random:6")
    assert s.components == (sd.Fault("pause", 1, 2.0, 3.0), sd.Fault("stall", 0, 1.5, 0.25), sd.Fault("kill", 2, 0.0),
                            sd.RandomSlowdown(6.0))
    assert s.faults(1) == (sd.Fault("pause", 1, 2.0, 3.0),)
    assert s.faults(3) == ()
    assert [f.spec for f in s.faults()] == ["pause:1:2:3", "stall:0:1.5:0.25", "kill:2:0"]
    s.validate(3)


@pytest.mark.parametrize("spec, message", [
    ("pause:1:2", "takes 3 argument"),
    ("stall:1:2:3:4", "takes 3 argument"),
    ("kill:1:2:3", "takes 2 argument"),
    ("pause:-1:2:3", "RANK must be >= 0, got '-1'"),
    ("pause:1.5:2:3", "RANK must be an integer, got '1.5'"),
    ("kill:x:2", "RANK must be an integer, got 'x'"),
    ("pause:1:-2:3", r"AT_S \(seconds after train begin\) must be >= 0, got '-2'"),
    ("stall:1:nan:3", "AT_S .* must be a finite number, got 'nan'"),
    ("kill:0:inf", "AT_S .* must be a finite number, got 'inf'"),
    ("pause:1:2:0", r"FOR_S \(seconds\) must be > 0, got '0'"),
    ("stall:1:2:-1", "FOR_S .* must be > 0, got '-1'"),
    ("pause:1:2:inf", "FOR_S .* must be a finite number, got 'inf'"),
    ("pause:1:2:", "FOR_S .* must be a number, got ''"),
    ("pause:1:2:3@0,1", "'@RANKS' is not allowed on faults"),
    ("kill:0:1+", "empty part"),
])
def test_bad_faults_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        sd.parse_spec(spec)


def test_fault_rank_must_be_in_the_world():
    with pytest.raises(ValueError, match="kill:2:1: RANK 2 is not a rank of this launch; allowed: 0..1"):
        sd.parse_spec("random:2+kill:2:1").validate(2)
    sd.parse_spec("kill:1:1").validate(2)


def test_faults_leave_the_seeded_draws_unchanged():
    plain = sd.parse_spec("random:6+uniform:0:50")
    faulty = sd.parse_spec("pause:0:1:1+random:6+kill:1:3+uniform:0:50+stall:0:1:2")
    for rank in (0, 1):
        a, b = plain.rng(5, rank), faulty.rng(5, rank)
        assert [plain.draw(a, rank, 2) for _ in range(200)] == [faulty.draw(b, rank, 2) for _ in range(200)]
    assert faulty.expected_factor(0, 2) == plain.expected_factor(0, 2)


def test_solo_speed_measurements_run_without_the_faults():
    from hetsync.bench import efficiency

    assert efficiency.solo_spec("device:25+pause:1:2:3+random:6+kill:0:1+stall:1:1:1") == "device:25+random:6"
    assert efficiency.solo_spec("kill:0:1") == "none"


def test_a_fault_fires_once_per_process(monkeypatch):
    monkeypatch.setattr(emulation_faults, "_fired", [])
    monkeypatch.setattr(emulation_faults, "_fired_keys", set())
    f = sd.Fault("stall", 0, 0.0, 0.01)
    assert not f.fired()
    record = f.fire(1.5)
    assert record["kind"] == "stall" and record["fired_at_s"] == 1.5 and record["resumed_at_s"] >= 1.5 + 0.01
    assert f.fired()
    assert f.fire(2.0) is None
    assert [r["fired_at_s"] for r in emulation_faults.fired_faults()] == [1.5]
