"""How benchmarks launch a training job: the command line and environment of one multi-process run.

Every benchmark (``hetsync.bench.matrix``, ``pause``, ``soak`` and the scripts in
``examples/benchmarks/``) runs the training job :mod:`hetsync.bench.job` (``python -m
hetsync.bench.job``, :data:`JOB`) under ``horovodrun --mpi`` or ``mpirun`` from the caller's working
directory; this module is the one place that builds those commands and their environment, so a
launch flag or variable changes once. Nothing here depends on a checkout: an installed
``hetsync-bench`` runs from any directory, with MNIST's files named by ``HETSYNC_DATA_DIR``.
"""
import os
import signal
import subprocess
import sys
import threading

from hetsync import world

__all__ = ["ROOT", "JOB", "mnist_dir", "job_env", "horovodrun", "mpirun", "on_cluster", "job_argv", "protocol_args",
           "dataset_args", "run", "run_for_summary", "CLUSTER_RECORD"]

#: the folder that holds the ``hetsync`` package (a checkout's root, or site-packages when installed):
#: put first on a launched job's ``PYTHONPATH`` so that it imports this very hetsync.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the training job benchmarks launch, as interpreter arguments: ``python -m hetsync.bench.job``.
JOB = ("-m", "hetsync.bench.job")
#: the file, in a run's output folder, where a launch on the emulated cluster keeps the cluster's record.
CLUSTER_RECORD = "cluster.json"


def mnist_dir():
    """Return the folder of MNIST's IDX files that the data setting names, if that folder exists.

    The setting is the environment variable ``HETSYNC_DATA_DIR`` (:func:`hetsync.data.data_dir`;
    ``hetsync-bench --data-dir DIR`` sets it for its launches); no path inside a checkout is guessed.

    Returns:
        str folder path, or None when the variable is unset, empty or names no existing folder.

    Raises:
        nothing.
    """
    from hetsync.data import data_dir

    folder = data_dir()
    return folder if folder and os.path.isdir(folder) else None


def job_env(stall_shutdown_s=None):
    """The environment (dict of str) of a launched job.

    One intra-op thread per rank (ranks share the machine's cores), TensorFlow's C++ log quiet
    (:data:`hetsync.world.QUIET_ENV` where the caller's environment sets no value, unless
    ``HETSYNC_VERBOSE=1``: :func:`hetsync.world.is_verbose`), OpenMPI allowed to run as root, this
    interpreter's ``bin/`` first on ``PATH`` (so ``horovodrun`` finds the same Python) and :data:`ROOT`
    first on ``PYTHONPATH``.

    Args:
        stall_shutdown_s: int seconds or None. When given, horovod's stall shutdown
            (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``) defaults to it; a value the caller's environment
            already sets wins.

    Raises:
        ValueError: ``stall_shutdown_s`` not a positive number.
    """
    if stall_shutdown_s is not None and not stall_shutdown_s > 0:
        raise ValueError(f"stall_shutdown_s must be > 0 seconds or None, got {stall_shutdown_s!r}")
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "TF_NUM_INTRAOP_THREADS": "1",
                "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
                "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")})
    if not world.is_verbose(env):
        for name, value in world.QUIET_ENV.items():
            env.setdefault(name, value)
    if stall_shutdown_s is not None:
        env.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(int(stall_shutdown_s)))
    return env


def _check_np(np_):
    if isinstance(np_, bool) or not isinstance(np_, int) or np_ < 1:
        raise ValueError(f"np (the number of ranks) must be an integer >= 1, got {np_!r}")


def horovodrun(np_, argv, cycle_time_ms=None):
    """``horovodrun --mpi -np NP [--cycle-time-ms MS] PYTHON ARGV...`` (list of str).

    Args:
        np_: int >= 1, ranks. argv: list of str, the interpreter's arguments (:data:`JOB` or a script) and the job's.
        cycle_time_ms: float milliseconds or None (horovod's default).

    Raises:
        ValueError: ``np_`` not an integer >= 1.
    """
    _check_np(np_)
    cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--mpi", "-np", str(np_)]
    if cycle_time_ms:
        cmd += ["--cycle-time-ms", str(cycle_time_ms)]
    return cmd + [sys.executable] + list(argv)


def mpirun(np_, argv):
    """``mpirun --oversubscribe -np NP`` over the loopback interface, then ``PYTHON ARGV...`` (list of str).

    Args:
        np_: int >= 1, ranks. argv: list of str, the interpreter's arguments (:data:`JOB` or a script) and the job's.

    Raises:
        ValueError: ``np_`` not an integer >= 1.
    """
    _check_np(np_)
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "--mca", "btl_tcp_if_include",
            "lo", sys.executable] + list(argv)


def on_cluster(spec, argv, record=None, timeout_s=3600.0):
    """``hetsync-cluster run ... -- horovodrun --mpi -np {np} -H {hosts} PYTHON ARGV...`` (list of str): the job
    on the emulated multi-host cluster :mod:`hetsync.emulation.cluster`, ranks placed ``spec.slots`` per host
    (``spec.host_slots`` where a host has its own count).

    Args:
        spec: :class:`hetsync.emulation.cluster.ClusterSpec` (hosts, slots, rates, dilation D; checked).
        argv: list of str, the interpreter's arguments (:data:`JOB`) and the job's.
        record: str path or None: where the cluster writes its record (D, rates, bytes per link;
            :meth:`hetsync.emulation.cluster.Cluster.record`), usually ``OUT/`` :data:`CLUSTER_RECORD`.
        timeout_s: float seconds > 0 the job may run inside the cluster (``--timeout``).

    Raises:
        ValueError: ``spec`` is not a ClusterSpec.
    """
    from hetsync.emulation.cluster.spec import ClusterSpec

    if not isinstance(spec, ClusterSpec):
        raise ValueError(f"on_cluster takes a ClusterSpec, got {spec!r}")
    cmd = [sys.executable, "-m", "hetsync.emulation.cluster", "run", "--hosts", str(spec.hosts), "--slots",
           str(spec.slots), "--link", spec.link, "--dilation", f"{spec.dilation:g}", "--timeout", f"{timeout_s:g}"]
    for host, rate in spec.host_links:
        cmd += ["--host-link", f"{host}={rate}"]
    for host, n in spec.host_slots:
        cmd += ["--host-slots", f"{host}={n}"]
    if record:
        cmd += ["--record", record]
    return cmd + ["--", os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--mpi", "-np", "{np}",
                  "-H", "{hosts}", sys.executable] + list(argv)


