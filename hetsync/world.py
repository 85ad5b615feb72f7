"""Process-level set-up: horovod on the MPI world shared with mpi4py, or on Gloo, or alone.

``hetsync.init()`` decides how the job was launched:

* ``horovodrun --mpi`` / ``mpirun`` (OpenMPI's ``OMPI_COMM_WORLD_SIZE`` is set): mpi4py
  initialises MPI with ``MPI_THREAD_MULTIPLE`` and horovod is initialised on
  ``MPI.COMM_WORLD``, so point-to-point traffic (mpi4py) and collectives (horovod) share one
  world. Every protocol is available. With ``HETSYNC_COLLECTIVES=gloo`` (:data:`COLLECTIVES_ENV`) horovod's
  collectives run on Gloo instead, its rendezvous made through MPI, while point-to-point traffic stays on
  mpi4py (:func:`collectives`); the emulated multi-host cluster sets it when its ranks share too few cores.
* ``horovodrun --gloo`` (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` is set): horovod on Gloo; only
  collectives-only protocols (BSP, task allocation, SelSync, ...) are available.
* a plain ``python script.py``: a world of one rank.

:func:`quiet_startup` (called by the examples and the training job before they import TensorFlow)
hides TensorFlow's start-up lines; ``HETSYNC_VERBOSE=1`` (:data:`VERBOSE_ENV`) keeps them.
"""
import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import threading

from hetsync import rendezvous
from hetsync.errors import NonFiniteError

log = logging.getLogger("hetsync")

__all__ = [
    "init", "is_initialized", "rank", "size", "local_rank", "local_size", "mpi_enabled",
    "launch_mode", "shutdown", "require_mpi", "COLLECTIVE_TIMEOUT_S",
    "register_shutdown", "dilation", "dilated", "DILATION_ENV", "host_name", "host_names", "HOST_ENVS",
    "quiet_startup", "is_verbose", "VERBOSE_ENV", "QUIET_ENV", "collectives", "COLLECTIVES_ENV", "COLLECTIVES",
    "RENDEZVOUS_TIMEOUT_S", "parse_dilation",
]


#: Seconds after which a stalled horovod collective aborts the job (horovod's stall shutdown).
COLLECTIVE_TIMEOUT_S = 300
#: The environment variable holding the run's time dilation D (``hetsync-cluster run --dilation D`` sets it).
DILATION_ENV = "HETSYNC_DILATION"

#: where a launcher names the host it started a rank on, first match wins: horovodrun's Gloo mode, then
#: OpenMPI's PMIx (the name given in ``-H``/the hostfile).
HOST_ENVS = ("HOROVOD_HOSTNAME", "PMIX_HOSTNAME")

#: the environment variable that keeps TensorFlow's start-up lines and prints full tracebacks: ``1`` (also
#: ``true``, ``yes``, ``on``). The ``--verbose`` flag of the examples and of the training job sets it.
VERBOSE_ENV = "HETSYNC_VERBOSE"
#: what :func:`quiet_startup` puts in the environment, each variable only where it is unset: TensorFlow's
#: C++ log level 2 (errors only), which hides its INFO and WARNING lines (the CPU-instructions notice,
#: cuda and TensorRT notices, data-pipeline notes) and, with them, absl's "All log messages before
#: absl::InitializeLog() ..." line.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}

#: the environment variable that chooses what horovod's collectives run on under an MPI launch: ``mpi``
#: (the default: horovod on ``MPI.COMM_WORLD``) or ``gloo`` (horovod on Gloo, its rendezvous made through MPI;
#: mpi4py's point-to-point traffic stays on MPI). horovod's MPI controller spin-waits in a blocking
#: ``MPI_Allreduce`` every cycle; where ranks share too few cores and talk over TCP (the emulated multi-host
#: cluster on a small machine) those waits starved the ranks they waited for, for seconds at a time. Gloo's
#: waits block.
COLLECTIVES_ENV = rendezvous.COLLECTIVES_ENV
#: the values :data:`COLLECTIVES_ENV` may take.
COLLECTIVES = ("mpi", "gloo")
#: seconds (times the dilation D) each MPI exchange of the Gloo rendezvous may wait for the other ranks.
RENDEZVOUS_TIMEOUT_S = 120.0

_lock = threading.Lock()
_state = {"mode": None, "collectives": None, "rendezvous": None}
_shutdown_hooks = []


def _detect_mode():
    if os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE") or os.environ.get("PMIX_RANK"):
        return "mpi"
    if os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return "gloo"
    return "single"


