"""Shared test helpers: launching real multi-process runs with mpirun / horovodrun."""
import fnmatch
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
# MNIST's IDX files: the data setting (HETSYNC_DATA_DIR) if given, else the copy beside the checkout when present
MNIST_DIR = os.environ.get("HETSYNC_DATA_DIR") or os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "mnist-t10k"))
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


#: environment variable naming the pytest session (the pid of its controller, inherited by the xdist workers):
#: every launch mark starts with it, so the controller can stop what a crashed worker's launches left running.
SESSION_VAR = "HETSYNC_TEST_SESSION"


def _session():
    return os.environ.get(SESSION_VAR) or str(os.getpid())


def _launch_id():
    _launch_count[0] += 1
    return f"{_session()}-{os.getpid()}-{_launch_count[0]}"


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
        pytest.skip(f"MNIST IDX files not found at {MNIST_DIR} (set HETSYNC_DATA_DIR)")
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


#: Launching tests that only `make test-full` runs (marked ``slow`` here, in one place, so the quick tier's budget
#: is visible): matrices over protocols whose every protocol keeps a launch in the quick tier elsewhere, second
#: cases of one mechanism, the benchmark preset, the soak sample and long convergence runs. The quick tier keeps
#: at least one launch per protocol and per mechanism (faults, pool, checkpoint, non-finite, user script, Gloo).
#: fnmatch patterns over node IDs.
SLOW_TESTS = (
    # a killed rank: one case per kind of rank in the quick tier (a worker, rank 0, a parameter server, Gloo)
    "tests/mp/test_dead_peer_mp.py::*[[]*-kill1-mpirun]",
    "tests/mp/test_dead_peer_mp.py::*[[]ssp-kill0-mpirun]",
    "tests/mp/test_dead_peer_mp.py::*[[]rnah-kill2-mpirun]",
    "tests/mp/test_dead_peer_mp.py::*[[]rna-kill1-horovodrun-mpi]",
    "tests/mp/test_dead_peer_mp.py::*[[]localsgd-kill1-horovodrun-gloo]",
    "tests/mp/test_dead_peer_mp.py::*[[]bsp-kill1-horovodrun-gloo]",
    # the user's convnet: BSP (checkpoints, TensorBoard) and RNA in the quick tier; every protocol in the full one
    "tests/e2e/test_user_scripts_mp.py::test_every_protocol_trains_the_ported_convnet_*[[][!br]*]",
    "tests/e2e/test_user_scripts_mp.py::test_every_protocol_trains_the_ported_convnet_*[[]rnah]",
    "tests/e2e/test_user_scripts_mp.py::test_mixed_bfloat16_*[[]rna-4]",
    "tests/e2e/test_user_scripts_mp.py::test_step_by_step_protocols_refuse_*[[]hop]",
    "tests/e2e/test_user_scripts_mp.py::test_step_by_step_protocols_refuse_*[[]asp]",
    # keras.applications (MobileNetV2, ResNet-50), the throughput workload: the convnet keeps the quick user-script launches
    "tests/e2e/test_user_scripts_mp.py::test_keras_applications_reports_images_per_second[[]*]",
    "tests/e2e/test_example_validation.py::*[[]args[0-3]-*]",
    "tests/e2e/test_bench_preset.py::*",
    "tests/e2e/test_soak_sample.py::test_a_small_soak_sample_*",
    # the advisor's probe under a launch (the unit tier checks its predictions and its refusals of bad input)
    "tests/mp/test_advise_mp.py::*",
    # second cases of one mechanism
    "tests/mp/test_bench_launch_mp.py::test_solo_measurement_*",
    "tests/mp/test_bsp_mp.py::test_bsp_trains_digits_to_90_percent_with_identical_weights[[]4]",
    "tests/mp/test_bsp_mp.py::test_slowdown_really_slows_the_named_rank",
    "tests/mp/test_checkpoint_mp.py::*[[]localsgd-*]",
    "tests/mp/test_checkpoint_mp.py::*[[]rna-*]",
    "tests/mp/test_checkpoint_mp.py::*[[]taskalloc-*]",
    "tests/mp/test_emulated_device_mp.py::test_no_device_part_keeps_todays_behaviour",
    "tests/mp/test_faults_mp.py::test_pause_and_stall_fire_and_the_run_completes[[]stall]",
    "tests/mp/test_faults_mp.py::test_a_stall_of_a_parameter_server_is_refused",
    "tests/mp/test_faults_mp.py::test_a_paused_parameter_server_resumes_and_the_run_completes",
    "tests/mp/test_ps_mp.py::test_more_servers_than_variables_fails_at_train_begin_on_every_rank",  # unit: the check
    # a killed parameter server: test_dead_peer_mp's quick server case; RNA's ending: the rank that stops stepping
    "tests/mp/test_ps_mp.py::test_a_killed_server_ends_the_job_with_the_launchers_error_not_a_hang",
    "tests/mp/test_rna_mp.py::test_a_rank_whose_thread_does_not_end_makes_every_rank_fail_the_same_way_after_the_gather",
    "tests/mp/test_rnah_mp.py::test_one_group_is_flat_rna_without_the_server",
    "tests/mp/test_hop_mp.py::test_hop_trains_digits_on_four_ranks_with_backup_workers",
    "tests/mp/test_nonfinite_mp.py::test_nan_on_one_rank_*[[]localsgd-*]",
    "tests/mp/test_nonfinite_mp.py::test_nan_on_one_rank_*[[]asp-*]",
    "tests/mp/test_nonfinite_mp.py::test_batchnorm_statistics_*[[]selsync-*]",
    "tests/mp/test_nonfinite_mp.py::test_batchnorm_statistics_*[[]rnah-*]",
    "tests/mp/test_nonfinite_mp.py::test_diverging_rna_run_of_the_example_*",
    "tests/mp/test_pool_mp.py::test_parameter_server_workers_draw_from_the_pool[[][!a]*]",
    "tests/mp/test_pool_mp.py::test_periodic_averaging_joins_the_same_rounds_on_every_rank[[]fedavg-*]",
    "tests/mp/test_pool_mp.py::test_rna_fixed_shares_remain_available",
    "tests/mp/test_ps_mp.py::test_example_script_unchanged_with_ensemble_reports_both_accuracies",
    "tests/mp/test_ps_mp.py::test_a_stalled_worker_is_named_by_the_server_which_tells_the_others",
    "tests/mp/test_rna_mp.py::test_ranks_with_different_step_counts_end_cleanly",
    "tests/mp/test_rnah_mp.py::test_auto_groups_split_the_slow_worker_off_after_the_warm_up",
    "tests/mp/test_rnah_mp.py::test_groups_by_host_follow_the_launch_host_names",
    "tests/mp/test_selsync_mp.py::test_huge_delta_never_synchronizes_after_the_first_step",
    "tests/mp/test_selsync_mp.py::test_noniid_injection_end_to_end_with_the_example",
    "tests/mp/test_selsync_mp.py::test_parameters_are_averaged_once_at_train_end",
    "tests/mp/test_taskalloc_mp.py::test_digits_accuracy_within_one_point_of_bsp_with_the_same_global_batch",
    "tests/mp/test_taskalloc_mp.py::test_adaptive_allocation_from_a_users_tf_data_pipeline",
    "tests/mp/test_transport_mp.py::test_dispatcher_between_ranks[[]4]",
    "tests/mp/test_auto_mp.py::test_a_switch_to_each_candidate_trains_on[[]*]",  # quick: the choice among two
    # the quick launch tier ran 1,390 s of CI's 1,500: these keep a quick case of the same mechanism
    "tests/mp/test_ps_mp.py::test_ssp_with_zero_staleness_matches_bsp",  # quick: the SSP gate with a straggler
    "tests/mp/test_ps_mp.py::test_a_stalled_server_gives_the_workers_a_clear_error",  # quick: a killed server
    "tests/mp/test_ps_mp.py::test_ensemble_never_changes_from_the_server",  # quick: the pool's PS run (asp)
    "tests/mp/test_rnah_mp.py::test_bad_groups_are_rejected_before_training",  # unit: the group checks
    "tests/e2e/test_example_quiet_mp.py::test_verbose_brings_the_start_up_lines_back",  # quick: the quiet case
    "tests/mp/test_rna_mp.py::test_rna_refused_under_gloo_before_training",  # quick: the Gloo refusals of BSP's test
    "tests/mp/test_dead_peer_mp.py::*[[]bsp-kill0-mpirun]",  # quick: rank 0 killed (RNA; BSP under Gloo)
    "tests/mp/test_nonfinite_mp.py::test_batchnorm_statistics_*[[]bsp-*]",  # quick: RNA's case
    "tests/mp/test_emulated_device_mp.py::test_task_allocation_measures_the_emulated_device_time",  # quick: the fit
)


