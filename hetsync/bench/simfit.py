"""The simulator fitted to the emulation: a validation run's prediction, the probe it is calibrated on, and
predicting recorded rows again.

Used by :mod:`hetsync.bench.validate` (which re-exports these names) and :mod:`hetsync.bench.advisor_check`.
A *probe run* (2 epochs of ``device:40`` without slowdowns, another seed) measures what happens outside the
emulated device time (:func:`probe_overheads`); :func:`calibrate` fits the simulator to it: the host work per
step (:func:`calibrate_host_ms`) and, for a protocol that exchanges point to point across hosts, the fraction of
the link rate its messages reach (:func:`calibrate_p2p_efficiency`); :func:`predict` and :func:`with_fixed_costs`
give a run's samples/s; :func:`repredict` predicts the rows of a recorded validation again from their probes.
"""
import os
import statistics

from hetsync.bench.efficiency import read_jsonl

__all__ = ["PROTOCOL_ARGS", "TRAIN_SAMPLES", "P2P_PROTOCOLS", "predict", "probe_overheads", "calibrate",
           "calibrate_host_ms", "calibrate_p2p_efficiency", "with_fixed_costs", "repredict"]

#: protocol arguments of the validation runs (``KEY=VALUE``), the same for the prediction.
PROTOCOL_ARGS = {"taskalloc": ("mode=adaptive",), "hop": ("graph=ring",)}
#: training samples per epoch of the job's data sets (80% of MNIST's 10,000 test files; 80% of the 1,797 digits).
TRAIN_SAMPLES = {"mnist": 8000, "digits": 1437}
#: protocols whose exchanges between hosts are point-to-point messages (the transport), not collectives.
P2P_PROTOCOLS = ("hop", "notifyack", "asp", "shat", "shatroot", "ensemble", "ssp")


def _sim_config(protocol):
    cfg = {}
    for kv in PROTOCOL_ARGS.get(protocol, ()):
        k, _, v = kv.partition("=")
        cfg[k] = int(v) if v.isdigit() else v
    return cfg


