"""The advisor's check against measured time to target (hetsync.bench.advisor_check) without launches: the
median with runs that missed the target, the verdict's 10% band and BSP rule, and a resumed check that finds
every summary on disk (no launch), asks the advisor and writes the documentation block."""
import json
import math
import os
import shutil

import pytest

from hetsync.bench import advisor_check, launch


def test_a_run_that_missed_the_target_counts_as_later_than_every_run_that_reached_it():
    assert advisor_check.median_time([12.0, None, 10.0]) == 12.0
    assert advisor_check.median_time([None, None, 10.0]) == math.inf
    assert advisor_check.median_time([3.0, 5.0]) == 4.0
    with pytest.raises(ValueError, match="at least one run"):
        advisor_check.median_time([])


def test_the_choice_passes_within_ten_percent_of_the_best_and_fails_beyond():
    medians = {"bsp": 30.0, "rna": 20.0, "fedavg": 21.9}
    v = advisor_check.verdict(medians, "fedavg")
    assert v["best"] == "rna" and v["ratio"] == pytest.approx(21.9 / 20.0) and v["ok"] and not v["bsp_rule_broken"]
    v = advisor_check.verdict({**medians, "fedavg": 22.1}, "fedavg")
    assert v["ratio"] == pytest.approx(1.105) and not v["ok"]
    v = advisor_check.verdict(medians, "rna")
    assert v["ratio"] == 1.0 and v["ok"]
    # a choice that did not reach the target fails; a tie with the best is the choice's
    assert not advisor_check.verdict({"bsp": 30.0, "rna": math.inf}, "rna")["ok"]
    assert advisor_check.verdict({"bsp": 20.0, "rna": 20.0}, "rna")["best"] == "rna"


def test_bsp_is_never_right_where_a_protocol_was_one_and_a_half_times_faster():
    v = advisor_check.verdict({"bsp": 30.0, "rna": 20.0}, "bsp")  # exactly 1.5x: broken even with a 10% band off
    assert v["bsp_rule_broken"] and not v["ok"]
    v = advisor_check.verdict({"bsp": 30.0, "rna": 20.5}, "bsp")  # 1.46x: outside 10% but not the BSP rule
    assert not v["bsp_rule_broken"] and not v["ok"]
    v = advisor_check.verdict({"bsp": 30.0, "rna": math.inf}, "bsp")  # a protocol that never reached breaks nothing
    assert v["ok"] and not v["bsp_rule_broken"]
    with pytest.raises(ValueError, match="was not measured"):
        advisor_check.verdict({"bsp": 30.0}, "rna")


def _summary(time_to_target, samples=None, overruns=0.0):
    return {"time_to_target_s": time_to_target, "samples_to_target": samples, "samples_per_s": 1000.0,
            "fit_wall_s": 30.0, "final_test_accuracy": 0.93, "overrun_fraction": overruns}


def _offline(monkeypatch):
    """No launch, the digits set, and the advisor's recorded inputs pinned, so that the choices follow from a
    test's figures alone."""
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail(f"launched {a[0]}"))
    monkeypatch.setattr(launch, "mnist_dir", lambda: None)
    from hetsync.advise import predict
    from hetsync.sim import target

    from hetsync.advise import kinds

    monkeypatch.setattr(target, "TABLE", {"fedavg": {"se": 0.99, "cells": []}})
    monkeypatch.setattr(kinds, "KINDS", {})
    monkeypatch.setattr(predict, "HOST_SHARE", {})


def _write_probe(probe, spacing_s, emulated_ms):
    """A BSP probe's records: two epochs of 20 steps ``spacing_s`` apart on a device of ``emulated_ms``, and a
    summary where BSP reached the target after 2,874 samples (2 epochs of the digits set's 1,437)."""
    os.makedirs(probe)
    with open(probe / "rank0.jsonl", "w") as f:
        for k in range(40):
            f.write(json.dumps({"step": k, "epoch": k // 20, "wall_s": 2.0 + spacing_s * k,
                                "emulated_ms": emulated_ms}) + "\n")
    (probe / "summary.json").write_text(json.dumps({"samples_per_s": 1000.0, "samples_to_target": 2874}))


