"""What an emulated cluster is: hosts, slots, link rates, dilation; checked before anything is created.

Rates use ``tc``'s units (``100mbit``, ``1gbit``, ``10gbit``, ``500kbit``; bits per second) and are the
rates of the cluster being *emulated*; the links are shaped to rate / D, where D is the time dilation
(:attr:`ClusterSpec.dilation`): device time and link rate scale together, so a machine too small to
keep up in real time emulates the same cluster slower. The rate :data:`UNSHAPED` (``"unshaped"``) leaves
a link without a token bucket (as fast as this machine's kernel moves bytes between namespaces): the
reference run of the communication share ``comm_fraction``.
"""
import math
import dataclasses
import re

__all__ = ["ClusterSpec", "parse_rate", "parse_host_links", "format_rate", "MAX_HOSTS", "ADDRESS_PREFIX", "host_name", "host_address", "UNSHAPED",
           "parse_host_slots", "QUEUE_LATENCY_S", "burst_bytes", "queue_delay_s"]

#: most hosts one cluster may have (one network namespace, one link and one sshd each).
MAX_HOSTS = 64
#: the benchmarking range (RFC 2544) the hosts' addresses come from: host i is ``198.18.0.<i+1>``.
ADDRESS_PREFIX = "198.18.0."
#: the link rate that means "no shaping" (:func:`parse_rate` gives infinity).
UNSHAPED = "unshaped"
#: seconds of traffic a shaped link's queue holds beyond its burst (``tc tbf ... latency 50ms``).
QUEUE_LATENCY_S = 0.050
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)


def parse_rate(text):
    """A rate in ``tc``'s units as bits per second.

    Args:
        text: str such as ``"1gbit"``, ``"100mbit"``, ``"2.5gbit"``, or :data:`UNSHAPED`.

    Returns:
        float bits per second (> 0; ``math.inf`` for :data:`UNSHAPED`).

    Raises:
        ValueError: ``text`` does not parse or is not positive; the message names it and the units.
    """
    if str(text).strip().lower() == UNSHAPED:
        return math.inf
    m = _RATE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"link rate {text!r} does not parse: give a positive number and one of "
                           f"{', '.join(_UNITS)} (tc's units, bits per second), e.g. 1gbit or 100mbit, "
                           f"or {UNSHAPED!r} (no shaping)")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_host_links(items):
    """``HOST=RATE`` texts (the command lines' repeatable ``--host-link``) as ``(host, rate)`` pairs (tuple).

    Raises:
        ValueError: an item without ``=`` (names it and the form).
    """
    pairs = []
    for item in items:
        host, sep, rate = str(item).partition("=")
        if not sep:
            raise ValueError(f"--host-link {item!r}: give HOST=RATE, e.g. h1=250mbit")
        pairs.append((host.strip(), rate.strip()))
    return tuple(pairs)


def parse_host_slots(items):
    """``HOST=S`` texts (the command lines' repeatable ``--host-slots``) as ``(host, slots)`` pairs (tuple).

    Raises:
        ValueError: an item without ``=`` or whose S is not an integer (names it and the form).
    """
    pairs = []
    for item in items:
        host, sep, n = str(item).partition("=")
        if not sep or not n.strip().isdigit():
            raise ValueError(f"--host-slots {item!r}: give HOST=S with S an integer >= 1, e.g. h3=1")
        pairs.append((host.strip(), int(n)))
    return tuple(pairs)


def format_rate(bits_per_s):
    """``bits_per_s`` (float > 0) in ``tc``'s units, as ``tc`` accepts it (``"250mbit"``, ``"1.5gbit"``);
    infinity gives :data:`UNSHAPED`."""
    if math.isinf(bits_per_s):
        return UNSHAPED
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits_per_s >= _UNITS[unit]:
            return f"{bits_per_s / _UNITS[unit]:.6g}{unit}"
    return f"{bits_per_s:.6g}bit"


def burst_bytes(rate_bps):
    """The token bucket's depth of a link shaped to ``rate_bps`` (float bits per second > 0, the shaped rate):
    5 ms of traffic, at least 128 KiB (two 64 KiB GSO segments), int bytes."""
    return max(int(rate_bps / 8 * 0.005), 128 * 1024)


def queue_delay_s(rate_bps):
    """How long a packet waits behind a full queue of a link shaped to ``rate_bps``: the bucket's depth
    (:func:`burst_bytes`) and :data:`QUEUE_LATENCY_S` of traffic, drained at the rate.

    A message that must cross a link busy with a bulk transfer (a receiver's clear-to-send behind its own
    outgoing data) waits about this long; :class:`hetsync.sim.network.Network` takes it as ``link_queue_s``.

    Args:
        rate_bps: float bits per second > 0, the shaped rate (the emulated rate / D); infinity: unshaped.

    Returns:
        float seconds >= 0 of wall time (0 for an unshaped link, which has no token bucket).

    Raises:
        ValueError: a rate that is not > 0.
    """
    if not rate_bps > 0:
        raise ValueError(f"a shaped rate must be > 0 bits/s, got {rate_bps!r}")
    if math.isinf(rate_bps):
        return 0.0
    return QUEUE_LATENCY_S + burst_bytes(rate_bps) * 8.0 / rate_bps


