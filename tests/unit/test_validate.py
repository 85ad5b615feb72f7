"""The simulator's validation command (hetsync.bench.validate) without launches: the probe's figures from
hand-made step records, the fixed costs in closed form, the cluster argument, and a resumed run that finds
every summary on disk (no launch), filters scenarios and protocols and writes the documentation block."""
import json
import os

import pytest

from hetsync.bench import launch, validate


def _write_records(folder, rank, steps_per_epoch, epochs, cycle_ms, device_ms, first_s, gap_s, wait_ms=0.0):
    """Step records whose wall clock advances cycle_ms + device_ms per step, first step ending at first_s, an
    extra gap_s before epoch 1's first step; each step waited wait_ms on the protocol's exchanges."""
    os.makedirs(folder, exist_ok=True)
    t = first_s
    with open(os.path.join(folder, f"rank{rank}.jsonl"), "w") as f:
        for e in range(epochs):
            for k in range(steps_per_epoch):
                if not (e == 0 and k == 0):
                    t += (cycle_ms + device_ms) / 1e3 + (gap_s if (e == 1 and k == 0) else 0.0)
                f.write(json.dumps({"step": e * steps_per_epoch + k, "epoch": e, "wall_s": t,
                                    "emulated_ms": device_ms, "sync_wait_ms": wait_ms}) + "\n")


def test_probe_overheads_from_step_records_in_closed_form(tmp_path):
    for r in range(2):
        _write_records(tmp_path, r, 10, 3, cycle_ms=6.0 + r, device_ms=40.0, first_s=2.0, gap_s=0.5, wait_ms=2.0 * r)
    over = validate.probe_overheads(str(tmp_path))
    assert over["cycle_ms"] == pytest.approx(6.5)  # the mean over ranks of 6 and 7 ms beyond the device time
    assert over["wait_ms"] == pytest.approx(1.0)  # the mean over ranks of 0 and 2 ms of waits per step
    assert over["host_ms_median"] == pytest.approx(6.5)
    assert over["first_step_s"] == pytest.approx(2.0)
    assert over["boundary_s"] == pytest.approx(0.5)
    os.makedirs(tmp_path / "empty")
    assert validate.probe_overheads(str(tmp_path / "empty")) is None  # no step records


def test_fixed_costs_add_the_first_step_and_each_later_epoch_boundary():
    over = {"first_step_s": 2.0, "boundary_s": 0.5}
    # 3 epochs of 8000 samples at 1000 samples/s: 24 s of steps + 2 s + 2 x 0.5 s
    assert validate.with_fixed_costs(1000.0, 24000, 3, over) == pytest.approx(24000 / 27.0)


def test_cluster_argument_is_parsed_and_bad_ones_are_refused():
    c = validate.parse_cluster("2x2/100mbit")
    assert (c.hosts, c.slots, c.link, c.np, c.dilation) == (2, 2, "100mbit", 4, 1.0)
    assert validate.cluster_label(c) == "2x2-100mbit" and validate.cluster_label(None) == "one host"
    for bad in ("2x2", "2/100mbit", "ax2/1gbit", "2x2/"):
        with pytest.raises(ValueError, match="HOSTSxSLOTS/RATE"):
            validate.parse_cluster(bad)
    with pytest.raises(ValueError):
        validate.parse_cluster("2x2/fast")  # the cluster tool refuses the rate
    assert validate.parse_cluster("2x4/100mbit@3").dilation == 3.0
    for bad in ("2x2/100mbit@", "2x2/100mbit@0.5", "2x2/100mbit@x"):
        with pytest.raises(ValueError):
            validate.parse_cluster(bad)


def test_dilation_arguments_are_parsed_and_bad_ones_are_refused():
    assert validate.parse_dilations(["8=3", "4=1.5"]) == {8: 3.0, 4: 1.5}
    for bad, message in (("8", "NP=D"), ("1=2", "NP >= 2"), ("8=0.5", ">= 1"), ("8=inf", ">= 1"), ("x=2", "NP=D")):
        with pytest.raises(ValueError, match=message):
            validate.parse_dilations([bad])


