"""The alpha-beta network model of a cluster: hosts, slots, one link per host to a switch.

A message of ``m`` bytes between two ranks takes ``alpha + m / beta`` seconds (Hockney's model):
``alpha`` is the per-message latency (seconds) and ``beta`` the bandwidth (bytes per second) of the
slowest hop. Ranks on the same host talk through shared memory (``local_alpha_s``, ``local_bytes_per_s``);
ranks on different hosts cross both hosts' links to the switch, so the path's bandwidth is the smaller
of the two link rates; a point-to-point message between hosts (Hop's updates, a parameter server's shards) gets
``p2p_efficiency`` times that rate (1 by default; calibrated from a probe where the transport reaches less).
The hosts are written in the cluster tool's syntax (``4x2``: 4 hosts of 2 slots;
``h0:2,h1:2,h2:1``), link rates in ``tc``'s units (``10gbit``), as ``hetsync-cluster`` takes them
(:mod:`hetsync.emulation.cluster.spec`); ranks are placed on hosts in order, filling each host's slots
(``mpirun -H h0:2,h1:2``: ranks 0, 1 on h0, ranks 2, 3 on h1).

A collective over p ranks is a ring (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009; horovod's and OpenMPI's large-message algorithm): an allreduce of
m bytes sends 2 (p - 1) messages of m / p bytes along the ring, so it takes
``2 (p - 1) alpha + 2 (p - 1) / p * m / beta`` with beta the slowest edge of a ring that visits the hosts in
order (one link in and one out per host), alpha the collective's own latency per step (``collective_alpha_s``,
by default the point-to-point ``alpha``). Every collective also pays ``overhead_s`` once (the framework's
negotiation: horovod's coordinator cycle). Contention between concurrent flows on one link is not part
of a single message's time; the event simulators that need it (a parameter server's link) queue the
messages themselves.
"""
import dataclasses
import math
import re

from hetsync.emulation.cluster import spec as _cluster_spec

__all__ = ["Network", "parse_hosts", "DEFAULT_ALPHA_S", "DEFAULT_LOCAL_BYTES_PER_S", "DEFAULT_LOCAL_ALPHA_S",
           "DEFAULT_OVERHEAD_S"]

#: one-way latency of a message between hosts, seconds (a 10 Gbit/s Ethernet switch and TCP stack: 25 us).
DEFAULT_ALPHA_S = 25e-6
#: latency of a message between ranks of one host (shared memory), seconds.
DEFAULT_LOCAL_ALPHA_S = 2e-6
#: bandwidth between ranks of one host (shared memory copy), bytes per second.
DEFAULT_LOCAL_BYTES_PER_S = 5e9
#: fixed cost of one collective (negotiation among the ranks), seconds.
DEFAULT_OVERHEAD_S = 0.5e-3

_AxB = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def parse_hosts(text, np_=None):
    """Slots per host from the cluster tool's host syntax.

    Args:
        text: str, ``"NxS"`` (N hosts of S slots, e.g. ``"4x2"``), ``"h0:2,h1:2,h2:1"`` (hosts and slots, in
            order), or None for one host holding every rank (then ``np_`` is needed).
        np_: int >= 1 or None, the world size; when given, the slots must add up to it.

    Returns:
        tuple of ints > 0, the slots of each host in order.

    Raises:
        ValueError: text that does not parse, a zero slot count, or slots that do not add up to ``np_``.
    """
    if text is None or str(text).strip() in ("", "1"):
        if np_ is None or np_ < 1:
            raise ValueError(f"one host needs the world size np >= 1, got {np_!r}")
        return (int(np_),)
    m = _AxB.match(str(text))
    if m:
        slots = (int(m.group(2)),) * int(m.group(1))
    else:
        slots = []
        for i, item in enumerate(str(text).split(",")):
            name, sep, n = item.strip().partition(":")
            if not sep or not n.strip().isdigit() or name.strip() != _cluster_spec.host_name(i):
                raise ValueError(f"hosts {text!r}: give NxS (4x2) or h0:S0,h1:S1,... with the hosts named "
                                 f"h0, h1, ... in order; item {item!r} does not fit")
            slots.append(int(n))
        slots = tuple(slots)
    if not slots or min(slots) < 1:
        raise ValueError(f"hosts {text!r}: every host needs at least one slot, and at least one host")
    if np_ is not None and sum(slots) != np_:
        raise ValueError(f"hosts {text!r} hold {sum(slots)} ranks but np is {np_}: give as many slots as ranks")
    return slots


