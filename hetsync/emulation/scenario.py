"""Heterogeneity injection: the papers' straggler scenarios.

A scenario is a spec string, several joined with ``+``:

=========================  ==========================================================================
``none``                   no injection
``random:K``               each step, each rank is K times slower with probability 1/n (Hop: K = 6)
``deterministic:R:K``      rank R is always K times slower (Hop: K = 4; SHAT: 2, 10, 100)
``uniform:A:B``            each step, each rank waits an extra delay drawn uniformly in [A, B] ms
                           (RNA section 8: 0-50 ms)
``speeds:S0,S1,...``       fixed per-rank speed factors, one per rank; rank i is max(S)/S_i times
                           slower (task allocation: speeds:1,1,1,0.5)
``netdelay:MS``            extra latency of MS milliseconds on every synchronization (slow network)
``device:MS``              emulated accelerator: a step of the run's per-rank batch size b takes MS
                           milliseconds on the reference device (MS x samples / b for a step of
                           another size); the other parts scale it (see below)
``PART@RANKS``             ``PART`` (``random``, ``deterministic``, ``uniform`` or ``speeds``) applies to
                           the listed ranks only, e.g. ``uniform:0:50@0,1+uniform:50:100@2-3`` (RNA's
                           mixed heterogeneity, section 8.1: half the ranks 0-50 ms, half 50-100 ms);
                           RANKS is a comma-separated list of ranks and ``A-B`` ranges
``pause:RANK:AT_S:FOR_S``  fault: AT_S seconds after its train begin, rank RANK's whole process is
                           stopped (SIGSTOP: every thread, as a paused VM or ``kill -STOP``) and
                           continued (SIGCONT) FOR_S seconds later by a detached watcher process
``stall:RANK:AT_S:FOR_S``  fault: at AT_S s only rank RANK's training thread sleeps FOR_S seconds;
                           its background threads (point-to-point receiver, RNA's control thread,
                           parameter-server threads) keep running: a stalled or preempted device
``kill:RANK:AT_S``         fault: rank RANK's process kills itself (SIGKILL) AT_S seconds after its
                           train begin: a dead peer
=========================  ==========================================================================

Faults are checked at each train batch begin of the named rank (a parameter-server
rank, which serves inside its train begin, arms a timer instead; ``stall`` cannot target it), fire
once per process (not again in a later ``fit``), are recorded (:func:`fired_faults`, the
``faults`` of :class:`hetsync.callbacks.SyncMetrics`' summary and step records) and take no part
in the per-step ``(factor, extra_ms)`` draws, so adding a fault leaves the seeded draws of the
other parts unchanged. RANK is an int in [0, world size), AT_S >= 0 and FOR_S > 0 finite seconds;
``@RANKS`` does not apply to faults (they name their rank).

Without ``device``, "K times slower" means the step takes K times its measured compute time: the
compiled delay op (:func:`hetsync.ops.delay`) holds the gradients back for (K - 1) x the compute
time measured since the step began. Combined specs multiply their factors and add their extra
milliseconds.

With ``device:MS`` (the *emulated cluster*) every step is padded, from its start to its gradients
being ready, to exactly K x MS x samples / b + extra milliseconds of wall time, whatever the real
compute took: the real math still runs inside, but the step's duration is the emulated device's,
as on a cluster where each rank computes on its own accelerator while the host CPU is free for
communication. ``random``, ``deterministic``, ``speeds`` and ``uniform`` keep their meaning
relative to the device time; ``netdelay`` still adds its latency to every synchronization. A step
whose real compute exceeds its emulated time is not shortened: it is an *overrun*, counted per rank
(:class:`hetsync.callbacks.SyncMetrics`); more than 1% overrun steps make the emulation invalid for
that run (a warning on rank 0; the benchmark marks the row). The emulation models per-rank devices
and their speeds, not host-side compute outside the step, memory or network bandwidth.
Draws are seeded per rank (``numpy.random.default_rng([seed, rank])``) and so reproducible.

The process-wide control variables read by every wrapped optimizer live here, so the delay op is
always part of the compiled step (with factor 1 and 0 ms it completes at once) and the
:class:`hetsync.callbacks.Slowdown` callback only assigns them.
"""
import dataclasses
import logging
import math

import numpy as np

from hetsync.emulation.components import (DeterministicSlowdown, Device, NetDelay, OnRanks,
                                          RandomSlowdown, Speeds, UniformDelay)
from hetsync.emulation.faults import FAULT_ARITY, Fault

__all__ = ["Scenario", "parse_spec", "MAX_RANKS"]

log = logging.getLogger("hetsync")


def _applies(c, rank):
    """The component acting on ``rank``: ``c`` itself, the inner part of an OnRanks that lists it, or None."""
    if isinstance(c, OnRanks):
        return c.part if rank in c.ranks else None
    return c


