"""The statistical-efficiency study (hetsync.bench.study) without launches: its table in closed form from hand-made
summaries, a resumed study that launches nothing and writes the docs block, the launch of a server protocol, and
bad arguments refused before anything runs."""
import json
import os
import statistics

import pytest

from hetsync.bench import launch, study


def _summary(folder, samples, ttt, acc, steady, overrun=0.0):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"samples_to_target": samples, "time_to_target_s": ttt, "final_test_accuracy": acc,
                   "samples_per_s": steady, "samples_per_s_steady": steady, "overrun_fraction": overrun,
                   "dilation": 1.0}, f)


def _no_launch_docs(docs, monkeypatch):
    # an empty docs folder with the benchmarks page, and any launch fails the test
    docs.mkdir()
    (docs / "benchmarks.md").write_text("# Benchmarks\n")
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("launched"))


def _make(out):
    # seeds 1-3 of BSP and RNA at 4 ranks (MLP, lr 0.2); RNA misses the target on seed 3
    for seed, (sb, tb, ab, sr, tr, ar) in enumerate([(1000, 10.0, 0.90, 1250, 5.0, 0.91),
                                                      (1200, 12.0, 0.92, 1200, 8.0, 0.90),
                                                      (1100, 11.0, 0.91, None, None, 0.85)], start=1):
        _summary(study.run_dir(out, 4, "mlp", 0.2, "bsp", seed), sb, tb, ab, 600.0)
        _summary(study.run_dir(out, 4, "mlp", 0.2, "rna", seed), sr, tr, ar, 900.0, overrun=0.002 * seed)
    # a setting without its BSP seed is left out of the table
    _summary(study.run_dir(out, 4, "mlp", 0.2, "hop", 9), 1000, 9.0, 0.9, 700.0)


def test_the_table_is_the_median_over_seeds_of_the_ratios_to_bsp(tmp_path):
    _make(str(tmp_path))
    rows = study.rows_from(str(tmp_path))
    assert len(rows) == 7 and {r["setting"] for r in rows} == {"bsp", "rna", "hop"}
    (t,) = study.table(rows)
    assert (t["np"], t["model"], t["lr"], t["setting"], t["seeds"], t["reached"]) == (4, "mlp", 0.2, "rna", 3, "2/3")
    assert t["se"] == pytest.approx((1000 / 1250 + 1200 / 1200) / 2)  # the seeds that reached the target
    assert t["samples_ratio"] == pytest.approx((1.25 + 1.0) / 2)
    assert t["time_ratio"] == pytest.approx((10 / 5 + 12 / 8) / 2)
    assert t["steady_ratio"] == pytest.approx(1.5)
    assert t["accuracy_delta"] == pytest.approx(-2.0)  # median of +1, -2, -6 points
    assert t["overrun_max"] == pytest.approx(0.006)
    text = study.markdown([t], {"date_utc": "d", "command": "c", "scenario": "s", "dataset": "MNIST", "target": 0.9})
    assert "| 4 | mlp | 0.2 | rna | 3 | 0.90 | 1.75x | 1.50x | -2.0 pt | 2/3 |" in text


def test_a_resumed_study_launches_nothing_and_writes_the_docs_block(tmp_path, monkeypatch):
    out, docs = str(tmp_path / "study"), tmp_path / "docs"
    _make(out)
    _no_launch_docs(docs, monkeypatch)
    status = study.main(["--out", out, "--np", "4", "--models", "mlp", "--settings", "rna", "--seeds", "1,2",
                         "--update-docs", "--docs-dir", str(docs)])
    assert status == 0
    doc = json.loads((docs / "bench" / "study.json").read_text())
    assert doc["summary"][0]["setting"] == "rna" and len(doc["rows"]) == 7
    page = (docs / "benchmarks.md").read_text()
    assert study.BEGIN in page and "## The statistical-efficiency study" in page and "| 4 | mlp | 0.2 | rna |" in page


def test_epochs_scale_with_the_world_size_for_the_same_bsp_steps():
    assert [study.epochs_for({"mlp": 3}, "mlp", n) for n in (2, 4, 8)] == [2, 3, 6]
    assert study.epochs_for({"cnn": 1}, "cnn", 2) == 1


