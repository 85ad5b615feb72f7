"""The alpha-beta microbenchmark of a cluster's links, and the analytic E it gives (efficiency with communication).

A benchmark cell on the emulated multi-host cluster (:mod:`hetsync.bench.cluster_cells`) runs this
microbenchmark on its own links, at its own time dilation, *before* its training runs, and writes the fitted
parameters down (``prepare.json``); every run of the cell is then compared with the E that the timing simulator
(:mod:`hetsync.sim`) predicts from those parameters and the devices' speeds alone (:func:`analytic_efficiency`).

**The measurement** (every rank of a launch: ``mpirun -np N -H {hosts} python -m hetsync.bench.alphabeta
--max-bytes M --out FILE``): for message sizes m from 4 bytes up to ``--max-bytes`` (the powers of 4 and M
itself) it times horovod's allreduce of m bytes of float32 over every rank, and a point-to-point round trip of m
bytes through the transport (the path Hop's updates and the parameter servers' shards take) between rank 0 and
the first rank on another host (:func:`hetsync.advise.probe.measure_network`, the median of 5 repetitions).
Rank 0 fits both (:func:`fit_line`; Hockney's model: the fixed cost from the small messages, the rate from the
large ones, since the token bucket's burst lets mid-sized messages through faster than the link):

* allreduce(m) = c0 + c1 m, the ring of :meth:`hetsync.sim.network.Network.allreduce_s` over p ranks:
  overhead + 2 (p - 1) alpha_c + 2 (p - 1) / p * m / beta;
* p2p(m) = a + m / B, one way (half the round trip): alpha + m / (eta beta).

**The network model** (:func:`network_from_fit`): alpha = a (a point-to-point message); a ring step's latency
alpha_c = min(a, c0 / (2 (p - 1))) and the collective's fixed cost overhead = c0 - 2 (p - 1) alpha_c, so the model's
allreduce over the p ranks has the measured c0 (hetsync's transport pickles each message and answers from a receive
thread: one point-to-point message can cost more than a whole small allreduce); the ring's slowest edge beta =
2 (p - 1) / (p c1); the links at max(beta, B), every host's the rate the cluster set it to scaled alike (one
efficiency for every link), the collectives reaching beta / max(beta, B) of it and point-to-point messages B /
max(beta, B). Times are wall seconds of the dilated cluster; the model is expressed in the emulated cluster's time
(alpha, alpha_c and overhead divided by D, rates times D), as the simulator takes it.

**The analytic E** of a run (:func:`analytic_efficiency`): the simulator's samples/s for the run's protocol,
scenario, world size, gradient size and batch size on that network, over the devices' summed solo speeds
(:func:`hetsync.bench.efficiency.analytic_solo`), with no host work (host time outside the device is not part of
the model; at the cluster cells' dilations it is a few percent of a step). The measured E it is compared with is
the run's ``efficiency_analytic`` (its samples/s over the same solo speeds).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

from hetsync.sim.registry import SERVER_PROTOCOLS

__all__ = ["sizes_up_to", "fit_line", "fit_measurements", "network_from_fit", "analytic_efficiency",
           "sim_config", "NOT_TIMING", "measure", "model_figures", "drawn_times", "main"]

#: the fewest message sizes a line is fitted through.
MIN_POINTS = 3
#: messages of at most this many bytes give the fixed cost (their time is latency and negotiation, not bytes).
SMALL_BYTES = 1024
#: protocol arguments that change what is learnt, not when messages go (left out of the simulator's configuration).
NOT_TIMING = ("lr", "data_plan", "timeout_s", "scale_lr", "momentum_correction", "stale_lr", "wait_timeout_s",
              "finish_timeout_s", "poll_ms", "average_at_end", "server_rule")


def sizes_up_to(max_bytes):
    """Message sizes of the microbenchmark: the powers of 4 from 4 bytes below ``max_bytes``, and ``max_bytes``.

    Args:
        max_bytes: int >= 64 bytes (the model's gradient size).

    Returns:
        list of int bytes, increasing, multiples of 4 (whole float32 values).

    Raises:
        ValueError: ``max_bytes`` below 64 bytes (too few sizes to fit a line) or not an int.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes < 64:
        raise ValueError(f"max_bytes must be an int >= 64 bytes (the gradient's size), got {max_bytes!r}")
    out, m = [], 4
    while m < max_bytes:
        out.append(m)
        m *= 4
    top = int(max_bytes) // 4 * 4
    return out + ([top] if top > out[-1] else [])


def fit_line(sizes, seconds):
    """The line t = c0 + c1 m through timed messages: the fixed cost c0 from the small messages, the time per byte
    c1 from the large ones.

    c0 is the median over the messages of at most :data:`SMALL_BYTES` of their time less c1 m; c1 puts the line
    through the largest message, the gradient the protocols send, so the model is exact at the size that
    matters. A token bucket lets a burst of its depth through at the speed of the machine
    (:mod:`hetsync.emulation.cluster`), so the mid-sized messages run faster than the link, and a least-squares
    fit through every point would give a rate the link cannot carry.

    Args:
        sizes: sequence of int bytes (at least :data:`MIN_POINTS`, increasing or not, the largest at least 16
            times the smallest).
        seconds: sequence of float seconds > 0, the same length.

    Returns:
        dict: ``c0_s`` (float seconds, the fixed cost), ``c1_s_per_byte`` (float seconds per byte),
        ``top_rel_error`` (float, |fit - t| / t at the largest message), ``max_rel_error`` (float, the worst over
        every point: the burst's size shows here).

    Raises:
        ValueError: fewer than :data:`MIN_POINTS` points, lengths that differ, sizes that span less than 16x, a
            time not > 0, or a slope not > 0 (the times do not grow with the size: the link was not what was
            measured).
    """
    m, t = np.asarray(sizes, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if m.shape != t.shape or m.size < MIN_POINTS:
        raise ValueError(f"need at least {MIN_POINTS} points, as many sizes as times; got {len(m)} sizes and "
                         f"{len(t)} times")
    if not m.max() >= 16 * max(m.min(), 1):
        raise ValueError(f"the sizes must span at least 16x (small messages for the fixed cost, large ones for the "
                         f"rate), got {m.tolist()}")
    if not np.all(t > 0) or not np.all(np.isfinite(t)):
        raise ValueError(f"times must be finite seconds > 0, got {t.tolist()}")
    small, top = m <= max(SMALL_BYTES, m.min()), int(np.argmax(m))
    c0, c1 = float(np.median(t[small])), 0.0
    for _ in range(4):  # the small messages' bytes cost c1 m too: the two estimates in turn (a contraction)
        c1 = float((t[top] - c0) / m[top])
        c0 = float(np.median(t[small] - c1 * m[small]))
    if not c1 > 0:
        raise ValueError(f"the fitted time per byte is {c1:.3g} s: the times {t.tolist()} do not grow with the "
                         f"sizes {m.tolist()}")
    err = np.abs((c0 + c1 * m) - t) / t
    return {"c0_s": c0, "c1_s_per_byte": c1, "top_rel_error": float(err[np.argmax(m)]),
            "max_rel_error": float(err.max())}


def fit_measurements(points, world_size):
    """Both fits and the derived parameters from the measured points (wall seconds of the dilated cluster).

    Args:
        points: list of dicts ``{"bytes": int, "allreduce_s": float, "p2p_s": float or None}`` (rank 0's medians;
            ``p2p_s`` one way).
        world_size: int p >= 2, the ranks the allreduce ran over.

    Returns:
        dict: ``allreduce`` and ``p2p`` (:func:`fit_line`'s dicts; ``p2p`` None without point-to-point times),
        ``alpha_s`` (a point-to-point message's latency: the ``p2p`` intercept), ``collective_alpha_s`` (one ring
        step's latency: at most the allreduce's intercept over 2 (p - 1), so the model's allreduce over the p
        ranks has the measured intercept), ``overhead_s`` (what is left of the allreduce's intercept),
        ``ring_bytes_per_s`` and ``p2p_bytes_per_s`` (None without them): wall figures of the dilated cluster.

    Raises:
        ValueError: too few points, or a fit that fails (:func:`fit_line`); a world size below 2.
    """
    p = int(world_size)
    if p < 2:
        raise ValueError(f"the microbenchmark needs at least 2 ranks, got {world_size!r}")
    ar = fit_line([q["bytes"] for q in points], [q["allreduce_s"] for q in points])
    pp = [q for q in points if q.get("p2p_s")]
    p2p = fit_line([q["bytes"] for q in pp], [q["p2p_s"] for q in pp]) if len(pp) >= MIN_POINTS else None
    alpha = max(p2p["c0_s"], 0.0) if p2p else 0.0
    # the collective's intercept bounds its per-step latency: a point-to-point message through the application's
    # transport (pickled, a receive thread) can cost more than a whole small allreduce
    coll_alpha = min(alpha, max(ar["c0_s"], 0.0) / (2 * (p - 1))) if p2p else 0.0
    return {"allreduce": ar, "p2p": p2p, "alpha_s": alpha, "collective_alpha_s": coll_alpha,
            "overhead_s": max(ar["c0_s"] - 2 * (p - 1) * coll_alpha, 0.0),
            "ring_bytes_per_s": 2.0 * (p - 1) / (p * ar["c1_s_per_byte"]),
            "p2p_bytes_per_s": (1.0 / p2p["c1_s_per_byte"]) if p2p else None}


def network_from_fit(fit, np_, hosts, link, host_links=(), dilation=1.0):
    """The simulator's network (:class:`hetsync.sim.network.Network`, emulated cluster's time) from a fit.

    Args:
        fit: :func:`fit_measurements`'s dict (wall figures at dilation D).
        np_: int, the ranks of the launch. hosts: str in the cluster tool's host syntax (``"4x2"``,
            ``"h0:2,h1:2,h2:2,h3:1,h4:1"``). link: str, the cluster's link rate (``"10gbit"``, emulated).
        host_links: iterable of ``"HOST=RATE"`` strs, per-host rates (emulated).
        dilation: float D >= 1 of the microbenchmark.

    Returns:
        Network: alpha, the collective's alpha (``collective_alpha_s``; alpha for a fit without it) and the
        overhead divided by D; the links at the faster of the two measured rates (the ring's beta and the
        point-to-point B), each host's its set rate scaled so that the slowest edge carries that rate (times D: the
        emulated cluster's time); ``collective_efficiency`` beta over it and ``p2p_efficiency`` B over it (both at
        most 1; B = beta without point-to-point times), so the model gives both measured rates; ``link_queue_s``
        each host's link buffer as the cluster shapes it (:func:`hetsync.emulation.cluster.spec.queue_delay_s` at
        the set rate / D, divided by D; 0 for an unshaped link).

    Raises:
        ValueError: a rate, host list or dilation the network model refuses.
    """
    from hetsync.emulation.cluster import spec as _cluster_spec
    from hetsync.sim import network

    d = float(dilation)
    if not (d >= 1.0 and math.isfinite(d)):
        raise ValueError(f"dilation must be a finite number >= 1, got {dilation!r}")
    base = network.Network.from_spec(np_, hosts=hosts, link=link, host_links=tuple(host_links))
    slow = base.ring()[1]  # the slowest set rate of the ring (emulated bytes/s)
    ring, p2p = fit["ring_bytes_per_s"], fit.get("p2p_bytes_per_s") or fit["ring_bytes_per_s"]
    fast = max(ring, p2p)  # the link carries at least what the faster of the two reached
    coll_alpha = fit.get("collective_alpha_s", fit["alpha_s"])  # a fit recorded before the two were told apart
    # each link's buffer as the cluster shapes it (wall seconds at the shaped rate, set rate / D), in emulated time
    queue = tuple(_cluster_spec.queue_delay_s(r * 8.0 / d) / d for r in base.link_bytes_per_s)
    return network.Network(base.slots, tuple(r * fast * d / slow for r in base.link_bytes_per_s),
                           alpha_s=fit["alpha_s"] / d, overhead_s=fit["overhead_s"] / d,
                           p2p_efficiency=p2p / fast, collective_efficiency=ring / fast,
                           collective_alpha_s=coll_alpha / d, link_queue_s=queue)


def sim_config(protocol, args, variable_bytes=None):
    """The simulator's configuration of a protocol variant (``NAME(KEY=VALUE;...)``'s arguments).

    Args:
        protocol: str, the protocol's name. args: dict str -> str of the variant's arguments.
        variable_bytes: list of int bytes per trainable variable (the run's summary), for layer-wise sharding.

    Returns:
        dict of keyword arguments for :func:`hetsync.sim.registry.simulate` (ints and floats parsed; the
        arguments of :data:`NOT_TIMING`, which do not change the timing, are left out).
    """
    cfg = {}
    for k, v in (args or {}).items():
        if k in NOT_TIMING:
            continue
        try:
            cfg[k] = int(v)
        except ValueError:
            try:
                cfg[k] = float(v)
            except ValueError:
                cfg[k] = v
    if protocol in SERVER_PROTOCOLS and cfg.get("sharding") == "layer" and variable_bytes:
        cfg["layer_bytes"] = [int(b) for b in variable_bytes]
    return cfg


def analytic_efficiency(protocol, args, scenario, np_, net, gradient_bytes, batch_size, variable_bytes=None,
                        steps=2000, seed=0):
    """E that the alpha-beta model predicts for one run: simulated samples/s over the devices' solo speeds.

    Args:
        protocol: str. args: dict of the variant's arguments (:func:`sim_config`). scenario: str slowdown spec
            (``device:MS`` and slowdowns). np_: int, the launch's ranks (workers and servers).
        net: :class:`hetsync.sim.network.Network` (:func:`network_from_fit`). gradient_bytes: int bytes of the
            gradient. batch_size: int samples per step per worker. variable_bytes: list of int, bytes per
            trainable variable (layer-wise sharding). steps: int draws per worker. seed: int.

    Returns:
        float E in (0, 1]: the workers' simulated samples/s over the sum of their solo samples/s.

    Raises:
        ValueError: a protocol or argument the simulator has no model for, or a spec it refuses.
    """
    from hetsync.bench import efficiency
    from hetsync.sim import registry, workload

    cfg, workers, work = _model_inputs(protocol, args, np_, gradient_bytes, batch_size, variable_bytes)
    times = workload.step_times(scenario, workers, steps, seed=seed)
    res = registry.simulate(protocol, times, net, work, **cfg)
    solo = efficiency.analytic_solo(scenario, workers, batch_size)
    return efficiency.efficiency(res.samples_per_s, solo)


def _model_inputs(protocol, args, np_, gradient_bytes, batch_size, variable_bytes=None):
    """The simulator's configuration, the workers of an ``np_``-rank launch and the workload (no host work)."""
    from hetsync.sim import workload

    cfg = sim_config(protocol, args, variable_bytes)
    workers = np_ - int(cfg.get("servers", 1)) if protocol in SERVER_PROTOCOLS else np_
    return cfg, workers, workload.Workload(model_bytes=int(gradient_bytes), batch_size=int(batch_size), host_ms=0.0)


def drawn_times(run_dir, workers, dilation, sync_latency_ms=0.0, steps=2000, window=None):
    """The device times a run's workers drew, as the simulator's step times.

    Args:
        run_dir: str, the run's folder (``rank{r}.jsonl``: each step's ``emulated_ms``, the padded device time).
        workers: int, the ranks 0 .. workers - 1 that trained. dilation: float D >= 1 of the run.
        sync_latency_ms: float >= 0, the scenario's ``netdelay`` (emulated milliseconds).
        steps: int, at least this many rows: the K drawn steps are repeated in order (a run of some 60 steps
            would otherwise put the simulation's start into the steady rate the run's window measures).
        window: ``(from_s, to_s)`` or None: only the steps that ended inside this span of the ranks' clocks
            (``wall_s``; the steady window :func:`hetsync.bench.efficiency.run_rates` measures the run's rate in).

    Returns:
        :class:`hetsync.sim.workload.StepTimes` [K x ceil(steps / K), workers] in the emulated cluster's
        milliseconds (``emulated_ms`` over D), K the fewest padded steps any worker ran (each worker's first K; the
        first, compiling step of a fit is not padded and not counted).

    Raises:
        ValueError: a worker with fewer than 2 padded steps. FileNotFoundError: a rank's records are missing.
    """
    import numpy as np

    from hetsync.bench import efficiency
    from hetsync.sim import workload

    seqs = []
    for r in range(int(workers)):
        recs = efficiency.read_jsonl(os.path.join(run_dir, f"rank{r}.jsonl"))
        ms = [float(x["emulated_ms"]) / float(dilation) for x in recs if x.get("emulated_ms")
              and (window is None or window[0] <= x["wall_s"] <= window[1])]
        if len(ms) < 2:
            raise ValueError(f"rank {r} of {run_dir} has {len(ms)} padded steps; the drawn times need at least 2")
        seqs.append(ms)
    k = min(len(ms) for ms in seqs)
    drawn = np.column_stack([ms[:k] for ms in seqs])
    return workload.StepTimes(np.tile(drawn, (-(-int(steps) // k), 1)), float(sync_latency_ms), "drawn")


def measure(spec, gradient_bytes, out_dir, timeout_s=600.0):
    """Run the microbenchmark on the cluster ``spec`` (its dilation included) and read rank 0's document.

    Args:
        spec: :class:`hetsync.emulation.cluster.ClusterSpec`. gradient_bytes: int >= 64, the largest message
            (the model's gradient). out_dir: str folder (``alphabeta.json``, ``launch.log``).
        timeout_s: float seconds > 0 for the launch.

    Returns:
        dict: the document (``points``, ``fit``, ``host_names``, ``dilation``), plus ``network`` (the model's
        parameters, :meth:`hetsync.sim.network.Network.describe`, in the emulated cluster's time).

    Raises:
        RuntimeError: the launch failed, timed out or wrote no document, or the fit failed (names why).
        ValueError: a gradient size below 64 bytes.
    """
    import subprocess

    from hetsync.bench import launch

    sizes_up_to(gradient_bytes)  # checked before anything is launched
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "alphabeta.json")
    cmd = launch.on_cluster(spec, ["-m", "hetsync.bench.alphabeta", "--max-bytes", str(int(gradient_bytes)),
                                   "--out", path], record=os.path.join(out_dir, launch.CLUSTER_RECORD),
                            timeout_s=timeout_s)
    try:
        proc = launch.run(cmd, timeout_s + 60.0, stall_shutdown_s=120)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the alpha-beta microbenchmark timed out after {timeout_s + 60.0:g} s") from exc
    with open(os.path.join(out_dir, "launch.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"the alpha-beta microbenchmark exited {proc.returncode} without {path}: "
                           f"{(proc.stdout + proc.stderr)[-800:]}")
    with open(path) as f:
        doc = json.load(f)
    if not doc.get("fit"):
        raise RuntimeError(f"the alpha-beta fit failed: {doc.get('error')}")
    net = network_from_fit(doc["fit"], spec.np, spec.hosts_arg(), spec.link, spec.host_links, spec.dilation)
    doc["network"] = net.describe()
    return doc


def model_figures(doc, spec, protocol, args, run_dir, measured_e, measured_sps=None):
    """A cluster run's analytic E with communication beside its measured E.

    Args:
        doc: :func:`measure`'s document (made before the cell's runs). spec: the cell's
            :class:`hetsync.emulation.cluster.ClusterSpec`. protocol: str; args: dict, the variant's arguments.
        run_dir: str, the run's folder (its ``summary.json``: ``scenario``, ``world_size``, ``batch_size``,
            ``gradient_bytes``, ``variable_bytes``). measured_e: float or None, the run's measured E (its
            samples/s over the devices' solo speeds: ``efficiency_analytic``).

    Returns:
        dict: ``efficiency_model`` (float, or None when the simulator has no model for the run),
        ``efficiency_model_error`` (str, why there is no model; None when there is one),
        ``efficiency_model_gap`` (measured / model - 1; None without both) and ``efficiency_model_gap_drawn``
        (``measured_sps`` over the model's samples/s on the device times the run itself drew inside the window
        its rate was measured in, :func:`drawn_times`, minus 1: the gap without the noise of the run's draws; None
        without ``measured_sps``, float samples/s in wall time, or without the run's step records).
    """
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    try:
        if not s.get("gradient_bytes"):
            raise ValueError("the run's summary names no gradient_bytes")
        net = network_from_fit(doc["fit"], spec.np, spec.hosts_arg(), spec.link, spec.host_links, spec.dilation)
        e = analytic_efficiency(protocol, args, s["scenario"], int(s["world_size"]), net, int(s["gradient_bytes"]),
                                int(s["batch_size"]), s.get("variable_bytes"))
    except (ValueError, KeyError, TypeError) as exc:
        return {"efficiency_model": None, "efficiency_model_gap": None, "efficiency_model_gap_drawn": None,
                "efficiency_model_error": f"{type(exc).__name__}: {exc}"[:300]}
    drawn = None
    if measured_sps:
        from hetsync.bench import efficiency
        from hetsync.sim import registry, workload

        cfg, workers, work = _model_inputs(protocol, args, int(s["world_size"]), s["gradient_bytes"],
                                           s["batch_size"], s.get("variable_bytes"))
        d = float(s.get("dilation") or spec.dilation or 1.0)
        try:
            times = drawn_times(run_dir, workers, d, workload.step_times(s["scenario"], workers, 1).sync_latency_ms,
                                window=efficiency.run_rates(run_dir)["window"])
            model_sps = registry.simulate(protocol, times, net, work, **cfg).samples_per_s  # emulated time
            drawn = float(measured_sps) * d / model_sps - 1.0
        except (ValueError, OSError, KeyError) as exc:
            print(f"no drawn-time model for {run_dir}: {exc}"[:300], file=sys.stderr)
    return {"efficiency_model": e, "efficiency_model_gap": (measured_e / e - 1.0) if measured_e and e else None,
            "efficiency_model_gap_drawn": drawn, "efficiency_model_error": None}


def main(argv=None):
    """``python -m hetsync.bench.alphabeta``: time the links on every rank; rank 0 fits and writes ``--out``.

    Args:
        argv: list of str (default ``sys.argv[1:]``): ``--max-bytes M`` (int >= 64, the largest message, the
            model's gradient size), ``--out FILE`` (JSON: the points, the fits, the world size and host names).

    Returns:
        int exit status 0.

    Raises:
        SystemExit: bad arguments (argparse names the value).
        hetsync.transport.TransportTimeout: the point-to-point peer did not answer within the transport's timeout.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-bytes", type=int, required=True, help="the largest message in bytes (the gradient's size)")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    args = p.parse_args(argv)
    try:
        sizes = sizes_up_to(args.max_bytes)
    except ValueError as exc:
        p.error(f"--max-bytes: {exc}")
    from hetsync import world
    from hetsync.advise import probe

    world.init()
    names = world.host_names()
    me = world.rank()
    peer = next((r for r, h in enumerate(names) if h != names[0]), 1 if len(names) > 1 else 0)
    points = []
    for m in sizes:
        t = probe.measure_network(m, peer, p2p=world.mpi_enabled() and len(names) > 1)
        points.append({"bytes": m, "allreduce_s": t["allreduce_s"], "p2p_s": t["p2p_s"]})
    if me == 0:
        doc = {"world_size": len(names), "host_names": names, "peer": peer, "dilation": world.dilation(),
               "points": points}
        try:
            doc["fit"] = fit_measurements(points, len(names))
        except ValueError as exc:
            doc["fit"], doc["error"] = None, str(exc)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
        print(json.dumps({"fit": doc["fit"], "error": doc.get("error")}), flush=True)
    world.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
