"""SSP: stale synchronous parallel training on parameter servers (Ho et al. 2013; SelSync's SSP baseline).

``docs/protocols/ssp.md``: every worker p has a clock, its completed iterations; a worker may start
iteration c only when the slowest clock is at least c - s. SelSync's baseline keeps the model on a
parameter server that applies every pushed gradient at once with the same learning rate (no averaging)
and workers read the whole model atomically (the design notes' recommended default).

Here one round trip per iteration carries both the push and the pull: worker p computes its gradient
on the model it last pulled, pushes it tagged with its iteration t (the server applies
w <- w - eta g and sets clock_p = t + 1) and waits for the reply, which the server holds back until
min over unfinished workers of clock_q >= t + 1 - s (the gate of iteration t + 1), then sends the model
as it is at that moment. So every iteration starts behind the gate, the read contains every update of
iterations <= t - s of every worker and all of p's own (read-my-writes), and:

* s = 0 is BSP: all replies of round t leave when the last worker's push of round t is applied, each with
  exactly the updates of rounds <= t; the gradients are summed at the server (eta per gradient), so SSP
  with learning rate eta matches BSP (averaged gradients) with learning rate n x eta;
* a very large s never holds a reply back: ASP.

A finished worker's clock no longer holds anyone back. The worker takes no local step (alpha = 1: it
continues from the pulled model). Statistics: the gate's largest lead t + 1 - min clock at a reply
(always <= s), the replies held back, the lead histogram per server, and what every PS protocol reports.
"""
import dataclasses
import typing

from hetsync.core.config import param
from hetsync.protocols.ps.worker import PSConfig, PSProtocol
from hetsync.core.wrapper import protocol_wrapper

__all__ = ["SSP", "SSPProtocol", "SSPConfig"]


@dataclasses.dataclass(frozen=True)
class SSPConfig(PSConfig):
    """SSP's parameters (see :func:`SSP`)."""

    owner: typing.ClassVar[str] = "SSP"

    staleness: int = param(3, "int s >= 0, the staleness bound in iterations: a worker starts iteration c only when "
                              "the slowest unfinished worker has completed at least c - s (0: BSP; very large: ASP).",
                           label="staleness s", ge=0, unit="iterations")


class SSPProtocol(PSProtocol):
    """SSP: clocks per worker and a start gate at the servers (see :func:`SSP`)."""

    name = "ssp"
    display_name = "SSP"
    Config = SSPConfig
    local_step = False  # the worker continues from the pulled model

    @property
    def staleness_bound(self):
        """The configured staleness s (int)."""
        return self.cfg.staleness

    def alpha(self, c):
        """Always ``(1.0, False)``: the pulled model replaces the local one."""
        return 1.0, False


SSP = protocol_wrapper(SSPProtocol, """Wrap a Keras 3 optimizer for stale synchronous parallel training on parameter servers (SSP).

    Each worker pushes its gradient (computed on the model it last pulled) and continues from the model
    the servers return, which they hold back until the slowest unfinished worker is at most ``staleness``
    iterations behind: a worker starts iteration c only when min clock >= c - s. The servers apply every
    gradient at once with the worker's learning rate (summed, not averaged: s = 0 equals BSP with n times
    the learning rate). Launch with K more ranks than workers (``servers=K``, the last K ranks serve); the
    script is unchanged. Needs an MPI launch and :func:`hetsync.callbacks.standard`; float32 parameters.
    The summary adds the gate's largest lead (<= s), replies held back and the lead histogram per server.

    Args:
        optimizer: a Keras 3 optimizer instance (its learning rate is used by the servers).
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``SSP_<optimizer class>``).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument.
        ValueError: staleness not an int >= 0, servers leaving no worker, or (at train begin) more servers than
            parameters.
        RuntimeError: hetsync not initialised, or launched under Gloo.
        hetsync.protocols.ps.worker.PSError: (during training) a server or worker silent for ``timeout_s``.
    """)
