"""The advisor's probe under a real launch: it measures 2 ranks and prints one JSON ranking on rank 0; a rank stuck
before the probe ends the whole launch at --timeout-s with a message naming the stage, leaving no process."""
import json
import os
import subprocess
import time

import conftest
from conftest import launch


def test_the_probe_measures_two_ranks_and_prints_one_json_document():
    p = launch(2, ["-m", "hetsync.advise", "--model", "advise_models:small", "--probe-s", "4", "--json",
                   "--protocols", "bsp,rna,localsgd,taskalloc"], timeout=240,
               env={"PYTHONPATH": os.pathsep.join([os.path.join(conftest.ROOT, "tests", "jobs"), conftest.ROOT])})
    doc = json.loads(p.stdout)
    assert doc["inputs"]["np"] == 2 and doc["inputs"]["probe"] is True
    assert all(n > 10 for n in doc["inputs"]["steps_measured"])
    assert doc["inputs"]["model_bytes"] == (64 * 32 + 32 + 32 * 10 + 10) * 4
    t = doc["inputs"]["timings_s"]
    assert t["allreduce_s"] > 0 and t["p2p_s"] > 0 and t["p2p_small_s"] > 0
    assert sorted(r["protocol"] for r in doc["protocols"]) == ["bsp", "localsgd", "rna", "taskalloc"]
    assert doc["recommended"]["protocol"] in {"bsp", "localsgd", "rna", "taskalloc"}


def test_a_rank_stuck_before_the_probe_ends_the_launch_at_the_deadline_and_leaves_no_process():
    from hetsync.bench import launch as jobs

    mark = conftest._launch_id() + "-advise"
    env = conftest._env({"PYTHONPATH": os.pathsep.join([os.path.join(conftest.ROOT, "tests", "jobs"),
                                                         conftest.ROOT])})
    env[conftest.LAUNCH_MARK] = mark
    cmd = jobs.mpirun(2, ["-m", "hetsync.advise", "--model", "advise_models:hang_on_rank1", "--probe-s", "2",
                          "--timeout-s", "15"])
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=conftest.ROOT, env=env, capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - t0
        assert p.returncode != 0
        assert "did not finish within --timeout-s=15 s (stage: building the model)" in p.stderr, p.stderr[-3000:]
        assert elapsed < 15 + 45, elapsed
        deadline = time.monotonic() + 10
        while conftest._marked_pids(mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert conftest._marked_pids(mark) == [], "processes of the launch were left running"
    finally:
        conftest._stop_launched(mark)
