"""Task allocation: per-rank batches proportional to speed, one weighted allreduce per step (BSP rounds).

Paper: "Task allocation for decentralized training in heterogeneous environment" (Chao, Liao, Gao), section
III: eq. (1), Algorithm 1, eq. (10). What hetsync's implementation does
(:mod:`hetsync.protocols.taskalloc.protocol`, ``allocation``, ``data``) and so what is modelled:

* **One Keras step is one round.** Rank i's batch holds its w_i micro-batches of mb samples, m_i = w_i mb
  samples (the plan of :func:`hetsync.protocols.taskalloc.allocation.plan_rounds`: full rounds, and a last
  round of each epoch that holds the remainder, split by largest remainders). Its device time is
  ``T_i(k) m_i / b``. Every step ends with one grouped allreduce (the scaled gradients, m_i and the [n]
  non-finite flags: m + 4 + 4 n bytes) run through ``synchronize`` (``netdelay`` delays it): a barrier, so
  step k lasts ``max_i (T_i(k) m_i / b + host) + latency + allreduce``.
* **The allocation** uses the implementation's own arithmetic: C micro-batches per round (static: ``total``
  or sum(weights) or n; adaptive without either: n b / unit, single samples by default), the micro-batch
  :func:`hetsync.protocols.taskalloc.allocation.default_micro_batch` (BSP's global batch) unless given,
  initial equal shares by :func:`hetsync.protocols.taskalloc.allocation.round_allocation`.
* **Adaptive** (Algorithm 1, eq. 10): each epoch the ranks' speeds v_i are measured as the *median* over the
  steps of m_i / (step time - time inside the allreduce) = m_i / (T_i(k) m_i / b + host) (the
  implementation's median, robust to single slow steps); eq. (10)
  (:func:`hetsync.protocols.taskalloc.allocation.adapt_allocation`) proposes a new w, adopted when
  :func:`hetsync.protocols.taskalloc.allocation.predicted_gain` exceeds ``threshold``; ``patience`` epochs
  below it freeze the allocation. The model measures the speeds over a warm-up window, the first K // 2
  draws (at least 1; the implementation pools its median over every step since the allocation last
  changed, so in the steady state it sees many steps, not one epoch's few when epochs are short), repeats
  the epoch rule on that window until the allocation is frozen (at most 100 epochs), and reports the
  **steady state**: the throughput of all K draws at the final allocation
  (``extra["first_epoch_samples_per_s"]``: at the initial one).
* **Random slowdowns cannot be allocated away**: the median ignores a rank's occasional slow step, the
  allocation follows the base speeds, and every slowed step still holds up the barrier of its round.
* Every epoch (R steps) ends with one allgather of each rank's measurements (a ~400-byte record per rank),
  also a barrier, not delayed by ``netdelay``.

Not modelled: the first step of each epoch (graph tracing, rank 0's evaluation), Keras' prefetching
thread waiting for the next epoch's plan, the epochs at the initial allocation before the steady state.
"""
import numbers

import numpy as np

from hetsync.protocols.taskalloc import allocation as _alloc
from hetsync.sim.result import SimResult, throughput_until

__all__ = ["simulate", "allocate", "DEFAULT_SAMPLES_PER_EPOCH", "ADAPTIVE_DEFAULT_UNIT"]

#: samples per epoch when the configuration does not say (MNIST's 60,000 training images).
DEFAULT_SAMPLES_PER_EPOCH = 60000
#: adaptive mode without ``weights`` or ``total``: samples per allocation unit (the implementation's value).
ADAPTIVE_DEFAULT_UNIT = 1
#: bytes of one rank's pickled epoch record in the end-of-epoch allgather.
_EPOCH_RECORD_BYTES = 400
#: epochs of adaptation simulated at most before the steady state is measured.
_MAX_EPOCHS = 100

_KEYS = {"mode": "static", "weights": None, "total": None, "threshold": 0.05, "patience": 2, "micro_batch": None,
         "samples_per_epoch": DEFAULT_SAMPLES_PER_EPOCH}


def _is_int(v, lo):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= lo


