"""Fault injection in the scenario language: pause, stall and kill parts, parsed and real runs."""
import json
import os
import pytest
from conftest import launch, read_json, read_jsonl
DIGITS = "examples/keras_digits.py"
_PAUSE_SCRIPT = """
import importlib, json, sys, threading, time
sd = importlib.import_module(sys.argv[1])  # the fault module alone: no TensorFlow
fault = sd.Fault("pause", 0, 0.2, 1.0)
t0 = time.monotonic()
timer = threading.Timer(0.2, fault.fire, args=(0.2,))  # from another thread, as on a parameter server
timer.start()
last, gap = time.monotonic(), 0.0
while time.monotonic() - t0 < 2.0:
    time.sleep(0.005)
    now = time.monotonic()
    gap, last = max(gap, now - last), now
timer.join()
print(json.dumps({"main_thread_gap_s": gap, "faults": sd.fired_faults()}))
"""


def test_a_pause_stops_every_thread_of_the_process(tmp_path):
    # the fault fires in a timer thread; the main thread, busy in its loop, must also stand still for FOR_S
    script = tmp_path / "pause.py"
    script.write_text(_PAUSE_SCRIPT)
    proc = launch(1, [str(script), "hetsync.emulation.faults"], launcher="single", timeout=60)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["main_thread_gap_s"] >= 1.0
    fault, = result["faults"]
    assert fault["kind"] == "pause" and fault["resumed_at_s"] >= 0.2 + 1.0


def _digits_run(tmp_path, spec, check=True):
    out = str(tmp_path / "out")
    # device:25 fixes a step to 25 ms of wall time, so 8 epochs (22 steps each) outlast the fault at 2 s
    proc = launch(2, [DIGITS, "--protocol", "bsp", "--epochs", "8", "--quiet", "--slowdown", f"device:25+{spec}",
                      "--out", out], timeout=240, check=check)
    return proc, out


@pytest.mark.parametrize("kind", ["pause", "stall"])
def test_pause_and_stall_fire_and_the_run_completes(tmp_path, kind):
    proc, out = _digits_run(tmp_path, f"{kind}:1:2:3")
    summary = read_json(os.path.join(out, "summary.json"))
    assert len(summary["faults"]) == 1
    fault = summary["faults"][0]
    assert (fault["kind"], fault["rank"], fault["at_s"], fault["for_s"]) == (kind, 1, 2.0, 3.0)
    assert fault["fired_at_s"] >= 2.0 and fault["resumed_at_s"] >= fault["fired_at_s"] + 3.0
    assert [r["faults"] for r in summary["per_rank"]] == [[], [fault]]
    # the step the fault hit carries it in rank 1's records; rank 0's carry none
    hit = [r for r in read_jsonl(os.path.join(out, "rank1.jsonl")) if "faults" in r]
    assert len(hit) == 1 and hit[0]["faults"] == [fault]
    assert not any("faults" in r for r in read_jsonl(os.path.join(out, "rank0.jsonl")))
    # the run completed: every rank did all its steps and BSP kept the ranks in sync
    assert summary["steps"] == 8 * 22 and [r["steps"] for r in summary["per_rank"]] == [176, 176]
    assert summary["weights_in_sync"]
    assert f"fault {kind}:1:2:3: rank 1" in proc.stderr + proc.stdout


def test_kill_ends_the_job_with_a_non_zero_status(tmp_path):
    proc, out = _digits_run(tmp_path, "kill:1:2", check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "fault kill:1:2: rank 1" in output
    assert "process rank 1" in output and "signal 9" in output
    assert not os.path.exists(os.path.join(out, "summary.json"))


def test_a_paused_parameter_server_resumes_and_the_run_completes(tmp_path):
    # a server rank serves inside its train begin, so its pause is armed on a timer (hetsync.callbacks.Slowdown)
    out = str(tmp_path / "out")
    launch(3, [DIGITS, "--protocol", "ssp", "--protocol-arg", "servers=1", "--protocol-arg", "data_plan=shard",
               "--epochs", "4", "--quiet",
               "--slowdown", "device:25+pause:2:1:2", "--out", out], timeout=240)
    summary = read_json(os.path.join(out, "summary.json"))
    fault, = summary["faults"]
    assert (fault["kind"], fault["rank"], fault["at_s"], fault["for_s"]) == ("pause", 2, 1.0, 2.0)
    assert fault["resumed_at_s"] >= 3.0
    assert [r["role"] for r in summary["per_rank"]] == ["worker", "worker", "server"]
    assert [len(r["faults"]) for r in summary["per_rank"]] == [0, 0, 1]
    assert [r["steps"] for r in summary["per_rank"]] == [4 * 22, 4 * 22, 0]


def test_a_stall_of_a_parameter_server_is_refused(tmp_path):
    proc = launch(3, [DIGITS, "--protocol", "ssp", "--protocol-arg", "servers=1", "--epochs", "1", "--quiet",
                      "--slowdown", "stall:2:1:2", "--out", str(tmp_path / "out")], timeout=240, check=False)
    assert proc.returncode != 0
    assert "['stall:2:1:2'] stall rank 2, a parameter server" in proc.stdout + proc.stderr