def dilation():
    """The run's time dilation D (float >= 1): the environment variable ``HETSYNC_DILATION``, 1.0 when unset.

    Under dilation the emulated cluster runs D times slower than the cluster it stands for: emulated
    device times, added latencies and fault times are D times longer (:class:`hetsync.callbacks.Slowdown`),
    links are shaped to rate / D (``hetsync-cluster run --dilation D`` sets both), every timeout of a
    wait and every host-side idle wait (the point-to-point receive thread's sleep, RNA's round loop) is D
    times longer (:func:`dilated`), so a machine too small to keep up in real time still emulates the
    same cluster. Host-side Python's work is not dilated.

    Raises:
        ValueError: the variable holds something other than a finite number >= 1 (names the value).
    """
    text = os.environ.get(DILATION_ENV, "").strip()
    return parse_dilation(text, DILATION_ENV) if text else 1.0


def parse_dilation(text, source):
    """A time dilation D (float >= 1) from ``text`` (str), as :func:`dilation` reads it.

    Args:
        text: str, the value given. source: str naming where it came from in the error (an environment
            variable, a command-line option).

    Raises:
        ValueError: ``text`` is not a finite number >= 1 (names ``source`` and the value).
    """
    try:
        d = float(text)
    except ValueError:
        d = float("nan")
    if not 1.0 <= d < float("inf"):
        raise ValueError(f"{source}={text!r}: the time dilation must be a finite number >= 1")
    return d


def dilated(seconds):
    """``seconds`` (float >= 0) of the emulated cluster as wall seconds of this run: ``seconds`` x :func:`dilation`.

    Raises:
        ValueError: see :func:`dilation`.
    """
    return seconds * dilation()


def init(collective_timeout_s=None):
    """Initialise horovod (and mpi4py under an MPI launch). Idempotent.

    Also installs a ``sys.excepthook``: a process that dies of a non-finite stop
    (:class:`hetsync.errors.NonFiniteError`) prints hetsync's message as one line, without a traceback
    unless ``HETSYNC_VERBOSE=1``, and under an MPI launch its rank ends the whole job (exit status
    non-zero); other exceptions keep Python's handling.

    Args:
        collective_timeout_s: seconds (int > 0) after which a collective that some ranks never
            join makes horovod shut the job down with a stall error instead of hanging.
            Default :data:`COLLECTIVE_TIMEOUT_S`, multiplied by the time dilation (:func:`dilation`);
            the environment variable ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` wins if set.

    Returns:
        str: the launch mode, ``"mpi"``, ``"gloo"`` or ``"single"``.

    Raises:
        ValueError: ``collective_timeout_s`` is not a positive number; a bad ``HETSYNC_DILATION``.
        RuntimeError: horovod was built without MPI support while launched under MPI.
    """
    with _lock:
        if _state["mode"] is not None:
            return _state["mode"]
        timeout = COLLECTIVE_TIMEOUT_S if collective_timeout_s is None else collective_timeout_s
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"collective_timeout_s must be a positive number of seconds, got {timeout!r}")
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(int(dilated(timeout))))
        # the check period follows the shutdown time in effect: horovod never shuts down when the
        # check period is the longer one (an environment's shutdown time below 2 x our timeout did that)
        shutdown_s = int(float(os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]))
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(max(1, shutdown_s // 2)))
        mode = _detect_mode()
        import horovod.tensorflow as hvd

        if mode == "mpi":
            local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "0") or 0)
            if local > (os.cpu_count() or 1):
                # More ranks than cores (horovodrun's -H localhost:N hides this from OpenMPI): busy
                # polling would starve the ranks that compute; yield as `mpirun --oversubscribe` does.
                os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
            world = _init_mpi_world()
            # rank 0's choice, for every rank: mpirun forwards no variable to other hosts unless told (-x)
            chosen, hosts = _exchange_at_init(world, _chosen_collectives())
            if chosen == "gloo":
                if not hvd.gloo_built():
                    raise RuntimeError(f"{COLLECTIVES_ENV}=gloo but horovod was built without Gloo; rebuild horovod "
                                       "with HOROVOD_WITH_GLOO=1 (`make deps`) or unset the variable")
                _state["rendezvous"] = rendezvous.gloo_over_mpi(world, hosts, dilated(RENDEZVOUS_TIMEOUT_S))
                hvd.init()
            else:
                if not hvd.mpi_built():
                    raise RuntimeError("hetsync was launched under MPI but horovod was built without MPI; "
                                       "rebuild horovod with HOROVOD_WITH_MPI=1 (`make deps`).")
                hvd.init(comm=world)
            _state["collectives"] = chosen
        else:
            hvd.init()
            _state["collectives"] = mode if mode == "gloo" else None
        # a process that dies of a non-finite stop prints hetsync's one-line message; under MPI the
        # stopped rank ends the whole job (exit status non-zero)
        _install_excepthook(abort_job=mode == "mpi")
        _state["mode"] = mode
        return mode