def _config(config, n):
    unknown = sorted(set(config) - set(_KEYS))
    if unknown:
        raise ValueError(f"taskalloc: unknown timing parameter(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(sorted(_KEYS))}")
    cfg = dict(_KEYS, **config)
    if cfg["mode"] not in ("static", "adaptive"):
        raise ValueError(f"taskalloc: mode must be 'static' or 'adaptive', got {cfg['mode']!r}")
    w = cfg["weights"]
    if w is not None:
        w = list(w)
        if len(w) != n or not all(_is_int(v, 1) for v in w):
            raise ValueError(f"taskalloc: weights must be {n} ints >= 1 (micro-batches per round, one per rank), "
                             f"got {w}")
        cfg["weights"] = w
    for key, lo in (("total", 1), ("micro_batch", 1)):
        if cfg[key] is not None and not _is_int(cfg[key], lo):
            raise ValueError(f"taskalloc: {key} must be None or an int >= {lo}, got {cfg[key]!r}")
    if w is not None and cfg["total"] is not None and sum(w) != cfg["total"]:
        raise ValueError(f"taskalloc: total C={cfg['total']} but the weights {w} sum to {sum(w)}")
    t = cfg["threshold"]
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t < 1:
        raise ValueError(f"taskalloc: threshold must be a float in [0, 1), got {t!r}")
    if not _is_int(cfg["patience"], 1):
        raise ValueError(f"taskalloc: patience must be an int >= 1 (epochs), got {cfg['patience']!r}")
    if not _is_int(cfg["samples_per_epoch"], n):
        raise ValueError(f"taskalloc: samples_per_epoch must be an int >= the world size {n} (every rank needs a "
                         f"sample per round), got {cfg['samples_per_epoch']!r}")
    return cfg


def _speeds(T, m, host_ms):
    """Median over the steps of m_i / (T_i(k) m_i / b + host): float64 [n] samples per millisecond.

    ``T`` holds device milliseconds per b samples already scaled to m_i (float64 [W, n]); m: float64 [n]."""
    return np.median(m[None, :] / (T + host_ms), axis=0)


