"""Statistical efficiency by scenario kind (hetsync.advise.kinds) and its use in the advisor's ranking."""
import os

import pytest

from hetsync.advise import kinds
from hetsync.advise import predict as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CALIBRATIONS = [os.path.join(ROOT, "docs", "simulator", f)
                for f in ("advisor_calibration.json", "advisor_calibration_np8.json")]

# two kinds at 4 ranks that differ in RNA's efficiency, one at 8 ranks
HAND = {
    4: {"fast-rna": {"spec": "device:40+random:6",
                     "fingerprint": {"rna": 2.0, "localsgd": 1.8, "fedavg": 2.0, "hop": 1.4}, "se": {"rna": 1.0}},
        "slow-rna": {"spec": "device:40",
                     "fingerprint": {"rna": 1.0, "localsgd": 1.3, "fedavg": 1.3, "hop": 0.9}, "se": {"rna": 0.1}}},
    8: {"eight": {"spec": "device:40", "fingerprint": {"rna": 1.0, "localsgd": 1.0, "fedavg": 1.0},
                  "se": {"rna": 0.5}}},
}


def test_kinds_are_the_recorded_calibrations():
    assert kinds.build(CALIBRATIONS) == kinds.KINDS
    assert sorted(kinds.KINDS) == [4, 8] and all(len(v) == 8 for v in kinds.KINDS.values())


def test_scenario_efficiency_in_closed_form():
    se = kinds.scenario_se({"bsp": 100.0, "rna": 200.0, "fedavg": 80.0, "hop": None, "localsgd": float("inf")})
    assert se == {"fedavg": 1.0, "hop": 0.0, "localsgd": 0.0, "rna": 0.5}  # above 1 capped; not reached: 0
    with pytest.raises(ValueError, match="BSP's samples to target"):
        kinds.scenario_se({"bsp": None, "rna": 100.0})


def test_the_nearest_kind_at_the_nearest_world_size_and_leave_one_out():
    near_fast = {"rna": 1.9, "localsgd": 1.7, "fedavg": 2.1, "hop": 1.3}
    assert kinds.nearest(near_fast, 4, HAND)[:2] == ("fast-rna", 4)
    assert kinds.nearest(near_fast, 4, HAND, exclude=("fast-rna",))[:2] == ("slow-rna", 4)
    assert kinds.nearest(near_fast, 6, HAND)[1] == 4  # tie between 4 and 8: the smaller
    assert kinds.nearest(near_fast, 1024, HAND)[:2] == ("eight", 8)
    assert kinds.nearest({"rna": 1.0, "hop": 1.0}, 4, HAND) is None  # fewer than MIN_SHARED protocols in common
    assert kinds.nearest(near_fast, 4, {}) is None
    with pytest.raises(ValueError, match="'rna'"):
        kinds.fingerprint({"rna": 0.0})


def test_predict_takes_the_efficiency_from_the_nearest_kind():
    inputs = P.inputs_from_args("device:40+random:6", 4, host_ms=2.0)
    protos = ("bsp", "rna", "localsgd", "fedavg", "hop")
    rows = {r["protocol"]: r for r in P.predict(inputs, protos, kinds=HAND)}
    rna = rows["rna"]
    assert rna["se_source"] == "scenario fast-rna at 4 ranks" and rna["statistical_efficiency"] == 1.0
    assert rna["time_to_target_vs_bsp"] == pytest.approx(rna["samples_per_s_vs_bsp"])
    assert rows["localsgd"]["se_source"] == "measured at 4 ranks"  # not calibrated in that kind: the table
    left_out = {r["protocol"]: r for r in P.predict(inputs, protos, kinds=HAND, exclude_kinds=("fast-rna",))}
    assert left_out["rna"]["se_source"] == "scenario slow-rna at 4 ranks"
    assert left_out["rna"]["time_to_target_vs_bsp"] == pytest.approx(0.1 * left_out["rna"]["samples_per_s_vs_bsp"])
    assert {r["se_source"] for r in P.predict(inputs, protos, kinds={}) if r["protocol"] != "bsp"} == {
        "measured at 4 ranks"}
    rec = P.recommend(P.predict(inputs, protos, kinds=HAND), inputs)
    assert rec["protocol"] == "rna" and any("calibrated scenario 'fast-rna' at 4 ranks" in r for r in rec["reasons"])


def test_the_check_judges_each_scenario_with_its_own_calibration_left_out():
    from hetsync.bench.advisor_check import advisor_choice

    protos = ("bsp", "rna", "localsgd", "fedavg", "taskalloc", "hop")
    own = advisor_choice("device:40+random:6", 8, 7.0, protos, 8000, 4.9)
    assert {r["se_source"] for r in own if r["protocol"] != "bsp"} == {"scenario random at 8 ranks"}
    out = advisor_choice("device:40+random:6", 8, 7.0, protos, 8000, 4.9, exclude=("random",))
    sources = {r["se_source"] for r in out if r["protocol"] != "bsp"}
    assert len(sources) == 1 and sources != {"scenario random at 8 ranks"}
    assert next(iter(sources)).startswith("scenario ")
