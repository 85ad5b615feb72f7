"""Roles: which ranks train (workers) and which serve parameters (servers).

A :class:`Roles` value is made by a protocol from its configuration and the launch's world size
(the parameter-server protocols' ``servers=K`` argument: the last K ranks of the launch serve, the
first n = size - K train; every other protocol has K = 0) and is owned by that protocol
(``protocol.roles``). Code that needs a rank's role asks the protocol it works for, so two wrapped
optimizers in one process never change each other's roles.

The module-level functions (``hetsync.num_workers()``, ``hetsync.is_server()``, ...) answer for the
protocol most recently attached in this process (:func:`current`), as the public API did before
protocols owned their roles; a protocol's own code never uses them.
"""
import dataclasses
import threading

from hetsync import world

__all__ = ["Roles", "current", "set_current", "num_servers", "num_workers", "is_server", "worker_rank", "role"]


@dataclasses.dataclass(frozen=True)
class Roles:
    """The worker and server ranks of one protocol on one launch (SHAT section III: n workers and
    K parameter servers; every other protocol: n = world size, K = 0).

    Attributes:
        size: int >= 1, the world size (ranks in the launch).
        servers: int in [0, size - 1], K, the number of parameter-server ranks (the last K ranks).
        rank: int in [0, size), this process's rank.

    Raises:
        ValueError: ``servers`` not an int >= 0, or it leaves no worker (``servers >= size``; the
            message names both and what to launch instead); ``size`` or ``rank`` out of range.
    """

    size: int
    servers: int = 0
    rank: int = 0

    def __post_init__(self):
        for name in ("size", "servers", "rank"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"Roles.{name} must be an int, got {v!r}")
        if self.size < 1:
            raise ValueError(f"Roles.size (the world size) must be >= 1, got {self.size}")
        if self.servers < 0:
            raise ValueError(f"servers must be an int >= 0, got {self.servers!r}")
        if self.servers >= self.size:
            raise ValueError(f"servers={self.servers} leaves no worker: the launch has {self.size} rank(s) and the "
                             f"last {self.servers} would all serve parameters; launch at least {self.servers + 1} "
                             f"ranks or use servers <= {self.size - 1}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"Roles.rank must be in [0, {self.size}), got {self.rank}")

    @classmethod
    def of_world(cls, servers=0):
        """The roles of this process's launch with ``servers`` server ranks (after ``hetsync.init()``).

        Args:
            servers: int K in [0, world size - 1].

        Raises:
            ValueError: as the constructor. RuntimeError: before ``hetsync.init()``.
        """
        return cls(size=world.size(), servers=servers, rank=world.rank())

    @property
    def num_workers(self):
        """n, the number of worker ranks (int >= 1): ranks 0 .. n - 1."""
        return self.size - self.servers

    @property
    def num_servers(self):
        """K, the number of server ranks (int >= 0): ranks n .. size - 1."""
        return self.servers

    @property
    def is_server(self):
        """True if this rank serves parameters instead of training."""
        return self.rank >= self.num_workers

    @property
    def worker_rank(self):
        """This rank's index among the workers (int in [0, n)), or None on a server rank (a worker's
        index equals its rank)."""
        return None if self.is_server else self.rank

    @property
    def role(self):
        """``"server"`` or ``"worker"``."""
        return "server" if self.is_server else "worker"

    @property
    def workers(self):
        """The worker ranks, ``range(n)``."""
        return range(self.num_workers)

    @property
    def server_ranks(self):
        """The server ranks, ``range(n, size)``."""
        return range(self.num_workers, self.size)


_lock = threading.Lock()
_current = {"roles": None}


def set_current(roles):
    """Record ``roles`` (a :class:`Roles`) as the most recently attached protocol's, for the
    module-level functions below. Called by the protocol when it attaches to an optimizer.

    Raises:
        TypeError: ``roles`` is not a :class:`Roles`.
    """
    if not isinstance(roles, Roles):
        raise TypeError(f"set_current takes a Roles, got {type(roles).__name__}")
    with _lock:
        _current["roles"] = roles


def current():
    """The :class:`Roles` of the protocol most recently attached in this process, or, before any,
    every rank a worker. Raises RuntimeError before ``hetsync.init()``."""
    with _lock:
        roles = _current["roles"]
    if roles is None or roles.size != world.size():
        return Roles.of_world(0)
    return roles


def num_servers():
    """K of :func:`current` (int >= 0)."""
    return current().num_servers


def num_workers():
    """n of :func:`current` (int >= 1). Raises RuntimeError before ``hetsync.init()``."""
    return current().num_workers


def is_server():
    """True if this rank serves parameters under :func:`current`."""
    return current().is_server


def worker_rank():
    """This rank's worker index under :func:`current`, or None on a server rank."""
    return current().worker_rank


def role():
    """``"server"`` or ``"worker"`` under :func:`current`."""
    return current().role