def _num(text, what, spec, minimum=None, integer=False, positive=False):
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"slowdown spec {spec!r}: {what} must be {kind}, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"slowdown spec {spec!r}: {what} must be a finite number, got {text!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"slowdown spec {spec!r}: {what} must be >= {minimum}, got {text!r}")
    if positive and not value > 0:
        raise ValueError(f"slowdown spec {spec!r}: {what} must be > 0, got {text!r}")
    return value


_USAGE = ("allowed: none, random:K, deterministic:RANK:K, uniform:A_MS:B_MS, speeds:S0,S1,..., "
          "netdelay:MS, device:MS, faults pause:RANK:AT_S:FOR_S, stall:RANK:AT_S:FOR_S, kill:RANK:AT_S, joined "
          "with '+'; PART@RANKS (e.g. uniform:0:50@0,1 or @2-3) restricts "
          "random, deterministic, uniform or speeds to some ranks")


#: ranks named after ``@`` must be below this (a guard against expanding ``0-10000000000`` into a list).
MAX_RANKS = 1 << 20


def _parse_ranks(text, part):
    """Parse the RANKS of ``PART@RANKS`` (``"0,1"``, ``"2-3"``, ``"0,4-5"``) into a sorted tuple of distinct ints."""
    ranks = []
    for item in text.split(","):
        item = item.strip()
        lo, dash, hi = item.partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise ValueError(f"slowdown spec {part!r}: RANKS after '@' must be ranks or A-B ranges separated by "
                             f"commas, got {item!r}") from None
        if a < 0 or b < a:
            raise ValueError(f"slowdown spec {part!r}: bad rank range {item!r} (need 0 <= A <= B)")
        if b >= MAX_RANKS:
            raise ValueError(f"slowdown spec {part!r}: rank {b} in {item!r} is too large (allowed: ranks below "
                             f"{MAX_RANKS})")
        ranks.extend(range(a, b + 1))
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"slowdown spec {part!r}: a rank is listed twice after '@'")
    return tuple(sorted(ranks))