@dataclasses.dataclass(frozen=True)
class Network:
    """An alpha-beta model of hosts joined by one switch.

    Attributes:
        slots: tuple of ints > 0, ranks per host, in rank order.
        link_bytes_per_s: tuple of floats > 0 (``math.inf``: unshaped), each host's link rate in bytes per second.
        alpha_s: float >= 0, one-way latency of a message between hosts (seconds).
        local_alpha_s, local_bytes_per_s: latency (seconds) and bandwidth (bytes per second) within a host.
        overhead_s: float >= 0, fixed cost of each collective (seconds).
        p2p_efficiency: float in (0, 1], the fraction of a link's rate that point-to-point messages between hosts
            achieve (:meth:`p2p_path`): 1 is the alpha-beta ideal; an MPI transport that pickles each message and
            crosses a rate-limited link (TCP's window, the rendezvous handshake of a large message) reaches less.
            Collectives keep the full rate (a ring allreduce pipelines its segments). The validation calibrates
            it from a probe (:func:`hetsync.bench.simfit.calibrate_p2p_efficiency`).
        collective_efficiency: float in (0, 1], the same for the collectives' ring between hosts (1 by default; the
            alpha-beta microbenchmark of the links, :mod:`hetsync.bench.alphabeta`, measures it where a collective
            reaches less of the link than point-to-point messages do).
        collective_alpha_s: float >= 0 or None, the latency of one step of a collective's ring between hosts
            (seconds; None: ``alpha_s``). A collective library's transfers between hosts are not a point-to-point
            message of the application's transport (mpi4py, a receive thread): the microbenchmark measures the
            two apart, and a collective's fixed cost (its small-message time) can be far below 2 (p - 1) times a
            point-to-point message's latency.
        link_queue_s: tuple of floats >= 0 (one per host; None: no queue, every 0), seconds a small message waits
            behind a full queue of the host's outgoing link (a shaped link's buffer,
            :func:`hetsync.emulation.cluster.spec.queue_delay_s`). The parameter servers' model
            (:mod:`hetsync.sim.ps`) charges it to a large message whose receiver's clear-to-send leaves while that
            receiver's own link is sending.
    """

    slots: tuple
    link_bytes_per_s: tuple
    alpha_s: float = DEFAULT_ALPHA_S
    local_alpha_s: float = DEFAULT_LOCAL_ALPHA_S
    local_bytes_per_s: float = DEFAULT_LOCAL_BYTES_PER_S
    overhead_s: float = DEFAULT_OVERHEAD_S
    p2p_efficiency: float = 1.0
    collective_efficiency: float = 1.0
    collective_alpha_s: float = None
    link_queue_s: tuple = None

    def __post_init__(self):
        # resolved once: a dataclasses.replace(net, alpha_s=...) keeps this collective latency unless given too
        if self.collective_alpha_s is None:
            object.__setattr__(self, "collective_alpha_s", self.alpha_s)
        if len(self.slots) != len(self.link_bytes_per_s) or not self.slots:
            raise ValueError(f"need one link rate per host: {len(self.slots)} hosts, "
                             f"{len(self.link_bytes_per_s)} rates")
        queue = (0.0,) * len(self.slots) if self.link_queue_s is None else tuple(self.link_queue_s)
        if len(queue) != len(self.slots) or not all(q >= 0 and math.isfinite(q) for q in queue):
            raise ValueError(f"link_queue_s must give one finite number of seconds >= 0 per host ({len(self.slots)} "
                             f"hosts), got {self.link_queue_s!r}")
        object.__setattr__(self, "link_queue_s", tuple(float(q) for q in queue))
        if min(self.link_bytes_per_s) <= 0 or self.local_bytes_per_s <= 0:
            raise ValueError(f"bandwidths must be > 0 bytes/s, got links {self.link_bytes_per_s} and local "
                             f"{self.local_bytes_per_s}")
        for name in ("alpha_s", "local_alpha_s", "overhead_s", "collective_alpha_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
        for name in ("p2p_efficiency", "collective_efficiency"):
            if not (0.0 < getattr(self, name) <= 1.0):
                raise ValueError(f"{name} must be in (0, 1] (a fraction of the link rate), got "
                                 f"{getattr(self, name)!r}")
        object.__setattr__(self, "_host", tuple(h for h, s in enumerate(self.slots) for _ in range(s)))

    @classmethod
    def from_spec(cls, np_, hosts=None, link="10gbit", host_links=(), latency_ms=None, overhead_ms=None,
                  p2p_efficiency=1.0):
        """Build the model from the cluster tool's arguments.

        Args:
            np_: int >= 1, the world size.
            hosts: str (``"4x2"``, ``"h0:2,h1:2"``) or None (one host, every rank on it: no link is crossed).
            link: str, every host's link rate in ``tc`` units (``"10gbit"``) or ``"unshaped"``.
            host_links: iterable of ``"HOST=RATE"`` strs or ``(host, rate)`` pairs, per-host rates (``h2=2.5gbit``;
                hosts named ``h0..h<N-1>`` in order).
            latency_ms: float >= 0 or None, one-way latency between hosts in milliseconds (None: 0.025 ms).
            overhead_ms: float >= 0 or None, fixed cost per collective in milliseconds (None: 0.5 ms).
            p2p_efficiency: float in (0, 1], the fraction of the link rate point-to-point messages achieve.

        Returns:
            Network.

        Raises:
            ValueError: hosts or rates that do not parse, slots that do not add up to ``np_``, a host name
                that is not ``h0..h<N-1>``.
        """
        slots = parse_hosts(hosts, np_)
        rate = _cluster_spec.parse_rate(link) / 8.0
        rates = [rate] * len(slots)
        pairs = [tuple(p) if not isinstance(p, str) else None for p in host_links]
        if any(p is None for p in pairs):
            pairs = list(_cluster_spec.parse_host_links([p for p in host_links if isinstance(p, str)])) + \
                [p for p in pairs if p is not None]
        for host, r in pairs:
            names = [_cluster_spec.host_name(i) for i in range(len(slots))]
            if host not in names:
                raise ValueError(f"host link {host}={r}: no host {host!r}; the hosts are {', '.join(names)}")
            rates[names.index(host)] = _cluster_spec.parse_rate(r) / 8.0
        kw = {"p2p_efficiency": float(p2p_efficiency)}
        if latency_ms is not None:
            kw["alpha_s"] = float(latency_ms) / 1e3
        if overhead_ms is not None:
            kw["overhead_s"] = float(overhead_ms) / 1e3
        return cls(tuple(slots), tuple(rates), **kw)

    @property
    def size(self):
        """World size n (int)."""
        return len(self._host)

    @property
    def hosts(self):
        """Number of hosts (int)."""
        return len(self.slots)

    def host_of(self, rank):
        """Host index (int) of ``rank`` (int in [0, n))."""
        return self._host[rank]

    def path(self, src, dst):
        """``(alpha_s, bytes_per_s)`` of the path from rank ``src`` to rank ``dst`` (ints)."""
        hs, hd = self._host[src], self._host[dst]
        if hs == hd:
            return self.local_alpha_s, self.local_bytes_per_s
        return self.alpha_s, min(self.link_bytes_per_s[hs], self.link_bytes_per_s[hd])

    def p2p_path(self, src, dst):
        """``(alpha_s, bytes_per_s)`` of a point-to-point message from rank ``src`` to rank ``dst`` (ints): the
        :meth:`path`, its rate times ``p2p_efficiency`` between hosts."""
        a, b = self.path(src, dst)
        return (a, b) if self._host[src] == self._host[dst] else (a, b * self.p2p_efficiency)

    def p2p_s(self, nbytes, src, dst):
        """Seconds (float) for one point-to-point message of ``nbytes`` (int >= 0) from rank ``src`` to rank
        ``dst``: alpha + m / beta on the :meth:`p2p_path`."""
        a, b = self.p2p_path(src, dst)
        return a + nbytes / b

    def ring(self, ranks=None):
        """``(alpha_s, bytes_per_s)`` of the slowest edge of a ring over ``ranks`` (default all) in rank order
        (between hosts the latency is ``collective_alpha_s``)."""
        ranks = list(range(self.size)) if ranks is None else sorted(ranks)
        if len(ranks) < 2:
            return 0.0, math.inf
        hosts = {self._host[r] for r in ranks}
        if len(hosts) == 1:
            return self.local_alpha_s, self.local_bytes_per_s
        return self.collective_alpha_s, min(min(self.link_bytes_per_s[h] for h in hosts) * self.collective_efficiency,
                                 self.local_bytes_per_s)

    def allreduce_s(self, nbytes, ranks=None):
        """Seconds (float) of a ring allreduce of ``nbytes`` (per rank, int >= 0) over ``ranks`` (default all):
        overhead + 2 (p - 1) alpha + 2 (p - 1) / p * m / beta; 0 for one rank."""
        p = self.size if ranks is None else len(ranks)
        if p < 2:
            return 0.0
        a, b = self.ring(ranks)
        return self.overhead_s + 2 * (p - 1) * a + 2.0 * (p - 1) / p * nbytes / b

    def broadcast_s(self, nbytes, ranks=None):
        """Seconds (float) of a pipelined ring broadcast of ``nbytes`` over ``ranks`` (default all):
        overhead + (p - 1) alpha + m / beta."""
        p = self.size if ranks is None else len(ranks)
        if p < 2:
            return 0.0
        a, b = self.ring(ranks)
        return self.overhead_s + (p - 1) * a + nbytes / b

    def describe(self):
        """A dict of the model's parameters for a report: hosts, slots, link rates (Gbit/s), alpha and the
        collective's alpha (ms), overhead (ms), the transports' efficiencies."""
        return {"hosts": self.hosts, "slots": list(self.slots),
                "link_gbit_s": [None if math.isinf(b) else b * 8 / 1e9 for b in self.link_bytes_per_s],
                "alpha_ms": self.alpha_s * 1e3, "collective_alpha_ms": self.collective_alpha_s * 1e3,
                "overhead_ms": self.overhead_s * 1e3,
                "local_gbyte_s": self.local_bytes_per_s / 1e9, "p2p_efficiency": self.p2p_efficiency,
                "collective_efficiency": self.collective_efficiency,
                "link_queue_ms": [q * 1e3 for q in self.link_queue_s]}
