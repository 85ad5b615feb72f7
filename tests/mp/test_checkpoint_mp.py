"""Checkpoint and resume: a 2-rank run SIGKILLed mid-epoch and relaunched with the same
command sees exactly the samples of an uninterrupted run and ends with its accuracy (real mpirun)."""
import os

import numpy as np
import pytest

from conftest import launch, read_json, read_jsonl

SCRIPT = "tests/jobs/checkpoint_run.py"
# digits: 1437 training samples, 718 per rank, b = 32 -> 22 steps per epoch; 3 epochs = 66 steps
# (task allocation: the global batch of 64 over all 1437 samples -> 23 rounds per epoch).
# Saves after steps 10, 20, 30; rank 1 dies after step 33 (epoch 1): the resume is at global step
# 30 = epoch 1, step 8 (task allocation: step 7).
EPOCHS, KILL_AT, SAVED = 3, 33, 30


def _final_weights(out, rank):
    with np.load(os.path.join(out, f"final_weights_rank{rank}.npz")) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


@pytest.mark.parametrize("protocol,args,same_run,steps_per_epoch", [
    ("bsp", [], True, 22), ("localsgd", ["--protocol-arg", "period=5", "--protocol-arg", "data_plan=shard"], True, 22),
    ("taskalloc", [], True, 23),
    # RNA's rounds depend on timing: two uninterrupted runs already differ, so only the counts are exact
    ("rna", ["--protocol-arg", "data_plan=shard"], False, 22)])
def test_killed_mid_epoch_and_relaunched_matches_uninterrupted(tmp_path, protocol, args, same_run, steps_per_epoch):
    common = ["--protocol", protocol, *args, "--epochs", str(EPOCHS), "--quiet"]
    out_a, out_b, backup = str(tmp_path / "A"), str(tmp_path / "B"), str(tmp_path / "backup")
    launch(2, [SCRIPT, *common, "--out", out_a])
    cmd_b = [SCRIPT, *common, "--out", out_b, "--backup-dir", backup, "--backup-every-steps", "10"]
    killed = launch(2, cmd_b, env={"HETSYNC_TEST_KILL": f"1:{KILL_AT}"}, check=False)
    assert killed.returncode != 0
    assert not os.path.exists(os.path.join(out_b, "summary.json"))
    for r in range(2):  # both ranks hold the checkpoint of step 30, complete
        assert SAVED in [int(n[5:]) for n in os.listdir(os.path.join(backup, f"rank{r}")) if n.startswith("step-")]
    resumed = launch(2, cmd_b)  # the same command again
    assert (f"rank 1 resumed from global step 30 (epoch 1, step {SAVED - steps_per_epoch} of {steps_per_epoch})"
            in resumed.stderr + resumed.stdout)
    a, b = read_json(os.path.join(out_a, "summary.json")), read_json(os.path.join(out_b, "summary.json"))
    steps = steps_per_epoch * EPOCHS
    for ra, rb in zip(a["per_rank"], b["per_rank"]):
        assert ra["steps"] == rb["steps"] == steps
        assert ra["samples"] == rb["samples"]  # none lost, none counted twice
        if protocol != "taskalloc":  # (task allocation: w_i micro-batches per round, reshared every epoch)
            assert ra["samples"] == steps * 32
    assert a["steps"] == b["steps"]
    for r in range(2):
        # the per-rank step records: every step exactly once (the killed run's steps after the
        # checkpoint were dropped and re-run)
        assert [rec["step"] for rec in read_jsonl(os.path.join(out_b, f"rank{r}.jsonl"))] == list(range(steps))
    assert not os.path.exists(backup)  # deleted when training completed
    if not same_run:
        return
    assert abs(a["final_test_accuracy"] - b["final_test_accuracy"]) <= 0.005
    for r in range(2):
        for wa, wb in zip(_final_weights(out_a, r), _final_weights(out_b, r)):
            np.testing.assert_allclose(wa, wb, rtol=1e-4, atol=1e-5)
    for k in ("syncs", "sync_steps", "local_steps", "bytes_sent"):  # the protocol's counters were restored
        assert b["stats"].get(k) == a["stats"].get(k), k