def pytest_itemcollected(item):
    """Mark by folder, as each test is collected: tests/mp and tests/e2e are ``mpi`` (e2e also ``e2e``) and get a
    900 s timeout unless they set their own. (``make test`` runs them in their own pytest process, one at a time,
    beside the in-process tier: see scripts/test.sh.)"""
    marks = TIER_MARKS.get(_tier(item))
    if not marks:
        return
    nodeid = "tests/" + item.nodeid.split("tests/", 1)[-1]
    if any(fnmatch.fnmatchcase(nodeid, pattern) for pattern in SLOW_TESTS):
        item.add_marker(pytest.mark.slow)
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


def pytest_configure(config):
    """The controller (or a run without xdist) names the session before any worker starts; a pytest run
    started inside a test gets its own name, not the outer run's."""
    if not hasattr(config, "workerinput"):
        os.environ[SESSION_VAR] = str(os.getpid())


def pytest_sessionfinish(session, exitstatus):
    """Stop whatever a launch left running (belt and braces: run_job stops its own). A worker stops its own
    launches' leftovers; the controller stops every launch of the session, also those of a worker that a test
    timeout ended while its launcher was still starting ranks (they would outlive the run)."""
    if hasattr(session.config, "workerinput"):
        _stop_launched(f"{_session()}-{os.getpid()}-", prefix=True)
    else:
        _stop_launched(f"{_session()}-", prefix=True)
