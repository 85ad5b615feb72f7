"""What a simulated rank computes: per-step device times from a scenario or a probe, and the model's size.

The step times come from the scenario language (:mod:`hetsync.emulation.scenario`: ``device:40+random:6``,
``speeds:1,1,1,0.5``, ...) drawn as a whole ``[K, n]`` array at once, so 1024 ranks take milliseconds, or
from a probe's measured samples (:func:`from_samples`, resampled per rank). A step time is for the run's
per-rank batch size b; a step of s samples takes ``time * s / b`` (the emulated device's rule), which is
how task allocation's unequal batches are simulated. The emulation's faults (``pause``, ``stall``,
``kill``) are not part of a timing prediction and are refused.
"""
import dataclasses

import numpy as np

from hetsync.emulation import components as _c
from hetsync.emulation import scenario as _scenario

__all__ = ["Workload", "StepTimes", "step_times", "from_samples", "EXAMPLE_MODEL_BYTES", "EXAMPLE_BATCH_SIZE",
           "EXAMPLE_STEP_MS"]

#: the example job's model (``python -m hetsync.bench.job --model mlp``): 101,770 float32 parameters.
EXAMPLE_MODEL_BYTES = 101_770 * 4
#: the example job's per-rank batch size (samples).
EXAMPLE_BATCH_SIZE = 32
#: the base step (milliseconds) of a scenario without ``device:MS``: the emulated cluster's usual 40 ms.
EXAMPLE_STEP_MS = 40.0


@dataclasses.dataclass(frozen=True)
class Workload:
    """The training job being simulated.

    Attributes:
        model_bytes: int > 0, bytes of one gradient (or parameter) vector (float32: 4 x parameters).
        batch_size: int > 0, per-rank batch size b (samples per step).
        host_ms: float >= 0, milliseconds of host work per step outside the device time (the framework's
            per-step work: Keras' loop, the optimizer wrapper; ``host_ms`` of the step records).
    """

    model_bytes: int = EXAMPLE_MODEL_BYTES
    batch_size: int = EXAMPLE_BATCH_SIZE
    host_ms: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.model_bytes, (int, np.integer)) and self.model_bytes > 0):
            raise ValueError(f"model_bytes must be an int > 0 (bytes of one gradient), got {self.model_bytes!r}")
        if not (isinstance(self.batch_size, (int, np.integer)) and self.batch_size > 0):
            raise ValueError(f"batch_size must be an int > 0 (samples per rank per step), got {self.batch_size!r}")
        if not self.host_ms >= 0:
            raise ValueError(f"host_ms must be >= 0 milliseconds, got {self.host_ms!r}")


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Drawn device times.

    Attributes:
        ms: float64 array [K, n], milliseconds of step k of rank i for the per-rank batch size b.
        sync_latency_ms: float >= 0, extra latency of every synchronization (the scenario's ``netdelay``).
        spec: str, where the times came from (the scenario spec, or ``"probe"``).
    """

    ms: np.ndarray
    sync_latency_ms: float = 0.0
    spec: str = ""

    @property
    def n(self):
        """World size n (int)."""
        return self.ms.shape[1]

    @property
    def steps(self):
        """Steps K drawn per rank (int)."""
        return self.ms.shape[0]

    def mean_ms(self):
        """Mean step time of each rank (float64 array [n], milliseconds)."""
        return self.ms.mean(axis=0)


def _apply(part, factor, extra, ranks, rng, n):
    """Apply one scenario part to the columns ``ranks`` of factor and extra ([K, n] arrays), in place."""
    K = factor.shape[0]
    if isinstance(part, _c.RandomSlowdown):
        hit = rng.random((K, len(ranks))) < 1.0 / n
        factor[:, ranks] *= np.where(hit, part.k, 1.0)
    elif isinstance(part, (_c.DeterministicSlowdown, _c.Speeds)):
        for r in ranks:
            factor[:, r] *= part.draw(None, r, n)[0]
    elif isinstance(part, _c.UniformDelay):
        extra[:, ranks] += rng.uniform(part.low_ms, part.high_ms, size=(K, len(ranks)))
    elif isinstance(part, (_c.Device, _c.NetDelay)):
        pass
    else:
        raise ValueError(f"the simulator cannot time scenario part {part!r}: faults (pause, stall, kill) are "
                         f"events, not step-time distributions; leave them out of a prediction")


def step_times(spec, n, steps, step_ms=None, seed=0):
    """Draw every rank's device times for ``steps`` steps from a scenario spec.

    The draws follow the emulation's rules (:mod:`hetsync.emulation.scenario`): ``random:K`` makes each
    step of each rank K times slower with probability 1/n, ``speeds`` and ``deterministic`` fix factors,
    ``uniform:A:B`` adds milliseconds; ``device:MS`` sets the base step (else ``step_ms``).
    The generator is one ``numpy.random.default_rng([seed, n])`` (not the emulation's per-rank streams:
    the same distribution, other draws).

    Args:
        spec: str, a scenario spec (``"device:40+random:6"``), or a parsed
            :class:`hetsync.emulation.scenario.Scenario`.
        n: int >= 1, world size. steps: int >= 1, steps K per rank.
        step_ms: float > 0 or None, the base step in milliseconds when the spec has no ``device:MS``
            (None: :data:`EXAMPLE_STEP_MS`).
        seed: int >= 0.

    Returns:
        :class:`StepTimes` with ``ms`` of shape [steps, n].

    Raises:
        ValueError: a spec that does not parse or does not fit n (names the part), a fault part, bad sizes.
    """
    sc = spec if isinstance(spec, _scenario.Scenario) else _scenario.parse_spec(spec)
    if not isinstance(n, (int, np.integer)) or n < 1 or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"need ints n >= 1 and steps >= 1, got n={n!r}, steps={steps!r}")
    sc.validate(n)
    base = sc.device_ms if sc.device_ms is not None else (EXAMPLE_STEP_MS if step_ms is None else float(step_ms))
    if not base > 0:
        raise ValueError(f"step_ms must be > 0 milliseconds, got {step_ms!r}")
    rng = np.random.default_rng([int(seed), int(n)])
    factor = np.ones((steps, n))
    extra = np.zeros((steps, n))
    everyone = np.arange(n)
    for c in sc.components:
        if isinstance(c, _c.OnRanks):
            _apply(c.part, factor, extra, np.array([r for r in c.ranks if r < n], dtype=int), rng, n)
        else:
            _apply(c, factor, extra, everyone, rng, n)
    return StepTimes(base * factor + extra, sc.sync_latency_ms, sc.spec)


def from_samples(samples_ms, steps, seed=0):
    """Resample measured step times (a probe's) into a [steps, n] array: each rank's own samples, drawn with
    replacement (a rank that was slow in the probe stays slow; random slowdowns stay random).

    Args:
        samples_ms: list of n sequences of floats > 0, milliseconds of each rank's measured steps (at least one each).
        steps: int >= 1. seed: int.

    Returns:
        :class:`StepTimes` (``spec`` ``"probe"``).

    Raises:
        ValueError: an empty rank, a non-positive sample.
    """
    rng = np.random.default_rng(int(seed))
    cols = []
    for r, s in enumerate(samples_ms):
        s = np.asarray(s, dtype=np.float64)
        if s.size == 0 or not np.all(s > 0):
            raise ValueError(f"rank {r}'s step-time samples must be non-empty and > 0 ms, got {s[:5]}...")
        cols.append(rng.choice(s, size=int(steps), replace=True))
    if not cols:
        raise ValueError("need the samples of at least one rank")
    return StepTimes(np.stack(cols, axis=1), 0.0, "probe")