def test_a_dilated_prediction_is_the_emulated_clusters_with_host_time_shrunk_by_d():
    from hetsync.sim import workload

    def rate(host_ms, d):
        return validate.predict("bsp", "device:40+random:6", 4, host_ms, workload.EXAMPLE_MODEL_BYTES, 32,
                                steps=200, seed=3, dilation=d).samples_per_s
    assert rate(30.0, 3.0) == pytest.approx(rate(10.0, 1.0))



@pytest.mark.parametrize("protocol, cluster, d", [
    ("bsp", None, 1.0), ("rna", None, 3.0), ("hop", "2x2/100mbit@3", 3.0), ("localsgd", "2x2/100mbit", 1.0)])
def test_the_calibrated_host_time_makes_the_simulated_probe_as_slow_as_the_measured_one(protocol, cluster, d):
    from hetsync.sim import workload

    spec = None if cluster is None else validate.parse_cluster(cluster)
    host = validate.calibrate_host_ms(protocol, 4, {"cycle_ms": 120.0}, steps=200, cluster=spec, dilation=d)
    res = validate.predict(protocol, "device:40", 4, host, workload.EXAMPLE_MODEL_BYTES, 32, steps=200, cluster=spec,
                           dilation=d)
    # the probe: 40 ms of device time and 120 wall ms beyond it, i.e. 120 / D in the emulated cluster's time
    assert 4 * 32 / res.samples_per_s * 1e3 == pytest.approx(40.0 + 120.0 / d, abs=0.1)
    assert 0.0 < host <= 120.0
    # a probe no slower than the simulator with no host work needs none
    assert validate.calibrate_host_ms(protocol, 4, {"cycle_ms": 0.0}, steps=200, cluster=spec, dilation=d) == 0.0


def test_hop_across_hosts_is_calibrated_on_its_waits_and_the_rate_its_messages_reach():
    from hetsync.sim import workload

    spec = validate.parse_cluster("2x2/100mbit@3")
    # Hop's probe on 2 hosts: 133.5 wall ms per step beyond the device time, 129 of them waiting for updates
    probe = {"cycle_ms": 133.5, "wait_ms": 129.0}
    fit = validate.calibrate("hop", 4, probe, steps=200, cluster=spec, dilation=3.0)
    assert fit["host_ms"] == pytest.approx(4.5) and 0.5 < fit["p2p_efficiency"] < 1.0
    res = validate.predict("hop", "device:40", 4, fit["host_ms"], workload.EXAMPLE_MODEL_BYTES, 32, steps=200,
                           cluster=spec, dilation=3.0, p2p_efficiency=fit["p2p_efficiency"])
    assert 4 * 32 / res.samples_per_s * 1e3 == pytest.approx(40.0 + 133.5 / 3.0, rel=0.01)
    # a straggler 4x slow (160 ms) hides the slower links: its step sets the pace, not host work on every step
    slow = validate.predict("hop", "device:40+deterministic:3:4", 4, fit["host_ms"], workload.EXAMPLE_MODEL_BYTES, 32,
                            steps=200, cluster=spec, dilation=3.0, p2p_efficiency=fit["p2p_efficiency"])
    assert 4 * 32 / slow.samples_per_s * 1e3 == pytest.approx(160.0 + 4.5 / 3.0, rel=0.02)
    # host work only: on one host, for a protocol of collectives, or for a probe that records no waits
    for proto, cluster, over in (("hop", None, probe), ("bsp", spec, probe), ("hop", spec, {"cycle_ms": 133.5})):
        fit = validate.calibrate(proto, 4, over, steps=200, cluster=cluster, dilation=3.0)
        assert fit["p2p_efficiency"] == 1.0
        assert fit["host_ms"] == pytest.approx(validate.calibrate_host_ms(proto, 4, over, steps=200, cluster=cluster,
                                                                          dilation=3.0))


