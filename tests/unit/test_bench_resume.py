"""A benchmark matrix resumed from its own document (hetsync.bench.record, ``hetsync-bench --resume``) and cut by
a time cap, without launches: the runs it records are kept and not launched again (also those a filtered sitting
leaves out), the solo speeds and cluster calibrations are reused, the summary under docs/results/ is itself a
document to resume from, and a document of another preset is refused."""
import json
import types

import pytest

from hetsync.bench import docpages, matrix, record


def _preset():
    return matrix.Preset("t", np=2, cells=(matrix.parse_cell("digits/device:10"),), seeds=(0, 1),
                         epochs={"digits": 1, "mnist": 1})


def _fake(monkeypatch):
    """No launch: each run's figures follow from its seed and protocol; count the launches and solo runs."""
    calls = {"runs": [], "solo": 0}

    def one_run(preset, seed, cell, proto, run_dir, proto_args, solo, log, prepared=None):
        calls["runs"].append((seed, proto))
        t = 10.0 + seed + (2.0 if proto == "rna" else 0.0)
        return {"protocol": proto, "seed": seed, "cell": cell.key, "dataset": cell.dataset, "scenario": cell.scenario,
                "np": 2, "status": "ok", "twin_of": None, "command": "x", "out": run_dir,
                **{k: 1.0 for k in matrix.METRICS}, "time_to_target_s": t, "final_test_accuracy": 0.9}

    def solo(*a, **k):
        calls["solo"] += 1
        return {"samples_per_s": [100.0, 100.0], "bsp_expected_e": 1.0}

    monkeypatch.setattr(matrix, "_one_run", one_run)
    monkeypatch.setattr(matrix.efficiency, "measure_solo", solo)
    return calls


def test_a_resumed_matrix_keeps_its_recorded_runs_and_launches_only_the_others(monkeypatch, tmp_path):
    calls = _fake(monkeypatch)
    first = matrix.run_matrix(_preset(), ["bsp", "rna"], str(tmp_path / "a"), progress=False, log=lambda m: None)
    assert len(calls["runs"]) == 4 and calls["solo"] == 1 and first["resumed"] == 0 and first["left"] == 0
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    doc["runs"] = [r for r in doc["runs"] if not (r["seed"] == 1 and r["protocol"] == "rna")]  # one run lost
    (tmp_path / "a" / "results.json").write_text(json.dumps(doc))
    calls["runs"].clear()
    resume = record.load_resume(str(tmp_path / "a" / "results.json"), "t")
    again = matrix.run_matrix(_preset(), ["bsp", "rna"], str(tmp_path / "b"), progress=False, log=lambda m: None,
                              resume=resume)
    assert calls["runs"] == [(1, "rna")] and calls["solo"] == 1  # the solo speeds came with the document
    assert again["resumed"] == 3 and len(again["runs"]) == 4
    speedups = {(r["seed"], r["protocol"]): r["speedup_time_to_target"] for r in again["runs"]}
    assert speedups[(1, "rna")] == pytest.approx(11.0 / 13.0) and speedups[(0, "rna")] == pytest.approx(10.0 / 12.0)


def test_the_time_cap_leaves_runs_unstarted_and_the_docs_summary_resumes_them(monkeypatch, tmp_path):
    calls = _fake(monkeypatch)
    clock = iter([0.0] + [100.0 * k for k in range(1, 50)])  # 100 s pass between looks at the clock
    monkeypatch.setattr(matrix, "time", types.SimpleNamespace(time=lambda: next(clock)))
    capped = matrix.run_matrix(_preset(), ["bsp", "rna"], str(tmp_path / "a"), progress=False, log=lambda m: None,
                               time_cap_s=250.0)
    assert len(calls["runs"]) == 2 and capped["left"] == 2
    capped.update(machine=record.machine_description(), wall_s=1.0, pairs=[])
    summary = docpages.summarize(capped)
    assert len(summary["runs"]) == 2 and "command" not in summary["runs"][0] and summary["left"] == 2
    path = tmp_path / "t.json"
    path.write_text(json.dumps(summary))
    calls["runs"].clear()
    monkeypatch.setattr(matrix, "time", types.SimpleNamespace(time=lambda: 0.0))
    done = matrix.run_matrix(_preset(), ["bsp", "rna"], str(tmp_path / "b"), progress=False, log=lambda m: None,
                             resume=record.load_resume(str(path), "t"))
    assert calls["runs"] == [(1, "rna"), (1, "bsp")] and done["left"] == 0 and done["resumed"] == 2


def test_a_document_of_another_preset_or_without_runs_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"preset": {"name": "cluster"}, "runs": [{"seed": 0, "cell": "c", "protocol": "bsp",
                                                                         "status": "ok"}]}))
    with pytest.raises(ValueError, match="preset 'cluster', this invocation runs 'cluster-full'"):
        record.load_resume(str(path), "cluster-full")
    assert list(record.load_resume(str(path), "cluster")["runs"]) == [(0, "c", "bsp")]
    path.write_text(json.dumps({"preset": "cluster", "rows": []}))
    with pytest.raises(ValueError, match="records no runs"):
        record.load_resume(str(path), "cluster")
    path.write_text("{")
    with pytest.raises(ValueError, match="not a JSON document"):
        record.load_resume(str(path), "cluster")


def test_a_filtered_sitting_keeps_the_resumed_runs_of_the_protocols_it_leaves_out(monkeypatch, tmp_path):
    calls = _fake(monkeypatch)
    matrix.run_matrix(_preset(), ["bsp", "rna", "hop"], str(tmp_path / "a"), progress=False, log=lambda m: None)
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    doc["runs"] = [r for r in doc["runs"] if not (r["seed"] == 1 and r["protocol"] == "rna")]
    (tmp_path / "a" / "results.json").write_text(json.dumps(doc))
    calls["runs"].clear()
    again = matrix.run_matrix(_preset(), ["bsp", "rna"], str(tmp_path / "b"), progress=False, log=lambda m: None,
                              resume=record.load_resume(str(tmp_path / "a" / "results.json"), "t"))
    assert calls["runs"] == [(1, "rna")]  # only the missing run of a planned protocol is launched
    assert again["resumed"] == 5 and sorted((r["seed"], r["protocol"]) for r in again["runs"]) == [
        (0, "bsp"), (0, "hop"), (0, "rna"), (1, "bsp"), (1, "hop"), (1, "rna")]
    assert again["protocols"] == ["bsp", "rna", "hop"]
    written = json.loads((tmp_path / "b" / "results.json").read_text())
    assert {(r["seed"], r["protocol"]) for r in written["runs"]} >= {(0, "hop"), (1, "hop")}
    hop = {r["seed"]: r["speedup_time_to_target"] for r in again["runs"] if r["protocol"] == "hop"}
    assert hop[1] == pytest.approx(1.0)  # still put against BSP of its seed and cell
