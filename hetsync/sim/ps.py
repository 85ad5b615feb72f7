"""Parameter-server protocols (ASP, SHAT, SHAT-root, ENSEMBLE, SSP): an event simulation of pushes and pulls.

What hetsync's implementation does (:mod:`hetsync.protocols.ps.worker`, ``server``, ``shat``, ``ssp``) and so
what is modelled:

* **Roles.** The last K ranks of the launch (``servers=K``) are the parameter servers, ranks 0 .. n - 1 the
  n workers (SHAT section III); the world size is n + K. Ranks fill the hosts' slots in order
  (:class:`hetsync.sim.network.Network`), so a server may share a host (and its link) with workers.
* **Sharding** (SHAT section 4.4). Server k owns one contiguous range of the flat float32 parameter
  vector. ``"memory"``: K chunks whose sizes differ by at most one element (4 bytes), so every server gets
  m / K bytes. ``"layer"``: whole variables in contiguous blocks of ceil(L / K) or floor(L / K) variables
  per server, so the bytes per server can be very unbalanced (the example MLP's first kernel holds 98.6 %
  of its parameters). The variables' sizes are not part of a :class:`hetsync.sim.workload.Workload`: give
  them as ``layer_bytes`` (bytes of each trainable variable in model order, adding up to ``model_bytes``);
  without it the model is taken as K variables of equal size, and layer-wise sharding equals memory-wise.
* **A worker step** (Algorithm 1, lines 3-8): compute (device time T_i(k) plus ``host_ms``), then, between
  steps, push one message per server (the gradient shard, non-blocking sends issued in server order), and
  wait for every server's reply, which carries the server's whole shard of w~ (the pull) and c_i. So
  every step moves each shard once in each direction, and the worker blocks until its last reply
  arrives. The mixing (alpha) costs no time here; ASP, SHAT and SHAT-root time alike.
* **ENSEMBLE.** The paper's ENSEMBLE trains locally with no traffic; hetsync's implementation still
  pushes and pulls every step (alpha = 0 only means the reply never changes the worker), so it is timed
  exactly like ASP. On a free network its throughput is the sum of the workers' own rates.
* **The server** serves the pushes one at a time in arrival order: each costs ``server_ms`` (default 0:
  the float32 update is negligible next to the transfer), then the reply leaves at once, or under SSP
  when the gate opens: the reply to the push of iteration t waits until the slowest worker's clock (its
  pushes applied at that server) is at least t + 1 - s (Ho et al. 2013; s = 0 is a barrier per step, BSP).
  Each server keeps its own clocks and gate, as in the implementation.
* **The network** (full duplex, every host's link shaped in each direction, as the emulated cluster's
  ``tc`` does): a message between two hosts occupies the sender's uplink for m / rate_src and the
  receiver's downlink for m / rate_dst, each link one message at a time, FIFO, cut-through (it may start
  on the downlink as soon as it started on the uplink and ends no earlier than its last byte left), then
  arrives ``alpha`` later; alone on idle links it takes ``alpha + m / min(rates)``, the alpha-beta time of
  :meth:`hetsync.sim.network.Network.p2p_s`. Messages within a host take ``local_alpha + m / local_rate``
  and queue nowhere. So many workers on one server share its downlink (pushes) and its uplink (replies):
  with fast workers, one server of link rate r bounds the job to r / m steps per second (r / (m / K) with
  K memory-wise servers on their own hosts).
* **The receiver takes one message at a time** (the transport's receive thread matches a message, receives
  it whole, then matches the next; OpenMPI sends a large message's bulk only once its receiver matched it and
  the clear-to-send came back): a message's bytes enter its receiver's downlink no earlier than the arrival
  of the message that receiver took before it, so messages queued for one server are ``alpha`` apart on its
  link rather than back to back. The clear-to-send leaves on the receiver's own uplink: when that link is
  sending at that moment (a server's replies), it waits behind the link's queue, ``net.link_queue_s`` of the
  receiver's host (a shaped link's buffer, :func:`hetsync.emulation.cluster.spec.queue_delay_s`; 0 without
  one). Measured on the emulated cluster (6 workers pushing 4.46 MB to one server at 1 Gbit/s, D = 40): a
  push every 1.52 s of wall time with 4.5 KB replies, where the bytes alone take 1.48 s at the fitted rate,
  and about 0.08 s more per push with full replies.
* **Staleness.** ``staleness_mean`` is the mean number of updates other workers applied at a server
  between the moment a worker's reply (pull) left and the moment its next push was applied (for ASP and
  SHAT: the counter c_i of Algorithm 1), averaged over servers and pushes; ENSEMBLE's workers apply only
  their own gradients (0; the server-side figure is in ``extra["server_lag_mean"]``).

Differences from the implementation the model ignores: a ``netdelay`` scenario's latency
(``times.sync_latency_ms``) delays only collectives inside the compiled step, never ``ps.push`` or
``ps.pull`` (``docs/protocols/shat.md``), so it is not added here; the dispatcher's receive thread polls
every 0.5 ms and pickles each message (fold such costs into ``server_ms`` and ``host_ms``); TCP flows
share a link rather than queueing whole messages; the data plan's pool requests (``data_plan="pool"``) and
the ``done`` messages at the end are not timed.
"""
import collections
import heapq
import math

