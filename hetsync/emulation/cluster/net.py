"""Bring an emulated cluster up and down: one network namespace per host, one switch, shaped links.

Layout of a cluster with id ``ID`` (:attr:`Cluster.cid`, unique per cluster, so two never collide):

* namespace ``hetsync-ID-sw``: the switch, a Linux bridge ``br0`` with one port ``h<i>`` per host;
* namespace ``hetsync-ID-h<i>`` per host: ``lo`` and ``eth0`` (the other end of port ``h<i>``),
  address ``198.18.0.<i+1>/24`` (the benchmarking range, RFC 2544);
* each link is shaped in both directions by a token bucket (``tc tbf``): on the switch port (traffic
  to the host) and on the host's ``eth0`` (traffic from it), at the host's rate / D;
* ``/etc/netns/hetsync-ID-h<i>/hosts`` names every host (``ip netns exec`` binds it over ``/etc/hosts``),
  and commands run in their host with a UTS namespace of their own whose hostname is ``h<i>``
  (:meth:`Cluster.exec_argv`): horovod and OpenMPI tell hosts apart by hostname.

The switch side's byte counters (:meth:`Cluster.counters`) show what crossed each link. Teardown deletes
the namespaces (which deletes their links) and the ``/etc/netns`` folders; :func:`down_all` removes
whatever a crashed run left (every ``hetsync-*`` namespace).

Needs CAP_NET_ADMIN and CAP_SYS_ADMIN (``ip netns add`` mounts); without them :func:`check_capabilities`
raises :class:`hetsync.errors.ClusterError` naming what is missing, before anything is created.
"""
import json
import math
import os
import re
import secrets
import shutil
import subprocess

from hetsync.emulation.cluster.spec import (QUEUE_LATENCY_S, ClusterSpec, burst_bytes, format_rate, host_address,
                                            host_name)
from hetsync.emulation.cluster.ssh import STATE_ROOT, SshHosts, sshd_path
from hetsync.errors import ClusterError

__all__ = ["Cluster", "check_capabilities", "down_all", "list_clusters", "netem_available", "NS_PREFIX",
           "COMMAND_TIMEOUT_S"]

#: every namespace of an emulated cluster starts with this.
NS_PREFIX = "hetsync-"
#: seconds any one ``ip``/``tc`` command may take.
COMMAND_TIMEOUT_S = 30.0
_CAPS = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}
_NETNS_DIR = "/etc/netns"


def check_capabilities():
    """Raise unless this process holds CAP_NET_ADMIN and CAP_SYS_ADMIN and has ``ip`` and ``tc``.

    Raises:
        ClusterError: the message names each missing capability or program and what needs it.
    """
    missing = []
    try:
        with open("/proc/self/status") as f:
            eff = int(next(line.split()[1] for line in f if line.startswith("CapEff:")), 16)
        missing = [name for name, bit in _CAPS.items() if not eff >> bit & 1]
    except (OSError, StopIteration, ValueError):
        missing = list(_CAPS)
    tools = [t for t in ("ip", "tc", "unshare") if shutil.which(t) is None]
    if missing or tools:
        parts = []
        if missing:
            parts.append(f"the capabilities {', '.join(missing)} (network namespaces, links and traffic "
                         "shaping need them: run as root, or grant them)")
        if tools:
            parts.append(f"the programs {', '.join(tools)} (Debian: iproute2, util-linux)")
        raise ClusterError("the emulated cluster cannot be set up: this process lacks " + " and ".join(parts))


def netem_available():
    """True if ``tc``'s netem qdisc (added latency) works on this kernel: tried on the loopback of a
    namespace made for the probe and deleted after it."""
    ns = f"{NS_PREFIX}{secrets.token_hex(3)}-probe"
    try:
        _run(["ip", "netns", "add", ns])
        return _run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                    check=False).returncode == 0
    finally:
        _run(["ip", "netns", "del", ns], check=False)


def _run(argv, check=True):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {COMMAND_TIMEOUT_S:.0f} s") from None
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


