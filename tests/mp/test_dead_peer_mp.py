"""A dead peer is detected and reported within a bounded time on every protocol.

Each run is a real launch of ``examples/keras_digits.py`` (digits, 2 epochs on an emulated 50 ms device, so
training lasts past the fault) whose scenario SIGKILLs one rank 1.5 s after its train begin
(``kill:RANK:1.5``, :class:`hetsync.emulation.scenario.Fault`). The job must end with a non-zero status, the launcher's
message must name the killed rank, and no rank may wait out a timeout: the time from the kill (the unix
time the fault prints) to the launcher's exit is bounded (60 s here, against horovod's 300 s stall
timeout and the protocols' 120 s ``timeout_s``; the measured figure is about a second under mpirun).
"""
import os
import re
import time
import pytest
from conftest import launch
DIGITS = "examples/keras_digits.py"
PS = ("asp", "ensemble", "rnah", "shat", "shatroot", "ssp")  # need --protocol-arg servers=1 and 3 ranks (2 workers)
PROTOCOLS = ("bsp", "fedavg", "hop", "localsgd", "notifyack", "rna", "selsync", "taskalloc") + PS
BOUND_S = 60.0
CASES = ([(p, 1, "mpirun") for p in PROTOCOLS]  # a worker dies
         + [("bsp", 0, "mpirun"), ("rna", 0, "mpirun"), ("ssp", 0, "mpirun")]  # rank 0 (RNA's controller) dies
         + [("ssp", 2, "mpirun"), ("rnah", 2, "mpirun")]  # the parameter server dies (the fault's timer path)
         + [("rna", 1, "horovodrun-mpi")]
         + [("bsp", 1, "horovodrun-gloo"), ("bsp", 0, "horovodrun-gloo"), ("localsgd", 1, "horovodrun-gloo")])


def test_the_cases_cover_every_protocol():
    from hetsync import protocols

    assert sorted(PROTOCOLS) == sorted(protocols.WRAPPERS)


@pytest.mark.parametrize("protocol, killed, launcher", CASES, ids=[f"{p}-kill{k}-{lc}" for p, k, lc in CASES])
def test_a_killed_rank_ends_the_job_within_bounded_time_naming_the_rank(tmp_path, protocol, killed, launcher):
    np_ = 3 if protocol in PS else 2
    out = tmp_path / "out"
    argv = [DIGITS, "--protocol", protocol, "--epochs", "2", "--quiet", "--slowdown", f"device:50+kill:{killed}:1.5",
            "--out", str(out)]
    if protocol in PS:
        argv += ["--protocol-arg", "servers=1"]
    if launcher == "horovodrun-gloo" and protocol == "localsgd":  # the sample pool needs MPI point-to-point
        argv += ["--protocol-arg", "data_plan=shard"]
    proc = launch(np_, argv, launcher=launcher, timeout=300, check=False)
    ended = time.time()
    text = proc.stdout + proc.stderr
    fired = re.search(rf"fault kill:{killed}:1.5: rank {killed} \(pid \d+\) at [\d.]+ s: SIGKILL to itself "
                      rf"\(unix time ([\d.]+)\)", text)
    assert fired, text[-4000:]
    assert proc.returncode != 0
    if launcher in ("mpirun", "horovodrun-mpi"):
        assert re.search(rf"process rank {killed} with PID \d+ on node \S+ exited on signal 9", text), text[-4000:]
    else:  # horovodrun --gloo: the surviving rank's collective fails at once (its TCP peer is gone)
        assert re.search(rf"first process to do so was:\s+Process name: {killed}\s+Exit code: 137", text), text[-4000:]
    assert not os.path.exists(out / "summary.json")
    detect_s = ended - float(fired.group(1))
    print(f"{protocol} kill:{killed} {launcher}: job ended {detect_s:.2f} s after the kill")
    assert detect_s < BOUND_S, (detect_s, text[-4000:])
