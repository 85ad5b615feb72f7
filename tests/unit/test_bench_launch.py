"""hetsync.bench.launch: the commands and environment every benchmark launches jobs with, and one real launch."""
import os
import sys
import pytest
from hetsync.bench import launch, matrix, pause, soak


def test_job_env_sets_one_thread_root_mpi_and_this_interpreter(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", raising=False)
    env = launch.job_env()
    assert env["TF_NUM_INTRAOP_THREADS"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["PYTHONPATH"] == launch.ROOT + os.pathsep + "/elsewhere"
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" not in env
    assert launch.job_env(stall_shutdown_s=120)["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "120"
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "7")  # the caller's value wins
    assert launch.job_env(stall_shutdown_s=120)["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "7"


def test_commands_and_job_argv():
    argv = launch.job_argv("rna", "/o", ["data_plan=shard", "scale_lr=true"], extra=["--dataset", "digits"],
                           batch_size=16, target_accuracy=0.9, lr=None)
    assert argv == ["-m", "hetsync.bench.job", "--protocol", "rna", "--batch-size", "16", "--target-accuracy", "0.9",
                    "--dataset", "digits", "--out", "/o", "--quiet",
                    "--protocol-arg", "data_plan=shard", "--protocol-arg", "scale_lr=true"]
    hv = launch.horovodrun(4, argv, cycle_time_ms=2.5)
    assert hv[1:6] == ["--mpi", "-np", "4", "--cycle-time-ms", "2.5"] and hv[6] == sys.executable and hv[7:] == argv
    assert os.path.basename(hv[0]) == "horovodrun"
    mp = launch.mpirun(2, argv)
    assert mp[:5] == ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    assert mp[mp.index(sys.executable) + 1:] == argv
    assert launch.protocol_args(["a=1"]) == ["--protocol-arg", "a=1"]
    assert launch.dataset_args(digits=True) == ["--dataset", "digits"]
    # the benchmarks build their commands here
    assert soak.command({"np": 3, "protocol": "bsp", "scenario": "none", "seed": 1, "epochs": 1}, "/o")[:5] == launch.mpirun(3, [])[:5]
    assert matrix.ROOT == soak.ROOT == launch.ROOT and pause.launch is launch


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_bad_rank_count_is_refused(bad):
    with pytest.raises(ValueError, match=r"np \(the number of ranks\) must be an integer >= 1, got"):
        launch.mpirun(bad, [*launch.JOB])
    with pytest.raises(ValueError, match="np"):
        launch.horovodrun(bad, [*launch.JOB])


@pytest.mark.parametrize("bad", [0, -5, None, True])
def test_unbounded_or_bad_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="timeout_s must be > 0 seconds"):
        launch.run(["true"], bad)
    with pytest.raises(ValueError, match="stall_shutdown_s"):
        launch.job_env(stall_shutdown_s=0)


def test_a_sigterm_to_the_benchmark_stops_the_launch_it_runs(tmp_path):
    import signal
    import subprocess
    import time

    pidfile = tmp_path / "child.pid"
    # the "launch": a shell that records its pid and sleeps; the "benchmark": a Python process running it
    script = (f"from hetsync.bench import launch; launch.run(['sh', '-c', 'echo $$ > {pidfile}; exec sleep 60'], 120)")
    bench = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline, "the launch did not start"
            time.sleep(0.1)
        child = int(pidfile.read_text())
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == 143
        deadline = time.monotonic() + 15
        while True:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "the launch outlived the benchmark"
            time.sleep(0.1)
    finally:
        bench.kill()
        bench.wait()


def test_a_launch_that_writes_its_summary_returns_it_and_one_that_fails_names_its_status(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    ok = ["sh", "-c", f"echo '{{\"samples_per_s\": 12.5}}' > {out}/summary.json"]
    assert launch.run_for_summary(ok, 30, str(out), "run A") == {"samples_per_s": 12.5}
    (out / "summary.json").unlink()
    with pytest.raises(RuntimeError, match=r"run B failed \(status 3\):\nboom"):
        launch.run_for_summary(["sh", "-c", "echo boom; exit 3"], 30, str(out), "run B")
    with pytest.raises(RuntimeError, match=r"run C failed \(status 0\)"):  # no summary written
        launch.run_for_summary(["true"], 30, str(out), "run C")