import numpy as np

from hetsync.sim.result import SimResult, throughput_until

__all__ = ["simulate", "plan_shard_bytes", "PROTOCOLS"]

#: the parameter-server protocols this model times.
PROTOCOLS = ("asp", "shat", "shatroot", "ensemble", "ssp")

# configuration keys (the fields of PSConfig and its subclasses) -> default; timeout_s, data_plan and
# log_base do not change the timing and are accepted so that a protocol's whole configuration can be passed.
_COMMON = {"servers": 1, "sharding": "memory", "timeout_s": 120.0, "data_plan": "pool", "layer_bytes": None,
           "server_ms": 0.0}
_KEYS = {"asp": dict(_COMMON), "shat": dict(_COMMON, log_base=math.e), "shatroot": dict(_COMMON),
         "ensemble": dict(_COMMON), "ssp": dict(_COMMON, staleness=3)}

_COMPUTE, _DOWN_PUSH, _ARRIVE, _APPLIED, _DOWN_REPLY, _RECEIVED = range(6)


def plan_shard_bytes(model_bytes, servers, sharding="memory", layer_bytes=None):
    """Bytes of each server's shard (SHAT section 4.4; the rule of ``hetsync.protocols.ps.server.plan_shards``).

    Args:
        model_bytes: int > 0, bytes of the flat float32 parameter vector m.
        servers: int K >= 1, the number of parameter servers.
        sharding: ``"memory"`` (K contiguous chunks differing by at most one 4-byte element) or ``"layer"``
            (whole variables, contiguous blocks of ceil(L / K) or floor(L / K) variables per server).
        layer_bytes: None or a sequence of L ints >= 0, bytes of each trainable variable in model order,
            adding up to ``model_bytes`` (used by ``"layer"``; None: K variables of equal size).

    Returns:
        list of K ints, the bytes server k holds (and receives and sends per worker step); they add up to
        ``model_bytes``.

    Raises:
        ValueError: an unknown sharding, K < 1, ``layer_bytes`` that are negative or do not add up to
            ``model_bytes``, or more servers than variables (``"layer"``) or elements (``"memory"``).
    """
    if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or servers < 1:
        raise ValueError(f"servers must be an int >= 1 (parameter-server ranks), got {servers!r}")
    if sharding not in ("layer", "memory"):
        raise ValueError(f"sharding must be 'layer' or 'memory', got {sharding!r}")
    servers = int(servers)
    item = 4 if model_bytes % 4 == 0 else 1
    elements = model_bytes // item

    def even(k):
        q, r = divmod(elements, k)
        return [(q + (1 if i < r else 0)) * item for i in range(k)]

    if layer_bytes is not None:
        layer_bytes = [int(b) for b in layer_bytes]
        if not layer_bytes or min(layer_bytes) < 0 or sum(layer_bytes) != model_bytes:
            raise ValueError(f"layer_bytes must be a non-empty list of ints >= 0 (bytes of each trainable variable) "
                             f"adding up to model_bytes={model_bytes}, got {len(layer_bytes)} values adding up to "
                             f"{sum(layer_bytes)}")
    if sharding == "memory":
        if servers > elements:
            raise ValueError(f"more servers than parameters: the model has {elements} parameter(s) for "
                             f"servers={servers}")
        return even(servers)
    sizes = even(servers) if layer_bytes is None else layer_bytes
    if servers > len(sizes):
        raise ValueError(f"more servers than parameters: layer-wise sharding gives whole variables to servers and "
                         f"layer_bytes names {len(sizes)} variable(s) for servers={servers}; use servers <= "
                         f"{len(sizes)} or sharding='memory'")
    q, r = divmod(len(sizes), servers)
    out, first = [], 0
    for k in range(servers):
        c = q + (1 if k < r else 0)
        out.append(int(sum(sizes[first:first + c])))
        first += c
    return out