def test_a_cluster_run_is_launched_through_the_cluster_tool(tmp_path, monkeypatch):
    seen = []

    def fake_run(cmd, timeout_s, **kwargs):
        seen.append(cmd)
        out = cmd[cmd.index("--out") + 1]
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump({"samples_per_s": 1.0}, f)

        class Done:
            returncode, stdout, stderr = 0, "", ""
        return Done()

    monkeypatch.setattr(launch, "run", fake_run)
    cluster = validate.parse_cluster("2x2/100mbit")
    s = validate.run_one(str(tmp_path / "r"), 4, "device:40", "bsp", 1, 2, cluster=cluster)
    assert s == {"samples_per_s": 1.0}
    cmd = seen[0]
    assert cmd[1:4] == ["-m", "hetsync.emulation.cluster", "run"]
    assert cmd[cmd.index("--link") + 1] == "100mbit" and cmd[cmd.index("--hosts") + 1] == "2"
    assert "horovodrun" in cmd[cmd.index("--") + 1]
    # resumable: the summary is there, nothing is launched again
    validate.run_one(str(tmp_path / "r"), 4, "device:40", "bsp", 1, 2, cluster=cluster)
    assert len(seen) == 1
    validate.run_one(str(tmp_path / "c3"), 4, "device:40", "bsp", 1, 2, cluster=validate.parse_cluster("2x2/1gbit@3"))
    assert seen[-1][seen[-1].index("--dilation") + 1] == "3"
    assert float(seen[-1][seen[-1].index("--timeout") + 1]) == 3 * 1800.0  # the run's timeout is dilated


def test_a_dilated_run_on_this_host_gets_the_dilation_in_its_environment(tmp_path, monkeypatch):
    envs = []

    def fake_run(cmd, timeout_s, **kwargs):
        envs.append((kwargs.get("env") or {}, timeout_s))
        with open(os.path.join(cmd[cmd.index("--out") + 1], "summary.json"), "w") as f:
            json.dump({"samples_per_s": 1.0}, f)

        class Done:
            returncode, stdout, stderr = 0, "", ""
        return Done()

    monkeypatch.setattr(launch, "run", fake_run)
    validate.run_one(str(tmp_path / "d1"), 2, "device:40", "bsp", 1, 2)
    validate.run_one(str(tmp_path / "d3"), 2, "device:40", "bsp", 1, 2, dilation=3.0)
    assert envs[0] == ({}, 1800.0 + 60.0)
    assert envs[1] == ({"HETSYNC_DILATION": "3"}, 3 * 1800.0 + 60.0)