def test_a_resumed_check_launches_nothing_asks_the_advisor_and_writes_the_docs_block(tmp_path, monkeypatch):
    _offline(monkeypatch)
    from hetsync.sim import target

    out = tmp_path / "c"
    # two epochs of 20 steps, 45 ms apart: 5 ms beyond the device
    _write_probe(out / "probes" / "np2" / "bsp-target", 0.045, 40.0)
    # homogeneous: BSP best; random: FedAvg (the advisor's choice there) 2x sooner than BSP
    times = {("homogeneous", "bsp"): (10.0, 11.0, 12.0), ("homogeneous", "fedavg"): (10.5, None, 12.5),
             ("random", "bsp"): (40.0, 42.0, 44.0), ("random", "fedavg"): (20.0, 21.0, 30.0)}
    for (scen, proto), ts in times.items():
        for seed, t in zip((1, 2, 3), ts):
            run = out / "runs" / "np2" / scen / proto / f"seed{seed}"
            os.makedirs(run)
            (run / "summary.json").write_text(json.dumps(_summary(t, None if t is None else int(t * 100),
                                                                  0.02 if proto == "fedavg" else 0.0)))
    docs = tmp_path / "docs"
    os.makedirs(docs)
    _, _, (begin, end), _ = advisor_check.doc_names(2)
    (docs / "simulator.md").write_text(f"# page\n\n{begin}\nold\n{end}\n")
    rc = advisor_check.main(["--out", str(out), "--np", "2", "--scenarios", "homogeneous,random",
                             "--protocols", "bsp,fedavg", "--update-docs", "--docs-dir", str(docs)])
    assert rc == 0
    doc = json.loads((docs / "simulator" / "advisor_check_np2.json").read_text())
    by = {s["scenario"]: s for s in doc["scenarios"]}
    assert (doc["samples_per_epoch"], doc["epochs_to_target"]) == (1437, 2.0)
    assert by["homogeneous"]["medians"] == {"bsp": 11.0, "fedavg": 12.5}
    assert by["homogeneous"]["samples"]["fedavg"] == 1250
    assert by["random"]["medians"] == {"bsp": 42.0, "fedavg": 21.0}
    assert by["random"]["choice"] == "fedavg" and by["random"]["verdict"]["ok"]
    assert by["random"]["overrun_max"] == 0.02 and len(doc["runs"]) == 12
    assert by["homogeneous"]["choice"] == "bsp" and by["homogeneous"]["verdict"]["ok"]
    page = (docs / "simulator.md").read_text()
    assert "--samples-per-epoch 1437 --epochs-to-target 2.00" in page
    assert "old" not in page and "in 2 of 2 scenarios (100%)" in page and "2.0% (!)" in page
    assert "| 3 of 6 " in page and "| 2.1k " in page  # FedAvg's runs over 1% overruns; its median samples
    assert "--out" not in doc["command"]
    # the medians as benchmark rows: the advisor's statistical efficiencies can be rebuilt from them
    table = target.estimate_from_results([str(docs / "simulator" / "advisor_check_np2.json")])
    cells = {c["cell"]: c for c in table["fedavg"]["cells"]}
    assert cells["np2:digits/device:40[check]"] == {"cell": "np2:digits/device:40[check]",
                                                    "se": round(1100 / 1250, 3), "how": "samples"}
    assert cells["np2:digits/device:40+random:6[check]"]["se"] == round(4200 / 2100, 3)


