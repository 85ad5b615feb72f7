"""Benchmark cells on the emulated multi-host cluster (hetsync.bench.cluster_cells and the matrix's
``cluster`` preset): protocol variants, cell names, the communication share, calibration shared between
cells, and the launch of a cluster cell's run. The real launches are in tests/mp/test_cluster_mp.py."""
import json
import os
import subprocess

import pytest

from hetsync.bench import alphabeta, cluster_cells, matrix
from hetsync.emulation.cluster.spec import UNSHAPED, ClusterSpec


def test_variants_name_a_protocol_with_its_arguments():
    assert cluster_cells.parse_variant("bsp") == ("bsp", ())
    assert cluster_cells.parse_variant("rnah(groups=host;servers=2)") == ("rnah", ("groups=host", "servers=2"))
    assert cluster_cells.parse_variant("shat()") == ("shat", ())
    for bad in ("shat(sharding)", "(x=1)", "shat(x=1"):
        with pytest.raises(ValueError, match="variant"):
            cluster_cells.parse_variant(bad)


def test_cluster_labels_and_the_device_part():
    assert cluster_cells.cluster_label(ClusterSpec(hosts=4, slots=2, link="10gbit")) == "4x2/10gbit"
    spec = ClusterSpec(hosts=5, slots=2, link="10gbit", host_slots=(("h3", 1), ("h4", 1)),
                       host_links=(("h2", "2.5gbit"),))
    assert cluster_cells.cluster_label(spec) == "h0:2,h1:2,h2:2,h3:1,h4:1/10gbit,h2=2.5gbit"
    assert cluster_cells.device_only("device:10+random:6") == "device:10"
    with pytest.raises(ValueError, match="needs an emulated device"):
        cluster_cells.device_only("random:6")


def _records(folder, rank, step_ms):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"rank{rank}.jsonl"), "w") as f:
        for i, ms in enumerate(step_ms):
            f.write(json.dumps({"step": i, "step_ms": ms}) + "\n")


def test_median_step_and_comm_fraction(tmp_path):
    _records(tmp_path, 0, [5000, 900, 100, 300, 200])
    _records(tmp_path, 1, [4000, 800, 400, 500])
    assert cluster_cells.median_step_ms(str(tmp_path)) == 300  # 100, 200, 300, 400, 500: the first 2 of each left out
    assert cluster_cells.comm_fraction(1000.0, 400.0) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="must be > 0"):
        cluster_cells.comm_fraction(0.0, 1.0)
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.raises(ValueError, match="no step records"):
        cluster_cells.median_step_ms(str(empty))


