"""The advisor cross-check: choices under each source of statistical efficiency, judged as the check judges."""
import json
import math

import pytest

from hetsync.bench import advisor_crosscheck as xc


def _scenario(name, sps, samples, medians, choice):
    ranking = [{"protocol": p, "samples_per_s_vs_bsp": v} for p, v in sps.items()]
    return {"scenario": name, "ranking": ranking, "samples": samples, "medians": medians, "choice": choice}


def _docs():
    sps_a = {"bsp": 1.0, "rna": 2.0, "localsgd": 1.5}
    sps_b = {"bsp": 1.0, "rna": 2.1, "localsgd": 1.5}
    sps_c = {"bsp": 1.0, "rna": 1.0, "localsgd": 1.0}
    check = {"np": 8, "seeds": [1, 2, 3], "scenarios": [
        # measured: local SGD best in a; RNA best in b; BSP best in c
        _scenario("a", sps_a, {"bsp": 100, "rna": 100, "localsgd": 100}, {"bsp": 30.0, "rna": 20.0, "localsgd": 16.0},
                  "rna"),
        _scenario("b", sps_b, {"bsp": 100, "rna": 100, "localsgd": 100}, {"bsp": 30.0, "rna": 14.0, "localsgd": 20.0},
                  "rna"),
        _scenario("c", sps_c, {"bsp": 100, "rna": 100, "localsgd": 100}, {"bsp": 10.0, "rna": 12.0, "localsgd": 11.0},
                  "bsp")]}
    cal = {"np": 8, "seeds": [4, 5], "scenarios": [
        # a's calibration: RNA needs 2x BSP's samples (SE 0.5), local SGD the same (SE 1)
        _scenario("a", sps_a, {"bsp": 100, "rna": 200, "localsgd": 100}, {"bsp": 30.0, "rna": 25.0, "localsgd": 17.0},
                  "rna"),
        _scenario("b", sps_b, {"bsp": 100, "rna": 110, "localsgd": 200}, {"bsp": 30.0, "rna": 15.0, "localsgd": 25.0},
                  "rna"),
        _scenario("c", sps_c, {"bsp": 100, "rna": 100, "localsgd": 100}, {"bsp": 10.0, "rna": 12.0, "localsgd": None},
                  "bsp")]}
    return check, cal


def test_statistical_efficiency_and_fingerprint_of_a_scenario():
    check, cal = _docs()
    se = xc.scenario_se(cal["scenarios"][0])
    assert se == {"bsp": 1.0, "rna": 0.5, "localsgd": 1.0}
    assert xc.scenario_se(_scenario("x", {}, {"bsp": 100, "rna": 50}, {}, "bsp"))["rna"] == 1.0  # capped at 1
    assert xc.fingerprint(check["scenarios"][0])["rna"] == pytest.approx(math.log(2.0))
    with pytest.raises(ValueError, match="no BSP samples"):
        xc.scenario_se(_scenario("x", {}, {"rna": 50}, {}, "bsp"))


def test_each_source_chooses_and_is_judged():
    check, cal = _docs()
    ks = {s["scenario"]: s for s in cal["scenarios"]}
    # a's nearest other scenario by predicted throughputs is b (c is far)
    assert xc.nearest_other("a", check["scenarios"][0], ks) == "b"
    ch = xc.choices("a", check["scenarios"][0], ks)
    # same scenario: RNA 2.0 x 0.5 = 1.0 against local SGD 1.5 x 1 -> local SGD
    assert ch["same scenario"] == ("localsgd", "")
    # b's SE: RNA 100/110, local SGD 0.5 -> RNA 1.82 against 0.75 -> RNA, noted with b
    assert ch["nearest other"] == ("rna", "b")
    assert ch["measured"] == ("localsgd", "") and ch["table"] == ("rna", "")
    rows, passed = xc.crosscheck(check, cal)
    a = rows[0]
    assert a["table"]["ratio"] == pytest.approx(20.0 / 16.0) and not a["table"]["ok"]
    assert a["same scenario"]["ok"] and a["same scenario"]["ratio"] == 1.0
    # c: calibration's local SGD did not reach the target (None): measured best there is BSP
    assert rows[2]["measured"]["choice"] == "bsp"
    # b borrows a's SE (RNA 0.5): local SGD, 20 s against RNA's 14 s; c borrows a's too: BSP wins the tie
    assert (rows[1]["nearest other"]["choice"], rows[1]["nearest other"]["note"]) == ("localsgd", "a")
    assert rows[1]["nearest other"]["ratio"] == pytest.approx(20.0 / 14.0)
    assert rows[2]["nearest other"]["choice"] == "bsp" and rows[2]["nearest other"]["ok"]
    assert passed == {"table": 2, "same scenario": 3, "nearest other": 1, "measured": 3}


def test_mismatched_documents_are_refused(tmp_path, capsys):
    check, cal = _docs()
    with pytest.raises(ValueError, match="world sizes differ"):
        xc.crosscheck(check, dict(cal, np=4))
    with pytest.raises(ValueError, match="lacks scenario"):
        xc.crosscheck(check, dict(cal, scenarios=cal["scenarios"][:2]))
    paths = []
    for name, doc in (("check.json", check), ("cal.json", cal)):
        paths.append(str(tmp_path / name))
        with open(paths[-1], "w") as f:
            json.dump(doc, f)
    assert xc.main(paths) == 0
    out = capsys.readouterr().out
    assert "| passed" in out and "1 of 3" in out and "localsgd" in out
