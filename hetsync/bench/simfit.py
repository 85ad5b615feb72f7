"""The simulator fitted to the emulation: a validation run's prediction, the probe it is calibrated on, and
predicting recorded rows again.

Used by :mod:`hetsync.bench.validate` (which re-exports these names) and :mod:`hetsync.bench.advisor_check`.
A *probe run* (2 epochs of ``device:40`` without slowdowns, another seed) measures what happens outside the
emulated device time (:func:`probe_overheads`); :func:`calibrate_host_ms` finds the simulator's host work per
step that reproduces it; :func:`predict` and :func:`with_fixed_costs` give a run's samples/s; :func:`repredict`
predicts the rows of a recorded validation again from the probes they keep.
"""
import os
import statistics

from hetsync.bench.efficiency import read_jsonl

__all__ = ["PROTOCOL_ARGS", "TRAIN_SAMPLES", "predict", "probe_overheads", "calibrate_host_ms", "with_fixed_costs",
           "repredict"]

#: protocol arguments of the validation runs (``KEY=VALUE``), the same for the prediction.
PROTOCOL_ARGS = {"taskalloc": ("mode=adaptive",), "hop": ("graph=ring",)}
#: training samples per epoch of the job's data sets (80% of MNIST's 10,000 test files; 80% of the 1,797 digits).
TRAIN_SAMPLES = {"mnist": 8000, "digits": 1437}


def _sim_config(protocol):
    cfg = {}
    for kv in PROTOCOL_ARGS.get(protocol, ()):
        k, _, v = kv.partition("=")
        cfg[k] = int(v) if v.isdigit() else v
    return cfg


def predict(protocol, spec, n, host_ms, model_bytes, batch_size, steps=2000, seed=0, samples_per_epoch=None,
            cluster=None, dilation=1.0):
    """The simulator's samples/s for one validation run.

    Args:
        protocol: str. spec: str slowdown spec. n: int world size. host_ms: float wall milliseconds of host work
            per step (from the probe run). model_bytes: int bytes of the gradient. batch_size: int per-rank samples.
        steps: int draws per rank. seed: int. samples_per_epoch: int or None (FedAvg's period).
        cluster: a :class:`hetsync.emulation.cluster.spec.ClusterSpec` or None (one host).
        dilation: float D >= 1, the run's time dilation: the simulator gets ``host_ms / D`` (host work is not
            dilated, so it is D times shorter in the emulated cluster's time).

    Returns:
        :class:`hetsync.sim.result.SimResult` of the emulated cluster (its samples/s over D is the wall rate).
    """
    from hetsync.sim import network, registry, workload

    times = workload.step_times(spec, n, steps, seed=seed)
    net = (network.Network.from_spec(n) if cluster is None else
           network.Network.from_spec(n, hosts=f"{cluster.hosts}x{cluster.slots}", link=cluster.link))
    work = workload.Workload(model_bytes=int(model_bytes), batch_size=int(batch_size),
                             host_ms=float(host_ms) / float(dilation))
    cfg = _sim_config(protocol)
    if protocol == "fedavg" and samples_per_epoch:
        cfg["samples_per_epoch"] = int(samples_per_epoch)
    return registry.simulate(protocol, times, net, work, **cfg)


def _records(run_dir):
    out = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("rank") and name.endswith(".jsonl"):
            out.append(read_jsonl(os.path.join(run_dir, name)))
    return out