def test_a_dilated_check_reads_its_own_folders_divides_host_time_by_d_and_writes_its_own_documents(tmp_path,
                                                                                                   monkeypatch,
                                                                                                   capsys):
    _offline(monkeypatch)
    from hetsync.bench import validate

    out = tmp_path / "c"
    probe = out / "probes" / "np8-d3" / "bsp-target"
    _write_probe(probe, 0.150, 120.0)  # at D = 3: 120 ms device steps, 150 ms apart
    for proto, t in (("bsp", 30.0), ("fedavg", 20.0)):
        for seed in (1, 2, 3):
            run = out / "runs" / "np8-d3" / "random" / proto / f"seed{seed}"
            os.makedirs(run)
            (run / "summary.json").write_text(json.dumps(_summary(t + seed, int(t * 100))))
    docs = tmp_path / "docs"
    os.makedirs(docs)
    (docs / "simulator.md").write_text("# page\n")
    rc = advisor_check.main(["--out", str(out), "--np", "8", "--dilation", "3", "--scenarios", "random",
                             "--protocols", "bsp,fedavg", "--update-docs", "--docs-dir", str(docs)])
    assert rc == 0
    doc = json.loads((docs / "simulator" / "advisor_check_np8.json").read_text())
    assert not (docs / "simulator" / "advisor_check.json").exists()
    over = validate.probe_overheads(str(probe))
    assert over["cycle_ms"] == pytest.approx(30.0)
    assert doc["dilation"] == 3.0 and doc["host_ms"] == pytest.approx(
        validate.calibrate_host_ms("bsp", 8, over, dilation=3.0) / 3.0)
    assert doc["scenarios"][0]["medians"] == {"bsp": 32.0, "fedavg": 22.0}
    page = (docs / "simulator.md").read_text()
    _, _, (begin, end), _ = advisor_check.doc_names(8)
    assert begin == "<!-- BEGIN generated: advisor check np8 -->" and begin in page and end in page
    assert "### Does the advisor choose well?, 8 ranks" in page and "(8 ranks at time dilation 3," in page
    # seeds the check read are not fresh: refused before anything runs
    fresh_argv = ["--out", str(out), "--np", "8", "--dilation", "3", "--scenarios", "random",
                  "--protocols", "bsp,fedavg", "--update-docs", "--docs-dir", str(docs), "--fresh"]
    with pytest.raises(SystemExit):
        advisor_check.main(fresh_argv + ["--seeds", "2", "7"])
    assert "--fresh: seeds [2] were read while the advisor was built (advisor_check_np8.json)" in \
        capsys.readouterr().err
    # the same runs under other seeds judged as a check on fresh seeds: its own document and table, the check's
    # left as they were
    for proto in ("bsp", "fedavg"):
        for seed in (1, 2, 3):
            run = out / "runs" / "np8-d3" / "random" / proto
            shutil.copytree(run / f"seed{seed}", run / f"seed{seed + 6}")
    rc = advisor_check.main(fresh_argv + ["--seeds", "7", "8", "9"])
    assert rc == 0
    fresh = json.loads((docs / "simulator" / "advisor_check_fresh_np8.json").read_text())
    assert fresh["seeds"] == [7, 8, 9] and fresh["scenarios"][0]["seed_list"] == [7, 8, 9]
    assert fresh["scenarios"][0]["medians"] == doc["scenarios"][0]["medians"]
    assert json.loads((docs / "simulator" / "advisor_check_np8.json").read_text()) == doc
    after = (docs / "simulator.md").read_text()
    _, _, (fbegin, fend), _ = advisor_check.doc_names(8, fresh=True)
    assert fbegin == "<!-- BEGIN generated: advisor check fresh np8 -->" and fbegin in after and fend in after
    assert after.startswith(page) and "### The advisor on fresh seeds, 8 ranks" in after
    assert advisor_check.doc_names(4, fresh=True)[0] == "advisor_check_fresh.json"


def test_bad_arguments_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("launched"))
    for argv, message in ((["--np", "1"], "at least 2 ranks"), (["--scenarios", "nowhere"], "unknown scenario"),
                          (["--protocols", "ssp"], "not checked"), (["--protocols", "rna,hop"], "must include bsp"),
                          (["--target", "1.5"], "(0, 1]"), (["--seeds", "1", "1"], "a seed twice"),
                          (["--epochs", "0"], ">= 1"), (["--dilation", "0.5"], "--dilation"),
                          (["--fresh", "--calibration"], "exclude each other")):
        with pytest.raises(SystemExit):
            advisor_check.main(["--out", str(tmp_path), *argv])
        assert message in capsys.readouterr().err


