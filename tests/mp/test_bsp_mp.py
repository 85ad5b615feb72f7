"""BSP with real multi-process launches (mpirun, horovodrun --mpi, horovodrun --gloo)."""
import os
import statistics

import pytest

from conftest import launch, read_json, read_jsonl



@pytest.mark.parametrize("np_", [2, 4])
def test_bsp_trains_digits_to_90_percent_with_identical_weights(np_, tmp_path):
    launch(np_, ["examples/keras_digits.py", "--protocol", "bsp", "--epochs", "20", "--lr", "0.2",
                 "--out", str(tmp_path), "--quiet", "--slowdown", "random:3"], launcher="horovodrun-mpi")
    s = read_json(tmp_path / "summary.json")
    assert s["protocol"] == "bsp" and s["world_size"] == np_ and s["scenario"] == "random:3"
    assert s["weights_in_sync"] is True and s["weights_max_abs_diff"] == 0.0
    assert s["final_test_accuracy"] >= 0.90
    assert s["time_to_target_s"] is not None and 0 < s["time_to_target_s"] <= s["wall_s"]
    # the benchmarks' time to target: the same moment from the end of rank 0's first (compiling) step
    first_step_end = read_jsonl(tmp_path / "rank0.jsonl")[0]["wall_s"]
    assert s["time_to_target_after_first_step_s"] == pytest.approx(s["time_to_target_s"] - first_step_end)
    steps = s["steps"]
    assert [r["steps"] for r in s["per_rank"]] == [steps] * np_
    assert s["stats"]["syncs"] == steps  # one allreduce per step
    for key in ("dataset", "epochs", "samples_per_s", "stats", "scenario", "wall_s"):
        assert key in s
    for r in range(np_):
        recs = read_jsonl(tmp_path / f"rank{r}.jsonl")
        assert len(recs) == steps
        assert {"step", "wall_s", "loss", "delay_ms", "sync_wait_ms", "compute_ms"} <= set(recs[0])
    assert os.path.isdir(tmp_path / "tensorboard")


def test_bsp_equals_single_process_on_the_concatenated_batch(tmp_path):
    out = tmp_path / "eq.json"
    launch(2, ["tests/jobs/bsp_equivalence.py", str(out), "12", "16"])
    r = read_json(out)
    assert r["syncs"] == 12
    assert r["diff_across_ranks"] == 0.0
    assert r["moved"] > 1e-2  # training really changed the weights
    assert r["diff_vs_single"] < 1e-5  # float32 summation-order differences only


def test_slowdown_really_slows_the_named_rank(tmp_path):
    """deterministic:1:4 holds rank 1's gradients for 3x its measured compute time, its steps really
    last that long, and rank 0 waits for it in the allreduce. Every comparison is within one run and
    per step, so a loaded machine (longer compute, longer delays) does not change the outcome."""
    launch(2, ["tests/jobs/slowdown_measure.py", str(tmp_path), "deterministic:1:4"])
    slow = [read_jsonl(tmp_path / "slow" / f"rank{r}.jsonl")[3:] for r in range(2)]  # skip tracing steps
    none = read_jsonl(tmp_path / "none" / "rank1.jsonl")[3:]
    assert len(slow[0]) == len(slow[1]) > 20
    assert all(r["delay_ms"] == 0.0 for r in slow[0]) and all(r["delay_ms"] == 0.0 for r in none)
    # the op's delay is (K - 1) x the compute time it measured, on every step of rank 1
    for r in slow[1]:
        assert r["delay_ms"] == pytest.approx(3.0 * r["compute_ms"], rel=1e-9, abs=1e-6)
    requested = statistics.median(r["delay_ms"] for r in slow[1])
    assert requested > 8.0, requested  # 3x a real compute time of several ms
    # the step lasted at least its compute plus the delay (median over steps: a late callback is noise)
    assert statistics.median(r["step_ms"] - r["delay_ms"] - r["compute_ms"] for r in slow[1]) >= -1.0
    # rank 0 is not delayed itself but waits for rank 1 in every allreduce
    assert statistics.median(a["sync_wait_ms"] / b["delay_ms"] for a, b in zip(slow[0], slow[1])) >= 0.5


def test_bsp_under_gloo_and_mpi_only_protocols_refused(tmp_path):
    out = tmp_path / "gloo.json"
    launch(2, ["tests/jobs/gloo_check.py", str(out)], launcher="horovodrun-gloo")
    r = read_json(out)
    assert r["mode"] == "gloo" and r["size"] == 2
    assert "runs on Gloo; launch it with `horovodrun --mpi" in r["mpi_error"]
    assert r["weights_diff"] == 0.0


def test_a_collective_that_a_rank_never_joins_fails_within_the_timeout():
    # rank 1 sleeps 5 x 6 s and never joins; rank 0 must fail by horovod's stall shutdown after the 6 s
    # of init(collective_timeout_s=6) (the suite's 120 s default is removed for this run), long before
    # rank 1 would end: a failure at 30 s would only be rank 1's exit
    proc = launch(2, ["tests/jobs/collective_timeout.py", "6"], check=False, timeout=180,
                  env={"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": None})
    line = next((ln for ln in proc.stdout.splitlines() if "RESULT" in ln), "")
    assert "RESULT error" in line, proc.stdout[-3000:] + proc.stderr[-3000:]
    elapsed = float(line.split("RESULT error ")[1].split()[0])
    assert 5.0 <= elapsed <= 25.0, line
    assert "Horovod has been shut down" in line
    assert proc.returncode != 0