def probe_overheads(run_dir):
    """What a probe run measured outside the emulated device time.

    Args:
        run_dir: str, the probe run's folder (``rank*.jsonl`` step records with ``wall_s``, ``epoch``,
            ``emulated_ms``).

    Returns:
        dict of floats, or None without records: ``cycle_ms``, the mean over ranks of the mean wall time per step
        (between consecutive steps' ends) within the epochs after the first, less the mean emulated device time,
        in milliseconds (Keras' per-step work, the callbacks, the protocol's own exchanges and periodic averages,
        CPU contention between ranks); ``host_ms_median``, the median over ranks of the median of the same
        per-step figure; ``first_step_s``, seconds from train begin to the first step's end (tracing, compiling;
        median over ranks); ``boundary_s``, seconds between the last step of epoch 0 and the first of epoch 1
        beyond one mean cycle (rank 0's evaluation, the data plan's new epoch; median over ranks).
    """
    cycle, medians, first, boundary = [], [], [], []
    for recs in _records(run_dir):
        if not recs or "wall_s" not in recs[0]:
            continue
        first.append(recs[0]["wall_s"])
        later = [i for i, r in enumerate(recs) if r.get("epoch", 0) >= 1]
        if not later or later[0] == 0:
            continue
        i0 = later[0]
        pairs = [(a, b) for a, b in zip(recs[i0:], recs[i0 + 1:]) if a.get("epoch") == b.get("epoch")]
        if not pairs:
            continue
        per = [(b["wall_s"] - a["wall_s"]) * 1e3 - b.get("emulated_ms", 0.0) for a, b in pairs]
        mean = statistics.mean(per)
        cycle.append(mean)
        medians.append(statistics.median(per))
        gap = (recs[i0]["wall_s"] - recs[i0 - 1]["wall_s"]) * 1e3 - recs[i0].get("emulated_ms", 0.0) - mean
        boundary.append(max(gap, 0.0) / 1e3)
    if not cycle:
        return None
    return {"cycle_ms": float(statistics.mean(cycle)), "host_ms_median": float(statistics.median(medians)),
            "first_step_s": float(statistics.median(first)), "boundary_s": float(statistics.median(boundary))}


def calibrate_host_ms(protocol, n, overheads, probe_spec="device:40", steps=2000, seed=0, cluster=None,
                      dilation=1.0, tol_ms=0.05):
    """The simulator's ``host_ms`` that reproduces the probe: the host work per step (wall milliseconds) with which
    the simulated probe (its scenario, world size and cluster) takes the probe's measured time per step, the
    emulated device time plus ``cycle_ms`` / D.

    Found by bisection: the simulated step time grows with ``host_ms``, but not always one for one (host work of
    Hop or RNA overlaps their waits for neighbours and initiators), so the probe's cycle less what the simulator
    adds with no host work (the additive estimate) would leave such a protocol's simulation faster than its probe.

    Args:
        protocol: str. n: int world size. overheads: :func:`probe_overheads`'s dict. probe_spec: str, the probe's
            scenario. steps, seed: ints of the simulation. cluster: the probe's ClusterSpec or None (one host).
        dilation: float D >= 1 of the probe run. tol_ms: float, the bisection's tolerance in emulated ms.

    Returns:
        float wall milliseconds >= 0 (give :func:`predict` the same ``dilation``); 0 when the simulator with no
        host work is already as slow as the probe.

    Raises:
        ValueError: no host work makes the simulated probe as slow as the measured one.
    """
    from hetsync.sim import workload

    d = float(dilation)
    device = float(workload.step_times(probe_spec, n, 1).ms.mean())
    target = device + float(overheads["cycle_ms"]) / d

    def step_ms(h):  # the simulated probe's emulated ms per step with h emulated ms of host work
        res = predict(protocol, probe_spec, n, h * d, workload.EXAMPLE_MODEL_BYTES, 32, steps=steps, seed=seed,
                      samples_per_epoch=None, cluster=cluster, dilation=d)
        return n * 32 / res.samples_per_s * 1e3

    lo, hi = 0.0, max(target - device, 0.0)
    if step_ms(lo) >= target:
        return 0.0
    while step_ms(hi) < target:  # host work hidden behind waits: look further
        if hi > 100.0 * target:
            raise ValueError(f"{protocol}: the simulated probe stays under the measured {target:.1f} ms per step "
                             f"whatever its host work (tried {hi:.0f} ms)")
        lo, hi = hi, 2.0 * hi + 1.0
    while hi - lo > tol_ms:
        mid = 0.5 * (lo + hi)
        if step_ms(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi) * d