def test_a_server_protocol_launches_one_more_rank_and_a_dilated_world_gets_d(tmp_path, monkeypatch):
    seen = []

    def fake_run(cmd, timeout_s, env=None, **kw):
        seen.append((cmd, timeout_s, env))
        _summary(cmd[cmd.index("--out") + 1], 100, 1.0, 0.9, 100.0)
        return type("P", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(launch, "run", fake_run)
    study.run_one(str(tmp_path / "a"), 4, "mlp", 0.1, "shat", 1, "device:40", 1, 0.9)
    study.run_one(str(tmp_path / "b"), 8, "cnn", 0.1, "hop-backup", 1, "device:40", 1, 0.9, dilation=3.0,
                  timeout_s=100.0)
    (cmd_a, _, env_a), (cmd_b, t_b, env_b) = seen
    assert cmd_a[cmd_a.index("-np") + 1] == "5" and env_a == {}
    assert cmd_b[cmd_b.index("-np") + 1] == "8" and env_b == {"HETSYNC_DILATION": "3"} and t_b == 360.0
    assert "backup_workers=1" in cmd_b and cmd_b[cmd_b.index("--model") + 1] == "cnn"
    # the run is not launched again
    study.run_one(str(tmp_path / "a"), 4, "mlp", 0.1, "shat", 1, "device:40", 1, 0.9)
    assert len(seen) == 2


@pytest.mark.parametrize("argv, message", [
    (["--settings", "rna,nope"], "unknown nope"),
    (["--models", "resnet"], "unknown resnet"),
    (["--np", "1"], "world sizes >= 2"),
    (["--target", "1.5"], "--target must be in (0, 1)"),
    (["--lrs", "0"], "--lrs > 0"),
    (["--select-seeds", "x"], "--select-seeds"),
    (["--epochs", "mlp=0"], "no epochs >= 1 for mlp"),
    (["--dilation", "8=0.5"], ">= 1"),
    (["--time-cap-min", "0"], "--time-cap-min must be > 0 minutes (a cap of 0 would start no run)"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(SystemExit) as exc:
        study.main(["--out", str(tmp_path)] + argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_study_resumed_from_its_document_runs_only_what_the_document_lacks(tmp_path, monkeypatch):
    first, docs = str(tmp_path / "first"), tmp_path / "docs"
    _make(first)
    _no_launch_docs(docs, monkeypatch)
    assert study.main(["--out", first, "--np", "4", "--models", "mlp", "--settings", "rna", "--seeds", "1,2,3",
                       "--update-docs", "--docs-dir", str(docs)]) == 0
    doc_path = str(docs / "bench" / "study.json")
    # a new sitting in an empty folder: BSP and RNA of seeds 1-3 come from the document, only SSP runs
    ran = []

    def fake_run_one(folder, n, model, lr, setting, seed, *a, **k):
        ran.append((setting, seed))
        _summary(folder, 1500, 9.0, 0.9, 800.0)
        return {"samples_to_target": 1500}

    monkeypatch.setattr(study, "run_one", fake_run_one)
    second = str(tmp_path / "second")
    assert study.main(["--out", second, "--np", "4", "--models", "mlp", "--settings", "rna,ssp", "--seeds", "1,2,3",
                       "--resume-doc", doc_path, "--update-docs", "--docs-dir", str(docs)]) == 0
    assert sorted(ran) == [("ssp", 1), ("ssp", 2), ("ssp", 3)]
    doc = json.loads((docs / "bench" / "study.json").read_text())
    assert len(doc["rows"]) == 7 + 3 and {t["setting"] for t in doc["summary"]} == {"rna", "ssp"}
    assert doc["command"].count("; then ") == 1 and "--resume-doc" in doc["command"]
    ssp = [t for t in doc["summary"] if t["setting"] == "ssp"][0]
    assert ssp["se"] == pytest.approx(statistics.median([1000 / 1500, 1200 / 1500, 1100 / 1500]))
    # a document of another scenario is refused before anything runs
    with pytest.raises(SystemExit):
        study.main(["--out", second, "--np", "4", "--resume-doc", doc_path, "--scenario", "device:40"])
    with pytest.raises(ValueError, match="not a study document"):
        (tmp_path / "x.json").write_text("[]")
        study.recorded_rows(str(tmp_path / "x.json"), "device:40+random:6", 0.9)


def test_the_document_names_every_invocation_that_ran_in_its_folder(tmp_path, monkeypatch):
    out, docs = str(tmp_path / "out"), tmp_path / "docs"
    _make(out)
    _no_launch_docs(docs, monkeypatch)
    plain = ["--out", out, "--np", "4", "--models", "mlp", "--settings", "rna", "--seeds", "1,2,3"]
    assert study.main(plain) == 0  # no --update-docs: logged, not written into the docs
    assert study.main(plain) == 0  # the same command again: logged once
    assert not (docs / "bench" / "study.json").exists()
    assert study.main(plain[:-2] + ["--seeds", "1,2", "--update-docs", "--docs-dir", str(docs)]) == 0
    doc = json.loads((docs / "bench" / "study.json").read_text())
    first, second = doc["command"].split("; then ")
    assert first == "python -m hetsync.bench.study " + " ".join(plain) and second.endswith("--docs-dir " + str(docs))
    # a later sitting from the document keeps the chain and adds its own command once
    assert study.command_chain(doc["command"], str(tmp_path / "new"), "python -m hetsync.bench.study X") == \
        doc["command"] + "; then python -m hetsync.bench.study X"
    assert json.loads((tmp_path / "new" / study.COMMANDS_FILE).read_text()) == ["python -m hetsync.bench.study X"]


def _grid(out):
    # BSP and SSP at lr 0.2 and 0.4 on seeds 1, 2 (reported) and 4, 5 (selection)
    times = {("bsp", 0.2): 20.0, ("bsp", 0.4): 12.0, ("ssp", 0.2): 8.0, ("ssp", 0.4): 10.0}
    for (setting, lr), t in times.items():
        for seed in (1, 2, 4, 5):
            samples = None if (setting, lr, seed) == ("ssp", 0.4, 5) else int(t * 500) + seed
            _summary(study.run_dir(out, 4, "mlp", lr, setting, seed), samples, t + seed if samples else None,
                     0.9, 600.0 if setting == "bsp" else 900.0)


def test_selection_seeds_choose_each_rate_and_the_tuned_table_reports_the_others(tmp_path):
    _grid(str(tmp_path))
    rows = study.rows_from(str(tmp_path))
    sel = study.select(rows, [5, 4])
    assert sel["select_seeds"] == [4, 5]
    assert [(c["setting"], c["lr"]) for c in sel["chosen"]] == [("bsp", 0.4), ("ssp", 0.2)]
    assert sel["chosen"][0]["time_to_target_s"] == pytest.approx(12.0 + 4.5)  # median of 16 and 17 s
    (t,) = sel["tuned"]
    assert (t["setting"], t["lr"], t["bsp_lr"], t["seeds"], t["reached"]) == ("ssp", 0.2, 0.4, 2, "2/2")
    # seeds 1, 2 only: BSP at 0.4 (13, 14 s) over SSP at 0.2 (9, 10 s)
    assert t["time_ratio"] == pytest.approx((13 / 9 + 14 / 10) / 2)
    assert t["se"] == pytest.approx(((6001 / 4001) + (6002 / 4002)) / 2)
    # the per-rate table leaves the selection seeds out
    assert {x["seeds"] for x in study.table(rows, exclude_seeds=[4, 5])} == {2}
    text = study.markdown(study.table(rows, exclude_seeds=[4, 5]), {"date_utc": "d", "command": "c", "scenario": "s",
                                                                   "dataset": "MNIST", "target": 0.9}, sel)
    assert "on the seeds other than 4, 5" in text and "| 4 | mlp | ssp | 0.2 | 0.4 | 2 |" in text
    with pytest.raises(ValueError, match="at least one selection seed"):
        study.select(rows, [])


def test_a_rate_missing_a_selection_seed_or_overrunning_does_not_compete(tmp_path):
    _grid(str(tmp_path))
    _summary(study.run_dir(str(tmp_path), 4, "mlp", 0.8, "bsp", 4), 100, 1.0, 0.9, 600.0)  # no seed 5 at 0.8
    _summary(study.run_dir(str(tmp_path), 4, "mlp", 1.6, "bsp", 4), 100, 1.0, 0.9, 600.0, overrun=0.02)
    _summary(study.run_dir(str(tmp_path), 4, "mlp", 1.6, "bsp", 5), 100, 1.0, 0.9, 600.0)
    sel = study.select(study.rows_from(str(tmp_path)), [4, 5])
    assert [(c["setting"], c["lr"]) for c in sel["chosen"]] == [("bsp", 0.4), ("ssp", 0.2)]


def test_a_faster_rate_that_ends_below_bsps_accuracy_loses_to_one_that_does_not(tmp_path):
    out = str(tmp_path)
    # BSP: 0.4 wins (12 s) with final accuracy 0.92 on the selection seeds; 0.2 (20 s) ends at 0.95
    # SSP: 0.2 is faster (8 s) but ends at 0.914 (0.6 points below BSP's 0.92); 0.4 (10 s) ends at 0.916 (0.4 below)
    grid = {("bsp", 0.2): (20.0, 0.95), ("bsp", 0.4): (12.0, 0.92), ("ssp", 0.2): (8.0, 0.914),
            ("ssp", 0.4): (10.0, 0.916)}
    for (setting, lr), (t, acc) in grid.items():
        for seed in (1, 4, 5):
            _summary(study.run_dir(out, 4, "mlp", lr, setting, seed), int(t * 500), t, acc, 600.0)
    sel = study.select(study.rows_from(out), [4, 5])
    assert [(c["setting"], c["lr"]) for c in sel["chosen"]] == [("bsp", 0.4), ("ssp", 0.4)]
    assert study.ACCURACY_SLACK == pytest.approx(0.005)
    # no SSP rate within 0.5 points of BSP: every rate competes, the fastest wins
    for seed in (4, 5):
        _summary(study.run_dir(out, 4, "mlp", 0.4, "ssp", seed), 5000, 10.0, 0.90, 600.0)
    sel = study.select(study.rows_from(out), [4, 5])
    assert [(c["setting"], c["lr"]) for c in sel["chosen"]] == [("bsp", 0.4), ("ssp", 0.2)]


def test_a_study_with_selection_seeds_writes_the_tuned_table(tmp_path, monkeypatch):
    out, docs = str(tmp_path / "study"), tmp_path / "docs"
    _grid(out)
    _no_launch_docs(docs, monkeypatch)
    assert study.main(["--out", out, "--np", "4", "--models", "mlp", "--settings", "ssp", "--seeds", "4,5",
                       "--lrs", "0.2,0.4", "--select-seeds", "4,5", "--update-docs", "--docs-dir", str(docs)]) == 0
    doc = json.loads((docs / "bench" / "study.json").read_text())
    assert doc["selection"]["tuned"][0]["bsp_lr"] == 0.4 and {t["seeds"] for t in doc["summary"]} == {2}
    assert "**Tuned fairly**" in (docs / "benchmarks.md").read_text()


def test_twins_run_bsp_on_the_homogeneous_twin_and_give_the_tax(tmp_path, monkeypatch):
    out = str(tmp_path / "study")
    _grid(out)  # BSP chooses 0.4 (13, 14 s on seeds 1, 2), SSP 0.2 (9, 10 s)
    launched = []

    def fake_run_one(folder, n, model, lr, setting, seed, spec, *a, **k):
        if os.path.exists(os.path.join(folder, "summary.json")):
            return {}  # run_one launches only what has no summary
        launched.append((setting, lr, seed, spec))
        _summary(folder, 3000, {1: 6.5, 2: 5.0, 4: 6.0, 5: 6.0}[seed], 0.9, 1000.0)
        return {"samples_to_target": 3000}

    monkeypatch.setattr(study, "run_one", fake_run_one)
    assert study.main(["--out", out, "--np", "4", "--models", "mlp", "--settings", "ssp", "--seeds", "1,2,4,5",
                       "--lrs", "0.2,0.4", "--select-seeds", "4,5", "--twins"]) == 0
    # only the twins were missing; device:40+random:6 on 4 ranks has the mean step 40 x (1 + 5/4) = 90 ms
    assert sorted(launched) == sorted((study.TWIN, lr, seed, "device:90") for lr in (0.2, 0.4) for seed in (1, 2, 4, 5))
    rows = study.rows_from(out)
    (t,) = study.select(rows, [4, 5])["tuned"]
    assert t["tax"] == pytest.approx(statistics.median([9 / 6.5, 10 / 5.0]))  # SSP's time over the twin's at 0.4
    assert t["bsp_tax"] == pytest.approx(statistics.median([13 / 6.5, 14 / 5.0]))
    ssp = [x for x in study.table(rows, exclude_seeds=[4, 5]) if x["setting"] == "ssp" and x["lr"] == 0.2][0]
    assert ssp["tax"] == pytest.approx(statistics.median([9 / 6.5, 10 / 5.0]))
    assert all(x["setting"] != study.TWIN for x in study.table(rows))  # the twin is a reference, not a row
    text = study.markdown(study.table(rows, exclude_seeds=[4, 5]), {"date_utc": "d", "command": "c", "scenario": "s",
                                                                   "dataset": "MNIST", "target": 0.9})
    bsp_tax = statistics.median([21 / 6.5, 22 / 5.0])  # BSP at 0.2: 21, 22 s
    assert f"| {statistics.median([9 / 6.5, 10 / 5.0]):.2f} ({bsp_tax:.2f}) |" in text


def test_twins_need_an_emulated_device(tmp_path, capsys):
    with pytest.raises(SystemExit):
        study.main(["--out", str(tmp_path), "--np", "4", "--scenario", "random:6", "--twins"])
    assert "--twins" in capsys.readouterr().err and not (tmp_path / study.COMMANDS_FILE).exists()
