"""hetsync.bench with real launches: a 2-rank job through hetsync.bench.launch, and the solo measurement (each rank's
scenario run alone, one process per rank) that the efficiency E divides by. Both run the training job as a module
(``python -m hetsync.bench.job``) from a folder outside the checkout."""
import json

import pytest

from conftest import PY, _env, read_json, read_jsonl
from hetsync.bench import efficiency, launch


def test_a_real_two_rank_launch_writes_a_summary(tmp_path):
    cmd = launch.mpirun(2, launch.job_argv("bsp", "run", extra=launch.dataset_args(digits=True), epochs=1,
                                           batch_size=32, seed=3))
    proc = launch.run(cmd, 300, cwd=str(tmp_path))  # the job runs in the caller's folder: --out run is under it
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "run" / "summary.json") as f:
        s = json.load(f)
    assert s["protocol"] == "bsp" and s["world_size"] == 2 and len(s["per_rank"]) == 2
    assert s["weights_in_sync"] is True


def test_solo_measurement_draws_the_scenario_as_each_rank_without_netdelay(tmp_path):
    env = _env()
    job = [*launch.JOB, "--epochs", "3", "--lr", "0.2", "--dataset", "digits"]
    solo = efficiency.measure_solo(job, "deterministic:1:8+netdelay:200", 2, str(tmp_path), python=PY, cwd=tmp_path,
                                   env=env, timeout_s=300)
    assert solo["spec"] == "deterministic:1:8"
    v = solo["samples_per_s"]
    assert len(v) == 2 and all(x > 0 for x in v)
    assert solo["bsp_expected_e"] == pytest.approx(2 * min(v) / sum(v))
    recs = [read_jsonl(tmp_path / f"rank{r}" / "rank0.jsonl")[15:] for r in range(2)]
    for r in range(2):
        s = read_json(tmp_path / f"rank{r}" / "summary.json")
        assert s["scenario"] == "deterministic:1:8" and s["world_size"] == 1
        # rank r's shard of the 1437 training images, in full batches of 32 (the remainder is left out)
        assert s["per_rank"][0]["samples"] == 3 * ((1437 // 2) // 32) * 32
        assert all(x["sync_wait_ms"] < 50 for x in recs[r])  # no 200 ms network latency alone
    assert all(x["delay_ms"] == 0.0 for x in recs[0])  # rank 0 is not the straggler
    delay = sum(x["delay_ms"] for x in recs[1])
    compute = sum(x["compute_ms"] for x in recs[1])
    assert delay == pytest.approx(7 * compute, rel=0.05)  # (K - 1) x compute, as rank 1 of 2
    assert v[1] < v[0]


def test_solo_measurement_with_per_rank_arguments_over_the_common_window(tmp_path):
    job = [*launch.JOB, "--epochs", "3", "--lr", "0.2", "--dataset", "digits"]
    solo = efficiency.measure_solo(job, "none", 2, str(tmp_path), python=PY, cwd=tmp_path, env=_env(), timeout_s=300,
                                   rank_argv=[[], ["--batch-size", "64", "--epochs", "6"]], common_window=True)
    assert len(solo["samples_per_s"]) == 2 and all(v > 0 for v in solo["samples_per_s"])
    s = [read_json(tmp_path / f"rank{r}" / "summary.json") for r in range(2)]
    assert s[0]["per_rank"][0]["samples"] == 3 * ((1437 // 2) // 32) * 32
    assert s[1]["per_rank"][0]["samples"] == 6 * ((1437 // 2) // 64) * 64  # rank 1's own batch and epochs
    with pytest.raises(ValueError, match="one argument list per rank"):
        efficiency.measure_solo(job, "none", 2, str(tmp_path), rank_argv=[[]])
