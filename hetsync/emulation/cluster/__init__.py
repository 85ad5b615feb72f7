"""The emulated multi-host cluster: network namespaces as hosts, one switch, links shaped by ``tc``.

* :mod:`hetsync.emulation.cluster.spec`: :class:`ClusterSpec` (hosts, slots, rates, dilation), checked
  before anything is created;
* :mod:`hetsync.emulation.cluster.net`: :class:`Cluster`, bringing one up and down, byte counters;
* ``python -m hetsync.emulation.cluster`` / ``hetsync-cluster``: the command line.

Loads no TensorFlow.
"""
from hetsync.emulation.cluster.net import Cluster, check_capabilities, down_all, list_clusters
from hetsync.emulation.cluster.spec import ClusterSpec, format_rate, parse_rate

__all__ = ["Cluster", "ClusterSpec", "check_capabilities", "down_all", "list_clusters", "parse_rate", "format_rate"]