def test_a_resumed_validation_launches_nothing_and_writes_the_docs_block(tmp_path, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError(f"launched {args[0]}")

    monkeypatch.setattr(launch, "run", no_launch)
    monkeypatch.setattr(launch, "mnist_dir", lambda: None)  # the digits set: 1437 samples per epoch
    out = tmp_path / "v"
    for proto in ("bsp", "localsgd"):
        probe = out / "probes" / "np2" / proto
        _write_records(probe, 0, 20, 2, cycle_ms=5.0, device_ms=40.0, first_s=2.0, gap_s=0.3)
        (probe / "summary.json").write_text(json.dumps({"samples_per_s": 1000.0}))
        run = out / "runs" / "np2" / "homogeneous" / proto / "seed1"
        _write_records(run, 0, 20, 3, cycle_ms=5.0, device_ms=40.0, first_s=1.0, gap_s=0.3)
        (run / "summary.json").write_text(json.dumps({"samples_per_s": 1300.0, "wall_s": 40.0, "epochs": 3,
                                                      "samples": 3 * 1437, "overrun_fraction": 0.0}))
    docs = tmp_path / "docs"
    os.makedirs(docs)
    (docs / "simulator.md").write_text(f"# page\n\n## Validation\n\n{validate.BEGIN}\nold\n{validate.END}\n")
    rc = validate.main(["--out", str(out), "--np", "2", "--scenarios", "homogeneous", "--protocols", "bsp,localsgd",
                        "--update-docs", "--docs-dir", str(docs)])
    assert rc == 0
    doc = json.loads((docs / "simulator" / "validation.json").read_text())
    assert [(r["np"], r["cluster"], r["scenario"], r["protocol"]) for r in doc["rows"]] == [
        (2, "one host", "homogeneous", "bsp"), (2, "one host", "homogeneous", "localsgd")]
    for r in doc["rows"]:
        assert r["measured"] == 1300.0 and r["error"] == pytest.approx(r["predicted"] / 1300.0 - 1.0)
        assert r["compile_fraction"] == pytest.approx(1.0 / 40.0)
    assert "--out" not in doc["command"]
    page = (docs / "simulator.md").read_text()
    assert "old" not in page and "| np2 " in page and "np2 on one host: 2 runs, median |error|" in page
    assert "(2 under 1% overruns: median" in page

    # A second run re-measures BSP at dilation 3 (its own folders): the recorded document keeps the local SGD
    # row it did not re-measure, the BSP row is replaced, and both commands are named.
    for where, proto in (("probes/np2-d3/bsp", None), ("runs/np2-d3/homogeneous/bsp/seed1", "run")):
        folder = out / where
        _write_records(folder, 0, 20, 3 if proto else 2, cycle_ms=5.0, device_ms=120.0, first_s=1.0, gap_s=0.3)
        (folder / "summary.json").write_text(json.dumps({"samples_per_s": 500.0, "wall_s": 90.0, "epochs": 3,
                                                         "samples": 3 * 1437, "overrun_fraction": 0.0}))
    rc = validate.main(["--out", str(out), "--np", "2", "--dilation", "2=3", "--scenarios", "homogeneous",
                        "--protocols", "bsp", "--update-docs", "--docs-dir", str(docs)])
    assert rc == 0
    doc = json.loads((docs / "simulator" / "validation.json").read_text())
    assert [(r["protocol"], r["dilation"], r["measured"]) for r in doc["rows"]] == [
        ("bsp", 3.0, 500.0), ("localsgd", 1.0, 1300.0)]
    assert len(doc["commands"]) == 2 and "--dilation 2=3" in doc["commands"][1]
    page = (docs / "simulator.md").read_text()
    assert "np2 on one host at dilation 3: 1 runs" in page and "np2 on one host: 1 runs" in page


def test_recorded_rows_are_predicted_again_from_their_probes_without_a_run(tmp_path, monkeypatch):
    from hetsync.sim import workload

    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("launched"))
    probe = {"cycle_ms": 30.0, "host_ms_median": 29.0, "first_step_s": 2.0, "boundary_s": 0.1, "host_ms": 99.0}
    rows = []
    for proto, cluster, d in (("bsp", "one host", 1.0), ("hop", "2x2-100mbit", 3.0)):
        spec = None if cluster == "one host" else validate.parse_cluster(f"2x2/100mbit@{d:g}")
        old = validate.predict(proto, "device:40+random:6", 4, 99.0, workload.EXAMPLE_MODEL_BYTES, 32, steps=200,
                               seed=1, cluster=spec, dilation=d).samples_per_s / d
        # an older row: no "samples"; the fit's samples (5 epochs of 7,900) follow from its two predictions
        rows.append({"np": 4, "cluster": cluster, "dilation": d, "scenario": "random", "spec": "device:40+random:6",
                     "protocol": proto, "seed": 1, "measured": 300.0, "probe": probe, "epochs": 5,
                     "dataset": "mnist", "predicted_steady": old,
                     "predicted": validate.with_fixed_costs(old, 39500, 5, probe)})
    new = validate.repredict(rows, steps=200)
    for r, n in zip(rows, new):
        spec = None if r["cluster"] == "one host" else validate.parse_cluster(f"2x2/100mbit@{r['dilation']:g}")
        host = validate.calibrate_host_ms(r["protocol"], 4, probe, steps=200, cluster=spec, dilation=r["dilation"])
        rate = validate.predict(r["protocol"], r["spec"], 4, host, workload.EXAMPLE_MODEL_BYTES, 32, steps=200, seed=1,
                                samples_per_epoch=8000, cluster=spec, dilation=r["dilation"]).samples_per_s
        assert n["samples"] == 39500 and n["probe"]["host_ms"] == pytest.approx(host)
        assert n["predicted_steady"] == pytest.approx(rate / r["dilation"])
        assert n["predicted"] == pytest.approx(validate.with_fixed_costs(rate / r["dilation"], 39500, 5, probe))
        assert n["error"] == pytest.approx(n["predicted"] / 300.0 - 1.0) and n["measured"] == 300.0
    assert rows[0]["probe"]["host_ms"] == 99.0  # the recorded rows are not changed in place


