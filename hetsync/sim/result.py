"""What a protocol's timing simulation returns (one type for every protocol)."""
import dataclasses

import numpy as np

__all__ = ["SimResult", "throughput_until"]


@dataclasses.dataclass
class SimResult:
    """The simulated behaviour of one protocol on one cluster.

    Attributes:
        protocol: str, the registry name (``"bsp"``, ``"rna"``, ...).
        n: int, world size (workers and servers).
        workers: int, ranks that compute gradients.
        samples_per_s: float, samples processed per second by all workers together, over ``duration_s``.
        duration_s: float seconds simulated (the measured window: until the first worker ran out of draws).
        steps: list of ``workers`` ints, steps each worker completed inside the window.
        wait_s: list of ``workers`` floats, seconds each worker spent blocked (on the network, a barrier,
            tokens) inside the window.
        rounds: int, synchronization rounds (allreduces, averaging periods, Hop iterations of the slowest
            rank, server updates) inside the window; None where the notion does not apply.
        contributors_per_round: float or None, mean workers whose fresh gradient entered a round.
        staleness_mean: float or None, mean age in steps (iterations) of what a worker applied.
        extra: dict of protocol-specific figures (``dropped``, ``sync_fraction``, ``max_gap`` ...).
    """

    protocol: str
    n: int
    workers: int
    samples_per_s: float
    duration_s: float
    steps: list
    wait_s: list
    rounds: object = None
    contributors_per_round: object = None
    staleness_mean: object = None
    extra: dict = dataclasses.field(default_factory=dict)

    def as_dict(self):
        """The result as a JSON-ready dict (floats rounded to 6 significant digits)."""
        d = dataclasses.asdict(self)
        for k in ("steps", "wait_s"):
            d[k] = [float(f"{v:.6g}") if isinstance(v, float) else int(v) for v in d[k]]
        return d


def throughput_until(ends_ms, samples, horizon_ms):
    """Samples per second of work completed by ``horizon_ms``.

    Args:
        ends_ms: float array [K, w], the time (ms) each worker's step k ended (``inf`` if never).
        samples: float array [K, w] or scalar, samples of each step.
        horizon_ms: float > 0, the end of the window (ms).

    Returns:
        ``(samples_per_s, steps)``: float, and an int array [w] of steps completed by the horizon.
    """
    ends = np.asarray(ends_ms, dtype=np.float64)
    done = ends <= horizon_ms + 1e-9
    s = np.broadcast_to(np.asarray(samples, dtype=np.float64), ends.shape)
    return float((s * done).sum() / (horizon_ms / 1e3)), done.sum(axis=0).astype(int)