def protocol_args(pairs):
    """``--protocol-arg KEY=VALUE`` for each pair (list of str); ``pairs`` is an iterable of ``"KEY=VALUE"``."""
    out = []
    for kv in pairs:
        out += ["--protocol-arg", kv]
    return out


def dataset_args(digits=False):
    """The job's data flags (list of str): MNIST from :func:`mnist_dir` when it names a folder and
    ``digits`` is false, else scikit-learn's digits."""
    folder = mnist_dir()
    if folder and not digits:
        return ["--dataset", "mnist-idx", "--data-dir", folder]
    return ["--dataset", "digits"]


def job_argv(protocol, out, protocol_args=(), extra=(), **flags):
    """The training job's argument list (list of str): ``-m hetsync.bench.job --protocol PROTOCOL``, then ``--FLAG VALUE``
    for each keyword (underscores become dashes: ``batch_size=32`` gives ``--batch-size 32``; a value of
    None is left out), then ``extra``, ``--out OUT --quiet`` and ``--protocol-arg`` for each
    ``"KEY=VALUE"`` of ``protocol_args``.

    Args:
        protocol: str, a registered protocol name. out: str, the run's output folder.
        protocol_args: iterable of str ``"KEY=VALUE"``. extra: iterable of str, flags as they are.
        flags: flag values (str, int or float; seconds, samples or steps as the job's ``--help`` says).
    """
    argv = [*JOB, "--protocol", protocol]
    for k, v in flags.items():
        if v is not None:
            argv += ["--" + k.replace("_", "-"), str(v)]
    argv += list(extra) + ["--out", out, "--quiet"]
    for kv in protocol_args:
        argv += ["--protocol-arg", kv]
    return argv


def run(cmd, timeout_s, capture=True, stall_shutdown_s=None, cwd=None, env=None):
    """Run one launch command with :func:`job_env`; return its ``CompletedProcess``.

    Args:
        cmd: list of str (from :func:`horovodrun` or :func:`mpirun`). timeout_s: float seconds > 0.
        cwd: str folder the launch runs in (None: this process's working directory).
        capture: bool, capture stdout and stderr as text (else they go to this process's).
        stall_shutdown_s: int seconds or None, passed to :func:`job_env`.
        env: dict of str or None: variables set on top of :func:`job_env` (e.g. ``HETSYNC_DILATION``).

    Raises:
        ValueError: ``timeout_s`` not a positive number (a launch never waits without a bound).
        subprocess.TimeoutExpired: the job ran longer than ``timeout_s``; the launcher's process group got
            SIGTERM (mpirun and horovodrun then stop their ranks) and, 10 s later, SIGKILL.
        SystemExit: this process got SIGTERM while the launch ran (status 143; called from the main thread); the
            launch's group was stopped the same way first. Ctrl-C (KeyboardInterrupt) stops it too.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(cmd, cwd=cwd, env={**job_env(stall_shutdown_s), **(env or {})}, stdout=pipe, stderr=pipe,
                            text=True, start_new_session=True)
    # the launch runs in its own session, so a SIGTERM to this process (a benchmark stopped by ``kill``) would
    # leave it running: while it runs, SIGTERM raises SystemExit here and the launch's group is stopped below
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        _stop_group(proc)
        exc.output, exc.stderr = proc.communicate(timeout=30)
        raise
    except BaseException:
        _stop_group(proc)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_for_summary(cmd, timeout_s, out_dir, what, env=None):
    """Run one launch (:func:`run`) that writes ``OUT_DIR/summary.json``; return that summary (dict).

    Args:
        cmd: list of str, the launch. timeout_s: float seconds > 0. out_dir: str, the job's ``--out`` folder.
        what: str naming the run in the error (``"study run rna np4 ..."``). env: dict of str or None (:func:`run`).

    Raises:
        RuntimeError: the launch failed or wrote no summary (its status and the tail of its output in the message).
        subprocess.TimeoutExpired, ValueError, SystemExit: as :func:`run`.
    """
    import json

    path = os.path.join(out_dir, "summary.json")
    proc = run(cmd, timeout_s, env=env)
    if proc.returncode != 0 or not os.path.exists(path):
        tail = ((proc.stdout or "") + (proc.stderr or ""))[-2000:]
        raise RuntimeError(f"{what} failed (status {proc.returncode}):\n{tail}")
    with open(path) as f:
        return json.load(f)


def _terminate(signum, frame):
    """SIGTERM while a launch runs: leave through :class:`SystemExit` (status 128 + 15) so the launch is stopped."""
    raise SystemExit(128 + signum)


def _stop_group(proc, grace_s=10.0):
    """SIGTERM ``proc``'s process group (its own session: the launcher and what it started locally), SIGKILL
    after ``grace_s`` seconds if the launcher is still alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
