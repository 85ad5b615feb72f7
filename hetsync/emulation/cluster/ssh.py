"""ssh between the emulated hosts, so that launchers place ranks with ``-H h0:S,h1:S,...`` and no ssh flags.

At :meth:`SshHosts.start` a key pair (the only key accepted) and a host key are made in a folder of this
cluster's own (``/run/hetsync-cluster/<id>``, mode 700). Every host gets an ``sshd`` that listens only on
that host's emulated address, port 22, and accepts only that key, and a client configuration
(``/etc/netns/<namespace>/ssh/ssh_config``, which ``ip netns exec`` binds over ``/etc/ssh``) that uses
the key and trusts the cluster's hosts. The client sends the cluster's time dilation
(``HETSYNC_DILATION``, :func:`hetsync.world.dilation`) with every session and the daemons accept it, so
ranks started over ssh (``mpirun -H``'s daemons) run dilated as the ranks in ``h0`` do. :meth:`SshHosts.stop` stops the daemons and deletes the keys and
configurations.

Needs Debian's ``openssh-server`` (``/usr/sbin/sshd``; ``make deps`` installs it) and ``ssh-keygen``.
"""
import logging
import os
import shutil
import subprocess
import time

from hetsync.emulation.cluster.spec import host_address, host_name
from hetsync.world import DILATION_ENV
from hetsync.errors import ClusterError

__all__ = ["SshHosts", "sshd_path", "STATE_ROOT", "START_TIMEOUT_S"]

log = logging.getLogger("hetsync")

#: the parent of every cluster's key folder.
STATE_ROOT = "/run/hetsync-cluster"
#: seconds every sshd has to accept connections after it is started.
START_TIMEOUT_S = 30.0


def sshd_path():
    """The sshd program (str), or None when openssh-server is not installed."""
    for path in (shutil.which("sshd"), "/usr/sbin/sshd"):
        if path and os.access(path, os.X_OK):
            return path
    return None


class SshHosts:
    """The sshd daemons, keys and client configuration of one cluster.

    Args:
        cluster: the :class:`hetsync.emulation.cluster.net.Cluster` (up) whose hosts get sshd.

    Raises:
        ClusterError: at :meth:`start`, sshd or ssh-keygen missing (names the package), a key that could
            not be made, or a daemon that did not accept connections within :data:`START_TIMEOUT_S`.
    """

    def __init__(self, cluster):
        self.cluster = cluster
        self.state = os.path.join(STATE_ROOT, cluster.cid)
        self.procs = []

    @property
    def key(self):
        """The client's private key (str path): the only key every host's sshd accepts."""
        return os.path.join(self.state, "id_ed25519")

    def start(self):
        """Make the keys and configurations and start one sshd per host. Returns ``self``."""
        sshd = sshd_path()
        if sshd is None or shutil.which("ssh-keygen") is None:
            raise ClusterError("the hosts' sshd needs Debian's openssh-server (sshd, ssh-keygen): run `make deps`, "
                               "or apt-get install openssh-server")
        os.makedirs(self.state, mode=0o700, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
        for name in ("id_ed25519", "host_ed25519"):
            path = os.path.join(self.state, name)
            if not os.path.exists(path):
                proc = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hetsync-cluster-{name}",
                                       "-f", path], capture_output=True, text=True, timeout=30)
                if proc.returncode != 0:
                    raise ClusterError(f"ssh-keygen could not make {path}: {proc.stderr.strip()}")
        shutil.copyfile(self.key + ".pub", os.path.join(self.state, "authorized_keys"))
        n = self.cluster.spec.hosts
        for i in range(n):
            cfg = os.path.join(self.state, f"sshd_config.{host_name(i)}")
            with open(cfg, "w") as f:
                f.write(f"ListenAddress {host_address(i)}\nPort 22\n"
                        f"HostKey {os.path.join(self.state, 'host_ed25519')}\n"
                        f"AuthorizedKeysFile {os.path.join(self.state, 'authorized_keys')}\n"
                        f"PidFile {os.path.join(self.state, f'sshd.{host_name(i)}.pid')}\n"
                        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nX11Forwarding no\n"
                        "MaxStartups 64:30:128\nMaxSessions 64\nLogLevel ERROR\n"
                        f"AcceptEnv {DILATION_ENV}\n")
            client = os.path.join("/etc/netns", self.cluster.host_ns(i), "ssh")
            os.makedirs(client, exist_ok=True)
            with open(os.path.join(client, "ssh_config"), "w") as f:
                f.write("Host " + " ".join(host_name(j) for j in range(n)) + " "
                        + " ".join(host_address(j) for j in range(n)) + "\n"
                        f"  IdentityFile {self.key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                        "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n  ConnectTimeout 10\n"
                        "  ServerAliveInterval 15\n"
                        f"  SetEnv {DILATION_ENV}={self.cluster.spec.dilation:g}\n")
            self.procs.append(subprocess.Popen(self.cluster.exec_argv(i, [sshd, "-D", "-e", "-f", cfg]),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        deadline = time.time() + START_TIMEOUT_S
        for i in range(n):
            while not self._listening(i):
                if self.procs[i].poll() is not None:
                    raise ClusterError(f"sshd in {host_name(i)} exited {self.procs[i].returncode}: "
                                       f"{self.procs[i].stderr.read()[-800:]}")
                if time.time() > deadline:
                    raise ClusterError(f"sshd in {host_name(i)} did not accept connections on "
                                       f"{host_address(i)}:22 within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.1)
        return self

    def _listening(self, i):
        """True if host ``i``'s sshd accepts a TCP connection (tried from inside the host)."""
        probe = f"import socket; socket.create_connection(('{host_address(i)}', 22), timeout=1).close()"
        return subprocess.run(["ip", "netns", "exec", self.cluster.host_ns(i), "python3", "-c", probe],
                              capture_output=True, timeout=30).returncode == 0

    def exited(self):
        """The indices (list of int) of the hosts whose sshd has exited while the cluster was up: a host whose
        processes were all killed (a lost machine); empty after :meth:`stop`."""
        return [i for i, p in enumerate(self.procs) if p.poll() is not None]

    def stop(self):
        """Stop every sshd and delete the keys and configurations. Idempotent."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # killed, yet alive: stuck in the kernel; its namespace is deleted next
                log.warning("hetsync-cluster: an sshd (pid %d) did not exit within %.0f s of SIGKILL", p.pid,
                            START_TIMEOUT_S)
        self.procs = []
        self.remove(self.cluster.cid)

    @staticmethod
    def remove(cid):
        """Delete cluster ``cid``'s key folder (the ``/etc/netns`` entries go with the namespaces)."""
        shutil.rmtree(os.path.join(STATE_ROOT, cid), ignore_errors=True)

