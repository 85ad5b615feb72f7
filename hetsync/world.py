"""Process-level set-up: horovod on the MPI world shared with mpi4py, or on Gloo, or alone.

``hetsync.init()`` decides how the job was launched:

* ``horovodrun --mpi`` / ``mpirun`` (OpenMPI's ``OMPI_COMM_WORLD_SIZE`` is set): mpi4py
  initialises MPI with ``MPI_THREAD_MULTIPLE`` and horovod is initialised on
  ``MPI.COMM_WORLD``, so point-to-point traffic (mpi4py) and collectives (horovod) share one
  world. Every protocol is available.
* ``horovodrun --gloo`` (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` is set): horovod on Gloo; only
  collectives-only protocols (BSP, task allocation, SelSync, ...) are available.
* a plain ``python script.py``: a world of one rank.
"""
import logging
import os
import threading

from hetsync.errors import NONFINITE_MARK

log = logging.getLogger("hetsync")

__all__ = [
    "init", "is_initialized", "rank", "size", "local_rank", "local_size", "mpi_enabled",
    "launch_mode", "shutdown", "require_mpi", "COLLECTIVE_TIMEOUT_S",
    "register_shutdown", "dilation", "dilated", "DILATION_ENV", "host_name", "host_names", "HOST_ENVS",
]


#: Seconds after which a stalled horovod collective aborts the job (horovod's stall shutdown).
COLLECTIVE_TIMEOUT_S = 300
#: The environment variable holding the run's time dilation D (``hetsync-cluster run --dilation D`` sets it).
DILATION_ENV = "HETSYNC_DILATION"

#: where a launcher names the host it started a rank on, first match wins: horovodrun's Gloo mode, then
#: OpenMPI's PMIx (the name given in ``-H``/the hostfile).
HOST_ENVS = ("HOROVOD_HOSTNAME", "PMIX_HOSTNAME")

_lock = threading.Lock()
_state = {"mode": None}
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
    if not text:
        return 1.0
    try:
        d = float(text)
    except ValueError:
        d = float("nan")
    if not 1.0 <= d < float("inf"):
        raise ValueError(f"{DILATION_ENV}={text!r}: the time dilation must be a finite number >= 1")
    return d


def dilated(seconds):
    """``seconds`` (float >= 0) of the emulated cluster as wall seconds of this run: ``seconds`` x :func:`dilation`.

    Raises:
        ValueError: see :func:`dilation`.
    """
    return seconds * dilation()


def init(collective_timeout_s=None):
    """Initialise horovod (and mpi4py under an MPI launch). Idempotent.

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
            if not hvd.mpi_built():
                raise RuntimeError("hetsync was launched under MPI but horovod was built without MPI; "
                                   "rebuild horovod with HOROVOD_WITH_MPI=1 (`make deps`).")
            hvd.init(comm=world)
            # a rank stopped by a non-finite value ends the job (exit status non-zero)
            _abort_job_on(NONFINITE_MARK)
        else:
            hvd.init()
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
        _state["mode"] = None


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


def _abort_job_on(marker, grace_s=1.0):
    """End the whole MPI job when this rank dies of an uncaught exception whose text contains ``marker``.

    Installs a ``sys.excepthook`` that prints the traceback as usual, waits ``grace_s`` seconds (so
    that ranks stopping for the same reason print their own error first), then calls
    ``MPI_Abort(COMM_WORLD, 1)``: ``mpirun`` ends every rank and the job's exit status is non-zero.
    Without it, a rank that dies while a communication thread (RNA's rounds, the point-to-point
    dispatcher) is still running can hang in MPI's finalisation, and the other ranks wait for it.
    Used for the non-finite stop (:data:`hetsync.errors.NONFINITE_MARK`); other
    exceptions keep Python's default handling. Idempotent per marker.

    Args:
        marker: str looked for in ``str(exception)``. grace_s: float seconds >= 0.
    """
    import sys
    import time

    from mpi4py import MPI

    previous = sys.excepthook
    if marker in getattr(previous, "hetsync_markers", ()):
        return

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        if marker in str(exc) and MPI.COMM_WORLD.Get_size() > 1:
            sys.stderr.flush()
            sys.stdout.flush()
            time.sleep(grace_s)
            MPI.COMM_WORLD.Abort(1)

    hook.hetsync_markers = tuple(getattr(previous, "hetsync_markers", ())) + (marker,)
    sys.excepthook = hook
