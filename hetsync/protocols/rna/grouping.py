"""RNA's grouping rule by speed (RNA section 4, paragraph 2): pure Python, no TensorFlow, no MPI.

Hierarchical RNA (:mod:`hetsync.protocols.rna.hierarchical`) applies it to the measured step times of
the workers; the timing simulator (:mod:`hetsync.sim.rna`) applies it to modelled ones.
"""
import math
import numbers

__all__ = ["speed_groups"]


def speed_groups(times):
    """Group processes by speed with RNA's rule (section 4, paragraph 2; docs/protocols/rnah.md, grouping).

    With zeta = max t - min t and v = mean t over a set: if zeta <= v the set is one group; else it is
    split into the faster processes (t <= v, ties go to the faster side) and the slower ones (t > v),
    and each part is split again by the same rule with its own zeta and v. Both parts are non-empty
    whenever zeta > v (min <= mean < max), so the recursion ends; a single process has zeta = 0.
    Examples: [1, 3, 9, 27] -> [[0, 1], [2], [3]]; [1, 1, 1, 4] -> [[0, 1, 2], [3]]; [1, 1, 1, 2] -> one
    group; [10, 10, 10, 10, 30, 30, 30, 30] -> one group (zeta = 20 = v). One straggler k times slower
    among n equal processes is split off iff k > (2n - 1) / (n - 1).

    Args:
        times: non-empty sequence of per-process iteration times (finite numbers >= 0, any unit,
            typically milliseconds per step measured after a warm-up), indexed by process.

    Returns:
        list of groups, each a sorted list of process indices; the groups partition range(len(times))
        and are ordered from the fastest to the slowest.

    Raises:
        ValueError: empty ``times`` or a value that is not a finite number >= 0 (names its index).
    """
    times = list(times)
    if not times:
        raise ValueError("speed_groups: times must not be empty")
    for i, t in enumerate(times):
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"speed_groups: times[{i}] = {t!r} is not a finite number >= 0")

    def split(idx):
        ts = [float(times[i]) for i in idx]
        mean = sum(ts) / len(ts)
        if max(ts) - min(ts) <= mean:
            return [sorted(idx)]
        faster = [i for i in idx if times[i] <= mean]
        slower = [i for i in idx if times[i] > mean]
        return split(faster) + split(slower)

    return split(list(range(len(times))))
