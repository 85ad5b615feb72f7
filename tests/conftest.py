"""Shared test helpers: launching real multi-process runs with mpirun / horovodrun."""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import settings as _hypothesis_settings

# Hypothesis: derandomized under CI (CI=true), so a CI run draws the same examples every time; random
# locally, where new examples are wanted. HYPOTHESIS_PROFILE overrides either.
_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
_hypothesis_settings.register_profile("dev", print_blob=True)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
import hetsync.bench.launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MP_DIR = os.path.join(ROOT, "tests", "mp")
MNIST_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "mnist-t10k"))
PY = sys.executable
BIN = os.path.dirname(PY)


def _env(extra=None):
    """The launched job's environment: hetsync.bench.launch.job_env (one intra-op thread, quiet TensorFlow, this
    interpreter first on PATH, the checkout first on PYTHONPATH) with horovod's stall shutdown at 120 s, then
    ``extra`` (a value of None removes the variable)."""
    from hetsync.bench.launch import job_env
    env = job_env(stall_shutdown_s=120)
    env.update(extra or {})
    return {k: v for k, v in env.items() if v is not None}


def launch(np_, argv, launcher="mpirun", timeout=300, env=None, check=True):
    """Run ``argv`` (a list starting with a script path) on ``np_`` ranks.

    launcher: "mpirun", "horovodrun-mpi", "horovodrun-gloo" or "single". env: extra variables (a value of
    None removes the variable).
    Returns the CompletedProcess; with check=True a non-zero exit fails the test with the output.
    """
    from hetsync.bench import launch as jobs
    if launcher == "mpirun":
        cmd = jobs.mpirun(np_, argv)
    elif launcher == "horovodrun-mpi":
        cmd = jobs.horovodrun(np_, argv)
    elif launcher == "horovodrun-gloo":
        cmd = [os.path.join(BIN, "horovodrun"), "--gloo", "-np", str(np_), PY] + list(argv)
    else:
        cmd = [PY] + list(argv)
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
                    f"--- stderr\n{proc.stderr[-6000:]}")
    return proc


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def mnist_dir():
    if not os.path.isdir(MNIST_DIR):
        pytest.skip(f"shared MNIST files not found at {MNIST_DIR}")
    return MNIST_DIR
