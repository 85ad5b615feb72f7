"""Heterogeneity injection: the papers' straggler scenarios (GUIDE section 2).

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

Faults (issue 15) are checked at each train batch begin of the named rank (a parameter-server
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
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

__all__ = [
    "Scenario", "Component", "RandomSlowdown", "DeterministicSlowdown", "UniformDelay", "Speeds", "NetDelay",
    "Device", "OnRanks", "Fault", "parse_spec", "fired_faults", "OVERRUN_WARN_FRACTION", "step_control",
    "sync_control",
]

log = logging.getLogger("hetsync")


class Component:
    """Base of one scenario part; subclasses are frozen dataclasses."""

    def validate(self, world_size):
        """Check the part against the world size (int). Raises ValueError if it does not fit."""

    def draw(self, rng, rank, world_size):
        """Draw one step's injection for ``rank`` (int) from ``rng`` (numpy Generator).

        Returns:
            ``(factor, extra_ms)``: float factor K >= 1 and float extra delay in milliseconds.
        """
        return 1.0, 0.0


@dataclasses.dataclass(frozen=True)
class RandomSlowdown(Component):
    """``random:K``: each step each rank is K times slower with probability 1/n (Hop section 7).

    Attributes:
        k: float >= 1, the slowdown factor.
    """

    k: float

    def draw(self, rng, rank, world_size):
        return (self.k if rng.random() < 1.0 / world_size else 1.0), 0.0


@dataclasses.dataclass(frozen=True)
class DeterministicSlowdown(Component):
    """``deterministic:R:K``: rank R is always K times slower.

    Attributes:
        rank: int, the straggler's rank. k: float >= 1, its slowdown factor.
    """

    rank: int
    k: float

    def validate(self, world_size):
        if not 0 <= self.rank < world_size:
            raise ValueError(f"slowdown spec deterministic:{self.rank}:{self.k:g} names rank {self.rank}, "
                             f"but the world has ranks 0..{world_size - 1}")

    def draw(self, rng, rank, world_size):
        return (self.k if rank == self.rank else 1.0), 0.0


@dataclasses.dataclass(frozen=True)
class UniformDelay(Component):
    """``uniform:A:B``: an extra delay drawn uniformly in [A, B] milliseconds per step (RNA section 8).

    Attributes:
        low_ms, high_ms: float, 0 <= low_ms <= high_ms.
    """

    low_ms: float
    high_ms: float

    def draw(self, rng, rank, world_size):
        return 1.0, float(rng.uniform(self.low_ms, self.high_ms))


@dataclasses.dataclass(frozen=True)
class Speeds(Component):
    """``speeds:S0,S1,...``: per-rank speed factors; rank i is max(S)/S_i times slower.

    Attributes:
        speeds: tuple of float > 0, one per rank.
    """

    speeds: tuple

    def validate(self, world_size):
        if len(self.speeds) != world_size:
            raise ValueError(f"slowdown spec speeds:{','.join(f'{s:g}' for s in self.speeds)} gives "
                             f"{len(self.speeds)} speeds, but the world size is {world_size}")

    def draw(self, rng, rank, world_size):
        return max(self.speeds) / self.speeds[rank], 0.0


@dataclasses.dataclass(frozen=True)
class NetDelay(Component):
    """``netdelay:MS``: MS milliseconds of extra latency on every synchronization.

    Attributes:
        ms: float >= 0.
    """

    ms: float

    def draw(self, rng, rank, world_size):
        return 1.0, 0.0


@dataclasses.dataclass(frozen=True)
class Device(Component):
    """``device:MS``: the emulated device; a step of b samples (the run's per-rank batch size) takes MS ms.

    The step of a rank drawing ``(K, extra_ms)`` from the other components lasts
    K x MS x samples / b + extra_ms milliseconds of wall time (see the module docstring).

    Attributes:
        ms: float > 0, milliseconds per step of b samples on the reference device.
    """

    ms: float


@dataclasses.dataclass(frozen=True)
class OnRanks(Component):
    """``PART@RANKS``: the component ``part`` applies to the ranks in ``ranks`` only; the others draw
    ``(1.0, 0.0)`` (no injection) and consume nothing from their generator.

    Attributes:
        part: a RandomSlowdown, DeterministicSlowdown, UniformDelay or Speeds (not Device or NetDelay,
            which act on the whole launch). ranks: tuple of distinct ints >= 0, sorted.
    """

    part: Component
    ranks: tuple

    def validate(self, world_size):
        bad = [r for r in self.ranks if r >= world_size]
        if bad:
            raise ValueError(f"slowdown spec part @{','.join(map(str, self.ranks))} names rank(s) {bad}, but the "
                             f"world has ranks 0..{world_size - 1}")
        self.part.validate(world_size)

    def draw(self, rng, rank, world_size):
        return self.part.draw(rng, rank, world_size) if rank in self.ranks else (1.0, 0.0)


#: the fault kinds and their number of arguments after the name
FAULT_ARITY = {"pause": 3, "stall": 3, "kill": 2}

# Watcher run as a separate process by a pause: waits until the paused process is really stopped
# (/proc state T; at most 60 s, or at once where /proc is missing), sleeps FOR_S, then sends SIGCONT.
_WATCHER = """
import os, signal, sys, time
pid, for_s = int(sys.argv[1]), float(sys.argv[2])
def state():
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return None
end = time.monotonic() + 60.0
while state() not in ('T', None) and time.monotonic() < end:
    time.sleep(0.002)
time.sleep(for_s)
try:
    os.kill(pid, signal.SIGCONT)
except OSError:
    pass
"""

_fired_lock = threading.Lock()
_fired = []      # records of the faults fired in this process, in order
_fired_keys = set()


def fired_faults():
    """The faults fired in this process so far (issue 15).

    Returns:
        list of dicts ``{"kind", "rank", "at_s", "for_s", "fired_at_s", "resumed_at_s"}`` (seconds;
        ``fired_at_s`` and ``resumed_at_s`` count from the train begin of the ``fit`` that fired it;
        ``for_s`` and ``resumed_at_s`` are None for ``kill``), copies.
    """
    with _fired_lock:
        return [dict(r) for r in _fired]


@dataclasses.dataclass(frozen=True)
class Fault(Component):
    """A fault (issue 15): ``pause:RANK:AT_S:FOR_S``, ``stall:RANK:AT_S:FOR_S`` or ``kill:RANK:AT_S``.

    ``pause`` stops the whole process (SIGSTOP: all threads, the point-to-point receiver and protocol
    threads too) for ``for_s`` seconds; a detached watcher process sends SIGCONT. ``stall`` sleeps the
    calling (training) thread only, so background threads keep serving: a stalled device.
    ``kill`` sends SIGKILL to the process itself (a dead peer; the launcher sees a rank killed by
    signal 9). A fault takes no part in the per-step draw (``draw`` returns ``(1.0, 0.0)`` and
    consumes nothing from the generator).

    Attributes:
        kind: str, ``"pause"``, ``"stall"`` or ``"kill"``. rank: int >= 0, the rank it hits.
        at_s: float >= 0, seconds after that rank's train begin. for_s: float > 0 seconds (pause,
            stall) or None (kill).
    """

    kind: str
    rank: int
    at_s: float
    for_s: float = None

    @property
    def spec(self):
        """The part's spec text, e.g. ``"pause:1:2:3"``."""
        tail = "" if self.for_s is None else f":{self.for_s:g}"
        return f"{self.kind}:{self.rank}:{self.at_s:g}{tail}"

    def validate(self, world_size):
        """Raises ValueError if ``rank`` is not in [0, world_size)."""
        if not 0 <= self.rank < world_size:
            raise ValueError(f"slowdown spec {self.spec}: RANK {self.rank} is not a rank of this launch; allowed: "
                             f"0..{world_size - 1}")

    def draw(self, rng, rank, world_size):
        return 1.0, 0.0

    def fired(self):
        """Whether this fault already fired in this process (bool)."""
        with _fired_lock:
            return self in _fired_keys

    def fire(self, elapsed_s):
        """Inflict the fault on this process now, once per process (a second call does nothing).

        Args:
            elapsed_s: float seconds since the train begin, recorded as ``fired_at_s``.

        Returns:
            dict, the record (see :func:`fired_faults`), or None if it had fired already. ``kill`` does
            not return.

        Raises:
            OSError: the pause watcher could not be started (the process is then not stopped).
        """
        with _fired_lock:
            if self in _fired_keys:
                return None
            _fired_keys.add(self)
            record = {"kind": self.kind, "rank": self.rank, "at_s": self.at_s, "for_s": self.for_s,
                      "fired_at_s": float(elapsed_s), "resumed_at_s": None}
            _fired.append(record)
        msg = f"hetsync: fault {self.spec}: rank {self.rank} (pid {os.getpid()}) at {elapsed_s:.2f} s: "
        if self.kind == "kill":
            sys.stderr.write(f"{msg}SIGKILL to itself (unix time {time.time():.3f})\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60.0)  # not reached: SIGKILL cannot be caught
        t = time.monotonic()
        if self.kind == "pause":
            log.warning("%sSIGSTOP for %g s", msg, self.for_s)
            for h in logging.getLogger().handlers + log.handlers:
                h.flush()
            sys.stderr.flush()
            sys.stdout.flush()
            subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, str(os.getpid()), repr(self.for_s)],
                             start_new_session=True, stdin=subprocess.DEVNULL, close_fds=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            log.warning("%sthe training thread sleeps %g s", msg, self.for_s)
            time.sleep(self.for_s)
        with _fired_lock:
            record["resumed_at_s"] = float(elapsed_s) + time.monotonic() - t
            return dict(record)


def _applies(c, rank):
    """The component acting on ``rank``: ``c`` itself, the inner part of an OnRanks that lists it, or None."""
    if isinstance(c, OnRanks):
        return c.part if rank in c.ranks else None
    return c


#: fraction of overrun steps above which an emulated run is invalid (warned on rank 0, marked by the bench).
OVERRUN_WARN_FRACTION = 0.01


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

_lock = threading.Lock()
_controls = {}


def _control(name, initial):
    import tensorflow as tf

    with _lock:
        if name not in _controls:
            with tf.init_scope():  # created eagerly even if first asked for while tracing
                _controls[name] = tf.Variable(initial, dtype=tf.float64, trainable=False,
                                              name=f"hetsync_{name}")
        return _controls[name]


def step_control():
    """The float64 variable of shape [4] ``[step_start_s, factor, extra_ms, device_ms]`` fed to the step's
    delay op (``device_ms`` 0: no emulated device; see :func:`hetsync.ops.delay`)."""
    return _control("step_control", [0.0, 1.0, 0.0, 0.0])


def sync_control():
    """The float64 variable of shape [3] ``[0, 1, latency_ms]`` fed to the delay op before each synchronization."""
    return _control("sync_control", [0.0, 1.0, 0.0])