def test_repredict_rewrites_the_recorded_document_and_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("launched"))
    probe = {"cycle_ms": 20.0, "host_ms_median": 20.0, "first_step_s": 2.0, "boundary_s": 0.0, "host_ms": 20.0}
    row = {"np": 2, "cluster": "one host", "dilation": 1.0, "scenario": "homogeneous", "spec": "device:40",
           "protocol": "bsp", "seed": 1, "measured": 1000.0, "predicted": 900.0, "predicted_steady": 950.0,
           "error": -0.1, "probe": probe, "epochs": 3, "dataset": "digits", "samples": 4311, "overrun": 0.0}
    docs = tmp_path / "docs"
    os.makedirs(docs / "simulator")
    (docs / "simulator" / "validation.json").write_text(json.dumps(
        {"command": "python -m hetsync.bench.validate --np 2", "commands": ["python -m hetsync.bench.validate --np 2"],
         "date_utc": "2026-11-20 10:00", "rows": [row], "summary": "old"}))
    (docs / "simulator.md").write_text(f"# page\n\n## Validation\n\n{validate.BEGIN}\nold\n{validate.END}\n")
    assert validate.main(["--repredict", "--update-docs", "--docs-dir", str(docs)]) == 0
    doc = json.loads((docs / "simulator" / "validation.json").read_text())
    (new,) = doc["rows"]
    # BSP on 2 ranks of the homogeneous device: 40 ms + the probe's 20 ms per step, 64 samples, plus the first step
    assert new["predicted_steady"] == pytest.approx(64 / 0.060, rel=0.01)
    assert new["predicted"] == pytest.approx(4311 / (2.0 + 4311 / new["predicted_steady"]))
    assert new["measured"] == 1000.0 and doc["date_utc"] == "2026-11-20 10:00"
    assert doc["commands"] == ["python -m hetsync.bench.validate --np 2",
                               "python -m hetsync.bench.validate --repredict --update-docs --docs-dir " + str(docs)]
    assert "old" not in (docs / "simulator.md").read_text()


def test_bad_arguments_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "run", lambda *a, **k: pytest.fail("launched"))
    for argv, message in ((["--np", "1"], "world sizes >= 2"), (["--cluster", "2x2"], "HOSTSxSLOTS/RATE"),
                          (["--np", "--scenarios", "homogeneous"], "nothing to validate"),
                          (["--scenarios", "nowhere"], "unknown scenario"), (["--protocols", "ssp"], "not validated"),
                          (["--np", "4", "--dilation", "8=3"], "that --np does not run"),
                          (["--dilation", "8=0.5"], ">= 1")):
        with pytest.raises(SystemExit):
            validate.main(["--out", str(tmp_path), *argv])
        assert message in capsys.readouterr().err
