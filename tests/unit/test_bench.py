"""hetsync.bench: E's formula and solo measurement, the figures of a run, and the quick preset end to end."""
import json
import os
import pytest
from conftest import PY, ROOT, _env
from hetsync.bench import efficiency, matrix, table


def test_efficiency_formula_and_bsp_expectation():
    v = [100.0, 100.0, 100.0, 50.0]  # speeds:1,1,1,0.5
    assert efficiency.efficiency(350.0, v) == pytest.approx(1.0)
    assert efficiency.efficiency(175.0, v) == pytest.approx(0.5)
    assert efficiency.bsp_expected_efficiency(v) == pytest.approx(4 * 50 / 350)
    assert efficiency.bsp_expected_efficiency([7.0, 7.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="solo speeds"):
        efficiency.efficiency(1.0, [1.0, 0.0])
    with pytest.raises(ValueError, match="measured"):
        efficiency.efficiency(0.0, [1.0])


def _records(step_s, epochs, steps_per_epoch, gap_s=0.5, warmup_s=3.0):
    """Per-step records: every step takes step_s, plus gap_s between epochs and warmup_s on step 0."""
    recs, t = [], warmup_s
    for e in range(epochs):
        for k in range(steps_per_epoch):
            t += step_s + (gap_s if k == 0 and e > 0 else 0.0)
            recs.append({"step": len(recs), "epoch": e, "wall_s": t, "step_ms": step_s * 1e3,
                         "compute_ms": step_s * 400, "delay_ms": step_s * 300, "sync_wait_ms": step_s * 200})
    return recs


def test_steady_rate_skips_warmup_and_epoch_boundaries():
    steps, samples = efficiency.steady_rate(_records(0.01, epochs=4, steps_per_epoch=10), samples_per_step=32)
    assert steps == pytest.approx(100.0) and samples == pytest.approx(3200.0)
    with pytest.raises(ValueError, match="measurable steps"):
        efficiency.steady_rate(_records(0.01, epochs=1, steps_per_epoch=3), 32)


def test_solo_spec_drops_network_latency_only():
    assert efficiency.solo_spec("speeds:1,1,1,0.5+netdelay:50") == "speeds:1,1,1,0.5"
    assert efficiency.solo_spec("netdelay:50") == "none"
    assert efficiency.solo_spec("random:6") == "random:6"
    with pytest.raises(ValueError, match="unknown slowdown scenario"):
        efficiency.solo_spec("sometimes:3")


def _fake_run(path, step_s_per_rank, samples_per_step=32, epochs=4, steps_per_epoch=10, target=0.9, late_s=()):
    """A run folder with known per-rank speeds, as SyncMetrics and the example write it
    (rank r's warm-up lasts ``3 + late_s[r]`` seconds)."""
    os.makedirs(path, exist_ok=True)
    per_rank = []
    for r, step_s in enumerate(step_s_per_rank):
        recs = _records(step_s, epochs, steps_per_epoch, warmup_s=3.0 + (late_s[r] if r < len(late_s) else 0.0))
        with open(os.path.join(path, f"rank{r}.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in recs)
        per_rank.append({"rank": r, "steps": len(recs), "samples": len(recs) * samples_per_step})
    curve = [{"step": 10, "epoch": 0, "wall_s": 3.2, "accuracy": 0.5},
             {"step": 20, "epoch": 1, "wall_s": 4.0, "accuracy": 0.92}]
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"per_rank": per_rank, "target_accuracy": target, "accuracy_curve": curve,
                   "final_test_accuracy": 0.92, "time_to_target_s": 4.0, "steps": epochs * steps_per_epoch,
                   "wall_s": 9.0}, f)


def test_e_of_a_synthetic_run_with_known_speeds(tmp_path):
    # ranks step every 10 ms and 20 ms: 3200 and 1600 samples/s; alone they would do 3200 and 3200.
    _fake_run(str(tmp_path / "run"), [0.01, 0.02])
    for r, step_s in enumerate([0.01, 0.01]):
        _fake_run(str(tmp_path / "solo" / f"rank{r}"), [step_s])
    solo_rates = [efficiency.run_rates(str(tmp_path / "solo" / f"rank{r}")) for r in range(2)]
    v = [s["samples_per_s"] for s in solo_rates]
    assert v == pytest.approx([3200.0, 3200.0])
    solo = {"samples_per_s": v, "bsp_expected_e": efficiency.bsp_expected_efficiency(v)}
    fig = matrix.analyse_run(str(tmp_path / "run"), solo)
    assert fig["samples_per_s"] == pytest.approx(4800.0)
    assert fig["per_rank_samples_per_s"] == pytest.approx([3200.0, 1600.0])
    assert fig["steps_per_s"] == pytest.approx(75.0)  # mean of 100 and 50 steps/s
    assert fig["efficiency"] == pytest.approx(0.75)
    assert fig["bsp_expected_efficiency"] == pytest.approx(1.0)
    # time to target counts from the end of rank 0's first step (3.01 s)
    assert fig["time_to_target_s"] == pytest.approx(4.0 - 3.01)
    assert fig["final_test_accuracy"] == 0.92
    assert fig["rates_concurrent"] is True
    lo, hi = fig["rates_window_s"]
    assert lo == pytest.approx(3.0 + 10 * 0.02 + 0.5 + 0.02) and hi == pytest.approx(3.0 + 40 * 0.01 + 3 * 0.5)


def test_emulated_run_gets_analytic_e_and_flags(tmp_path):
    """E against the analytic solo speeds b / (E[K] MS): rank 1 is 2x slower on a 10 ms device."""
    _fake_run(str(tmp_path / "run"), [0.01, 0.02])
    path = tmp_path / "run" / "summary.json"
    s = json.loads(path.read_text())
    s.update(scenario="device:10+deterministic:1:2", world_size=2, batch_size=32, emulated_steps=80,
             overrun_steps=1, overrun_fraction=1 / 80, emulation_valid=False)
    path.write_text(json.dumps(s))
    assert efficiency.analytic_solo("device:10+deterministic:1:2", 2, 32) == pytest.approx([3200.0, 1600.0])
    assert efficiency.analytic_solo("deterministic:1:2", 2, 32) is None  # real CPU: measured only
    # BSP steps at the slowest rank's pace: n min(v) / sum(v) for fixed speeds; for random:6 on 4 ranks
    # E[K] = 2.25 per rank against E[max] = 6 - 5 (3/4)^4 = 4.418 per step
    assert efficiency.bsp_expected_efficiency_emulated("device:10+deterministic:1:2", 2, 32) == pytest.approx(2 / 3)
    assert efficiency.bsp_expected_efficiency_emulated("device:40+random:6", 4, 32) == pytest.approx(
        2.25 / (6 - 5 * 0.75 ** 4), rel=0.02)
    assert efficiency.bsp_expected_efficiency_emulated("random:6", 4, 32) is None
    fig = matrix.analyse_run(str(tmp_path / "run"), {"samples_per_s": [3200.0, 1600.0], "bsp_expected_e": 2 / 3})
    assert fig["efficiency_analytic"] == pytest.approx(1.0)  # each rank at its device's pace
    assert fig["bsp_expected_efficiency_analytic"] == pytest.approx(2 * 1600 / 4800)  # n min(v) / sum(v)
    assert fig["emulated"] and fig["overrun_fraction"] == pytest.approx(1 / 80) and fig["emulation_valid"] is False
    assert fig["step_ms"] == pytest.approx(1e3 / 75.0)
    assert not fig["e_flagged"]
    # a run faster than its devices allow is flagged (E > 1.05), and so is an overrun row in the table
    fig = matrix.analyse_run(str(tmp_path / "run"), {"samples_per_s": [3200.0, 1000.0]})
    assert fig["efficiency"] == pytest.approx(4800 / 4200) and not fig["e_flagged"]  # flags use the devices' speeds
    s["scenario"] = "device:12+deterministic:1:2"  # devices 20% slower than the run: E analytic 1.2
    path.write_text(json.dumps(s))
    fig = matrix.analyse_run(str(tmp_path / "run"), {"samples_per_s": [3200.0, 1000.0]})
    assert fig["efficiency_analytic"] == pytest.approx(1.2) and fig["e_flagged"]
    row = dict(fig, protocol="bsp", seed=0, cell="np2:digits/x", dataset="digits", scenario="x", status="ok", np=2)
    matrix.add_ratios([row])
    md = table.markdown_table({"aggregate": matrix.aggregate([row]), "preset": {"np": 4}})
    data = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
            if line.startswith("|") and "digits/x" in line]
    assert len(data) == 1 and data[0][:3] == ["2", "digits/x", "bsp"], md  # ranks of the row (np), cell, protocol
    assert "1.14 !" in md and "1.2% !" in md and "E ! :" in md and "overrun ! :" in md  # E column: measured
    # where ranks serve parameters, E analytic is over the workers' devices only (workers come first)
    s.update(scenario="device:10+deterministic:1:2", workers=1)
    path.write_text(json.dumps(s))
    fig = matrix.analyse_run(str(tmp_path / "run"), {"samples_per_s": [3200.0, 1600.0]})
    assert fig["efficiency_analytic"] == pytest.approx(4800 / 3200)


