"""hetsync.bench: E's formula and solo measurement, the figures of a run, and the quick preset end to end."""
import pytest
from conftest import PY, _env, read_json
from hetsync.bench import docpages
QUICK = ["--preset", "quick", "--np", "2", "--scenario", "digits/random:3", "--epochs", "2", "--seeds", "0"]
# one protocol of each family besides BSP (always run): RNA, hierarchical RNA (groups + server), a parameter
# server (1 worker + 1 server on 2 ranks), decentralized Hop, task allocation's uneven shares. Every protocol's
# launch of the job is covered by test_dead_peer_mp / test_soak; the default plan by the dry run below.
QUICK_PROTOCOLS = ["rna", "rnah", "asp", "hop", "taskalloc"]


@pytest.mark.timeout(1500)  # one launch per protocol in the run; slow when other jobs share the cores
def test_quick_preset_on_two_ranks_reports_every_field(tmp_path):
    import subprocess

    out = tmp_path / "bench"
    docs = tmp_path / "docs"
    docs.mkdir()
    begin, end = docpages.results_markers("quick")
    (docs / "results.md").write_text("# Results\n\nintro\n\n## Preset `quick`\n\n" + begin + "\nold\n" + end
                                     + "\n\n## After\n")
    (tmp_path / "README.md").write_text("# hetsync\n")
    # the installed console script, from a folder outside the checkout, with nothing on PYTHONPATH
    import os

    cmd = [os.path.join(os.path.dirname(PY), "hetsync-bench"), *QUICK, "--protocols", ",".join(QUICK_PROTOCOLS),
           "--micro-repeats", "3", "--no-progress", "--out", str(out), "--update-docs"]
    env = {k: v for k, v in _env().items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = read_json(out / "results.json")
    protocols = sorted(["bsp"] + QUICK_PROTOCOLS)
    assert sorted(res["protocols"]) == protocols and res["protocols"][0] == "bsp"
    assert len(res["runs"]) == len(protocols)
    solo = res["solo"]["digits/device:40+random:3"]
    assert len(solo["samples_per_s"]) == 2 and min(solo["samples_per_s"]) > 0
    for r in res["runs"]:
        assert r["status"] == "ok", r.get("error")
        assert r["np"] == 2 and r["seed"] == 0 and r["scenario"] == "device:40+random:3"
        # On the emulated cluster no protocol beats the devices' own speeds (E against them <= 1.05). The
        # measured solo speeds of a 2-epoch run carry the noise of ~20 random:3 draws (about +-11%), so E
        # against them is only bounded loosely (1.08 seen for RNA).
        assert r["emulated"] and r["emulated_steps"] > 0
        assert 0 < r["efficiency_analytic"] <= 1.05, (r["protocol"], r["efficiency_analytic"])
        assert 0 < r["efficiency"] <= 1.4, (r["protocol"], r["efficiency"])
        assert not r["e_flagged"]
        assert 0 < r["bsp_expected_efficiency"] <= 1.0
        # random:3 on 2 ranks: BSP waits for the slower of two draws, E[K] / E[max K] = 2 / 2.5
        assert r["bsp_expected_efficiency_analytic"] == pytest.approx(2.0 / 2.5, rel=0.03)
        assert 0 <= r["final_test_accuracy"] <= 1
        assert all(0 <= p["accuracy"] <= 1 for p in r["accuracy_curve"])
        assert r["steps_per_s"] > 0 and r["samples_per_s"] > 0 and len(r["per_rank_samples_per_s"]) == r["workers"]
        # parameter-server protocols: 1 worker + 1 server (servers=1) on 2 ranks; the others train on both
        assert r["workers"] == (1 if r["protocol"] in ("asp", "shat", "shatroot", "ensemble", "ssp", "rnah") else 2)
        assert r["time_to_target_s"] is None or r["time_to_target_s"] >= 0
        for k in ("samples_per_s_ratio", "steps_per_s_ratio", "efficiency_ratio"):
            assert r[k] > 0, (r["protocol"], k)
        assert r["speedup_time_to_target"] is None or r["speedup_time_to_target"] > 0
        assert "horovodrun --mpi -np 2" in r["command"]
        assert isinstance(r["rates_concurrent"], bool)
    bsp = next(r for r in res["runs"] if r["protocol"] == "bsp")
    assert bsp["samples_per_s_ratio"] == 1.0 and bsp["efficiency_ratio"] == 1.0
    assert {a["protocol"] for a in res["aggregate"]} == set(protocols)
    for a in res["aggregate"]:
        assert a["efficiency"]["n"] == 1 and a["failed"] == 0
    md = (out / "results.md").read_text()
    for p in protocols:
        assert f"| digits/device:40+random:3 | {p} " in md
    for png in ("accuracy_vs_time.png", "timeline_digits_device_40_random_3.png"):
        data = (out / "plots" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    micro = read_json(out / "micro.json")
    assert micro["sim"].get("rows") or micro["sim"].get("skipped")
    delay = micro["ops"][0]
    assert delay["name"].startswith("delay op") and delay["op_us"] > 0 and delay["ratio"] > 0
    text = (docs / "results.md").read_text()
    assert text.count(begin) == 1 and text.count(end) == 1 and "\nold\n" not in text
    assert text.startswith("# Results\n\nintro\n") and text.rstrip().endswith("## After")
    assert "| digits/device:40+random:3 | bsp " in text
    assert "![test accuracy vs wall-clock](bench/quick-accuracy_vs_time.png)" in text
    assert (docs / "bench" / "quick-accuracy_vs_time.png").exists()
    summary = read_json(docs / "results" / "quick.json")
    assert summary["preset"] == "quick" and summary["launches"] == len(protocols)
    assert {r["protocol"] for r in summary["rows"]} == set(protocols)
    assert (tmp_path / "README.md").read_text() == "# hetsync\n"  # the headline comes from the cluster preset only