def _initial(cfg, n, b):
    """``(C, w, mb)``: micro-batches per round, the initial int64 [n] allocation, samples per micro-batch."""
    w = cfg["weights"]
    total = cfg["total"]
    if cfg["mode"] == "adaptive" and w is None and total is None:
        unit = cfg["micro_batch"] if cfg["micro_batch"] is not None else ADAPTIVE_DEFAULT_UNIT
        total = max(n, (n * b) // unit)
    elif total is None:
        total = sum(w) if w is not None else n
    if total < n:
        raise ValueError(f"taskalloc: total C={total} is smaller than the world size {n}; every rank needs at "
                         "least one micro-batch per round")
    weights = np.asarray(w, np.int64) if w is not None else _alloc.round_allocation([total / n] * n, total)
    mb = cfg["micro_batch"] if cfg["micro_batch"] is not None else _alloc.default_micro_batch(n, b, total)
    return int(total), weights, int(mb)


def allocate(T_window, b, host_ms, n, cfg):
    """The allocation the implementation settles on (task allocation paper, Algorithm 1 and eq. 10).

    Args:
        T_window: float64 [W, n], device milliseconds per b samples of the warm-up window's steps.
        b: int, the run's per-rank batch size (samples). host_ms: float >= 0, host milliseconds per step.
        n: int, world size. cfg: dict of the configuration (``mode``, ``weights``, ``total``, ``threshold``,
            ``patience``, ``micro_batch``), validated.

    Returns:
        dict: ``total`` (int C micro-batches per round), ``micro_batch`` (int mb samples), ``initial`` and
        ``weights`` (int64 [n] micro-batches per rank per round, before and after adaptation), ``epochs``
        (int, epochs of adaptation simulated), ``stable`` (bool), ``speeds`` (float64 [n] samples per second
        measured at the final allocation).

    Raises:
        ValueError: a total smaller than n.
    """
    total, weights, mb = _initial(cfg, n, b)
    initial = weights.copy()
    epochs, stable, count = 0, cfg["mode"] == "static", 0

    def measure(wts):
        m = (wts * mb).astype(np.float64)
        return _speeds(T_window * m[None, :] / b, m, host_ms)

    v = measure(weights)
    while not stable and epochs < _MAX_EPOCHS:
        epochs += 1
        new = _alloc.adapt_allocation(weights, weights * mb / v, total)
        gain = _alloc.predicted_gain(weights, new, v)
        if gain > cfg["threshold"]:
            weights, count = new, 0
            v = measure(weights)
        else:
            count += 1
            stable = count >= cfg["patience"]
    return {"total": int(total), "micro_batch": int(mb), "initial": initial, "weights": weights, "epochs": epochs,
            "stable": bool(stable), "speeds": v * 1e3}


def _run(T, counts, work, comm_ms, epoch_ms):
    """Step end times (float64 [K], ms) and samples (float64 [K, n]) of K rounds following the plan ``counts``."""
    K, n = T.shape
    R = counts.shape[0]
    m = counts[np.arange(K) % R].astype(np.float64)  # [K, n]
    compute = T * m / work.batch_size + work.host_ms
    slowest = compute.max(axis=1)
    step = slowest + comm_ms + np.where(np.arange(K) % R == R - 1, epoch_ms, 0.0)
    return np.cumsum(step), m, compute, slowest


def simulate(times, net, work, **config):
    """Simulate task allocation (task allocation paper section III: eq. 1, Algorithm 1, eq. 10).

    Args:
        times: :class:`hetsync.sim.workload.StepTimes`, float64 [K, n] device milliseconds per step of b samples
            (n = ``net.size``; a step of s samples takes ``ms * s / b``).
        net: :class:`hetsync.sim.network.Network`. work: :class:`hetsync.sim.workload.Workload` (m bytes, b
            samples per rank per step as for BSP, host milliseconds per step).
        **config: ``mode`` (``"static"``/``"adaptive"``), ``weights`` (n ints w_i >= 1 or None), ``total`` (int
            C >= n or None), ``threshold`` (float in [0, 1)), ``patience`` (int >= 1 epochs), ``micro_batch``
            (int samples or None), and the model's ``samples_per_epoch`` (int N >= n, default 60000: rounds
            per epoch, the last partial round, the epoch exchange).

    Returns:
        :class:`hetsync.sim.result.SimResult` of the steady state (``rounds`` = K weighted allreduces),
        ``extra`` with ``batches`` (samples per rank per full round, w_i mb), ``weights``, ``initial_weights``,
        ``micro_batch``, ``total``, ``rounds_per_epoch``, ``speeds`` (samples per second), ``adapt_epochs``,
        ``stable``, ``warmup_steps``, ``allreduce_ms`` and ``first_epoch_samples_per_s``.

    Raises:
        ValueError: an unknown configuration key (names the allowed ones), a value out of range, weights not
            one per rank, step times for a world size other than ``net.size``.
    """
    T = np.asarray(times.ms, dtype=np.float64)
    if T.ndim != 2 or T.shape[1] != net.size:
        raise ValueError(f"step times are for {T.shape[-1] if T.ndim else 0} ranks but the network has "
                         f"{net.size}; every rank of task allocation is a worker")
    K, n = T.shape
    cfg = _config(config, n)
    b = int(work.batch_size)
    N = int(cfg["samples_per_epoch"])
    # the rounds per epoch do not depend on how C is split (plan_rounds); equal shares give R
    _, w0, mb0 = _initial(cfg, n, b)
    R = _alloc.plan_rounds(N, mb0, w0).shape[0]
    warm = max(1, K // 2)
    a = allocate(T[:warm], b, work.host_ms, n, cfg)
    comm_ms = net.allreduce_s(int(work.model_bytes) + 4 + 4 * n) * 1e3 + times.sync_latency_ms
    a_ring, beta = net.ring()
    epoch_ms = 0.0 if n < 2 else (net.overhead_s + (n - 1) * a_ring
                                  + (n - 1) / n * n * _EPOCH_RECORD_BYTES / beta) * 1e3
    counts = _alloc.plan_rounds(N, a["micro_batch"], a["weights"])
    end, m, compute, slowest = _run(T, counts, work, comm_ms, epoch_ms)
    horizon = float(end[-1])
    sps, steps = throughput_until(np.broadcast_to(end[:, None], (K, n)), m, horizon)
    wait = ((slowest[:, None] - compute).sum(axis=0) + K * comm_ms + (K // R) * epoch_ms) / 1e3
    end0, m0, _, _ = _run(T, _alloc.plan_rounds(N, a["micro_batch"], a["initial"]), work, comm_ms, epoch_ms)
    first = float(m0.sum() / (end0[-1] / 1e3))
    extra = {"batches": [int(v) for v in a["weights"] * a["micro_batch"]], "weights": [int(v) for v in a["weights"]],
             "initial_weights": [int(v) for v in a["initial"]], "micro_batch": a["micro_batch"], "total": a["total"],
             "global_batch": a["total"] * a["micro_batch"], "rounds_per_epoch": int(R),
             "speeds": [float(v) for v in a["speeds"]], "adapt_epochs": a["epochs"], "stable": a["stable"],
             "warmup_steps": int(warm), "allreduce_ms": comm_ms, "epoch_exchange_ms": epoch_ms,
             "first_epoch_samples_per_s": first, "mode": cfg["mode"]}
    return SimResult("taskalloc", n, n, sps, horizon / 1e3, [int(v) for v in steps], [float(v) for v in wait],
                     rounds=K, contributors_per_round=float(n), staleness_mean=0.0, extra=extra)