def host_name(i):
    """The name of host ``i`` (int >= 0) inside the cluster: ``h<i>``."""
    return f"h{i}"


def host_address(i):
    """The emulated address of host ``i`` (int >= 0): ``198.18.0.<i+1>``."""
    return f"{ADDRESS_PREFIX}{i + 1}"


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """An emulated cluster of ``hosts`` hosts with ``slots`` ranks each, joined by one switch.

    Attributes:
        hosts: int N in [1, :data:`MAX_HOSTS`].
        slots: int S >= 1, ranks per host (the ``{hosts}`` list gives each host S slots).
        host_slots: tuple of ``(host name, int)`` pairs overriding ``slots`` for those hosts (parameter
            servers on hosts of their own: ``(("h3", 1), ("h4", 1))``). Ranks fill the hosts in order
            (``h0``'s slots first), so the last ranks of a launch land on the last hosts.
        link: str, every host's link rate (``tc`` units), emulated.
        host_links: tuple of ``(host name, rate str)`` pairs overriding ``link`` for those hosts
            (a mixed network: one host on a slower link).
        latency_ms: float >= 0 one-way added latency per link (0: none).
        dilation: float D >= 1: links are shaped to rate / D (device time is dilated by the same D).

    Raises:
        ValueError: at construction, any bad value (named, with what is allowed).
    """

    hosts: int
    slots: int = 1
    link: str = "1gbit"
    host_links: tuple = ()
    latency_ms: float = 0.0
    dilation: float = 1.0
    host_slots: tuple = ()

    def __post_init__(self):
        if isinstance(self.hosts, bool) or not isinstance(self.hosts, int) or not 1 <= self.hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be an int in [1, {MAX_HOSTS}], got {self.hosts!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"slots must be an int >= 1 (ranks per host), got {self.slots!r}")
        parse_rate(self.link)
        names = {host_name(i) for i in range(self.hosts)}
        for pair in self.host_links:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"host_links entries are (host, rate) pairs, got {pair!r}")
            if pair[0] not in names:
                raise ValueError(f"host link {pair[0]}={pair[1]}: no host {pair[0]!r} in a cluster of "
                                   f"{self.hosts} hosts (h0..h{self.hosts - 1})")
            parse_rate(pair[1])
        for pair in self.host_slots:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"host_slots entries are (host, slots) pairs, got {pair!r}")
            if pair[0] not in names:
                raise ValueError(f"host slots {pair[0]}={pair[1]}: no host {pair[0]!r} in a cluster of "
                                 f"{self.hosts} hosts (h0..h{self.hosts - 1})")
            if isinstance(pair[1], bool) or not isinstance(pair[1], int) or pair[1] < 1:
                raise ValueError(f"host slots {pair[0]}={pair[1]!r}: slots must be an int >= 1")
        if isinstance(self.latency_ms, bool) or not isinstance(self.latency_ms, (int, float)) \
                or not 0 <= self.latency_ms < float("inf"):
            raise ValueError(f"latency_ms must be a finite number >= 0, got {self.latency_ms!r}")
        if isinstance(self.dilation, bool) or not isinstance(self.dilation, (int, float)) \
                or not 1 <= self.dilation < float("inf"):
            raise ValueError(f"dilation must be a finite number >= 1, got {self.dilation!r}")

    @property
    def np(self):
        """Ranks in all: the sum of every host's slots (hosts x slots without ``host_slots``; int)."""
        return sum(self.slots_of(i) for i in range(self.hosts))

    def slots_of(self, i):
        """Ranks host ``i`` runs (int >= 1)."""
        return dict(self.host_slots).get(host_name(i), self.slots)

    def host_of_rank(self, rank):
        """The name of the host that runs ``rank`` (int in [0, np)): ranks fill the hosts in order."""
        left = rank
        for i in range(self.hosts):
            left -= self.slots_of(i)
            if left < 0 <= rank:
                return host_name(i)
        raise ValueError(f"rank {rank!r} is outside this cluster's {self.np} ranks")

    def rate(self, i):
        """Emulated link rate of host ``i`` in bits per second (float)."""
        return parse_rate(dict(self.host_links).get(host_name(i), self.link))

    def shaped_rate(self, i):
        """The rate host ``i``'s link is shaped to: emulated rate / D (float bits per second; infinity
        for an :data:`UNSHAPED` link)."""
        return self.rate(i) / self.dilation

    def hosts_arg(self):
        """The ``-H`` list of the launchers: ``"h0:S,h1:S,..."`` (each host's own slots)."""
        return ",".join(f"{host_name(i)}:{self.slots_of(i)}" for i in range(self.hosts))
