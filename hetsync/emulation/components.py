"""The parts of a heterogeneity scenario: per-step slowdowns, fixed speeds, the emulated device, network latency.

Each part is a frozen dataclass that checks itself against the world size (:meth:`Component.validate`)
and draws one step's ``(factor, extra_ms)`` for a rank (:meth:`Component.draw`); a
:class:`hetsync.emulation.scenario.Scenario` combines them (factors multiply, extra milliseconds add).
The grammar that builds them from a spec string is :func:`hetsync.emulation.scenario.parse_spec`.
"""
import dataclasses

__all__ = ["Component", "RandomSlowdown", "DeterministicSlowdown", "UniformDelay", "Speeds", "NetDelay", "Device",
           "OnRanks"]


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
