"""Task allocation's arithmetic: no TensorFlow, no MPI, unit-tested directly.

Paper: "Task allocation for decentralized training in heterogeneous environment" (Chao, Liao,
Gao), section III: eq. (1) (the update over a global batch), Algorithm 1 and eq. (10) (the
self-adaptive allocation) (heterogeneity efficiency). The protocol and its data
plumbing are in :mod:`hetsync.protocols.taskalloc.protocol`.

Units: n ranks; w_i micro-batches of rank i per synchronization round; C = sum_i w_i; mb samples
per micro-batch; b the run's per-rank batch size (samples).
"""
import math
import heapq
import numbers

import numpy as np

__all__ = ["default_micro_batch", "round_allocation", "plan_rounds", "epoch_indices", "adapt_allocation",
           "allocation_change", "predicted_gain", "heterogeneity_efficiency"]

def default_micro_batch(n, batch_size, total):
    """Micro-batch size that keeps BSP's global batch: n b / C samples, rounded, at least 1.

    With it a round of C micro-batches holds C x mb samples, exactly n x b (BSP's global batch:
    n ranks x b samples) when C divides n b, else the nearest multiple of C (n b / C rounded to
    the nearest integer, halves up; at least 1, so whenever C > n b the micro-batch is 1 sample and
    the global batch C samples, more than BSP's).
    Example: n = 4 ranks, b = 32, C = 8 n = 32: mb = 4, global batch 128 = 4 x 32.

    Args:
        n: int >= 1, number of ranks (world size).
        batch_size: int b >= 1, the run's per-rank batch size in samples (BSP's per-rank batch).
        total: int C >= 1, micro-batches per round over all ranks.

    Returns:
        int mb >= 1, samples per micro-batch.

    Raises:
        ValueError: an argument that is not an integer >= 1 (the message names it and its value).
    """
    for name, value in (("n", n), ("batch_size", batch_size), ("total", total)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"default_micro_batch: {name} must be an integer >= 1, got {value!r}")
    n, b, c = int(n), int(batch_size), int(total)
    return max(1, (2 * n * b + c) // (2 * c))


def round_allocation(ideal, total, minimum=1):
    """Round a real allocation to integers with a fixed sum (largest-remainder / Hamilton method).

    Each entry starts at ``max(minimum, floor(ideal_i))``; while the sum is below ``total`` the
    entry with the largest remainder ``ideal_i - a_i`` gets one more; while it is above (only
    possible because of the lower bound) the entry above ``minimum`` with the smallest remainder
    ``ideal_i - (a_i - 1)`` gives one back. Ties go to the lower rank, so every rank computes the
    same result from the same input. O(n log n) whatever ``total``: the units are handed out (or
    taken back) in bulk down to a bisected remainder threshold, then one by one from a heap.

    Args:
        ideal: sequence of n floats >= 0 (need not sum to ``total`` exactly).
        total: int >= n * minimum, the required sum.
        minimum: int >= 0, the smallest allowed entry.

    Returns:
        numpy int64 array [n] with sum ``total`` and every entry >= ``minimum``.

    Raises:
        ValueError: ``total`` < n * minimum, or a non-finite / negative ideal value.
    """
    x = np.asarray(ideal, dtype=np.float64)
    n = len(x)
    if n == 0 or not np.all(np.isfinite(x)) or np.any(x < 0):
        raise ValueError(f"round_allocation: ideal allocation must be n >= 1 finite values >= 0, got {list(x)}")
    if total < n * minimum:
        raise ValueError(f"round_allocation: total {total} cannot give {n} entries at least {minimum} each")
    a = np.maximum(minimum, np.floor(x)).astype(np.int64)
    total = int(total)
    if a.sum() < total:
        a = _hand_out(x, a, total - int(a.sum()))
    elif a.sum() > total:
        a = _take_back(x, a, int(a.sum()) - total, minimum)
    return a


def _threshold(count, k, lo, hi):
    """The largest float t in [lo, hi] (bisection, 200 halvings) with ``count(t) <= k``, for a count that
    falls as t grows and ``count(hi) <= k``."""
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        if count(mid) <= k:
            hi = mid
        else:
            lo = mid
    return hi


def _hand_out(x, a, k):
    """Give ``k`` > 0 more units, each to the entry with the largest remainder ``x_i - a_i`` (ties to the
    lower index), in O(n log n) whatever k: every unit whose remainder lies above a bisected threshold t
    is among the k largest and goes at once; the few left (those at t) go one by one from a heap, in
    exactly the order of the one-unit-at-a-time rule (remainders compared as that rule computes them)."""
    r = x - a  # the unit j of entry i has remainder x_i - (a_i + j), j = 0, 1, ...

    def units_above(t):  # per entry, the units whose remainder (computed exactly as the rule does) is > t
        c = np.maximum(0.0, np.ceil(r - t)).astype(np.int64)
        while True:
            grow = (x - (a + c)) > t
            shrink = (c > 0) & ~((x - (a + c - 1)) > t)
            if not (grow.any() or shrink.any()):
                return c
            c = c + grow - shrink

    t = _threshold(lambda u: int(units_above(u).sum()), k, float(r.min()) - k - 2.0, float(r.max()))
    c = units_above(t)
    a = a + c
    heap = [(-(x[i] - a[i]), i) for i in range(len(a))]
    heapq.heapify(heap)
    for _ in range(k - int(c.sum())):
        _, i = heapq.heappop(heap)
        a[i] += 1
        heapq.heappush(heap, (-(x[i] - a[i]), i))
    return a


def _take_back(x, a, k, minimum):
    """Take ``k`` > 0 units back, each from the entry above ``minimum`` whose remainder after giving one
    back, ``x_i - (a_i - 1)``, is smallest (ties to the lower index); O(n log n) as :func:`_hand_out`."""
    room = a - minimum
    s = x - a + 1.0  # the unit j of entry i (j < room_i) has value x_i - (a_i - 1 - j)

    def units_below(t):  # per entry, the units (at most room_i) whose value is < t
        c = np.minimum(room, np.maximum(0.0, np.ceil(t - s))).astype(np.int64)
        while True:
            grow = (c < room) & ((x - (a - 1 - c)) < t)
            shrink = (c > 0) & ~((x - (a - c)) < t)
            if not (grow.any() or shrink.any()):
                return c
            c = c + grow - shrink

    lo, hi = float(s.min()) - 1.0, float(s.max()) + k + 2.0
    t = -_threshold(lambda u: int(units_below(-u).sum()), k, -hi, -lo)
    c = units_below(t)
    a = a - c
    heap = [(x[i] - (a[i] - 1), i) for i in range(len(a)) if a[i] > minimum]
    heapq.heapify(heap)
    for _ in range(k - int(c.sum())):
        _, i = heapq.heappop(heap)
        a[i] -= 1
        if a[i] > minimum:
            heapq.heappush(heap, (x[i] - (a[i] - 1), i))
    return a


def plan_rounds(n_samples, micro_batch, weights):
    """Split one epoch into synchronization rounds and each round into per-rank sample counts.

    A full round holds C x mb samples (C = sum(weights), mb = ``micro_batch``) and rank i gets
    w_i x mb of them. The last round holds what is left; if that is fewer samples than ranks it is
    merged into the round before. A round of S samples that is not full is split with
    :func:`round_allocation` of ``S * w / C`` (every rank gets at least one sample, so every rank
    takes part in every round). Every sample is in exactly one round.

    Args:
        n_samples: int N >= number of ranks, training samples per epoch.
        micro_batch: int mb >= 1, samples per micro-batch.
        weights: sequence of n ints w_i >= 1 (micro-batches per rank per round).

    Returns:
        numpy int64 array [R, n]: samples of rank i in round r; rows sum to the round sizes and
        the whole array sums to N. R = ceil(N / (C mb)), or one less after a merge; R does not
        depend on how C is split between the ranks.

    Raises:
        ValueError: fewer samples than ranks.
    """
    w = np.asarray(weights, dtype=np.int64)
    n, total = len(w), int(w.sum())
    if n_samples < n:
        raise ValueError(f"task allocation: {n_samples} training samples cannot be shared by {n} ranks "
                         "(every rank needs at least one sample per round)")
    full = total * micro_batch
    rounds = max(1, math.ceil(n_samples / full))
    sizes = [full] * (rounds - 1) + [n_samples - full * (rounds - 1)]
    if rounds > 1 and sizes[-1] < n:
        sizes = sizes[:-2] + [sizes[-2] + sizes[-1]]
    rows = [w * micro_batch if s == full else round_allocation(s * w / total, s, minimum=1) for s in sizes]
    return np.stack(rows).astype(np.int64)


def epoch_indices(n_samples, counts, epoch, seed=0):
    """Return the sample indices of every (round, rank) of one epoch.

    The N samples are permuted with ``default_rng([seed, epoch])`` (identically on every rank);
    round r takes the next ``counts[r].sum()`` of them and hands them out in rank order.

    Args:
        n_samples: int N. counts: int array [R, n] from :func:`plan_rounds`. epoch: int >= 0.
        seed: int.

    Returns:
        list of R lists of n int64 arrays; together they hold every index in [0, N) exactly once.
    """
    perm = np.random.default_rng([int(seed), int(epoch)]).permutation(n_samples)
    out, pos = [], 0
    for row in counts:
        parts = []
        for c in row:
            parts.append(perm[pos:pos + int(c)])
            pos += int(c)
        out.append(parts)
    assert pos == n_samples, (pos, n_samples)
    return out


def adapt_allocation(weights, compute_s, total):
    """One self-adaptive step, eq. (10): w_i <- C (w_i / t_s^i) / sum_j (w_j / t_s^j), rounded.

    Args:
        weights: sequence of n ints w_i^(k) (micro-batches per round in epoch k).
        compute_s: sequence of n floats t_s^i > 0: rank i's compute time (seconds, waiting
            excluded) for a fixed amount of its work at allocation w^(k), e.g. per round.
        total: int C = sum of the new allocation.

    Returns:
        numpy int64 array [n], w^(k+1), rounded by :func:`round_allocation` (sum C, each >= 1).

    Raises:
        ValueError: a compute time that is not a positive finite number.
    """
    w = np.asarray(weights, dtype=np.float64)
    t = np.asarray(compute_s, dtype=np.float64)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError(f"task allocation: compute times must be positive seconds, got {list(t)}")
    speed = w / t
    return round_allocation(total * speed / speed.sum(), total, minimum=1)


def allocation_change(old, new):
    """Fraction of the global batch that moves between two allocations: sum_i |new_i - old_i| / (2 C)."""
    old, new = np.asarray(old), np.asarray(new)
    return float(np.abs(new - old).sum()) / (2.0 * float(old.sum()))


def predicted_gain(old, new, speeds):
    """Relative shortening of a round predicted for a reallocation: 1 - max_i(new_i / v_i) / max_i(old_i / v_i).

    A round lasts as long as its slowest rank's compute, max_i w_i mb / v_i (mb samples per
    micro-batch; the barrier before the allreduce, paper section III-B); with the speeds v_i
    measured at the old allocation this is the fraction of that time the new allocation saves
    (negative: it would be slower). Unlike :func:`allocation_change` it weighs a move by its
    effect: one micro-batch taken from a bottleneck rank with w_i = 4 shortens the round by up to
    25%, the same move between two equally fast ranks by nothing.

    Args:
        old, new: sequences of n ints w_i (micro-batches per round). speeds: sequence of n floats
            v_i > 0 (samples per second of compute; any common unit).

    Returns:
        float < 1.

    Raises:
        ValueError: a speed that is not a positive finite number, or lengths that differ.
    """
    old, new = np.asarray(old, np.float64), np.asarray(new, np.float64)
    v = np.asarray(speeds, np.float64)
    if not (len(old) == len(new) == len(v)) or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"predicted_gain: need n allocations and n positive speeds, got {list(old)}, {list(new)}, "
                         f"{list(v)}")
    return float(1.0 - np.max(new / v) / np.max(old / v))