def _config(protocol, config):
    if protocol not in _KEYS:
        raise ValueError(f"the parameter-server model times {', '.join(PROTOCOLS)}; got protocol {protocol!r}")
    allowed = _KEYS[protocol]
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"{protocol}: unknown parameter(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(allowed))}")
    cfg = dict(allowed, **config)
    s = cfg.get("staleness")
    if protocol == "ssp" and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0):
        raise ValueError(f"ssp: staleness must be an int >= 0 (iterations), got {s!r}")
    sm = cfg["server_ms"]
    if isinstance(sm, bool) or not isinstance(sm, (int, float, np.number)) or not (sm >= 0 and math.isfinite(sm)):
        raise ValueError(f"server_ms must be a finite number of milliseconds >= 0, got {sm!r}")
    return cfg


def simulate(times, net, work, protocol="asp", **config):
    """Simulate a parameter-server protocol: ASP, SHAT, SHAT-root, ENSEMBLE (SHAT Algorithm 1, section 4.1.2)
    or SSP (Ho et al. 2013, the staleness bound s), by events (a heap) over workers, servers and links.

    Args:
        times: :class:`hetsync.sim.workload.StepTimes`, ``ms`` float64 [K, n] device milliseconds of the n
            workers (one column per worker; servers compute nothing).
        net: :class:`hetsync.sim.network.Network` over the whole launch: n workers then K servers
            (``net.size`` = n + ``servers``).
        work: :class:`hetsync.sim.workload.Workload` (``model_bytes`` m, ``batch_size`` b, ``host_ms``).
        protocol: str, one of :data:`PROTOCOLS`.
        **config: the protocol's configuration fields: ``servers`` (int K >= 1, default 1), ``sharding``
            (``"memory"`` default, or ``"layer"``), ``staleness`` (SSP only, int s >= 0, default 3),
            ``layer_bytes`` (list of ints, bytes per trainable variable in model order, for ``"layer"``;
            default K equal variables), ``server_ms`` (float >= 0 milliseconds per push served, default 0);
            ``timeout_s``, ``data_plan`` and (SHAT) ``log_base`` are accepted and do not change the timing.

    Returns:
        :class:`hetsync.sim.result.SimResult`: ``samples_per_s`` of the workers until the first worker ran
        out of draws, ``steps`` and ``wait_s`` (seconds blocked in the push/pull exchange, SSP's gate
        included) per worker, ``rounds`` = updates (pushes applied) at server 0, ``contributors_per_round``
        1.0, ``staleness_mean`` (updates by other workers between a worker's pull and its push; 0 for
        ENSEMBLE), and ``extra``: ``server_link_utilisation`` (per server, the busier direction of its host's
        link, fraction of the window), ``server_link_in_utilisation``, ``server_link_out_utilisation``,
        ``bytes_per_server`` (ints), ``updates_per_server``, ``server_lag_mean``; SSP adds ``gate_max_lead``
        (<= s) and ``gate_held_replies``.

    Raises:
        ValueError: an unknown protocol or configuration key (names the allowed ones), a value out of range,
            or step times whose worker count plus ``servers`` is not ``net.size``.
    """
    cfg = _config(protocol, config)
    K = cfg["servers"]
    T = np.asarray(times.ms, dtype=np.float64)
    if T.ndim != 2 or T.shape[0] < 1 or T.shape[1] < 1:
        raise ValueError(f"times.ms must be a [K, workers] array with K >= 1 and workers >= 1, got shape {T.shape}")
    steps_k, n = T.shape
    shard = plan_shard_bytes(work.model_bytes, K, cfg["sharding"], cfg["layer_bytes"])
    if n + K != net.size:
        raise ValueError(f"{protocol}: the step times have one column per worker ({n} workers) and servers={K}, so "
                         f"the launch has {n + K} ranks, but the network has {net.size}")
    gate = int(cfg["staleness"]) if protocol == "ssp" else None
    server_ms = float(cfg["server_ms"])
    host = float(work.host_ms)

    # -- static tables (milliseconds) ------------------------------------------------------------------
    hosts = [net.host_of(r) for r in range(n + K)]
    rate = [r * net.p2p_efficiency for r in net.link_bytes_per_s]  # point-to-point shards
    w_host = hosts[:n]
    s_host = hosts[n:]
    alpha_ms = net.alpha_s * 1e3
    # per (host, server) link occupancy of one shard, and the local-path time of one shard
    link_ms = [[shard[j] / rate[h] * 1e3 for j in range(K)] for h in range(net.hosts)]
    local_ms = [net.local_alpha_s * 1e3 + shard[j] / net.local_bytes_per_s * 1e3 for j in range(K)]
    queue_ms = [q * 1e3 for q in net.link_queue_s]
    up_free = [0.0] * net.hosts
    down_free = [0.0] * net.hosts
    receiving = [False] * (n + K)  # a rank's receive thread is taking a message between hosts
    inbox = [collections.deque() for _ in range(n + K)]  # (is_reply, worker, server, uplink end) waiting
    srv_hosts = set(s_host)
    busy_in = {h: ([], []) for h in srv_hosts}  # starts, ends of each message's occupancy
    busy_out = {h: ([], []) for h in srv_hosts}

    Tl = (T + host).tolist()
    ends = np.full((steps_k, n), np.inf)
    cdone = np.full((steps_k, n), np.inf)
    step = [0] * n
    pend = [0] * n
    last_arr = [0.0] * n
    horizon = [math.inf]

    updates = [0] * K
    pulled_at = [[0] * n for _ in range(K)]
    clocks = [[0] * n for _ in range(K)]
    lag_sum = [0]
    lag_count = [0]
    srv_free = [0.0] * K
    # SSP: count of workers at each clock, the min clock, held replies (iteration, apply order, worker)
    at_clock = [[n] + [0] * (steps_k + 1) for _ in range(K)]
    min_clock = [0] * K
    held = [[] for _ in range(K)]
    gate_stats = {"max_lead": 0, "held": 0}
    order = [0]

    heap = []
    seq = [0]

    def push_event(t, kind, a, b, c):
        seq[0] += 1
        heapq.heappush(heap, (t, seq[0], kind, a, b, c))

    def offer(t, is_reply, w, j, ue):
        # a message between hosts is ready at t (its first bytes left the sender): its receiver takes it now or after
        # the messages before it
        rr = w if is_reply else n + j
        if receiving[rr]:
            inbox[rr].append((is_reply, w, j, ue))
        else:
            take(t, rr, is_reply, w, j, ue)

    def take(t, rr, is_reply, w, j, ue):
        # the receiver rr matched the message at t: its clear-to-send leaves on rr's uplink (behind that link's queue
        # when it is sending), then the bytes hold rr's downlink for d ms, ending no earlier than the uplink's end ue
        hd = w_host[w] if is_reply else s_host[j]
        d = link_ms[hd][j]
        go = t + queue_ms[hd] if up_free[hd] > t else t
        s2 = go if go >= down_free[hd] else down_free[hd]
        f2 = s2 + d
        if ue > f2:
            f2 = ue
        down_free[hd] = f2
        if hd in srv_hosts:
            b = busy_in[hd]
            b[0].append(f2 - d)
            b[1].append(f2)
        receiving[rr] = True
        push_event(f2 + alpha_ms, _RECEIVED, w, j, 1.0 if is_reply else 0.0)

    def received(t, w, j, is_reply):
        # the message is in: handled first (a server's reply leaves now), then the receiver takes the next one
        rr = w if is_reply else n + j
        receiving[rr] = False
        if is_reply:
            got_reply(w, t)
        else:
            arrive(t, j, w)
        if inbox[rr] and not receiving[rr]:
            take(t, rr, *inbox[rr].popleft())

    def up(hs, t, d):
        s1 = t if t >= up_free[hs] else up_free[hs]
        up_free[hs] = s1 + d
        if hs in srv_hosts:
            b = busy_out[hs]
            b[0].append(s1)
            b[1].append(s1 + d)
        return s1

    def got_reply(w, arr):
        if arr > last_arr[w]:
            last_arr[w] = arr
        pend[w] -= 1
        if pend[w]:
            return
        k = step[w]
        end = last_arr[w]
        ends[k, w] = end
        k += 1
        step[w] = k
        if k == steps_k:
            if end < horizon[0]:
                horizon[0] = end
            return
        c = end + Tl[k][w]
        cdone[k, w] = c
        push_event(c, _COMPUTE, w, 0, 0.0)

    def send_reply(t, j, w):
        pulled_at[j][w] = updates[j]
        hs, hw = s_host[j], w_host[w]
        if hs == hw:
            got_reply(w, t + local_ms[j])
            return
        s1 = up(hs, t, link_ms[hs][j])
        ue = s1 + link_ms[hs][j]
        if s1 <= t:
            offer(t, True, w, j, ue)
        else:
            push_event(s1, _DOWN_REPLY, w, j, ue)

    def applied(t, j, w):
        lag_sum[0] += updates[j] - pulled_at[j][w]
        lag_count[0] += 1
        updates[j] += 1
        cl = clocks[j]
        old = cl[w]
        cl[w] = old + 1
        if gate is None:
            send_reply(t, j, w)
            return
        ac = at_clock[j]
        ac[old] -= 1
        ac[old + 1] += 1
        m = min_clock[j]
        while ac[m] == 0:
            m += 1
        min_clock[j] = m
        order[0] += 1
        hq = held[j]
        heapq.heappush(hq, (old, order[0], w))
        ready = []
        while hq and hq[0][0] + 1 - gate <= m:
            ready.append(heapq.heappop(hq))
        if not any(r[2] == w and r[0] == old for r in ready):
            gate_stats["held"] += 1
        ready.sort(key=lambda r: r[1])
        for it, _, v in ready:
            lead = it + 1 - m
            if lead > gate_stats["max_lead"]:
                gate_stats["max_lead"] = lead
            send_reply(t, j, v)

    def arrive(t, j, w):
        if server_ms <= 0.0:
            applied(t, j, w)
            return
        start = t if t >= srv_free[j] else srv_free[j]
        srv_free[j] = start + server_ms
        push_event(start + server_ms, _APPLIED, w, j, 0.0)

    for w in range(n):
        cdone[0, w] = Tl[0][w]
        push_event(Tl[0][w], _COMPUTE, w, 0, 0.0)

    pop = heapq.heappop
    while heap:
        t, _, kind, a, b, c = heap[0]
        if t > horizon[0]:
            break
        pop(heap)
        if kind == _COMPUTE:
            w = a
            pend[w] = K
            last_arr[w] = t
            hw = w_host[w]
            for j in range(K):
                hs = s_host[j]
                if hs == hw:
                    push_event(t + local_ms[j], _ARRIVE, w, j, 0.0)
                    continue
                d = link_ms[hw][j]
                s1 = up(hw, t, d)
                if s1 <= t:
                    offer(t, False, w, j, s1 + d)
                else:
                    push_event(s1, _DOWN_PUSH, w, j, s1 + d)
        elif kind == _DOWN_PUSH:
            offer(t, False, a, b, c)
        elif kind == _ARRIVE:
            arrive(t, b, a)
        elif kind == _APPLIED:
            applied(t, b, a)
        elif kind == _DOWN_REPLY:
            offer(t, True, a, b, c)
        else:  # _RECEIVED
            received(t, a, b, c > 0.5)

    H = horizon[0]
    sps, done = throughput_until(ends, work.batch_size, H)
    wait = np.clip(np.minimum(ends, H) - np.minimum(cdone, H), 0.0, None).sum(axis=0) / 1e3

    def util(busy, h):
        st, en = (np.asarray(x, dtype=np.float64) for x in busy[h])
        return float((np.minimum(en, H) - np.minimum(st, H)).sum() / H) if st.size else 0.0

    u_in = [util(busy_in, h) for h in s_host]
    u_out = [util(busy_out, h) for h in s_host]
    lag = lag_sum[0] / lag_count[0] if lag_count[0] else 0.0
    extra = {"server_link_utilisation": [max(a, b) for a, b in zip(u_in, u_out)],
             "server_link_in_utilisation": u_in, "server_link_out_utilisation": u_out,
             "bytes_per_server": [int(x) for x in shard], "updates_per_server": list(updates),
             "server_lag_mean": lag, "servers": K, "sharding": cfg["sharding"], "server_ms": server_ms}
    if gate is not None:
        extra.update(staleness=gate, gate_max_lead=int(gate_stats["max_lead"]),
                     gate_held_replies=int(gate_stats["held"]))
    return SimResult(protocol, n + K, n, sps, H / 1e3, [int(x) for x in done], [float(x) for x in wait],
                     rounds=int(updates[0]), contributors_per_round=1.0,
                     staleness_mean=0.0 if protocol == "ensemble" else float(lag), extra=extra)
