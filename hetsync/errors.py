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
import re

__all__ = [
    "HetsyncError", "NONFINITE_MARK", "NonFiniteError", "OpLibraryError", "TransportError", "TransportTimeout",
    "DataError", "PoolError", "RNAError", "RNAHError", "HopError", "PSError", "SoloError", "ClusterError",
]

#: the text every non-finite stop's message starts with. Inside the compiled step the stop is raised
#: by an assert op, so TensorFlow's ``InvalidArgumentError`` carries it; hetsync's callbacks re-raise
#: that as a :class:`NonFiniteError` with the clean message (:meth:`NonFiniteError.from_exception`).
#: An MPI launch ends the whole job when a rank dies of an exception carrying it.
NONFINITE_MARK = "hetsync non-finite stop"


class HetsyncError(Exception):
    """Base class of every exception hetsync raises during a run."""


class NonFiniteError(HetsyncError, FloatingPointError):
    """A non-finite value (NaN or inf) stopped training before it left this rank.

    ``model.fit`` raises it (``except hetsync.errors.NonFiniteError`` works in a script): eagerly
    (between steps, at train end, by a communication thread, for a non-finite loss), and for the
    stop inside the compiled step too, where TensorFlow raises an ``InvalidArgumentError`` that
    :class:`hetsync.callbacks.ProtocolHooks` re-raises as this class with the clean message
    (``from None``: TensorFlow's error stays in ``__context__``). The message starts with
    :data:`NONFINITE_MARK` and names the rank(s), the step and the protocol. The held-back values are
    counted in the ``nonfinite_dropped`` statistic.

    When a process dies of it after :func:`hetsync.init`, it prints this message as one line (no
    traceback; ``HETSYNC_VERBOSE=1`` prints the full tracebacks, TensorFlow's included) and, under an
    MPI launch of more than one rank, ends the whole job with a non-zero exit status.
    """

    @classmethod
    def from_exception(cls, exc):
        """hetsync's non-finite stop carried by another exception, as a :class:`NonFiniteError`.

        Takes the message from TensorFlow's wrapping of an assert op's data: the compiled step's
        ``"assertion failed: [MESSAGE]"`` followed by graph-node lines, or an eager assert's
        ``"Summarized data: b'MESSAGE'"``; the message runs from :data:`NONFINITE_MARK` to the end
        of its line, with the wrapping's closing bracket or quote and its escapes removed.

        Args:
            exc: BaseException (typically ``tf.errors.InvalidArgumentError``).

        Returns:
            ``exc`` itself if it is a :class:`NonFiniteError`; a new :class:`NonFiniteError` whose
            message starts with :data:`NONFINITE_MARK` if ``str(exc)`` contains it; else None.

        Raises:
            nothing.
        """
        if isinstance(exc, cls):
            return exc
        text = str(exc)
        start = text.find(NONFINITE_MARK)
        if start < 0:
            return None
        message, before = text[start:].split("\n", 1)[0].rstrip(), text[:start]
        for opening, closing in (("[", "]"), ("b'", "'"), ('b"', '"')):
            if before.endswith(opening) and message.endswith(closing):
                message = message[:-len(closing)]
                break
        # the assert op's printing (C-style) and Python's bytes repr escape quotes and backslashes
        message = re.sub(r"\\([\\'\"])", r"\1", message)
        return cls(message)


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
