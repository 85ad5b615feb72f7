"""horovod's collectives on Gloo under an MPI launch: the rendezvous made through MPI.

``HETSYNC_COLLECTIVES=gloo`` (:data:`hetsync.world.COLLECTIVES_ENV`) under ``mpirun``/``horovodrun --mpi``:
mpi4py keeps the MPI world for point-to-point traffic, and horovod runs its controller and collectives on
Gloo, whose waits block, instead of spin-waiting in MPI. What ``horovodrun --gloo`` does before it starts
the ranks is done here by the ranks themselves, over MPI: rank 0 starts horovod's rendezvous server with
the slot plan (:func:`gloo_slots`) and broadcasts its address and interface; every rank sets horovod's Gloo variables
before ``hvd.init()``. Called by :func:`hetsync.world.init` only.
"""
import os

__all__ = ["gloo_slots", "gloo_over_mpi", "gloo_iface", "iface_address", "wait_mpi", "COLLECTIVES_ENV"]

#: the variable that asks for it (defined here; :mod:`hetsync.world` re-exports it).
COLLECTIVES_ENV = "HETSYNC_COLLECTIVES"


def gloo_slots(hosts):
    """horovod's slot plan for a Gloo rendezvous from every rank's host name, ranks kept in MPI's order.

    Args:
        hosts: list of str, the host name of rank r at index r (length = world size >= 1).

    Returns:
        list of ``horovod.runner.common.util.hosts.SlotInfo``, one per rank: ``local_rank``/``local_size``
        within its host; ``cross_rank``/``cross_size`` among the hosts that have a rank with that local rank
        (hosts in order of their first rank), as ``horovodrun --gloo`` assigns them.

    Raises:
        ValueError: ``hosts`` is empty or holds an empty name.
    """
    from horovod.runner.common.util.hosts import SlotInfo

    if not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ValueError(f"gloo_slots: every rank needs a non-empty host name, got {hosts!r}")
    order = list(dict.fromkeys(hosts))
    local = {h: [r for r, hr in enumerate(hosts) if hr == h] for h in order}
    slots = []
    for r, h in enumerate(hosts):
        lr = local[h].index(r)
        cross = [g for g in order if len(local[g]) > lr]
        slots.append(SlotInfo(hostname=h, rank=r, local_rank=lr, cross_rank=cross.index(h), size=len(hosts),
                              local_size=len(local[h]), cross_size=len(cross)))
    return slots


def gloo_iface(single_host):
    """The network interface Gloo binds (str): ``HOROVOD_GLOO_IFACE``, else the one interface OpenMPI's TCP
    transport was given (``OMPI_MCA_btl_tcp_if_include``, as horovodrun sets it; a list or a network does not
    count), else ``lo`` when every rank is on one host (``single_host``: bool).

    Raises:
        RuntimeError: several hosts and no interface named (asks for ``HOROVOD_GLOO_IFACE``).
    """
    for var in ("HOROVOD_GLOO_IFACE", "OMPI_MCA_btl_tcp_if_include"):
        value = os.environ.get(var, "").strip()
        if value and "," not in value and "/" not in value:
            return value
    if single_host:
        return "lo"
    raise RuntimeError(f"{COLLECTIVES_ENV}=gloo across hosts needs the network interface for Gloo: set "
                       "HOROVOD_GLOO_IFACE (for example eth0)")


def iface_address(iface):
    """The IPv4 address (str, dotted) of network interface ``iface`` (str) on this host (``SIOCGIFADDR``).

    Raises:
        RuntimeError: the interface does not exist here or has no IPv4 address (names it).
    """
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface.encode()[:15]))
        except OSError as exc:
            raise RuntimeError(f"{COLLECTIVES_ENV}=gloo: network interface {iface!r} has no IPv4 address here "
                               f"({exc}); set HOROVOD_GLOO_IFACE to one that has") from None
    return socket.inet_ntoa(packed[20:24])


def wait_mpi(request, what, comm, timeout_s):
    """Wait for a non-blocking MPI request (an mpi4py ``Request``) at most ``timeout_s`` seconds (float > 0).

    Raises:
        RuntimeError: the request did not complete in time (names the rank, ``what`` and the world size).
    """
    import time

    deadline = time.monotonic() + timeout_s
    while not request.Test():
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {comm.Get_rank()}: timed out after {timeout_s:g} s in the Gloo rendezvous "
                               f"({what} over {comm.Get_size()} ranks): some rank did not start or is stalled")
        time.sleep(0.002)


def gloo_over_mpi(comm, hosts, timeout_s):
    """Set this rank's environment for horovod's Gloo rendezvous, made through MPI.

    Rank 0 chooses the interface (:func:`gloo_iface`), starts horovod's rendezvous server with
    :func:`gloo_slots` of ``hosts`` and broadcasts the interface's name, its IPv4 address on rank 0's host and
    the server's port. Every rank then sets ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``,
    ``HOROVOD_CONTROLLER``/``CPU_OPERATIONS=gloo``, ``HOROVOD_GLOO_IFACE`` and its slot (``HOROVOD_RANK``,
    ``SIZE``, ``LOCAL_RANK``, ...), as ``horovodrun --gloo`` would, so that ``hvd.init()`` joins the Gloo context.
    Only rank 0's environment matters: ``mpirun`` passes no variable to other hosts unless told to.

    Args:
        comm: mpi4py intracommunicator, the MPI world (every rank calls this).
        hosts: list of str, every rank's host name by rank. timeout_s: float seconds the broadcast may wait.

    Returns:
        horovod's ``RendezvousServer`` on rank 0 (stop it at shutdown), None on the other ranks.

    Raises:
        RuntimeError: no interface for Gloo or the interface has no IPv4 address (rank 0 names the cause, the
            other ranks refer to it), or the broadcast timed out.
    """
    import ipaddress

    import numpy as np

    slots = gloo_slots(hosts)
    width = 16  # bytes of an interface name (IFNAMSIZ)
    server, info, error = None, np.zeros(2 + width, np.int64), None
    if comm.Get_rank() == 0:
        try:
            iface = gloo_iface(single_host=len(set(hosts)) == 1)
            address = iface_address(iface)
            from horovod.runner.http.http_server import RendezvousServer

            server = RendezvousServer()
            port = server.start()
            server.init(slots)
            name = iface.encode()[:width]
            info[:2] = (int(ipaddress.IPv4Address(address)), port)
            info[2:2 + len(name)] = list(name)
        except RuntimeError as exc:
            error = exc  # broadcast the zero address first, so the other ranks fail at once too
    wait_mpi(comm.Ibcast(info, root=0), "the rendezvous address's broadcast", comm, timeout_s)
    if error is not None:
        raise error
    if info[1] == 0:
        raise RuntimeError(f"rank {comm.Get_rank()}: rank 0 could not start the Gloo rendezvous (its error names "
                           "the cause)")
    iface = bytes(int(b) for b in info[2:] if b).decode()
    me = slots[comm.Get_rank()]
    os.environ.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": str(ipaddress.IPv4Address(int(info[0]))),
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(int(info[1])), "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": iface, "HOROVOD_HOSTNAME": me.hostname,
        "HOROVOD_RANK": str(me.rank), "HOROVOD_SIZE": str(me.size), "HOROVOD_LOCAL_RANK": str(me.local_rank),
        "HOROVOD_LOCAL_SIZE": str(me.local_size), "HOROVOD_CROSS_RANK": str(me.cross_rank),
        "HOROVOD_CROSS_SIZE": str(me.cross_size)})
    return server
