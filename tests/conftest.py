"""Shared test helpers: launching real multi-process runs with mpirun / horovodrun."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import settings as _hypothesis_settings

# Hypothesis: derandomized under CI (CI=true), so a CI run draws the same examples every time; random
# locally, where new examples are wanted. HYPOTHESIS_PROFILE overrides either.
_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
_hypothesis_settings.register_profile("dev", print_blob=True)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS_DIR = os.path.join(ROOT, "tests", "jobs")
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
    """Run ``argv`` (a list starting with a script path) on ``np_`` ranks and wait at most ``timeout`` seconds.

    launcher: "mpirun", "horovodrun-mpi", "horovodrun-gloo" or "single". env: extra variables (a value of
    None removes the variable).
    Returns the CompletedProcess; with check=True a non-zero exit fails the test with the output. On timeout
    the whole launch (launcher and ranks) is stopped and the test fails naming the command and its output.
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
    proc = run_job(cmd, timeout, env)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
                    f"--- stderr\n{proc.stderr[-6000:]}")
    return proc


def run_job(cmd, timeout, env=None):
    """Run a launch command (``cmd``, a list) in its own session with the launch marker in its environment and
    wait at most ``timeout`` seconds. Returns the CompletedProcess (text output). On timeout every process of
    this launch is stopped (see :func:`_stop_launched`) and the test fails with the output so far."""
    job_env = _env(env)
    job_env[LAUNCH_MARK] = _launch_id()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_die_with_parent)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_launched(job_env[LAUNCH_MARK])
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(cmd)} did not finish within its {timeout} s timeout; the launch was stopped\n"
                    f"--- stdout\n{(out or '')[-6000:]}\n--- stderr\n{(err or '')[-6000:]}", pytrace=False)
    finally:
        _stop_launched(job_env[LAUNCH_MARK])  # ranks an exited launcher left behind
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


#: environment variable carried by every process a test launches: its value names the launch, so the processes
#: of a launch (launcher, MPI daemons, ranks, even ones that left the launcher's process group) can be found.
LAUNCH_MARK = "HETSYNC_TEST_LAUNCH"
_launch_count = [0]


def _launch_id():
    _launch_count[0] += 1
    return f"{os.getpid()}-{_launch_count[0]}"


def _die_with_parent():
    """In the child before exec: SIGTERM when the test process dies (a test timeout that kills the xdist worker
    would otherwise leave the launcher running)."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _marked_pids(value, prefix=False):
    """PIDs of live processes whose environment has ``LAUNCH_MARK`` equal to ``value`` (with ``prefix``:
    starting with it)."""
    needle = f"{LAUNCH_MARK}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(v == needle or (prefix and v.startswith(needle)) for v in env):
            pids.append(int(entry))
    return pids


def _stop_launched(value, prefix=False, grace_s=5.0):
    """SIGTERM every process marked with ``value`` (one launch; with ``prefix`` every launch whose mark starts
    with it), then SIGKILL what is left after ``grace_s`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _marked_pids(value, prefix)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _is_zombie(p)]
            time.sleep(0.1)
        if not pids:
            return


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


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


# ---- tiers -------------------------------------------------------------------------------------------------------
#: tests/<tier>/ -> markers every test there gets. A launching test lives in tests/mp or tests/e2e, so the marker
#: cannot be forgotten; a test elsewhere that launches a job fails (see _no_launch_outside_the_launch_tiers).
TIER_MARKS = {"mp": ("mpi",), "e2e": ("mpi", "e2e")}
#: default timeout (seconds) of a launching test that sets none; in-process tests have pyproject's (120 s).
LAUNCH_TEST_TIMEOUT_S = 900
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _tier(item):
    """The tier folder of a test: the folder after the last ``tests`` folder of its path ("unit", "mp", "e2e")."""
    parts = os.path.normpath(str(item.path)).split(os.sep)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "tests":
            return parts[i + 1]
    return ""


def pytest_itemcollected(item):
    """Mark by folder, as each test is collected: tests/mp and tests/e2e are ``mpi`` (e2e also ``e2e``) and get a
    900 s timeout unless they set their own. (``make test`` runs them in their own pytest process, one at a time,
    beside the in-process tier: see scripts/test.sh.)"""
    marks = TIER_MARKS.get(_tier(item))
    if not marks:
        return
    for name in marks:
        item.add_marker(getattr(pytest.mark, name))
    if item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(LAUNCH_TEST_TIMEOUT_S))


_LAUNCHERS = {"mpirun", "mpiexec", "orterun", "horovodrun"}


def launches_a_job(args):
    """True when ``args`` (a Popen argument: list or string) starts a training job: an MPI or horovod launcher,
    a script under examples/ or tests/jobs/, or ``-m hetsync.bench.job``."""
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    if not argv:
        return False
    if os.path.basename(argv[0]) in _LAUNCHERS:
        return True
    for i, a in enumerate(argv):
        full = os.path.normpath(os.path.join(ROOT, a))
        if a.endswith(".py") and (full.startswith(os.path.join(ROOT, "examples") + os.sep)
                                  or full.startswith(JOBS_DIR + os.sep)):
            return True
        if a == "-m" and i + 1 < len(argv) and argv[i + 1] == "hetsync.bench.job":
            return True
    return False


@pytest.fixture(autouse=True)
def _no_launch_outside_the_launch_tiers(request, monkeypatch):
    """In tests/unit (and anywhere but tests/mp, tests/e2e) starting a job fails the test: launches belong to the
    serial, marked tiers."""
    if _tier(request.node) in TIER_MARKS:
        yield
        return
    real = subprocess.Popen

    class _Guarded(real):
        def __init__(self, args, *a, **kw):
            if launches_a_job(args):
                pytest.fail(f"{request.node.nodeid} launches a job ({args!r}); launching tests belong in tests/mp "
                            "or tests/e2e", pytrace=False)
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", _Guarded)
    yield


def pytest_sessionfinish(session, exitstatus):
    """Stop whatever a launch of this test process left running (belt and braces: run_job stops its own)."""
    _stop_launched(f"{os.getpid()}-", prefix=True)