def test_prepare_calibrates_with_the_candidate_then_runs_bsp_shaped_and_unshaped(monkeypatch, tmp_path):
    calls = []

    def fake_calibrate(hosts, slots, link, job, out_dir, candidates, host_links, timeout_s, log, host_slots):
        calls.append(("calibrate", hosts, slots, link, tuple(job)))
        return {"dilation": 60.0, "trials": []}

    def fake_trial(spec, job, out, timeout_s):
        calls.append(("trial", spec.link, spec.dilation, spec.host_links, job[job.index("--protocol") + 1]))
        _records(out, 0, [1, 1, 600, 600] if spec.link == UNSHAPED else [1, 1, 1000, 1000, 1000])
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump({"gradient_bytes": 7_454_760}, f)
        return {"ok": True, "overrun_fraction": 0.0}

    def fake_measure(spec, gradient_bytes, out_dir, timeout_s):
        calls.append(("alphabeta", spec.link, spec.dilation, spec.host_links, gradient_bytes))
        return {"fit": {"alpha_s": 1e-4}}

    monkeypatch.setattr(cluster_cells._calibrate, "calibrate", fake_calibrate)
    monkeypatch.setattr(cluster_cells._calibrate, "trial", fake_trial)
    monkeypatch.setattr(cluster_cells._alphabeta, "measure", fake_measure)
    spec = ClusterSpec(hosts=4, slots=2, link="10gbit", host_links=(("h2", "2.5gbit"),))
    cell = matrix.Cell("mnist", "device:10+random:6", np=8, protocols=("bsp", "rna(probes=2)"), cluster=spec,
                       model="wide")
    job = ["-m", "hetsync.bench.job", "--dataset", "digits", "--epochs", "3", "--model", "wide"]
    cache = {}
    got = cluster_cells.prepare(cell, job, str(tmp_path / "a"), cache, log=lambda m: None)
    assert got["dilation"] == 60.0 and got["comm_fraction"] == pytest.approx(0.4)
    assert got["shaped_step_ms"] == 1000 and got["unshaped_step_ms"] == 600 and got["calibrated_with"] == "rna(probes=2)"
    kind, hosts, slots, link, argv = calls[0]
    assert (kind, hosts, slots, link) == ("calibrate", 4, 2, "10gbit") and argv[:2] == ("--dataset", "digits")
    assert argv[argv.index("--slowdown") + 1] == "device:10" and argv[argv.index("--epochs") + 1] == "1"
    assert argv[argv.index("--protocol") + 1] == "rna" and argv[-2:] == ("--protocol-arg", "probes=2")
    assert calls[1] == ("trial", "10gbit", 60.0, (("h2", "2.5gbit"),), "bsp")  # the cell's own links
    assert calls[2] == ("trial", UNSHAPED, 60.0, (), "bsp")
    # then the alpha-beta microbenchmark on the cell's shaped links at D, up to the model's gradient
    assert calls[3] == ("alphabeta", "10gbit", 60.0, (("h2", "2.5gbit"),), 7_454_760)
    assert got["alphabeta"] == {"fit": {"alpha_s": 1e-4}}
    # another cell on the same cluster, model, device and candidate: no second calibration
    other = matrix.Cell("mnist", "device:10+random:3", np=8, protocols=("rna(probes=2)",), cluster=spec, model="wide")
    assert cluster_cells.prepare(other, job, str(tmp_path / "b"), cache, log=lambda m: None) is got
    assert len(calls) == 4


def test_the_cluster_preset_plans_exactly_its_variants_and_launches_on_the_cluster(monkeypatch, tmp_path):
    monkeypatch.setenv("HETSYNC_DATA_DIR", str(tmp_path))  # the mnist cells' folder (not read here)
    preset = matrix.PRESETS["cluster"]
    preset.validate()
    order = matrix.plan(preset, ["bsp", "rna", "rnah", "shat"])
    assert len(order) == 18 and {s for s, _, _ in order} == {0, 1, 2}
    by_cell = {}
    for _, cell, proto in order:
        by_cell.setdefault(cell.key, set()).add(proto)
    assert by_cell == {
        "np8:mnist/device:10+random:6@4x2/10gbit[wide]":
            {"bsp", "rna(update_rule=samples;wait_for_round=true;wait_lag=1)"},
        "np8:mnist/device:10+random:6@h0:2,h1:2,h2:2,h3:1,h4:1/10gbit,h2=2.5gbit[wide]":
            {"rna", "rnah(groups=host;servers=2;server_rule=delta)"},
        "np8:digits/device:10@h0:2,h1:2,h2:2,h3:1,h4:1/1gbit[wide]":
            {f"shat(sharding={s};servers=2;data_plan=shard)" for s in ("layer", "memory")}}
    assert len(matrix.plan(preset, ["bsp", "rna"])) == 9  # filtered by the variants' protocol names
    cell = next(c for c in preset.cells if c.protocols[0] == "rna")
    cmd = matrix.launch_command(preset, 1, cell, "rnah(groups=host;servers=2)", "/tmp/x", ("timeout_s=60",),
                                dilation=30.0)
    assert cmd[1:4] == ["-m", "hetsync.emulation.cluster", "run"]
    text = " ".join(cmd)
    assert "--dilation 30 " in text and "--host-slots h3=1 --host-slots h4=1" in text
    assert "--host-link h2=2.5gbit" in text and "--record /tmp/x/cluster.json" in text
    assert "-np {np} -H {hosts}" in text and "--model wide" in text and "--protocol rnah " in text
    assert text.endswith("--protocol-arg groups=host --protocol-arg servers=2 --protocol-arg timeout_s=60")


