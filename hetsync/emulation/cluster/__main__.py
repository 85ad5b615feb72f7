"""``python -m hetsync.emulation.cluster`` / ``hetsync-cluster``: an emulated multi-host cluster on this machine.

Commands::

    hetsync-cluster run --hosts N --slots S --link RATE [--host-link HOST=RATE ...] [--host-slots HOST=S ...]
                        [--latency-ms MS] [--dilation D] [--timeout S] -- COMMAND...
    hetsync-cluster up --hosts N ...        # leaves it up; prints its description (with its id)
    hetsync-cluster status                  # the clusters up on this machine
    hetsync-cluster down [--cluster ID]     # one cluster, or every one (what a crashed run left)

``run`` brings the hosts up, runs COMMAND inside host ``h0`` with ``{hosts}`` replaced by
``h0:S,h1:S,...`` and ``{np}`` by N x S (each host's own S where ``--host-slots`` gives one; RATE ``unshaped``
leaves the links without shaping), prints one JSON line of what it set up (and, after COMMAND,
the bytes that crossed each link), tears everything down (also on an error, a timeout or Ctrl-C) and
exits with COMMAND's status (124 on timeout). RATE uses ``tc``'s units (``100mbit``, ``1gbit``); it is
the emulated cluster's rate, and the links are shaped to RATE / D. COMMAND runs with ``HETSYNC_DILATION=D``
(and so do ranks started over ssh), so its emulated device times and timeouts are D times longer
(:func:`hetsync.world.dilation`). ``--record FILE`` writes the cluster's record (:meth:`Cluster.record`:
D, rates, the bytes and utilisation of each link over COMMAND's run) that the benchmark merges, with
``exit`` (COMMAND's status) and ``lost_hosts`` (:meth:`Cluster.lost_hosts`: hosts whose every process died
during the run, each with the ranks it ran; also named in one line on stderr, since OpenMPI's own error
names only its lost daemon).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

from hetsync.emulation.cluster.net import Cluster, down_all, list_clusters
from hetsync.emulation.cluster.spec import ClusterSpec, parse_host_links, parse_host_slots
from hetsync.emulation.cluster.ssh import sshd_path
from hetsync.errors import ClusterError
from hetsync.world import COLLECTIVES_ENV, DILATION_ENV

__all__ = ["main", "parse_args", "spec_from_args", "substitute", "LAUNCHERS"]

#: launchers that start ranks on the ``-H`` hosts: with more than one host their command must name ``{hosts}``.
LAUNCHERS = ("horovodrun", "mpirun", "mpiexec", "orterun", "prterun")
#: seconds a killed command's process group has to be reaped.
REAP_S = 30.0


def parse_args(argv=None):
    """Parse the command line (list of str, None for ``sys.argv[1:]``); exits with status 2 on bad usage."""
    p = argparse.ArgumentParser(prog="hetsync-cluster", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "up"):
        q = sub.add_parser(name, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        q.add_argument("--hosts", type=int, required=True, help="hosts N (one network namespace each)")
        q.add_argument("--slots", type=int, default=1, help="ranks per host S")
        q.add_argument("--link", default="1gbit", help="every host's emulated link rate (tc units: 100mbit, 10gbit)")
        q.add_argument("--host-link", action="append", default=[], metavar="HOST=RATE",
                       help="one host's own rate (a mixed network), repeatable, e.g. h3=250mbit")
        q.add_argument("--host-slots", action="append", default=[], metavar="HOST=S",
                       help="one host's own rank count, repeatable, e.g. h3=1 (parameter servers on hosts of their own)")
        q.add_argument("--latency-ms", type=float, default=0.0, help="one-way added latency per link (ms)")
        q.add_argument("--dilation", type=float, default=1.0, help="time dilation D >= 1: links shaped to RATE / D")
        if name == "run":
            q.add_argument("--timeout", type=float, default=3600.0, help="seconds COMMAND may run")
            q.add_argument("--record", default=None, metavar="FILE",
                           help="write the cluster's record (D, rates, bytes and utilisation per link) to FILE as JSON")
            q.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    sub.add_parser("status")
    d = sub.add_parser("down")
    d.add_argument("--cluster", default=None, help="cluster id (default: every emulated cluster on this machine)")
    args = p.parse_args(argv)
    if args.cmd == "run":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not args.command:
            p.error("run needs a command after --")
        if not args.timeout > 0:
            p.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    return args


def spec_from_args(args):
    """The :class:`ClusterSpec` of parsed ``run``/``up`` arguments.

    Raises:
        ValueError: a bad value (``--hosts 0``, a rate that does not parse, ``--host-link`` without ``=``,
            ``--host-slots`` whose S is not an integer >= 1).
    """
    return ClusterSpec(hosts=args.hosts, slots=args.slots, link=args.link, host_links=parse_host_links(args.host_link),
                       latency_ms=args.latency_ms, dilation=args.dilation,
                       host_slots=parse_host_slots(args.host_slots))


def substitute(command, spec):
    """COMMAND (list of str) with ``{hosts}`` and ``{np}`` replaced.

    Raises:
        ValueError: a launcher (:data:`LAUNCHERS`) on more than one host whose command never names
            ``{hosts}`` (its ranks would all start in ``h0``).
    """
    if (os.path.basename(command[0]) in LAUNCHERS and spec.hosts > 1
            and not any("{hosts}" in a for a in command)):
        raise ValueError(f"{os.path.basename(command[0])} on {spec.hosts} hosts: its command must place the ranks "
                         "with -H {hosts} (replaced by " + spec.hosts_arg() + "); without it every rank starts in h0")
    return [a.replace("{hosts}", spec.hosts_arg()).replace("{np}", str(spec.np)) for a in command]


def _run(args):
    spec = spec_from_args(args)
    command = substitute(args.command, spec)
    launcher = os.path.basename(command[0]) in LAUNCHERS
    if launcher and spec.hosts > 1 and sshd_path() is None:
        raise ClusterError(f"{os.path.basename(command[0])} reaches the other hosts by ssh, and openssh-server "
                           "is not installed: run `make deps` (or apt-get install openssh-server)")
    env = dict(os.environ, **{DILATION_ENV: f"{spec.dilation:g}"})
    if spec.np > (os.cpu_count() or 1):
        # every emulated host believes it has the machine's cores: without this OpenMPI would busy-poll
        # S ranks per host on cores that N x S ranks share
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        # horovod's MPI controller spin-waits in a blocking allreduce every cycle; with ranks on TCP sharing
        # too few cores, those waits starved the ranks they waited for (stalls of seconds on every rank):
        # horovod's collectives go on Gloo (blocking waits), mpi4py's point-to-point traffic stays on MPI
        env.setdefault(COLLECTIVES_ENV, "gloo")
        env.setdefault("HOROVOD_GLOO_IFACE", "eth0")  # each host's link (rank 0 passes it on to the others)
    cluster = Cluster(spec, ssh=True if launcher and spec.hosts > 1 else "auto")

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        with cluster:
            print(json.dumps({"event": "up", **cluster.describe(), "command": command}), flush=True)
            before, t0 = cluster.counters(), time.monotonic()
            proc = subprocess.Popen(cluster.exec_argv(0, command), start_new_session=True, env=env)
            try:
                rc = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"hetsync-cluster: the command ran past --timeout {args.timeout:g} s; stopped",
                      file=sys.stderr, flush=True)
                rc = 124
            except KeyboardInterrupt:
                rc = 130
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=REAP_S)
            lost = cluster.lost_hosts()
            for host in lost:  # OpenMPI's message names the lost daemon only: say which ranks went with it
                print(f"hetsync-cluster: host {host['host']} was lost during the run (every process of it, its "
                      f"sshd included, exited): it ran rank{'s' if len(host['ranks']) != 1 else ''} "
                      f"{', '.join(map(str, host['ranks']))}; the command exited with status {rc}",
                      file=sys.stderr, flush=True)
            record = dict(cluster.record(max(time.monotonic() - t0, 1e-9), before), exit=rc, command=command,
                          lost_hosts=lost)
            if args.record:
                with open(args.record, "w") as f:
                    json.dump(record, f, indent=1)
            print(json.dumps({"event": "down", **record}), flush=True)
        return rc
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM outside COMMAND's wait (starting it, reading counters):
        return 130  # the with-block has torn the cluster down
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv=None):
    """Run the command line; returns the exit status (COMMAND's for ``run``, 2 for bad arguments, 1 for
    a cluster that could not be set up)."""
    args = parse_args(argv)
    try:
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "up":
            cluster = Cluster(spec_from_args(args)).up()
            print(json.dumps({"event": "up", **cluster.describe()}), flush=True)
            return 0
        if args.cmd == "status":
            print(json.dumps({"clusters": list_clusters()}))
            return 0
        removed = [Cluster.teardown_id(args.cluster) or args.cluster] if args.cluster else down_all()
        print(json.dumps({"removed": removed}))
        return 0
    except ValueError as exc:
        print(f"hetsync-cluster: {exc}", file=sys.stderr)
        return 2
    except ClusterError as exc:
        print(f"hetsync-cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