def is_initialized():
    """Return True once :func:`init` has run in this process."""
    return _state["mode"] is not None


def _hvd():
    if _state["mode"] is None:
        raise RuntimeError("hetsync is not initialised: call hetsync.init() first")
    import horovod.tensorflow as hvd

    return hvd


def rank():
    """Return this process's rank (int in [0, size())). Raises RuntimeError before init()."""
    return _hvd().rank()


def size():
    """Return the world size, the number of ranks (int >= 1). Raises RuntimeError before init()."""
    return _hvd().size()


def local_rank():
    """Return the rank within this host (int). Raises RuntimeError before init()."""
    return _hvd().local_rank()


def local_size():
    """Return the number of ranks on this host (int). Raises RuntimeError before init()."""
    return _hvd().local_size()


def host_name():
    """The name of the host this rank was launched on, as the launch named it (``-H h0:2,h1:2`` gives
    ``"h0"`` or ``"h1"``): the first of :data:`HOST_ENVS` that is set, else ``socket.gethostname()``
    (a launch that names no host: one machine).

    Returns:
        str. Raises: nothing.
    """
    for var in HOST_ENVS:
        if os.environ.get(var):
            return os.environ[var]
    import socket

    return socket.gethostname()


def host_names():
    """Every rank's :func:`host_name`, by rank (list of ``size()`` str). Collective: every rank calls it.

    horovod's ``allgather_object`` (under MPI and Gloo alike), so a rank that never joins ends the job at
    horovod's stall shutdown (:data:`COLLECTIVE_TIMEOUT_S` x D) instead of hanging; in a single process
    ``[host_name()]``.

    Raises:
        RuntimeError: before :func:`init`.
    """
    mode = launch_mode()
    if mode is None:
        raise RuntimeError("hetsync.world.host_names: call hetsync.init() first")
    if mode == "single":
        return [host_name()]
    return [str(h) for h in _hvd().allgather_object(host_name(), name="hetsync_host_names")]


def launch_mode():
    """Return ``"mpi"``, ``"gloo"``, ``"single"``, or None before :func:`init`."""
    return _state["mode"]


def collectives():
    """What horovod's collectives run on: ``"mpi"``, ``"gloo"`` (``horovodrun --gloo``, or an MPI launch with
    ``HETSYNC_COLLECTIVES=gloo``), or None in a single process and before :func:`init`."""
    return _state["collectives"]


def mpi_enabled():
    """Return True when point-to-point traffic through mpi4py is available (MPI launch or one rank)."""
    return _state["mode"] in ("mpi", "single")


def require_mpi(what):
    """Raise a clear error if point-to-point MPI is not available.

    Args:
        what: str, the protocol or feature that needs MPI (named in the message).

    Raises:
        RuntimeError: launched under Gloo (``horovodrun --gloo``) or not initialised.
    """
    mode = _state["mode"]
    if mode is None:
        raise RuntimeError(f"{what} needs hetsync.init() to be called first")
    if mode == "gloo":
        raise RuntimeError(
            f"{what} needs MPI point-to-point messaging (mpi4py), but this job runs on Gloo; "
            "launch it with `horovodrun --mpi ...` or `mpirun ...`."
        )


def shutdown():
    """Shut the point-to-point dispatcher (counting what is in flight) and horovod down.

    Optional: both also shut down at exit.
    """
    if _state["mode"] is not None:
        with _lock:
            hooks = list(reversed(_shutdown_hooks))
        for fn in hooks:
            fn()
        _hvd().shutdown()
        server, _state["rendezvous"] = _state["rendezvous"], None
        if server is not None:
            server.stop()
        _state["mode"] = _state["collectives"] = None