def test_cells_with_their_own_ranks_protocols_and_epochs(monkeypatch, tmp_path):
    monkeypatch.setenv("HETSYNC_DATA_DIR", str(tmp_path))  # the mnist cell's data setting
    c = matrix.parse_cell("np8:mnist/device:40+random:6", protocols=("rna",), epochs=8)
    assert (c.np, c.dataset, c.scenario, c.protocols, c.epochs) == (8, "mnist", "device:40+random:6", ("rna",), 8)
    assert c.key == "np8:mnist/device:40+random:6" and c.emulated
    assert matrix.with_device(matrix.parse_cell("digits/none"), 30).scenario == "device:30"
    assert matrix.with_device(matrix.parse_cell("digits/random:6"), 0).scenario == "random:6"
    assert matrix.with_device(c, 30) is c  # has a device already
    p = matrix.Preset("t", np=4, cells=(c, matrix.parse_cell("digits/none")), seeds=(0,),
                      epochs={"digits": 2, "mnist": 1}, evals=20)
    p.validate()
    order = matrix.plan(p, ["bsp", "rna", "selsync"])
    assert [(cell.key, proto) for _, cell, proto in order] == [
        ("np8:mnist/device:40+random:6", "bsp"), ("np8:mnist/device:40+random:6", "rna"),
        ("digits/none", "rna"), ("digits/none", "selsync"), ("digits/none", "bsp")]
    cmd = matrix.launch_command(p, 0, c, "rna", "/tmp/x")
    assert cmd[cmd.index("-np") + 1] == "8" and cmd[cmd.index("--epochs") + 1] == "8"
    # 8000 MNIST samples / (8 ranks x 32) = 31 steps per epoch, 8 epochs, 20 evaluations
    assert cmd[cmd.index("--eval-every") + 1] == str(31 * 8 // 20)
    with pytest.raises(ValueError, match="does not fit 4 ranks"):
        matrix.Preset("t", np=4, cells=(matrix.parse_cell("np4:digits/speeds:1,1"),), seeds=(0,),
                      epochs={"digits": 1}).validate()


def test_ranks_that_never_overlap_fall_back_to_their_own_steady_state(tmp_path):
    _fake_run(str(tmp_path / "run"), [0.01, 0.02], late_s=(0.0, 10.0))  # rank 1 starts after rank 0 ended
    rates = efficiency.run_rates(str(tmp_path / "run"))
    assert rates["concurrent"] is False and rates["window"] is None
    # 27 measured steps each, over the span from rank 0's warm-up end (3.61 s) to rank 1's last step
    span = (13.0 + 40 * 0.02 + 3 * 0.5) - (3.0 + 10 * 0.01 + 0.5 + 0.01)
    assert [p["samples_per_s"] for p in rates["per_rank"]] == pytest.approx([27 * 32 / span] * 2)
    assert rates["samples_per_s"] < 3200 + 1600  # a lower bound, never more than each rank alone


def test_ratios_against_bsp_of_the_same_seed_and_cell():
    def run(proto, seed, ttt, sps, e, acc):
        return {"protocol": proto, "seed": seed, "cell": "digits/random:6", "dataset": "digits",
                "scenario": "random:6", "status": "ok", "time_to_target_s": ttt, "samples_per_s": sps,
                "steps_per_s": sps / 32, "efficiency": e, "final_test_accuracy": acc, "bsp_expected_efficiency": 0.5}
    runs = [run("bsp", 0, 10.0, 1000.0, 0.4, 0.90), run("rna", 0, 5.0, 2000.0, 0.8, 0.91),
            run("bsp", 1, 8.0, 1000.0, 0.5, 0.92), run("rna", 1, None, 1500.0, 0.75, 0.88)]
    matrix.add_ratios(runs)
    assert runs[1]["speedup_time_to_target"] == pytest.approx(2.0)
    assert runs[1]["samples_per_s_ratio"] == pytest.approx(2.0)
    assert runs[1]["efficiency_ratio"] == pytest.approx(2.0)
    assert runs[3]["speedup_time_to_target"] is None  # target missed: no ratio
    assert runs[3]["accuracy_delta"] == pytest.approx(-0.04)
    agg = {a["protocol"]: a for a in matrix.aggregate(runs)}
    assert agg["rna"]["efficiency"]["median"] == pytest.approx(0.775)
    assert agg["rna"]["efficiency"]["min"] == 0.75 and agg["rna"]["efficiency"]["max"] == 0.8
    assert agg["rna"]["reached_target"] == 1 and agg["bsp"]["reached_target"] == 2
    assert "0.78 (0.75-0.80)" in table.markdown_table({"aggregate": list(agg.values())})


def test_plan_interleaves_and_rotates_protocols():
    p = matrix.Preset("t", np=2, cells=(matrix.parse_cell("random:3"), matrix.parse_cell("mnist/none")),
                      seeds=(0, 1), epochs={"digits": 1, "mnist": 1})
    order = matrix.plan(p, ["bsp", "a", "b"])
    assert len(order) == 12
    assert [x[2] for x in order[:6]] == ["bsp", "a", "b", "a", "b", "bsp"]
    assert {(s, c.key) for s, c, _ in order} == {(s, c) for s in (0, 1) for c in ("digits/random:3", "mnist/none")}
    with pytest.raises(ValueError, match="does not fit 2 ranks"):
        matrix.Preset("t", np=2, cells=(matrix.parse_cell("speeds:1,1,1,0.5"),), seeds=(0,),
                      epochs={"digits": 1}).validate()
    with pytest.raises(ValueError, match="unknown data set"):
        matrix.parse_cell("cifar/none")


def test_window_rates_measure_ranks_only_while_all_of_them_run():
    # rank 0: 10 steps per epoch at 10 ms for 4 epochs, then stops (at 4.9 s); rank 1: 20 ms steps for 4
    # epochs (to 6.1 s), then 5 ms steps once it has the cores to itself. Over the common window it ran at 20 ms.
    fast = _records(0.01, epochs=4, steps_per_epoch=10)
    slow = _records(0.02, epochs=4, steps_per_epoch=10)
    t = slow[-1]["wall_s"]
    for k in range(40):
        t += 0.005
        slow.append({"step": len(slow), "epoch": 4 + k // 20, "wall_s": t})
    rates = efficiency.window_rates([(0, fast, 32.0), (1, slow, 32.0)], "synthetic")
    assert rates["concurrent"] is True
    assert [p["samples_per_s"] for p in rates["per_rank"]] == pytest.approx([3200.0, 1600.0])
    alone = efficiency.steady_rate(slow, 32.0)[1]
    assert alone > 1.5 * 1600  # its own whole run would count the faster steps after rank 0 ended


def test_failed_solo_measurement_raises_with_the_output(tmp_path):
    with pytest.raises(efficiency.SoloError, match="no_such_job.py"):
        efficiency.measure_solo([str(tmp_path / "no_such_job.py")], "none", 1, str(tmp_path), python=PY, cwd=ROOT,
                                env=_env(), timeout_s=120)


QUICK = ["--preset", "quick", "--np", "2", "--scenario", "digits/random:3", "--epochs", "2", "--seeds", "0"]


def test_default_plan_runs_every_registered_protocol_bsp_first():
    import subprocess

    import hetsync.protocols

    proc = subprocess.run([PY, "-m", "hetsync.bench", *QUICK, "--dry-run"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  seed 0  digits/device:40+random:3")]
    assert [r[-1] for r in rows][0] == "bsp"
    assert sorted(r[-1] for r in rows) == sorted(hetsync.protocols.WRAPPERS)
    assert f"{len(hetsync.protocols.WRAPPERS)} training launches" in proc.stdout


def test_cli_rejects_bad_values_before_running(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HETSYNC_DATA_DIR", str(tmp_path))  # the mnist cells' data setting
    from hetsync.bench.__main__ import parse_args

    docs_cluster = tmp_path / "cluster.json"
    docs_cluster.write_text(json.dumps({"preset": "cluster", "runs": [{"seed": 0, "cell": "c", "protocol": "bsp",
                                                                       "status": "ok"}]}))
    for args, msg in ((["--protocols", "bsp,nope"], "unknown protocol 'nope'"),
                      (["--np", "2", "--scenario", "speeds:1,1,1,0.5"], "does not fit 2 ranks"),
                      (["--protocol-arg", "bsp=1"], "PROTO:KEY=VALUE"),
                      (["--protocol-arg", "bsp:nope=1"], "takes no argument 'nope'"),
                      (["--epochs", "0"], "--epochs must be positive"),
                      (["--time-cap-min", "0"], "--time-cap-min must be a positive number of minutes"),
                      (["--resume", str(tmp_path / "none.json")], "--resume"),
                      (["--resume", str(docs_cluster)], "preset 'cluster', this invocation runs 'quick'")):
        with pytest.raises(SystemExit) as exc:
            parse_args(args)
        assert exc.value.code == 2 and msg in capsys.readouterr().err, args
    args, preset, names, _ = parse_args(["--np", "2", "--scenario", "mnist/random:3", "--seeds", "3,4"])
    assert names[0] == "bsp" and preset.np == 2 and preset.seeds == (3, 4)
    assert preset.cells == (matrix.Cell("mnist", "device:40+random:3"),)  # the emulated cluster by default
    _, preset, _, _ = parse_args(["--np", "2", "--scenario", "mnist/random:3", "--device", "0"])
    assert preset.cells == (matrix.Cell("mnist", "random:3"),)  # real CPU
    _, preset, _, _ = parse_args(["--scenario", "np8:mnist/device:30+random:6", "--device", "50"])
    assert preset.cells == (matrix.Cell("mnist", "device:30+random:6", np=8),)
    # --cell keeps the preset's cells whose key contains the text: the cluster preset's sharding cell alone
    _, preset, _, _ = parse_args(["--preset", "cluster", "--cell", "1gbit", "--seeds", "3,4,5"])
    assert [c.key for c in preset.cells] == ["np8:digits/device:10@h0:2,h1:2,h2:2,h3:1,h4:1/1gbit[wide]"]
    assert preset.seeds == (3, 4, 5)
    _, preset, _, _ = parse_args(["--preset", "cluster", "--cell", "1gbit", "--cell", "2.5gbit"])
    assert len(preset.cells) == 2
    for args, msg in ((["--device", "-1"], "--device must be a number of milliseconds >= 0"),
                      (["--preset", "cluster", "--cell", "nosuch"], "no cell of this invocation has a key"),
                      (["--preset", "cluster", "--cell", "1gbit", "--update-docs"], "give one or the other"),
                      (["--scenario", "np1:digits/none"], "at least 2 ranks"),
                      (["--scenario", "digits/device:0"], "must be > 0")):
        with pytest.raises(SystemExit) as exc:
            parse_args(args)
        assert exc.value.code == 2 and msg in capsys.readouterr().err, args


def test_taskalloc_bench_rejects_bad_values_before_running(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "taskalloc_bench", os.path.join(ROOT, "examples", "benchmarks", "taskalloc_bench.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for args, msg in ((["--skip", "10", "--epochs", "10"], "--skip must be in [0, --epochs)"),
                      (["--cycle-time-ms", "-1"], "--cycle-time-ms must be >= 0"),
                      (["--solo-epochs", "0"], "--solo-epochs must be a positive integer")):
        with pytest.raises(SystemExit) as exc:
            bench.main(args)
        assert exc.value.code == 2 and msg in capsys.readouterr().err, args
    with pytest.raises(SystemExit, match="multiple of --np 4"):
        bench.configs(30, 32, 4)