def with_fixed_costs(samples_per_s, samples, epochs, overheads):
    """Samples/s over a whole fit: the simulated steady rate plus the probe's fixed costs (the first step and
    each epoch boundary after the first epoch).

    Args:
        samples_per_s: float > 0, simulated. samples: int, samples of the whole fit (epochs x samples per epoch).
        epochs: int >= 1. overheads: :func:`probe_overheads`'s dict.

    Returns:
        float samples per second.
    """
    seconds = overheads["first_step_s"] + samples / samples_per_s + (epochs - 1) * overheads["boundary_s"]
    return samples / seconds


def _cluster_of(row):
    """The ClusterSpec of a recorded row (its ``cluster`` label and ``dilation``), or None for one host."""
    from hetsync.emulation.cluster.spec import ClusterSpec

    label = row.get("cluster", "one host")
    if label == "one host":
        return None
    hosts, _, link = label.partition("-")
    h, _, s = hosts.partition("x")
    return ClusterSpec(hosts=int(h), slots=int(s), link=link, dilation=float(row.get("dilation", 1.0)))


def _fit_samples(row):
    """Samples of a recorded row's fit: its ``samples``, else recovered from its whole-fit and steady predictions
    (:func:`with_fixed_costs` inverted), else epochs x the training set."""
    if row.get("samples"):
        return int(row["samples"])
    probe, epochs = row["probe"], int(row["epochs"])
    fixed = probe["first_step_s"] + (epochs - 1) * probe["boundary_s"]
    whole, steady = row.get("predicted"), row.get("predicted_steady")
    if fixed > 0 and whole and steady and 1.0 / whole > 1.0 / steady:
        return int(round(fixed / (1.0 / whole - 1.0 / steady)))
    return epochs * TRAIN_SAMPLES[row.get("dataset", "mnist")]


def repredict(rows, steps=2000):
    """Recorded validation rows predicted again by this simulator and calibration, without a run: each row's probe
    (kept in the row) is calibrated again (:func:`calibrate_host_ms`) and its run predicted again
    (:func:`predict`, :func:`with_fixed_costs`) with the run's scenario, world size, cluster, D, seed and samples.

    Args:
        rows: list of row dicts of a validation document. steps: int draws per rank of each simulation.

    Returns:
        list of new row dicts (same order; ``predicted``, ``predicted_steady``, ``error``, ``probe.host_ms`` and
        ``samples`` updated; the measurement untouched).

    Raises:
        KeyError: a row lacks a field the validation records (its probe, spec, epochs).
    """
    from hetsync.sim import workload

    calibrated, out = {}, []
    for r in rows:
        cluster, d = _cluster_of(r), float(r.get("dilation", 1.0))
        probe = dict(r["probe"])
        key = (r["protocol"], r["np"], r.get("cluster"), d, probe["cycle_ms"])
        if key not in calibrated:
            calibrated[key] = calibrate_host_ms(r["protocol"], r["np"], probe, steps=steps, cluster=cluster,
                                                dilation=d)
        probe["host_ms"] = calibrated[key]
        samples = _fit_samples(r)
        pred = predict(r["protocol"], r["spec"], r["np"], probe["host_ms"], workload.EXAMPLE_MODEL_BYTES, 32,
                       steps=steps, seed=r["seed"], samples_per_epoch=TRAIN_SAMPLES[r.get("dataset", "mnist")],
                       cluster=cluster, dilation=d)
        whole = with_fixed_costs(pred.samples_per_s / d, samples, int(r["epochs"]), probe)
        out.append(dict(r, probe=probe, samples=samples, predicted=whole, predicted_steady=pred.samples_per_s / d,
                        error=whole / r["measured"] - 1.0))
    return out