def _parse_one(part):
    if "@" in part:
        inner, _, ranks = part.rpartition("@")
        if not inner.strip():
            raise ValueError(f"slowdown spec {part!r}: nothing before '@'; {_USAGE}")
        try:
            component = _parse_one(inner.strip())
        except ValueError as exc:
            raise ValueError(f"in slowdown spec part {part!r}: {exc}") from None
        if isinstance(component, Fault):
            raise ValueError(f"slowdown spec {part!r}: a fault names its rank itself ({component.kind}:RANK:...); "
                             f"'@RANKS' is not allowed on faults (give one fault part per rank)")
        if isinstance(component, (Device, NetDelay, OnRanks)):
            raise ValueError(f"slowdown spec {part!r}: only random, deterministic, uniform and speeds can be "
                             f"restricted to ranks with '@' (device and netdelay act on the whole launch)")
        return OnRanks(component, _parse_ranks(ranks, part))
    name, _, rest = part.partition(":")
    args = rest.split(":") if rest else []
    arity = {"random": 1, "deterministic": 2, "uniform": 2, "speeds": 1, "netdelay": 1, "device": 1, **FAULT_ARITY}
    if name not in arity:
        raise ValueError(f"unknown slowdown scenario {name!r} in {part!r}; {_USAGE}")
    if len(args) != arity[name]:
        raise ValueError(f"slowdown spec {part!r} takes {arity[name]} argument(s) after '{name}:', "
                         f"got {len(args)}; {_USAGE}")
    if name in FAULT_ARITY:
        rank = _num(args[0], "RANK", part, minimum=0, integer=True)
        at_s = _num(args[1], "AT_S (seconds after train begin)", part, minimum=0)
        for_s = _num(args[2], "FOR_S (seconds)", part, positive=True) if name != "kill" else None
        return Fault(name, rank, at_s, for_s)
    if name == "random":
        return RandomSlowdown(_num(args[0], "K", part, minimum=1))
    if name == "deterministic":
        return DeterministicSlowdown(_num(args[0], "RANK", part, minimum=0, integer=True),
                                     _num(args[1], "K", part, minimum=1))
    if name == "uniform":
        low, high = _num(args[0], "A", part, minimum=0), _num(args[1], "B", part, minimum=0)
        if high < low:
            raise ValueError(f"slowdown spec {part!r}: need A <= B milliseconds, got A={low:g} > B={high:g}")
        return UniformDelay(low, high)
    if name == "speeds":
        speeds = tuple(_num(s, "each speed", part) for s in args[0].split(","))
        if any(s <= 0 for s in speeds):
            raise ValueError(f"slowdown spec {part!r}: speeds must be > 0, got {args[0]!r}")
        return Speeds(speeds)
    if name == "device":
        ms = _num(args[0], "MS (milliseconds per step of the run's batch size)", part)
        if ms <= 0:
            raise ValueError(f"slowdown spec {part!r}: MS (milliseconds per step of the run's batch size) must "
                             f"be > 0, got {args[0]!r}")
        return Device(ms)
    return NetDelay(_num(args[0], "MS", part, minimum=0))


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A parsed slowdown spec: a tuple of components whose effects combine.

    Attributes:
        spec: str, the normalised spec string ("none" if empty).
        components: tuple of RandomSlowdown / DeterministicSlowdown / UniformDelay / Speeds / NetDelay /
            Device / OnRanks.
    """

    spec: str
    components: tuple

    @property
    def device_ms(self):
        """Emulated device time in milliseconds per step of the run's batch size (float), or None
        without a ``device`` part."""
        ms = [c.ms for c in self.components if isinstance(c, Device)]
        return ms[0] if ms else None

    def expected_extra_ms(self, rank, world_size):
        """Mean additive delay of ``rank`` in milliseconds per step (sum of the means of the ``uniform`` parts
        acting on ``rank``)."""
        del world_size
        parts = [_applies(c, rank) for c in self.components]
        return float(sum((c.low_ms + c.high_ms) / 2 for c in parts if isinstance(c, UniformDelay)))

    def expected_step_ms(self, rank, world_size, samples=1, batch_size=1):
        """Expected emulated duration of one step of ``rank`` in milliseconds (``device`` scenarios only).

        E[K] x MS x samples / batch_size + E[extra]: the analytic solo speed of the rank is
        samples / this (the factor and the additive delays are drawn independently).

        Args:
            rank, world_size: ints. samples, batch_size: the step's samples and the run's per-rank
                batch size b (the reference of MS); their ratio scales the device time.

        Raises:
            ValueError: the scenario has no ``device`` part.
        """
        if self.device_ms is None:
            raise ValueError(f"scenario {self.spec!r} has no device:MS part: its step time is the real compute time")
        return (self.expected_factor(rank, world_size) * self.device_ms * samples / batch_size
                + self.expected_extra_ms(rank, world_size))

    @property
    def sync_latency_ms(self):
        """Extra latency in milliseconds added to every synchronization (sum of ``netdelay`` parts)."""
        return float(sum(c.ms for c in self.components if isinstance(c, NetDelay)))

    def faults(self, rank=None):
        """The fault parts (tuple of :class:`Fault`), all or only those hitting ``rank`` (int)."""
        return tuple(c for c in self.components if isinstance(c, Fault) and (rank is None or c.rank == rank))

    def validate(self, world_size):
        """Check the scenario against the world size.

        Raises:
            ValueError: a ``deterministic`` or fault rank outside [0, world_size) or a ``speeds`` list whose
                length differs from world_size.
        """
        if sum(isinstance(c, Device) for c in self.components) > 1:
            raise ValueError(f"slowdown spec {self.spec!r} has more than one device:MS part; give one")
        for c in self.components:
            if hasattr(c, "validate"):
                c.validate(world_size)

    def rng(self, seed, rank):
        """Return the per-rank ``numpy.random.Generator`` seeded with ``[seed, rank]``."""
        return np.random.default_rng([int(seed), int(rank)])

    def draw(self, rng, rank, world_size):
        """Draw one step's injection for ``rank``.

        Returns:
            ``(factor, extra_ms)``: float factor K >= 1 (product over components) and float extra
            delay in milliseconds (sum over components).
        """
        factor, extra = 1.0, 0.0
        for c in self.components:
            f, e = c.draw(rng, rank, world_size)
            factor *= f
            extra += e
        return factor, extra

    def expected_factor(self, rank, world_size):
        """Mean slowdown factor of ``rank`` ignoring additive delays (used for reporting)."""
        factor = 1.0
        for c in self.components:
            c = _applies(c, rank)
            if isinstance(c, RandomSlowdown):
                factor *= 1.0 + (c.k - 1.0) / world_size
            elif isinstance(c, (DeterministicSlowdown, Speeds)):
                factor *= c.draw(None, rank, world_size)[0]
        return factor


def parse_spec(spec):
    """Parse a slowdown spec string such as ``"random:6"`` or ``"speeds:1,1,1,0.5+netdelay:50"``.

    Args:
        spec: str (or None / "" / "none" for no injection).

    Returns:
        Scenario.

    Raises:
        ValueError: unknown scenario name, wrong number of arguments, or a value out of range;
            the message names the bad part and lists what is allowed.
    """
    if spec is None:
        spec = "none"
    if not isinstance(spec, str):
        raise TypeError(f"slowdown spec must be a string, got {type(spec).__name__}: {spec!r}")
    text = spec.strip()
    if text in ("", "none"):
        return Scenario("none", ())
    parts = [p.strip() for p in text.split("+")]
    if any(not p for p in parts):
        raise ValueError(f"slowdown spec {spec!r} has an empty part; {_USAGE}")
    scenario = Scenario(text, tuple(_parse_one(p) for p in parts))
    if sum(isinstance(c, Device) for c in scenario.components) > 1:
        raise ValueError(f"slowdown spec {spec!r} has more than one device:MS part; give one")
    return scenario


# --- process-wide control variables read inside every compiled step -----------------------------


