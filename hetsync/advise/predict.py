"""Rank the protocols for a cluster from the timing simulator and the measured statistical efficiency.

TF-free: used by ``python -m hetsync.advise --predict`` (no probe) and by the probe's rank 0 once it has
measured the cluster. Each protocol is simulated (:func:`hetsync.sim.registry.simulate`) on the same drawn
step times and network model; its time to target relative to BSP is ``SE_p * S_p / S_BSP`` (> 1 is faster;
:func:`hetsync.sim.target.speedup_vs_bsp`), where SE_p is the protocol's statistical efficiency measured in
the recorded benchmarks (1.0, flagged, where none was measured). The first of the ranking is recommended,
with the reasons the simulation gives (how long BSP's ranks wait, the network's share of a BSP step, how
many ranks a partial round carries).
"""
import dataclasses

from hetsync.sim import network as _network
from hetsync.sim import registry as _registry
from hetsync.sim import target as _target
from hetsync.sim import workload as _workload

__all__ = ["DEFAULT_PROTOCOLS", "DEFAULT_CONFIGS", "TIE_BAND", "FREE_RUNNING", "Inputs", "predict", "first_choice",
           "recommend", "rows_table", "inputs_from_args"]

#: what ``--predict`` ranks by default: the protocols that need no server ranks (every rank computes).
DEFAULT_PROTOCOLS = ("bsp", "rna", "hop", "localsgd", "fedavg", "selsync", "taskalloc")
#: the configuration each protocol is predicted (and recommended) with, where its default is not the useful one:
#: task allocation's default ``static`` mode with no weights is BSP; ``adaptive`` follows the measured speeds.
DEFAULT_CONFIGS = {"taskalloc": {"mode": "adaptive"}}
#: a protocol within this fraction of the best is a tie: the simpler (earlier in DEFAULT_PROTOCOLS) wins.
TIE_BAND = 0.05


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a prediction is made from.

    Attributes:
        times: :class:`hetsync.sim.workload.StepTimes` [K, n] of every rank (servers excluded).
        net: :class:`hetsync.sim.network.Network` of the launch (servers included for server protocols).
        work: :class:`hetsync.sim.workload.Workload`.
        servers: int >= 0, server ranks a server protocol would use (they come on top of the ranks of ``times``).
        hosts: str or None, the hosts in the cluster tool's syntax (for the report). link: str, the link rate.
    """

    times: object
    net: object
    work: object
    servers: int = 1
    hosts: object = None
    link: str = "10gbit"


def _net_for(inputs, protocol):
    if protocol in _registry.SERVER_PROTOCOLS:
        n = inputs.times.n + inputs.servers
        base = inputs.net
        slots = list(base.slots) + [1] * inputs.servers
        rates = list(base.link_bytes_per_s) + [max(base.link_bytes_per_s)] * inputs.servers
        return _network.Network(tuple(slots), tuple(rates), base.alpha_s, base.local_alpha_s, base.local_bytes_per_s,
                                base.overhead_s) if n != base.size else base
    return inputs.net


#: the protocols whose ranks run free of each other (no collective every step): on fixed equal shares
#: (``fixed_shares=True``) each rank runs the same steps, so the slowest rank's step count sets the throughput.
FREE_RUNNING = ("rna", "hop", "notifyack", "asp", "shat", "shatroot", "ensemble", "ssp", "rnah")


def first_choice(rows, order=DEFAULT_PROTOCOLS):
    """The recommended row: the best predicted time to target, where rows within :data:`TIE_BAND` of the best
    tie and the one earliest in ``order`` (the simpler protocol) wins.

    Args:
        rows: non-empty list of :func:`predict` rows. order: sequence of protocol names, simplest first.

    Returns:
        one of ``rows`` (dict).

    Raises:
        ValueError: ``rows`` is empty.
    """
    if not rows:
        raise ValueError("no protocol to choose from")
    rank = {p: i for i, p in enumerate(order)}
    best = max(row["time_to_target_vs_bsp"] for row in rows)
    ties = [row for row in rows if row["time_to_target_vs_bsp"] >= best * (1 - TIE_BAND)]
    return min(ties, key=lambda row: rank.get(row["protocol"], len(rank)))


def predict(inputs, protocols=DEFAULT_PROTOCOLS, configs=None, table=None, fixed_shares=False):
    """Simulate each protocol and rank them by predicted time to target relative to BSP.

    Args:
        inputs: :class:`Inputs`.
        protocols: iterable of protocol names (:func:`hetsync.sim.registry.names`); BSP is always simulated.
        configs: dict protocol -> dict of its timing parameters (default: :data:`DEFAULT_CONFIGS`, else each
            protocol's defaults).
        table: statistical-efficiency table (default :data:`hetsync.sim.target.TABLE`).
        fixed_shares: bool, the ranks train on fixed equal shares (the shard plan, every rank the same steps per
            epoch) instead of the sample pool: the throughput of a protocol of :data:`FREE_RUNNING` is then its
            slowest rank's (``samples/s x min(steps) / mean(steps)``); pass ``data_plan="shard"`` in ``configs``
            for local SGD and FedAvg, whose models have the plan.

    Returns:
        list of dicts, best first: ``protocol``, ``samples_per_s`` (float), ``samples_per_s_vs_bsp`` (float),
        ``time_to_target_vs_bsp`` (float, > 1 is faster), ``statistical_efficiency`` (float), ``se_source``
        (str: ``"measured"``, ``"reference"``, ``"as <family>"`` or ``"assumed (lowest measured)"``), ``config`` (dict), ``contributors_per_round``, ``staleness_mean``, ``wait_share`` (float in [0, 1]:
        the workers' mean blocked time over the simulated time), ``workers`` (int).

    Raises:
        ValueError: an unknown protocol (names the known ones).
    """
    configs = {**DEFAULT_CONFIGS, **(configs or {})}
    names = list(dict.fromkeys(["bsp", *protocols]))
    for p in names:
        if p not in _registry.MODELS:
            raise ValueError(f"no timing model for protocol {p!r}; known: {', '.join(_registry.names())}")
    results = {}
    for p in names:
        cfg = dict(configs.get(p, {}))
        if p in _registry.SERVER_PROTOCOLS:
            cfg.setdefault("servers", inputs.servers)
        results[p] = (_registry.simulate(p, inputs.times, _net_for(inputs, p), inputs.work, **cfg), cfg)
    bsp = results["bsp"][0].samples_per_s
    rows = []
    for p, (r, cfg) in results.items():
        rate = r.samples_per_s
        if fixed_shares and p in FREE_RUNNING and r.steps and sum(r.steps):
            rate *= min(r.steps) / (sum(r.steps) / len(r.steps))
        speed, se, source = _target.speedup_vs_bsp(p, rate, bsp, table)
        wait = sum(r.wait_s) / max(len(r.wait_s), 1) / r.duration_s if r.duration_s else 0.0
        rows.append({"protocol": p, "samples_per_s": rate, "samples_per_s_vs_bsp": rate / bsp,
                     "time_to_target_vs_bsp": speed, "statistical_efficiency": se, "se_source": source,
                     "config": cfg, "contributors_per_round": r.contributors_per_round,
                     "staleness_mean": r.staleness_mean, "wait_share": wait, "workers": r.workers,
                     "extra": {k: v for k, v in r.extra.items() if isinstance(v, (int, float, str, type(None)))}})
    rows.sort(key=lambda row: -row["time_to_target_vs_bsp"])
    first = first_choice(rows)
    rows.remove(first)
    return [first] + rows


def recommend(rows, inputs):
    """The recommendation: the first row, its configuration and the reasons.

    Args:
        rows: :func:`predict`'s list. inputs: :class:`Inputs`.

    Returns:
        dict: ``protocol``, ``config``, ``time_to_target_vs_bsp``, ``reasons`` (list of str).
    """
    first = rows[0]
    bsp = next(r for r in rows if r["protocol"] == "bsp")
    mean = inputs.times.mean_ms()
    reasons = [f"BSP's ranks wait {bsp['wait_share'] * 100:.0f}% of the time for the slowest rank and the "
               f"allreduce (step-time spread: mean {mean.mean():.1f} ms, slowest rank's mean {mean.max():.1f} ms)"]
    ar = bsp["extra"].get("allreduce_ms")
    if ar is not None:
        step = 1e3 * bsp["workers"] * inputs.work.batch_size / bsp["samples_per_s"]
        reasons.append(f"the allreduce of {inputs.work.model_bytes / 1e6:.2f} MB takes {ar:.1f} ms, "
                       f"{ar / step * 100:.0f}% of a BSP step")
    if first["protocol"] != "bsp":
        reasons.append(f"{first['protocol']} is predicted {first['samples_per_s_vs_bsp']:.2f}x BSP's samples/s"
                       + (f", with {first['contributors_per_round']:.1f} of {first['workers']} ranks per round"
                          if first["contributors_per_round"] is not None and first["protocol"] in ("rna", "rnah")
                          else ""))
    src = first["se_source"]
    reasons.append(f"statistical efficiency {first['statistical_efficiency']:.2f} ("
                   + ("measured in the recorded benchmarks" if src in ("measured", "reference") else
                      f"not measured for {first['protocol']}: {src}") + ")")
    return {"protocol": first["protocol"], "config": first["config"],
            "time_to_target_vs_bsp": first["time_to_target_vs_bsp"], "reasons": reasons}


def rows_table(rows):
    """The ranking as a list of table rows (lists of str) and their headers, for ``tabulate``."""
    headers = ["rank", "protocol", "samples/s", "vs BSP", "statistical eff.", "time to target vs BSP", "ranks/round"]
    body = []
    for i, r in enumerate(rows, 1):
        body.append([i, r["protocol"], f"{r['samples_per_s']:.0f}", f"{r['samples_per_s_vs_bsp']:.2f}x",
                     f"{r['statistical_efficiency']:.2f}" + ("" if r["se_source"] in ("measured", "reference")
                                                      else f" ({r['se_source']})"),
                     f"{r['time_to_target_vs_bsp']:.2f}x",
                     "" if r["contributors_per_round"] is None else f"{r['contributors_per_round']:.1f}"])
    return body, headers


def inputs_from_args(scenario, np_, hosts=None, link="10gbit", host_links=(), latency_ms=None, batch_size=None,
                     step_ms=None, model_mb=None, host_ms=0.0, servers=1, steps=400, seed=0):
    """:class:`Inputs` from the command line's values (``--predict``).

    Args:
        scenario: str slowdown spec. ``np_``: int >= 1 ranks that compute. hosts: str or None (cluster tool syntax).
        link: str rate. host_links: iterable of ``HOST=RATE``. latency_ms: float or None.
        batch_size: int or None (the example job's 32). step_ms: float or None, the base step without ``device:MS``.
        model_mb: float or None, megabytes (1e6 bytes) of one gradient (None: the example job's MLP, 0.41 MB).
        host_ms: float >= 0 ms of host work per step. servers: int. steps: int draws per rank. seed: int.

    Returns:
        :class:`Inputs`.

    Raises:
        ValueError: any value out of range (names it).
    """
    if isinstance(np_, bool) or not isinstance(np_, int) or np_ < 1:
        raise ValueError(f"--np must be an integer >= 1 (ranks), got {np_!r}")
    if model_mb is not None and not model_mb > 0:
        raise ValueError(f"--model-mb must be > 0 megabytes, got {model_mb!r}")
    times = _workload.step_times(scenario, np_, steps, step_ms=step_ms, seed=seed)
    net = _network.Network.from_spec(np_, hosts=hosts, link=link, host_links=host_links, latency_ms=latency_ms)
    work = _workload.Workload(model_bytes=int(model_mb * 1e6) if model_mb else _workload.EXAMPLE_MODEL_BYTES,
                              batch_size=int(batch_size or _workload.EXAMPLE_BATCH_SIZE), host_ms=float(host_ms))
    return Inputs(times, net, work, int(servers), hosts, link)