def test_a_check_resumes_from_its_document_when_the_run_folders_are_gone(tmp_path, monkeypatch, capsys):
    _offline(monkeypatch)
    first = tmp_path / "first"
    _write_probe(first / "probes" / "np2" / "bsp-target", 0.045, 40.0)
    for proto, t in (("bsp", 40.0), ("fedavg", 20.0)):
        for seed in (1, 2, 3):
            run = first / "runs" / "np2" / "random" / proto / f"seed{seed}"
            os.makedirs(run)
            (run / "summary.json").write_text(json.dumps(_summary(t + seed, int(t * 100))))
    assert advisor_check.main(["--out", str(first), "--np", "2", "--scenarios", "random",
                               "--protocols", "bsp,fedavg"]) == 0
    recorded = first / "advisor_check.json"
    before = json.loads(recorded.read_text())
    # a new checkout: no probe, no run folders; the document alone gives the same verdict and host time
    again = tmp_path / "again"
    assert advisor_check.main(["--out", str(again), "--np", "2", "--scenarios", "random", "--protocols",
                               "bsp,fedavg", "--resume-doc", str(recorded)]) == 0
    after = json.loads((again / "advisor_check.json").read_text())
    assert after["host_ms"] == before["host_ms"] and after["epochs_to_target"] == before["epochs_to_target"]
    assert after["scenarios"][0]["medians"] == {"bsp": 42.0, "fedavg": 22.0}
    assert after["scenarios"][0]["choice"] == before["scenarios"][0]["choice"] and len(after["runs"]) == 6
    assert "resumed 6 runs" in capsys.readouterr().out
    # the resumed document names every command that measured it, the first one first
    first_command = before["command"]
    assert after["command"].startswith(first_command + "; then python -m hetsync.bench.advisor_check ")
    assert "--resume-doc" in after["command"].split("; then ")[1]
    # a document from before the dilation was recorded ran undilated
    recorded.write_text(json.dumps({k: v for k, v in before.items() if k != "dilation"}))
    assert advisor_check.main(["--out", str(again), "--np", "2", "--scenarios", "random", "--protocols",
                               "bsp,fedavg", "--resume-doc", str(recorded)]) == 0
    # a document measured with other settings is refused, naming the setting
    with pytest.raises(SystemExit):
        advisor_check.main(["--out", str(again), "--np", "2", "--epochs", "8", "--resume-doc", str(recorded)])
    assert "epochs = 4, this check runs 8" in capsys.readouterr().err


def test_a_stopped_sitting_keeps_the_complete_seeds_of_a_scenario(tmp_path, monkeypatch, capsys):
    _offline(monkeypatch)
    out = tmp_path / "c"
    _write_probe(out / "probes" / "np2" / "bsp-target", 0.045, 40.0)
    # homogeneous: every seed; random: seed 3 has BSP's run only (the time cap stopped the sitting there)
    runs = {("homogeneous", "bsp"): (10.0, 11.0, 12.0), ("homogeneous", "fedavg"): (10.5, 11.5, 12.5),
            ("random", "bsp"): (40.0, 42.0, 44.0), ("random", "fedavg"): (20.0, 22.0)}
    for (scen, proto), ts in runs.items():
        for seed, t in zip((1, 2, 3), ts):
            run = out / "runs" / "np2" / scen / proto / f"seed{seed}"
            os.makedirs(run)
            (run / "summary.json").write_text(json.dumps(_summary(t, int(t * 100))))
    assert advisor_check.main(["--out", str(out), "--np", "2", "--scenarios", "homogeneous,random",
                               "--protocols", "bsp,fedavg", "--seeds", "1", "2", "3",
                               "--time-cap-min", "0"]) == 0
    doc = json.loads((out / "advisor_check.json").read_text())
    by = {s["scenario"]: s for s in doc["scenarios"]}
    assert by["homogeneous"]["seed_list"] == [1, 2, 3] and by["homogeneous"]["medians"]["bsp"] == 11.0
    assert by["random"]["seed_list"] == [1, 2] and by["random"]["seeds"] == 2
    assert by["random"]["medians"] == {"bsp": 41.0, "fedavg": 21.0}  # seed 3's BSP run is not in the median
    assert by["random"]["samples"] == {"bsp": 4100.0, "fedavg": 2100.0}
    assert len(doc["runs"]) == 11  # every run is kept for the next sitting
    assert {r["cell"] for r in doc["rows"]} == {"np2:digits/device:40[check]", "np2:digits/device:40+random:6[check]"}
    captured = capsys.readouterr()
    assert "random: judged over seeds 1, 2 only" in captured.err
    assert "Judged over fewer seeds than the others" in captured.out and "random (seeds 1, 2)" in captured.out