def register_shutdown(fn):
    """Run ``fn()`` (no arguments) in :func:`shutdown`, before horovod shuts down; hooks run in the
    reverse order of registration. The point-to-point layer registers its counted shutdown here, so
    ``world`` imports no layer above it. Registering the same function twice runs it once.

    Args:
        fn: callable taking no arguments; its exceptions propagate out of :func:`shutdown`.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"register_shutdown takes a callable, got {fn!r}")
    with _lock:
        if fn not in _shutdown_hooks:
            _shutdown_hooks.append(fn)


# -- the MPI world under an MPI launch (mpi4py initialises it with thread support; horovod shares it) --

def _init_mpi_world():
    """Initialise MPI through mpi4py (thread level ``MPI_THREAD_MULTIPLE``) and return ``MPI.COMM_WORLD``.

    Idempotent: mpi4py initialises MPI at its first import only.

    Returns:
        ``mpi4py.MPI.Intracomm``, the world communicator, to hand to ``hvd.init(comm=...)``.

    Logs a warning (does not raise) when the MPI library grants a thread level below
    ``MPI_THREAD_MULTIPLE``: the dispatcher's receive thread would then be unsafe.

    Raises:
        ImportError: mpi4py is not installed (``make deps`` installs it).
    """
    from mpi4py import MPI  # initialises MPI with MPI_THREAD_MULTIPLE by default

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        log.warning("MPI provides thread level %d < MPI_THREAD_MULTIPLE; communication threads may be unsafe",
                    MPI.Query_thread())
    return MPI.COMM_WORLD


def _install_excepthook(abort_job, grace_s=1.0):
    """Report an uncaught non-finite stop in one line and, under MPI, end the whole job. Idempotent.

    Installs a ``sys.excepthook`` for exceptions that carry :data:`hetsync.errors.NONFINITE_MARK`
    (a :class:`hetsync.errors.NonFiniteError`, or TensorFlow's error of a compiled step that no hetsync
    callback translated): it prints hetsync's message (:meth:`NonFiniteError.from_exception`) as one
    line on stderr, no traceback; with :func:`is_verbose` it prints the full tracebacks instead
    (TensorFlow's error too, which the translation hid). Then, with ``abort_job`` in a world of more
    than one rank, it waits ``grace_s`` seconds (so that ranks stopping for the same reason print
    their own message first) and calls ``MPI_Abort(COMM_WORLD, 1)``: ``mpirun`` ends every rank and the
    job's exit status is non-zero. Without it, a rank that dies while a communication thread (RNA's
    rounds, the point-to-point dispatcher) is still running can hang in MPI's finalisation, and the
    other ranks wait for it. Other exceptions keep the previous hook's handling (Python's traceback).

    Args:
        abort_job: bool, end the MPI job (an MPI launch). grace_s: float seconds >= 0.
    """
    previous = sys.excepthook
    if getattr(previous, "hetsync_nonfinite", False):
        return

    def hook(exc_type, exc, tb):
        stop = NonFiniteError.from_exception(exc)
        if stop is None:
            previous(exc_type, exc, tb)
            return
        if is_verbose():
            exc.__suppress_context__ = False  # the translated TensorFlow error's traceback too
            previous(exc_type, exc, tb)
        else:
            sys.stderr.write(f"{stop}\n")
        if abort_job:
            import time

            from mpi4py import MPI

            if MPI.COMM_WORLD.Get_size() > 1:
                sys.stderr.flush()
                sys.stdout.flush()
                time.sleep(grace_s)
                MPI.COMM_WORLD.Abort(1)

    hook.hetsync_nonfinite = True
    sys.excepthook = hook


# -- quiet start-up: TensorFlow's start-up lines, unless verbose -------------------------------------

def is_verbose(environ=None):
    """True when :data:`VERBOSE_ENV` (``HETSYNC_VERBOSE``) asks for TensorFlow's start-up lines and full tracebacks.

    Args:
        environ: mapping of str to str to read (None: ``os.environ``).

    Returns:
        bool: the variable holds ``1``, ``true``, ``yes`` or ``on`` (any case).

    Raises:
        nothing.
    """
    value = (os.environ if environ is None else environ).get(VERBOSE_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def quiet_startup(verbose=False):
    """Hide TensorFlow's start-up lines in this process; call it before TensorFlow (or Keras) is imported.

    Importing hetsync changes no process-wide setting; this call is what the examples, the training job
    (``python -m hetsync.bench.job``) and the benchmark scripts make at their top. Unless verbose, it

    * sets each variable of :data:`QUIET_ENV` that is unset (``os.environ.setdefault``: a value the user
      set wins; launched processes inherit them): TensorFlow's C++ log level 2;
    * filters the first ``import tensorflow``'s output on stderr (file descriptor 2), because some lines
      are printed while TensorFlow's libraries load, before it applies the log level: oneDNN's "oneDNN
      custom operations are on ..." and absl's "All log messages before absl::InitializeLog() ..." line.
      Log lines below the level of ``TF_CPP_MIN_LOG_LEVEL`` (and the lines continuing them) are dropped,
      everything else is written to stderr once the import is done (all of it if the import fails).
      oneDNN itself is left as TensorFlow chose (``TF_ENABLE_ONEDNN_OPTS`` is not touched: numerics stay).
      Not installed when TensorFlow is already imported or the level is 0.

    Verbose (``verbose`` true, which sets ``HETSYNC_VERBOSE=1`` for this process and the processes it
    launches, or :func:`is_verbose`) changes nothing else: every line is printed, and an uncaught
    non-finite stop prints its full tracebacks.

    Args:
        verbose: bool, the script's ``--verbose`` flag.

    Returns:
        dict of str to str: the environment variables this call set (empty when verbose or already set).

    Raises:
        nothing.
    """
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    if is_verbose():
        return {}
    changed = {k: v for k, v in QUIET_ENV.items() if k not in os.environ}
    os.environ.update(changed)
    if ("tensorflow" not in sys.modules and _min_log_level() > 0
            and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path)):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
    return changed


def _min_log_level():
    """TensorFlow's C++ log level in this process's environment (int, 0 when unset or not a number)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") or 0)
    except ValueError:
        return 0