def heterogeneity_efficiency(samples, compute_s, wall_s):
    """Heterogeneity efficiency E of one epoch, from in-run measurements.

    E = (sum_i D_i / T) / sum_i v_i with v_i = D_i / t_s^i: the job's samples per second divided
    by the sum of the ranks' own speeds while computing (samples per second of compute time, the
    paper's v_i = D_i / t_s^i, which stands for the rank's solo speed). D_i = samples of rank i in
    the epoch, t_s^i = its compute seconds (waiting excluded), T = the epoch's wall time (the
    protocol passes the epoch without its first step, which carries tracing and rank 0's
    evaluation). E = 1 when no rank ever waits or communicates; BSP under fixed speeds gets about
    n min_i v_i / sum_i v_i. This is the in-run stand-in for the benchmark's E, which divides by the
    ranks' speeds measured alone (:mod:`hetsync.bench.efficiency`). On dedicated devices the two
    agree; where ranks share cores this one reads low, because a waiting rank yields its core and
    the ranks still computing run faster meanwhile (4 ranks on 2 cores, equal speeds, a perfectly
    balanced job: 0.70-0.84 here against 0.92-1.05 by the solo speeds).

    Args:
        samples: sequence of n sample counts D_i. compute_s: sequence of n floats t_s^i > 0
            (seconds). wall_s: float T > 0 (seconds).

    Returns:
        float E (0 if any input is not positive).
    """
    d = np.asarray(samples, dtype=np.float64)
    t = np.asarray(compute_s, dtype=np.float64)
    if wall_s <= 0 or np.any(t <= 0) or np.any(d <= 0):
        return 0.0
    return float((d.sum() / wall_s) / np.sum(d / t))