def list_clusters():
    """Ids (str) of the emulated clusters whose namespaces exist on this machine, sorted."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = re.findall(rf"^{re.escape(NS_PREFIX)}([0-9a-f]+)-", out, flags=re.MULTILINE)
    return sorted(set(names))


def down_all():
    """Remove every emulated cluster's namespaces and ``/etc/netns`` entries (what a crashed run left).

    Returns:
        list of str, the cluster ids removed.
    """
    ids = list_clusters()
    for cid in ids:
        Cluster.teardown_id(cid)
    if os.path.isdir(STATE_ROOT):  # key folders of clusters whose namespaces are already gone
        for cid in os.listdir(STATE_ROOT):
            SshHosts.remove(cid)
    return ids


class Cluster:
    """One emulated cluster: :meth:`up`, commands in its hosts (:meth:`exec_argv`), :meth:`down`.

    A context manager: ``with Cluster(spec) as c:`` brings it up and always tears it down (an error,
    a timeout, Ctrl-C).

    Args:
        spec: :class:`hetsync.emulation.cluster.spec.ClusterSpec`.
        cid: str cluster id (hex), or None for a fresh random one.
        ssh: True (start an sshd in every host, :mod:`hetsync.emulation.cluster.ssh`; an error if
            openssh-server is missing), False (none), or "auto" (default: when sshd is installed).

    Raises:
        ClusterError: at :meth:`up`, a missing capability or a failed ``ip``/``tc`` command (the cluster
            is torn down before it is raised); ``latency_ms`` > 0 on a kernel without ``netem``.
    """

    def __init__(self, spec, cid=None, ssh="auto"):
        if not isinstance(spec, ClusterSpec):
            raise TypeError(f"Cluster takes a ClusterSpec, got {type(spec).__name__}")
        if ssh not in (True, False, "auto"):
            raise ValueError(f"ssh must be True, False or 'auto', got {ssh!r}")
        self.spec = spec
        self.cid = cid or secrets.token_hex(3)
        self.ssh = ssh
        self.sshd = None  # the running SshHosts
        self.is_up = False

    # -- names --------------------------------------------------------------------------------------
    @property
    def switch_ns(self):
        """The switch's namespace (str)."""
        return f"{NS_PREFIX}{self.cid}-sw"

    def host_ns(self, i):
        """Host ``i``'s namespace (str)."""
        return f"{NS_PREFIX}{self.cid}-{host_name(i)}"

    # -- life cycle ---------------------------------------------------------------------------------
    def up(self):
        """Create the switch, the hosts and their shaped links. Returns ``self``.

        Raises:
            ClusterError: see the class docstring.
        """
        check_capabilities()
        if self.spec.latency_ms > 0:
            why = ("this machine's kernel has no netem qdisc, tc's added-latency method" if not netem_available()
                   else "added latency is not implemented yet")
            raise ClusterError(f"latency_ms={self.spec.latency_ms:g}: {why}; run without added latency")
        try:
            self._create()
            if self.ssh is True or (self.ssh == "auto" and sshd_path() is not None):
                self.sshd = SshHosts(self).start()
        except BaseException:
            self.down()
            raise
        self.is_up = True
        return self

    def _create(self):
        n, sw = self.spec.hosts, self.switch_ns
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{host_address(i)} {host_name(i)}\n" for i in range(n))
        for i in range(n):
            ns, a, b = self.host_ns(i), f"hs{self.cid}a{i}", f"hs{self.cid}b{i}"
            _run(["ip", "netns", "add", ns])
            os.makedirs(os.path.join(_NETNS_DIR, ns), exist_ok=True)
            with open(os.path.join(_NETNS_DIR, ns, "hosts"), "w") as f:
                f.write(hosts_file)
            _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            _run(["ip", "link", "set", a, "netns", ns])
            _run(["ip", "link", "set", b, "netns", sw])
            _run(["ip", "-n", ns, "link", "set", a, "name", "eth0"])
            _run(["ip", "-n", sw, "link", "set", b, "name", host_name(i)])
            _run(["ip", "-n", sw, "link", "set", host_name(i), "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{host_address(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            rate = self.spec.shaped_rate(i)
            for where, dev in ((sw, host_name(i)), (ns, "eth0")) if math.isfinite(rate) else ():
                _run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", format_rate(rate),
                      "burst", str(burst_bytes(rate)), "latency", f"{QUEUE_LATENCY_S * 1e3:g}ms"])

    def down(self):
        """Delete this cluster's namespaces (their links go with them) and ``/etc/netns`` entries.
        Idempotent; never raises for what is already gone."""
        if self.sshd is not None:
            self.sshd.stop()
            self.sshd = None
        self.teardown_id(self.cid)
        self.is_up = False

    @staticmethod
    def teardown_id(cid):
        """Remove every namespace and ``/etc/netns`` folder of cluster ``cid`` (str)."""
        prefix = f"{NS_PREFIX}{cid}-"
        out = _run(["ip", "netns", "list"], check=False).stdout
        for ns in re.findall(rf"^({re.escape(prefix)}\S+)", out, flags=re.MULTILINE):
            _run(["ip", "netns", "pids", ns], check=False)
            for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)  # a process left inside would keep the namespace's links alive
                except (OSError, ValueError):
                    pass
            _run(["ip", "netns", "del", ns], check=False)
        if os.path.isdir(_NETNS_DIR):
            for name in os.listdir(_NETNS_DIR):
                if name.startswith(prefix):
                    shutil.rmtree(os.path.join(_NETNS_DIR, name), ignore_errors=True)
        SshHosts.remove(cid)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    # -- use ----------------------------------------------------------------------------------------
    def exec_argv(self, i, argv):
        """The command line running ``argv`` (list of str) in host ``i``: its network namespace, its
        ``/etc/hosts``, and a UTS namespace of its own with hostname ``h<i>``."""
        return (["ip", "netns", "exec", self.host_ns(i), "unshare", "--uts", "sh", "-c",
                 f'hostname {host_name(i)} && exec "$@"', "sh"] + list(argv))

    def counters(self):
        """Bytes that crossed each host's link, read on the switch side.

        Returns:
            list (one per host) of dicts ``{"host", "to_host_bytes", "from_host_bytes"}`` (int).
        """
        out = []
        for i in range(self.spec.hosts):
            stats = json.loads(_run(["ip", "-n", self.switch_ns, "-s", "-j", "link", "show", host_name(i)]).stdout)[0]
            s = stats["stats64"]
            out.append({"host": host_name(i), "to_host_bytes": int(s["tx"]["bytes"]),
                        "from_host_bytes": int(s["rx"]["bytes"])})
        return out

    def record(self, wall_s, before=None):
        """The cluster's own record of a run: what it emulated and what crossed each link.

        Args:
            wall_s: float wall seconds the run took (> 0). before: None or a :meth:`counters` list
                taken at the run's start (subtracted; None: the counters since :meth:`up`).

        Returns:
            dict: ``cluster``, ``dilation`` D, ``wall_s``, ``emulated_s`` (wall_s / D), and ``links``, one
            per host: ``host``, ``rate_bps`` (emulated), ``shaped_rate_bps`` (rate / D; both None when
            unshaped), ``to_host_bytes``,
            ``from_host_bytes`` and ``utilisation_to_host`` / ``utilisation_from_host`` (bytes x 8 over
            shaped rate x ``wall_s``: the fraction of the link's capacity the run used, in [0, 1] up to
            the token bucket's burst; None on an unshaped link).

        Raises:
            ValueError: ``wall_s`` is not positive. ClusterError: the counters could not be read.
        """
        if not wall_s > 0:
            raise ValueError(f"record: wall_s must be a positive number of seconds, got {wall_s!r}")
        now = self.counters()
        base = {c["host"]: c for c in before} if before else {}
        links = []
        for i, c in enumerate(now):
            b = base.get(c["host"], {"to_host_bytes": 0, "from_host_bytes": 0})
            to_b, from_b = c["to_host_bytes"] - b["to_host_bytes"], c["from_host_bytes"] - b["from_host_bytes"]
            cap = self.spec.shaped_rate(i) * wall_s / 8.0
            links.append({"host": c["host"], "rate_bps": _bps(self.spec.rate(i)),
                          "shaped_rate_bps": _bps(self.spec.shaped_rate(i)),
                          "to_host_bytes": to_b, "from_host_bytes": from_b,
                          "utilisation_to_host": to_b / cap if math.isfinite(cap) else None,
                          "utilisation_from_host": from_b / cap if math.isfinite(cap) else None})
        return {"cluster": self.cid, "dilation": self.spec.dilation, "hosts": self.spec.hosts,
                "slots": self.spec.slots,
                "host_slots": [self.spec.slots_of(i) for i in range(self.spec.hosts)], "wall_s": float(wall_s),
                "emulated_s": float(wall_s) / self.spec.dilation,
                "links": links}

    def measure_throughput(self, src, dst, nbytes=8 * 2**20, port=5201, timeout_s=60.0):
        """Send ``nbytes`` over TCP from host ``src`` to host ``dst`` and return the receiver's rate.

        The receiver times the last three quarters of the bytes, so neither connection set-up nor the
        token bucket's initial burst (:func:`hetsync.emulation.cluster.spec.burst_bytes`, sent at once) is counted.

        Args:
            src, dst: int host indices (different). nbytes: int bytes > 0. port: int TCP port.
            timeout_s: float seconds both ends may take.

        Returns:
            float bits per second.

        Raises:
            ClusterError: an end failed or did not finish within ``timeout_s`` (both ends are stopped).
        """
        import sys

        recv = ("import socket,time,sys\n"
                "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                f"s.bind(('{host_address(dst)}',{port}));s.listen(1);print('ready',flush=True)\n"
                f"c,_=s.accept();n=0;q={int(nbytes) // 4};n0=t0=None\n"
                "while True:\n"
                " b=c.recv(1<<20)\n"
                " if not b: break\n"
                " n+=len(b)\n"
                " if n0 is None and n>=q: n0,t0=n,time.time()\n"
                "print(n-n0,time.time()-t0,flush=True)\n")
        send = ("import socket\n"
                f"c=socket.create_connection(('{host_name(dst)}',{port}),timeout=10)\n"
                f"buf=b'x'*(1<<16);left={int(nbytes)}\n"
                "while left>0:\n"
                " c.sendall(buf[:min(left,len(buf))]);left-=min(left,len(buf))\n"
                "c.close()\n")
        rx = subprocess.Popen(self.exec_argv(dst, [sys.executable, "-c", recv]), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        try:
            if rx.stdout.readline().strip() != "ready":
                raise ClusterError(f"the receiver in {host_name(dst)} did not start: {rx.stderr.read()[-500:]}")
            _run(self.exec_argv(src, [sys.executable, "-c", send]))
            out, err = rx.communicate(timeout=timeout_s)
            n, secs = out.split()
            return int(n) * 8 / float(secs)
        except (subprocess.TimeoutExpired, ValueError) as exc:
            raise ClusterError(f"throughput {host_name(src)} -> {host_name(dst)} failed: {exc}") from None
        finally:
            if rx.poll() is None:
                rx.kill()
                rx.wait(timeout=COMMAND_TIMEOUT_S)

    def lost_hosts(self):
        """The hosts lost while the cluster was up, each with the ranks it ran, as a launch places them
        (ranks fill the hosts in order: :meth:`ClusterSpec.host_of_rank`).

        A host counts as lost when its sshd has exited: every process of the host died (a killed machine;
        OpenMPI's own error then names only its lost daemon). Without ssh (one host, or ``ssh=False``)
        nothing is detected.

        Returns:
            list of dicts ``{"host": str, "ranks": list of int}``, in host order.
        """
        if self.sshd is None:
            return []
        out = []
        for i in self.sshd.exited():
            name = host_name(i)
            out.append({"host": name, "ranks": [r for r in range(self.spec.np) if self.spec.host_of_rank(r) == name]})
        return out

    def describe(self):
        """What was set up (a JSON-able dict): id, hosts with names, namespaces, addresses and rates
        (emulated and shaped, bits per second), dilation, slots, np and the ``-H`` list."""
        return {"cluster": self.cid, "dilation": self.spec.dilation, "slots": self.spec.slots, "np": self.spec.np,
                "host_slots": [self.spec.slots_of(i) for i in range(self.spec.hosts)],
                "ssh": self.sshd is not None,
                "hosts_arg": self.spec.hosts_arg(), "switch_namespace": self.switch_ns,
                "hosts": [{"name": host_name(i), "namespace": self.host_ns(i), "address": host_address(i),
                           "rate_bps": _bps(self.spec.rate(i)), "shaped_rate_bps": _bps(self.spec.shaped_rate(i))}
                          for i in range(self.spec.hosts)]}


def _bps(rate):
    """A rate for JSON: float bits per second, or None for an unshaped link (infinite rate)."""
    return rate if math.isfinite(rate) else None