#: a C++ log line's start, TensorFlow's own format (``2024-01-01 12:00:00.000000: I path.cc:12] ``) or absl's
#: (``I0000 00:00:1700000000.000000   1234 path.cc:12] ``); the severity letter is group 1 or 2
_LOG_LINE = re.compile(r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) \S+:\d+\] "
                       r"|([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] )")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
#: lines that start Python's own output (a traceback, a warning), never the continuation of a log line
_PYTHON_LINE = re.compile(r"^(?:Traceback \(most recent call last\)|\S+:\d+: \w*(?:Warning|Error)\b)")


def _drop_startup_lines(text, min_level):
    """``text`` (captured stderr) without the log lines below ``min_level``, the lines continuing them (up to
    the next log line or Python output) and absl's preamble line (str)."""
    kept, dropping = [], False
    for line in text.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        match = _LOG_LINE.match(bare)
        if match:
            dropping = _SEVERITY[match.group(1) or match.group(2)] < min_level
        elif bare == _ABSL_PREAMBLE:
            continue
        elif not dropping or _PYTHON_LINE.match(bare):
            dropping = False
        if not dropping:
            kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def _startup_lines_filtered():
    """Capture file descriptor 2 in a temporary file; on exit write it back, less the start-up lines
    (:func:`_drop_startup_lines`; everything when the body raised)."""
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            data = (text if failed else _drop_startup_lines(text, _min_log_level())).encode("utf-8")
            while data:
                data = data[os.write(2, data):]


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, through the other finders, and has its loading filtered by
    :func:`_startup_lines_filtered` (installed by :func:`quiet_startup`; removes itself on first use)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _FilteredLoader(spec.loader)
        return spec


class _FilteredLoader(importlib.abc.Loader):
    """Runs a module's loader under :func:`_startup_lines_filtered`, then puts the real loader back on the module."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        try:
            with _startup_lines_filtered():
                self.loader.exec_module(module)
        finally:
            module.__loader__ = self.loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self.loader


def _chosen_collectives():
    value = os.environ.get(COLLECTIVES_ENV, "mpi").strip().lower() or "mpi"
    if value not in COLLECTIVES:
        raise ValueError(f"{COLLECTIVES_ENV}={os.environ[COLLECTIVES_ENV]!r}: allowed values are "
                         f"{', '.join(COLLECTIVES)} (what horovod's collectives run on under an MPI launch)")
    return value


def _exchange_at_init(comm, chosen):
    """One allgather at an MPI launch's start: every rank's :func:`host_name` and its :data:`COLLECTIVES_ENV`
    choice. Returns (rank 0's choice, the host names by rank); waits at most :data:`RENDEZVOUS_TIMEOUT_S` x D
    seconds."""
    import numpy as np

    width = 256
    mine = np.zeros(width, np.uint8)
    mine[0] = COLLECTIVES.index(chosen)
    name = host_name().encode()[:width - 1]
    mine[1:1 + len(name)] = np.frombuffer(name, np.uint8)
    table = np.zeros((comm.Get_size(), width), np.uint8)
    rendezvous.wait_mpi(comm.Iallgather(mine, table), "the host names' allgather", comm,
                        dilated(RENDEZVOUS_TIMEOUT_S))
    choice = COLLECTIVES[int(table[0, 0])]
    if choice != chosen:
        log.info("hetsync rank %d: horovod's collectives on %s, rank 0's choice (%s=%s here)", comm.Get_rank(),
                 choice, COLLECTIVES_ENV, chosen)
    return choice, [bytes(row[1:]).rstrip(b"\0").decode() for row in table]