def predict(protocol, spec, n, host_ms, model_bytes, batch_size, steps=2000, seed=0, samples_per_epoch=None,
            cluster=None, dilation=1.0, p2p_efficiency=1.0):
    """The simulator's samples/s for one validation run.

    Args:
        protocol: str. spec: str slowdown spec. n: int world size. host_ms: float wall milliseconds of host work
            per step (from the probe run). model_bytes: int bytes of the gradient. batch_size: int per-rank samples.
        steps: int draws per rank. seed: int. samples_per_epoch: int or None (FedAvg's period).
        cluster: a :class:`hetsync.emulation.cluster.spec.ClusterSpec` or None (one host).
        dilation: float D >= 1, the run's time dilation: the simulator gets ``host_ms / D`` (host work is not
            dilated, so it is D times shorter in the emulated cluster's time).
        p2p_efficiency: float in (0, 1], the fraction of the link rate point-to-point messages between hosts reach
            (:class:`hetsync.sim.network.Network`; :func:`calibrate`).

    Returns:
        :class:`hetsync.sim.result.SimResult` of the emulated cluster (its samples/s over D is the wall rate).

    Raises:
        ValueError: a spec, size or efficiency the simulator refuses.
    """
    from hetsync.sim import network, registry, workload

    times = workload.step_times(spec, n, steps, seed=seed)
    net = (network.Network.from_spec(n) if cluster is None else
           network.Network.from_spec(n, hosts=f"{cluster.hosts}x{cluster.slots}", link=cluster.link,
                                     p2p_efficiency=p2p_efficiency))
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
        per-step figure; ``wait_ms``, the mean over ranks of the mean ``sync_wait_ms`` of the same steps (the time
        the protocol blocked on its exchanges: Hop's wait for updates; 0 where no record carries it);
        ``first_step_s``, seconds from train begin to the first step's end (tracing, compiling;
        median over ranks); ``boundary_s``, seconds between the last step of epoch 0 and the first of epoch 1
        beyond one mean cycle (rank 0's evaluation, the data plan's new epoch; median over ranks).
    """
    cycle, medians, first, boundary, wait = [], [], [], [], []
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
        wait.append(statistics.mean(b.get("sync_wait_ms", 0.0) for _, b in pairs))
        medians.append(statistics.median(per))
        gap = (recs[i0]["wall_s"] - recs[i0 - 1]["wall_s"]) * 1e3 - recs[i0].get("emulated_ms", 0.0) - mean
        boundary.append(max(gap, 0.0) / 1e3)
    if not cycle:
        return None
    return {"cycle_ms": float(statistics.mean(cycle)), "host_ms_median": float(statistics.median(medians)),
            "first_step_s": float(statistics.median(first)), "boundary_s": float(statistics.median(boundary)),
            "wait_ms": float(statistics.mean(wait))}


def calibrate_host_ms(protocol, n, overheads, probe_spec="device:40", steps=2000, seed=0, cluster=None,
                      dilation=1.0, tol_ms=0.05, p2p_efficiency=1.0):
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
        p2p_efficiency: float in (0, 1] of the simulated network (:func:`predict`).

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
                      samples_per_epoch=None, cluster=cluster, dilation=d, p2p_efficiency=p2p_efficiency)
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


def calibrate_p2p_efficiency(protocol, n, overheads, host_ms, probe_spec="device:40", steps=2000, seed=0,
                             cluster=None, dilation=1.0, tol=1e-3):
    """The fraction of the link rate (``p2p_efficiency``, eta) with which the simulated probe, given ``host_ms`` of
    host work, takes the probe's measured time per step (the emulated device time plus ``cycle_ms`` / D).

    On the emulated cluster Hop's probe waits for its neighbours' updates most of its step (``wait_ms``), while
    its links carry less than their rate (pickled messages over TCP through a rate-limited link): charging that
    wait to host work, as :func:`calibrate_host_ms` alone would, puts it on the compute path, where a slowed rank
    cannot hide it; the transport's slower messages overlap the compute as the real ones do.

    Args:
        protocol: str. n: int world size. overheads: :func:`probe_overheads`'s dict. host_ms: float wall
            milliseconds >= 0 of host work per step. probe_spec, steps, seed, cluster, dilation: as
            :func:`calibrate_host_ms`. tol: float, the bisection's tolerance on eta.

    Returns:
        float eta in (0, 1]: 1.0 when the simulated probe at the full rate is already as slow as the measured one.

    Raises:
        ValueError: the simulated probe stays faster than the measured one at eta = 0.001 (links are not what
            makes the probe slow).
    """
    from hetsync.sim import workload

    d = float(dilation)
    target = float(workload.step_times(probe_spec, n, 1).ms.mean()) + float(overheads["cycle_ms"]) / d

    def step_ms(eta):
        res = predict(protocol, probe_spec, n, host_ms, workload.EXAMPLE_MODEL_BYTES, 32, steps=steps, seed=seed,
                      samples_per_epoch=None, cluster=cluster, dilation=d, p2p_efficiency=eta)
        return n * 32 / res.samples_per_s * 1e3

    lo, hi = 1e-3, 1.0
    if step_ms(hi) >= target:
        return 1.0
    if step_ms(lo) < target:
        raise ValueError(f"{protocol}: the simulated probe stays under the measured {target:.1f} ms per step even "
                         f"with point-to-point messages at {lo} of the link rate")
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if step_ms(mid) >= target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def calibrate(protocol, n, overheads, probe_spec="device:40", steps=2000, seed=0, cluster=None, dilation=1.0):
    """Fit the simulator to a probe: ``{"host_ms": wall ms, "p2p_efficiency": eta}`` for :func:`predict`.

    On one host, or for a protocol that synchronizes by collectives, eta is 1 and the host work is
    :func:`calibrate_host_ms`. For a :data:`P2P_PROTOCOLS` protocol across hosts whose probe records its waits,
    the host work is what the probe spent outside the device time and outside those waits (``cycle_ms`` -
    ``wait_ms``) and eta is :func:`calibrate_p2p_efficiency`; where no eta reproduces the probe (or eta is 1),
    it falls back to the host-only calibration.

    Args:
        protocol: str. n: int world size. overheads: :func:`probe_overheads`'s dict. probe_spec, steps, seed,
            cluster, dilation: as :func:`calibrate_host_ms`.

    Returns:
        dict: ``host_ms`` (float wall milliseconds >= 0), ``p2p_efficiency`` (float in (0, 1]).

    Raises:
        ValueError: as :func:`calibrate_host_ms`.
    """
    kw = {"probe_spec": probe_spec, "steps": steps, "seed": seed, "cluster": cluster, "dilation": dilation}
    if cluster is not None and protocol in P2P_PROTOCOLS and overheads.get("wait_ms"):
        host = max(float(overheads["cycle_ms"]) - float(overheads["wait_ms"]), 0.0)
        try:
            eta = calibrate_p2p_efficiency(protocol, n, overheads, host, **kw)
        except ValueError:
            eta = 1.0
        if eta < 1.0:
            return {"host_ms": host, "p2p_efficiency": eta}
    return {"host_ms": calibrate_host_ms(protocol, n, overheads, **kw), "p2p_efficiency": 1.0}


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
    (kept in the row) is calibrated again (:func:`calibrate`) and its run predicted again
    (:func:`predict`, :func:`with_fixed_costs`) with the run's scenario, world size, cluster, D, seed and samples.

    Args:
        rows: list of row dicts of a validation document. steps: int draws per rank of each simulation.

    Returns:
        list of new row dicts (same order; ``predicted``, ``predicted_steady``, ``error``, ``probe.host_ms``,
        ``probe.p2p_efficiency`` and ``samples`` updated; the measurement untouched). A probe recorded without
        ``wait_ms`` (older rows) is calibrated on host work alone.

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
            calibrated[key] = calibrate(r["protocol"], r["np"], probe, steps=steps, cluster=cluster, dilation=d)
        probe.update(calibrated[key])
        samples = _fit_samples(r)
        pred = predict(r["protocol"], r["spec"], r["np"], probe["host_ms"], workload.EXAMPLE_MODEL_BYTES, 32,
                       steps=steps, seed=r["seed"], samples_per_epoch=TRAIN_SAMPLES[r.get("dataset", "mnist")],
                       cluster=cluster, dilation=d, p2p_efficiency=probe["p2p_efficiency"])
        whole = with_fixed_costs(pred.samples_per_s / d, samples, int(r["epochs"]), probe)
        out.append(dict(r, probe=probe, samples=samples, predicted=whole, predicted_steady=pred.samples_per_s / d,
                        error=whole / r["measured"] - 1.0))
    return out
