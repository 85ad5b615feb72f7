"""The MPI world under an MPI launch: initialised by mpi4py with ``MPI_THREAD_MULTIPLE``, then shared with horovod.

:func:`hetsync.runtime.init` calls :func:`init_world` once before ``hvd.init(comm=...)``, so that
horovod's collectives and the point-to-point :class:`~hetsync.transport.p2p.Dispatcher` (which
duplicates the same world) run in one MPI process with thread support. Kept in ``transport`` so
that no module outside this package imports mpi4py.
"""
import logging

log = logging.getLogger("hetsync.transport")


def init_world():
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


def abort_job_on(marker, grace_s=1.0):
    """End the whole MPI job when this rank dies of an uncaught exception whose text contains ``marker``.

    Installs a ``sys.excepthook`` that prints the traceback as usual, waits ``grace_s`` seconds (so
    that ranks stopping for the same reason print their own error first), then calls
    ``MPI_Abort(COMM_WORLD, 1)``: ``mpirun`` ends every rank and the job's exit status is non-zero.
    Without it, a rank that dies while a communication thread (RNA's rounds, the point-to-point
    dispatcher) is still running can hang in MPI's finalisation, and the other ranks wait for it.
    Used for the non-finite stop (issue 15; :data:`hetsync.protocols.base.NONFINITE_MARK`); other
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
