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
import os
import threading

__all__ = [
    "init", "is_initialized", "rank", "size", "local_rank", "local_size", "mpi_enabled",
    "launch_mode", "shutdown", "require_mpi", "COLLECTIVE_TIMEOUT_S",
    "set_servers", "num_servers", "num_workers", "is_server", "worker_rank", "role",
]


#: Seconds after which a stalled horovod collective aborts the job (horovod's stall shutdown).
COLLECTIVE_TIMEOUT_S = 300

_lock = threading.Lock()
_state = {"mode": None, "servers": 0}


def _detect_mode():
    if os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE") or os.environ.get("PMIX_RANK"):
        return "mpi"
    if os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return "gloo"
    return "single"


def init(collective_timeout_s=None):
    """Initialise horovod (and mpi4py under an MPI launch). Idempotent.

    Args:
        collective_timeout_s: seconds (int > 0) after which a collective that some ranks never
            join makes horovod shut the job down with a stall error instead of hanging.
            Default :data:`COLLECTIVE_TIMEOUT_S`; the environment variable
            ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` wins if set.

    Returns:
        str: the launch mode, ``"mpi"``, ``"gloo"`` or ``"single"``.

    Raises:
        ValueError: ``collective_timeout_s`` is not a positive number.
        RuntimeError: horovod was built without MPI support while launched under MPI.
    """
    with _lock:
        if _state["mode"] is not None:
            return _state["mode"]
        timeout = COLLECTIVE_TIMEOUT_S if collective_timeout_s is None else collective_timeout_s
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"collective_timeout_s must be a positive number of seconds, got {timeout!r}")
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(int(timeout)))
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
            from .transport import mpi_world

            world = mpi_world.init_world()
            if not hvd.mpi_built():
                raise RuntimeError("hetsync was launched under MPI but horovod was built without MPI; "
                                   "rebuild horovod with HOROVOD_WITH_MPI=1 (`make deps`).")
            hvd.init(comm=world)
            # a rank stopped by a non-finite value ends the job (exit status non-zero), issue 15
            mpi_world.abort_job_on("hetsync non-finite stop")
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


def set_servers(k):
    """Make the last ``k`` ranks of the launch parameter servers (the rest are workers).

    Called by a parameter-server protocol when its optimizer is wrapped (``servers=K``), and with
    0 by every other protocol, so the roles always follow the most recently wrapped optimizer.

    Args:
        k: int in [0, size() - 1], the number of server ranks.

    Raises:
        ValueError: ``k`` is not an int, is negative, or leaves no worker (k >= size()).
        RuntimeError: before :func:`init`.
    """
    n = size()
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"servers must be an int >= 0, got {k!r}")
    if k >= n:
        raise ValueError(f"servers={k} leaves no worker: the launch has {n} rank(s) and the last {k} would all serve "
                         f"parameters; launch at least {k + 1} ranks or use servers <= {n - 1}")
    _state["servers"] = k


def num_servers():
    """Return the number K of parameter-server ranks (int >= 0; the last K ranks of the launch)."""
    return _state["servers"]


def num_workers():
    """Return the number n of worker ranks, the ranks that train (int >= 1): size() - num_servers().

    Raises:
        RuntimeError: before :func:`init`.
    """
    return size() - _state["servers"]


def is_server():
    """Return True if this rank serves parameters instead of training (it is one of the last K ranks)."""
    return rank() >= num_workers()


def worker_rank():
    """Return this rank's index among the workers (int in [0, num_workers())), or None on a server rank.

    Workers are ranks 0 .. n - 1, so a worker's index equals its rank."""
    return None if is_server() else rank()


def role():
    """Return ``"server"`` or ``"worker"`` (this rank's role under the current protocol)."""
    return "server" if is_server() else "worker"


def shutdown():
    """Shut the point-to-point dispatcher (counting what is in flight) and horovod down.

    Optional: both also shut down at exit.
    """
    if _state["mode"] is not None:
        from . import transport

        transport.shutdown()
        _hvd().shutdown()
        _state["mode"] = None
