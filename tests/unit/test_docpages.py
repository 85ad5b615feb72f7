"""hetsync.bench.docpages: the run summaries, the decision table, the README's headline and the page blocks."""
import json

import pytest

from hetsync.bench import docpages


def _stat(v):
    return {"median": v, "min": v, "max": v, "n": 3, "std": 0.0}


def _agg(cell, protocol, speedup, eff=None, runs=3, reached=3, scenario=None, overrun=0.0):
    return {"cell": cell, "np": int(cell[2]), "dataset": cell.split(":")[1].split("/")[0],
            "scenario": scenario or cell.split("/", 1)[1].split("@")[0].split("[")[0], "protocol": protocol,
            "label": protocol, "runs": runs, "reached_target": reached, "time_to_target_s": _stat(10.0 / speedup),
            "speedup_time_to_target": _stat(speedup), "samples_to_target": _stat(1000),
            "statistical_efficiency": None if eff is None else _stat(eff), "samples_per_s": _stat(100.0),
            "samples_per_s_ratio": _stat(speedup), "final_test_accuracy": _stat(0.9),
            "overrun_fraction": _stat(overrun)}


def _results(name, aggregate, pairs=(), wall_s=600.0, date="2026-11-25 10:00 UTC"):
    return {"preset": {"name": name}, "aggregate": list(aggregate), "runs": [{}] * 7, "wall_s": wall_s,
            "command": f"hetsync-bench --preset {name}", "pairs": list(pairs),
            "machine": {"date_utc": date, "cpu": "CPU", "cores": 2}}


RANDOM4 = "np4:mnist/device:40+random:6"
RANDOM8 = "np8:mnist/device:40+random:6"
SPEEDS = "np4:digits/device:40+speeds:1,1,1,0.5"


def test_summary_keeps_medians_cluster_and_overrun_and_round_trips(tmp_path):
    res = _results("full", [_agg(RANDOM4, "bsp", 1.0, 1.0), _agg(RANDOM4, "rna", 1.6, 0.8, overrun=0.004),
                            _agg("np8:mnist/device:10+random:6@4x2/10gbit[wide]", "rna", 2.0)])
    path = docpages.write_summary(str(tmp_path), res)
    assert path == str(tmp_path / "results" / "full.json")
    s = docpages.load_summaries(str(tmp_path / "results"))
    assert len(s) == 1 and s[0] == json.loads(json.dumps(docpages.summarize(res)))
    rows = s[0]["rows"]
    assert rows[1]["speedup_time_to_target"] == 1.6 and rows[1]["statistical_efficiency"] == 0.8
    assert rows[1]["overrun_fraction_max"] == 0.004 and rows[1]["cluster"] is None
    assert rows[2]["cluster"] == "4x2/10gbit" and s[0]["launches"] == 7 and s[0]["wall_s"] == 600.0


def test_load_summaries_names_a_file_that_is_not_one(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match=r"x.json is not a benchmark summary"):
        docpages.load_summaries(str(tmp_path))


@pytest.mark.parametrize("scenario,kind", [
    ("device:40+random:6", "random slowdowns"), ("device:40+netdelay:50", "slow network"),
    ("device:40+netdelay:50+random:6", "slow network"), ("speeds:1,1,0.5", "a fixed mix of speeds"),
    ("device:40+deterministic:3:4", "a deterministic straggler"), ("device:40", "none (homogeneous)"),
    ("none", "none (homogeneous)"), ("device:40+pause:1:5:2", "paused ranks"), ("device:40+stall:1:5:2", None)])
def test_heterogeneity_kind(scenario, kind):
    assert docpages.heterogeneity_kind(scenario) == kind


def test_decision_rows_pick_the_cell_with_most_seeds_then_ranks_and_the_best_protocol():
    full = docpages.summarize(_results("full", [
        _agg(RANDOM4, "bsp", 1.0), _agg(RANDOM4, "rna", 1.5), _agg(RANDOM4, "localsgd", 1.2),
        _agg(RANDOM8, "bsp", 1.0), _agg(RANDOM8, "rna", 2.2, 0.9), _agg(RANDOM8, "hop", 2.4, runs=3, reached=2),
        _agg(SPEEDS, "bsp", 1.0, runs=1, reached=1), _agg(SPEEDS, "taskalloc", 1.1, runs=1, reached=1),
        _agg("np4:digits/device:40+deterministic:3:4", "rna", 3.0, runs=1, reached=1)]))  # no BSP: skipped
    rows = docpages.decision_rows([full])
    assert [r["kind"] for r in rows] == ["random slowdowns", "a fixed mix of speeds", "paused ranks"]
    assert rows[2]["protocol"] == "-" and rows[2]["where"] == "no recorded run of this kind yet"
    r = rows[0]
    # 8 ranks beat 4 at equal seeds; Hop missed the target in one run, so RNA is the best that always reached it
    assert (r["protocol"], r["time_ratio"], r["samples_ratio"], r["runner_up"]) == ("rna", "2.20x", "0.90x", "-")
    assert r["where"] == "8 ranks, mnist, device:40+random:6, 3 seeds" and r["link"] == "../results.html#preset-full"
    assert rows[1]["where"].endswith("1 seed") and rows[1]["samples_ratio"] == "-"


def test_headline_from_pairs_and_refused_without():
    pair = {"cell": "np8:mnist/device:10+random:6@4x2/10gbit[wide]", "reference": "bsp", "candidate": "rna",
            "comm_fraction": 0.54, "time_to_target_s_ratio_median": 2.05, "samples_to_target_ratio_median": 0.55,
            "samples_per_s_ratio_median": 3.78}
    text = docpages.headline_section(docpages.summarize(_results("cluster", [], pairs=[pair])))
    assert "| `4x2/10gbit` | `device:10+random:6` | rna vs bsp | 2.05x | 0.55x | 3.78x | 0.54 |" in text
    with pytest.raises(ValueError, match="no side-by-side pairs"):
        docpages.headline_section(docpages.summarize(_results("full", [])))


def test_replace_block_changes_only_the_block_and_refuses_one_marker():
    b, e = docpages.results_markers("quick")
    page = f"# Results\n\nintro\n\n{b}\nold\n{e}\n\n## After\n"
    new = docpages.replace_block(page, b, e, "new body", "## Preset `quick`")
    assert new == f"# Results\n\nintro\n\n{b}\nnew body\n{e}\n\n## After\n"
    appended = docpages.replace_block("# Results\n", b, e, "x", "## Preset `quick`")
    assert appended == f"# Results\n\n## Preset `quick`\n\n{b}\nx\n{e}\n"
    with pytest.raises(ValueError, match="only one of the markers"):
        docpages.replace_block(f"# R\n{b}\n", b, e, "x", "## P")
