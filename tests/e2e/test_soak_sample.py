"""The soak script: its draws, its lost-sample accounting, its hang
detection, and a small sample of real runs (3 runs of 2-3 ranks, fixed seed) with 0 hangs, errors
and lost samples. The full soak (50 runs) is ``python -m hetsync.bench.soak --runs 50``."""
import json
import os
import pytest
from hetsync.bench import soak


def test_a_run_over_its_limit_is_a_hang_and_its_process_group_is_killed(tmp_path):
    run = {"index": 0, "protocol": "bsp", "np": 2, "scenario": "none", "seed": 0, "epochs": 1}
    rec = soak.launch_run(run, str(tmp_path / "run"), timeout_s=1.0)  # mpirun + TensorFlow start takes longer
    assert rec["status"] == "hang" and "no exit within 1 s; process group killed" in rec["error"]
    with pytest.raises(ProcessLookupError):
        os.killpg(rec["pid"], 0)  # nothing of the group is left
    assert open(tmp_path / "run" / "launch.log").read().startswith("mpirun ")


def test_a_small_soak_sample_has_no_hang_error_or_lost_sample(tmp_path, capsys):
    out = tmp_path / "soak"
    # seed 9 draws RNA (speeds:1,1,0.5), hierarchical RNA with a 4 s stall of worker 0 and ENSEMBLE
    # with worker 0 paused (SIGSTOP) for 3 s, all on 3 ranks
    code = soak.main(["--runs", "3", "--seed", "9", "--ranks", "2,3", "--epochs", "1", "--out", str(out),
                      "--timeout-s", "300"])
    printed = capsys.readouterr().out
    with open(out / "results.jsonl") as f:
        results = [json.loads(line) for line in f]
    assert len(results) == 3, printed
    assert [r["status"] for r in results] == ["ok"] * 3, printed
    assert all(r["lost"] == 0 and r["extra"] == 0 and r["trained"] == r["expected"] for r in results), printed
    assert [r["protocol"] for r in results] == ["rna", "rnah", "ensemble"], printed
    assert [r["faults_fired"] for r in results] == [0, 1, 1], printed  # the stall and the pause did land
    assert code == 0
    assert "3 runs: 0 hangs, 0 errors, 0 lost samples" in printed
    totals = json.loads((out / "summary.json").read_text())["totals"]
    assert (totals["runs"], totals["hangs"], totals["errors"], totals["lost_samples"]) == (3, 0, 0, 0)
