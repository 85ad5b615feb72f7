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
