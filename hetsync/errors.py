"""Every exception hetsync raises, in one place.

Each class derives from :class:`HetsyncError` and from the built-in exception a caller would expect
(``ValueError`` for bad data, ``RuntimeError`` for a failed protocol, ``TimeoutError`` for a wait that
gave up, ...), so ``except RuntimeError`` and ``except hetsync.errors.HetsyncError`` both work. The
messages name the rank, the peer, the wait and the value involved; the troubleshooting page of the
documentation says, class by class, what each one means and what to do.

Bad arguments are refused with the built-in ``ValueError`` / ``TypeError`` before any training
starts (their messages name the value and what is allowed); the classes here are for failures
during a run.
"""

__all__ = [
    "HetsyncError", "NONFINITE_MARK", "NonFiniteError", "OpLibraryError", "TransportError", "TransportTimeout",
    "DataError", "PoolError", "RNAError", "RNAHError", "HopError", "PSError", "SoloError", "ClusterError",
]

#: the text every non-finite stop's message starts with (in the compiled step it is inside
#: TensorFlow's ``InvalidArgumentError`` message; eagerly it is a :class:`NonFiniteError`). An MPI
#: launch ends the whole job when a rank dies of an exception carrying it.
NONFINITE_MARK = "hetsync non-finite stop"


class HetsyncError(Exception):
    """Base class of every exception hetsync raises during a run."""


class NonFiniteError(HetsyncError, FloatingPointError):
    """A non-finite value (NaN or inf) stopped training before it left this rank.

    Raised eagerly (between steps, at train end, by a communication thread); the same stop inside
    the compiled step is TensorFlow's ``InvalidArgumentError`` with the same message, starting with
    :data:`NONFINITE_MARK` and naming the rank(s), the step and the protocol. The held-back values
    are counted in the ``nonfinite_dropped`` statistic.
    """


class OpLibraryError(HetsyncError, ImportError):
    """The compiled op library is missing, was built for another TensorFlow, or failed to load
    (the message names the file and the command that rebuilds it: ``make build``)."""


class TransportError(HetsyncError, RuntimeError):
    """The point-to-point layer cannot be used: its receive thread failed, or it was shut down."""


class TransportTimeout(HetsyncError, TimeoutError):
    """A point-to-point wait exceeded its timeout; the message names the rank, the peer(s) and the channel.

    Args:
        message: str. pending: iterable of ``(peer, channel, tag)`` tuples still outstanding.

    Attributes:
        pending: list of ``(peer, channel, tag)`` tuples still outstanding when the wait gave up
            (sends not completed for a flush, peers whose end marker did not arrive for a drain,
            the awaited sender for a receive).
    """

    def __init__(self, message, pending=()):
        super().__init__(message)
        self.pending = list(pending)


class DataError(HetsyncError, ValueError):
    """A data file is missing, truncated or not in the expected format (the message names it)."""


class PoolError(HetsyncError, RuntimeError):
    """The sample pool failed: no reply from the pool server in time, or an inconsistent request."""


class RNAError(HetsyncError, RuntimeError):
    """RNA's communication failed or timed out (the message says which wait, on which rank)."""


class RNAHError(HetsyncError, RuntimeError):
    """Hierarchical RNA failed: a group member, an initiator or a server did not answer within
    ``timeout_s``, or a server failed (the message says which wait, on which rank)."""


class HopError(HetsyncError, RuntimeError):
    """Hop's communication failed or timed out on some rank (the message names the rank and the wait)."""


class PSError(HetsyncError, RuntimeError):
    """A parameter-server protocol failed: a server or worker did not answer in time, or a message was bad."""


class SoloError(HetsyncError, RuntimeError):
    """A benchmark's solo-speed measurement failed (the message carries the command and its output)."""


class ClusterError(HetsyncError, RuntimeError):
    """The emulated multi-host cluster could not be brought up or torn down: a missing capability
    (CAP_NET_ADMIN, CAP_SYS_ADMIN), a command of ``ip``/``tc`` that failed, or a latency method this
    kernel lacks (the message names the command and its output)."""
