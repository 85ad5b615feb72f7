"""The emulated device (scenario ``device:MS``): parser, the delay op's padding, step times, overruns."""
import os
import statistics
import pytest
from conftest import launch, read_json, read_jsonl


def test_emulated_step_times_and_overruns_in_a_fit(tmp_path):
    """Steps last device time x factor (within 5%); an impossible device time is counted as overruns."""
    specs = ["device:60", "device:60+deterministic:0:6", "device:0.01"]
    proc = launch(1, ["tests/jobs/emulated_device.py", str(tmp_path)] + specs, launcher="single", timeout=300)
    for i, target in enumerate([60.0, 360.0]):
        recs = read_jsonl(os.path.join(tmp_path, str(i), "rank0.jsonl"))
        steady = recs[1:]  # the first (tracing) step is not padded
        assert recs[0]["emulated_ms"] == 0.0
        assert all(r["emulated_ms"] == pytest.approx(target) for r in steady)
        assert statistics.median(r["step_ms"] for r in steady) == pytest.approx(target, rel=0.05)
        s = read_json(os.path.join(tmp_path, str(i), "summary.json"))
        assert s["emulated_steps"] == len(steady) and s["overrun_steps"] == 0 and s["emulation_valid"] is True
    # 10 microseconds per step: every padded step's real compute is longer
    s = read_json(os.path.join(tmp_path, "2", "summary.json"))
    assert s["emulated_steps"] == 11
    assert s["overrun_steps"] == 11 and s["per_rank"][0]["overrun_steps"] == 11
    assert s["emulation_valid"] is False
    assert "11 of 11 emulated steps" in proc.stderr and "overran their device time" in proc.stderr


def test_no_device_part_keeps_todays_behaviour(tmp_path):
    launch(1, ["tests/jobs/emulated_device.py", str(tmp_path), "deterministic:0:1"], launcher="single", timeout=300)
    s = read_json(os.path.join(tmp_path, "0", "summary.json"))
    assert s["emulated_steps"] == 0 and s["overrun_steps"] == 0 and s["emulation_valid"] is None


def test_task_allocation_measures_the_emulated_device_time(tmp_path):
    """Task allocation's speed measurement sees the emulated step time as compute time: on 40 ms devices of
    speeds 1 and 0.5 the adaptive allocation (single-sample units, C = 2 x 32) settles near 2:1, and
    each rank's emulated step costs MS x its samples / b (task allocation's micro-batches). With
    probe_rounds=4 the first reallocation comes after round 4 of the first epoch, not at its end."""
    out = tmp_path / "ta"
    launch(2, ["examples/keras_digits.py", "--protocol", "taskalloc", "--protocol-arg", "mode=adaptive",
               "--protocol-arg", "probe_rounds=4",
               "--slowdown", "device:40+speeds:1,0.5", "--epochs", "5", "--batch-size", "32", "--quiet",
               "--out", str(out)], launcher="horovodrun-mpi", timeout=300)
    s = read_json(out / "summary.json")
    stats = s["stats"]
    assert stats["total"] == 64 and stats["micro_batch"] == 1
    probe = stats["probe"]
    assert probe["epoch"] == 0 and probe["rounds"] == 4 and probe["w"] == [32, 32]
    assert 1.6 <= probe["next_w"][0] / probe["next_w"][1] <= 2.4, probe  # from the speeds of rounds 1-3
    rounds = stats["rounds_per_epoch"]
    for r in (0, 1):  # epoch 0: 32 samples per rank in rounds 0-3, then the probe's w (the last round: the rest)
        first = [rec["samples"] for rec in read_jsonl(out / f"rank{r}.jsonl")[:rounds]]
        assert first[:4] == [32.0] * 4 and first[4:rounds - 1] == [float(probe["next_w"][r])] * (rounds - 5), first
    assert sum(stats["epochs"][0]["samples"]) == 1437 and s["weights_in_sync"]
    w = stats["final_w"]
    # ideal [42.7, 21.3]; per-step host work outside the padded time (the same few ms on both ranks) pulls the
    # measured ratio a little towards 1 on a loaded machine ([41, 23] seen): far from equal shares or 5:1
    assert sum(w) == 64 and 1.6 <= w[0] / w[1] <= 2.4, w
    # (overruns are not asserted: on a loaded machine a few steps may overrun, which this test is not about)
    for r in (0, 1):
        recs = read_jsonl(out / f"rank{r}.jsonl")
        for rec in recs[1:]:
            if rec["samples"] > 0:  # K x MS x m_i / b: rank 1 is 2x slower per sample
                assert rec["emulated_ms"] == pytest.approx((1 + r) * 40.0 * rec["samples"] / 32), (r, rec)