def test_a_cluster_cell_whose_ranks_do_not_match_its_cluster_is_refused():
    spec = ClusterSpec(hosts=2, slots=2)
    bad = matrix.Cell("digits", "device:10", np=8, protocols=("bsp",), cluster=spec)
    preset = matrix.Preset("x", np=8, cells=(bad,), seeds=(0,), epochs={"digits": 1})
    with pytest.raises(ValueError, match="its cluster runs 4 ranks, the cell 8"):
        preset.validate()
    nodev = matrix.Cell("digits", "random:6", np=4, protocols=("bsp",), cluster=spec)
    with pytest.raises(ValueError, match="needs an emulated device"):
        matrix.Preset("x", np=4, cells=(nodev,), seeds=(0,), epochs={"digits": 1}).validate()


def test_pairs_put_each_cells_candidate_against_its_reference_seed_by_seed():
    spec = ClusterSpec(hosts=4, slots=2, link="10gbit")
    cell = matrix.Cell("mnist", "device:10+random:6", np=8, protocols=("bsp", "rna"), cluster=spec, model="wide")
    runs = []
    for seed, (tb, tr) in enumerate(((100.0, 50.0), (60.0, 62.0), (80.0, None))):
        runs.append({"cell": cell.key, "protocol": "bsp", "seed": seed, "status": "ok", "time_to_target_s": tb,
                     "samples_to_target": 6000, "samples_per_s": 60.0, "comm_fraction": 0.5, "dilation": 60.0,
                     "overrun_fraction": 0.0})
        runs.append({"cell": cell.key, "protocol": "rna", "seed": seed, "status": "ok", "time_to_target_s": tr,
                     "samples_to_target": 12000 if tr else None, "samples_per_s": 240.0, "comm_fraction": 0.5,
                     "dilation": 60.0, "overrun_fraction": 0.002})
    (row,) = cluster_cells.pair_ratios(runs, [cell, matrix.Cell("digits", "device:10")])
    assert row["time_to_target_s_ratio"] == {0: 2.0, 1: 60.0 / 62.0, 2: None}
    assert row["time_to_target_s_ratio_median"] == pytest.approx((2.0 + 60.0 / 62.0) / 2)
    assert row["samples_to_target_ratio_median"] == 0.5 and row["samples_per_s_ratio_median"] == 4.0
    assert row["overrun_fraction_max"] == 0.002 and row["comm_fraction"] == 0.5 and row["dilation"] == 60.0
    table = cluster_cells.pair_table([row])
    assert "| rna vs bsp | 1.48x | 0.50x | 4.00x | 0.50 | 60 | 0.2% |" in table


def test_a_cluster_run_is_put_beside_the_e_its_cells_alpha_beta_model_predicts(monkeypatch, tmp_path):
    monkeypatch.setenv("HETSYNC_DATA_DIR", str(tmp_path))
    preset = matrix.PRESETS["cluster"]
    cell = next(c for c in preset.cells if c.protocols[0] == "bsp")  # 4 x 2 hosts at 10 Gbit/s
    run_dir = tmp_path / "run"
    os.makedirs(run_dir)
    (run_dir / "summary.json").write_text(json.dumps({"scenario": "device:10", "world_size": 8, "batch_size": 32,
                                                      "gradient_bytes": 4 * 1_863_690}))
    monkeypatch.setattr(matrix.launch, "run", lambda *a, **k: subprocess.CompletedProcess(a[0], 0, "", ""))
    monkeypatch.setattr(matrix, "analyse_run", lambda run_dir, solo: {"efficiency_analytic": 0.5})
    # a ring edge of 1 Gbit/s in the dilated (D = 10) cluster's wall time: 10 Gbit/s emulated, no latency
    fit = {"alpha_s": 0.0, "overhead_s": 0.0, "ring_bytes_per_s": 1e9 / 8, "p2p_bytes_per_s": None}
    rec = matrix._one_run(preset, 0, cell, "bsp", str(run_dir), (), {}, log=lambda m: None,
                          prepared={"dilation": 10.0, "comm_fraction": 0.5, "alphabeta": {"fit": fit}})
    allreduce_ms = 2 * 7 / 8 * 4 * 1_863_690 / 1.25e9 * 1e3
    assert rec["status"] == "ok" and rec["efficiency_model"] == pytest.approx(10 / (10 + allreduce_ms))
    assert rec["protocol_args"] == []  # recorded, so a report from the run folders models the run as it ran
    assert rec["efficiency_model_gap"] == pytest.approx(0.5 / rec["efficiency_model"] - 1)


