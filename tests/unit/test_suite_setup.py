"""The suite's own set-up: hangs are stopped within their timeout and reported, the run goes on, and nothing a
launch started is left running.

One inner pytest run (one xdist worker as scripts/test.sh runs each tier, this repository's pytest configuration
and tests/conftest.py as a plugin)
over a temporary ``tests/unit`` and ``tests/mp`` holding: a passing test; an in-process hang; a hang inside a
hypothesis test (whose shrinking would swallow a signal-based timeout); a unit test that tries to launch a job
(refused: launches belong to tests/mp and tests/e2e); a launch that outlives its own timeout (stopped with its
ranks); and a launch whose test times out first (the worker is ended; the launcher dies with it).
"""
import os
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET

import pytest
from conftest import LAUNCH_MARK, ROOT, TESTS_DIR

UNIT = '''
import subprocess, time
import pytest
from hypothesis import given, settings, strategies as st

def test_passes():
    assert sum(range(5)) == 10

@pytest.mark.timeout(3)
def test_hangs_in_process():
    time.sleep(1000)

@pytest.mark.timeout(4)
@settings(deadline=None, max_examples=50)
@given(st.integers())
def test_hangs_under_hypothesis(x):
    time.sleep(1000)

def test_launches_from_the_unit_tier():
    subprocess.run(["mpirun", "-np", "1", "true"], timeout=30)
'''
MP = '''
import os, sys
import pytest
from conftest import launch

MARK = {{"HETSYNC_SELFTEST": "{tag}"}}
SLEEP = ["-c", "import time; time.sleep(1000)"]

def test_is_marked(request):
    assert request.node.get_closest_marker("mpi") is not None
    assert request.node.get_closest_marker("e2e") is None

def test_launch_outlives_its_timeout():
    launch(2, SLEEP, launcher="mpirun", timeout=4, env=MARK)

@pytest.mark.timeout(6)
def test_test_times_out_before_its_launch():
    launch(2, SLEEP, launcher="mpirun", timeout=600, env=MARK)
'''


def _leftovers(tag):
    """PIDs of processes whose environment carries HETSYNC_SELFTEST=tag."""
    needle = f"HETSYNC_SELFTEST={tag}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            pass
    return found


@pytest.mark.timeout(300)
def test_hangs_are_stopped_reported_and_cleaned_up(tmp_path):
    tag = uuid.uuid4().hex
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "mp").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_cases.py").write_text(UNIT)
    (tmp_path / "tests" / "mp" / "test_launch_cases.py").write_text(MP.format(tag=tag))
    junit = tmp_path / "junit.xml"
    env = dict(os.environ, PYTHONPATH=TESTS_DIR, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop(LAUNCH_MARK, None)
    env.pop("PYTEST_XDIST_WORKER", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", os.path.join(ROOT, "pyproject.toml"),
                           "--rootdir", str(tmp_path), "-p", "conftest", "-p", "no:cacheprovider", "-n", "1",
                           "--max-worker-restart", "10", f"--junitxml={junit}", str(tmp_path / "tests")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - t0
    try:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out[-4000:]  # tests failed; the run itself completed
        cases = {}
        for case in ET.parse(junit).getroot().iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            cases[case.get("name")] = None if bad is None else (bad.get("message") or "") + (bad.text or "")
        assert cases["test_passes"] is None and cases["test_is_marked"] is None, cases
        for name in ("test_hangs_in_process", "test_hangs_under_hypothesis", "test_test_times_out_before_its_launch"):
            # the timeout ended the worker; xdist reports the test and a new worker runs the rest, once each
            assert "crashed while running" in (cases[name] or ""), f"{name} not reported as stopped: {cases}"
        assert sum(f"::{name}" in line and "FAILED" in line for line in out.splitlines()
                   for name in ("test_hangs_in_process",)) == 1, out[-4000:]
        assert "launches a job" in cases["test_launches_from_the_unit_tier"], cases
        assert "did not finish within its 4 s timeout" in cases["test_launch_outlives_its_timeout"], cases
        # three hangs of 1000 s each, stopped after 3-6 s: the run ends well within its budget
        assert elapsed < 150, f"the inner run took {elapsed:.0f} s"
    finally:
        deadline = time.monotonic() + 20  # the launcher that outlived its worker gets SIGTERM and stops its ranks
        while _leftovers(tag) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _leftovers(tag)
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    assert not left, f"processes of the inner run's launches still running: {left}"
