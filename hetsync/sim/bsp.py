"""BSP (horovod's synchronous data parallelism): every step ends with an allreduce of every rank's gradient.

Step k of the job takes ``max_i T_i(k) + host + latency + allreduce(m)`` milliseconds: every rank computes its
gradient (device time T_i(k) plus the host's per-step work), the allreduce waits for the last one and
then moves m bytes around the ring (:meth:`hetsync.sim.network.Network.allreduce_s`). Rank i waits
``max_j T_j(k) - T_i(k)`` plus the allreduce. Under fixed speeds v_i the heterogeneity efficiency is
E = n min(v) / sum(v) (the emulated cluster's analytic E, :mod:`hetsync.bench.efficiency`).
"""

from hetsync.sim.result import SimResult

__all__ = ["simulate"]


def simulate(times, net, work):
    """Simulate BSP.

    Args:
        times: :class:`hetsync.sim.workload.StepTimes`, [K, n] device milliseconds (n = ``net.size``).
        net: :class:`hetsync.sim.network.Network`. work: :class:`hetsync.sim.workload.Workload`.

    Returns:
        :class:`hetsync.sim.result.SimResult` (``rounds`` = K allreduces, every rank contributing to each).

    Raises:
        ValueError: times for a world size other than ``net.size``.
    """
    T = times.ms
    K, n = T.shape
    if n != net.size:
        raise ValueError(f"step times are for {n} ranks but the network has {net.size}")
    comm_ms = net.allreduce_s(work.model_bytes) * 1e3 + times.sync_latency_ms
    slowest = T.max(axis=1)
    step = slowest + work.host_ms + comm_ms
    total_ms = float(step.sum())
    wait = ((slowest[:, None] - T).sum(axis=0) + K * comm_ms) / 1e3
    return SimResult("bsp", n, n, n * work.batch_size * K / (total_ms / 1e3), total_ms / 1e3, [K] * n,
                     [float(w) for w in wait], rounds=K, contributors_per_round=float(n), staleness_mean=0.0,
                     extra={"allreduce_ms": comm_ms})