def test_a_report_from_the_run_folders_fits_the_links_again_and_keeps_each_runs_variant(monkeypatch, tmp_path):
    preset = matrix.PRESETS["cluster"]
    cell = next(c for c in preset.cells if c.protocols[0] == "bsp")
    run_dir = tmp_path / "run"
    os.makedirs(run_dir)
    (run_dir / "summary.json").write_text(json.dumps({"scenario": "device:10", "world_size": 8, "batch_size": 32,
                                                      "gradient_bytes": 4 * 1_863_690}))
    monkeypatch.setattr(matrix, "analyse_run", lambda run_dir, solo: {"efficiency_analytic": 0.5,
                                                                      "protocol_label": "rna"})
    monkeypatch.setattr(matrix, "add_ratios", lambda runs: None)  # the figures over seeds are not the subject
    monkeypatch.setattr(matrix, "aggregate", lambda runs: [])
    # timings of a 1 Gbit/s ring in the dilated (D = 10) cluster's wall time whose collective costs 0.5 ms fixed,
    # where a point-to-point message costs 20 ms: the ring's steps get the collective's latency, not 20 ms each
    sizes = alphabeta.sizes_up_to(4 * 1_863_690)
    points = [{"bytes": m, "allreduce_s": 5e-4 + 2 * 7 / 8 * m / 1.25e8, "p2p_s": 0.02 + m / 1.25e8} for m in sizes]
    stale = {"alpha_s": 0.02, "overhead_s": 0.0, "ring_bytes_per_s": 1.25e8, "p2p_bytes_per_s": 1.25e8}
    variant = "rna(update_rule=samples;wait_for_round=true)"
    results = {"solo": {cell.key: {}}, "cells": {cell.key: {"dilation": 10.0, "alphabeta": {
        "fit": stale, "points": points, "world_size": 8}}},
        "runs": [{"cell": cell.key, "protocol": variant, "seed": 0, "status": "ok", "out": str(run_dir)},
                 {"cell": cell.key, "protocol": "rna", "seed": 1, "status": "ok", "out": str(run_dir),
                  "protocol_args": ["update_rule=samples", "wait_for_round=true"]},
                 {"cell": cell.key, "protocol": "rna", "seed": 2, "status": "ok", "out": str(run_dir)}]}
    matrix.reanalyse(results, str(tmp_path), preset)
    run, with_args, plain = results["runs"]
    # the same setting given as --protocol-arg values is modelled as the variant; without them, RNA's default
    assert with_args["efficiency_model"] == pytest.approx(run["efficiency_model"])
    assert plain["efficiency_model"] != pytest.approx(run["efficiency_model"])
    assert results["cells"][cell.key]["alphabeta"]["fit"]["collective_alpha_s"] == pytest.approx(5e-4 / 14)
    assert run["protocol_label"] == variant and run["efficiency_model"] is not None
    # waiting for each round: a step lasts the device time plus one round (2 latencies and the allreduce)
    round_ms = (5e-4 + 2 * 7 / 8 * (4 * 1_863_690 + 4) / 1.25e8 + 2 * 0.02) / 10 * 1e3
    assert run["efficiency_model"] == pytest.approx(10 / (10 + round_ms), rel=1e-3)
    # points that no longer fit keep the recorded fit (and say so); results of another preset are refused
    results["cells"][cell.key]["alphabeta"]["points"] = points[:2]
    kept = dict(results["cells"][cell.key]["alphabeta"]["fit"])
    matrix.reanalyse(results, str(tmp_path), preset)
    assert results["cells"][cell.key]["alphabeta"]["fit"] == kept
    results["preset"] = {"name": "full"}
    with pytest.raises(ValueError, match="of preset 'full', not 'cluster'"):
        matrix.reanalyse(results, str(tmp_path), preset)
