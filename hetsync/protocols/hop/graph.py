"""Hop's communication graphs: the named families, a user's edge list, the mixing matrix and the spectral gap.

Luo et al., "Hop: Heterogeneity-aware decentralized training" (ASPLOS '19), section 3.1, Figure 11,
Figure 21 and footnote 2; ``docs/protocols/hop.md`` re-derives the figures.

* A graph is directed: edge (i, j) means that i sends its updates to j. N_in(i) = {j | (j, i) in E},
  N_out(i) = {j | (i, j) in E}. **Every node has a self-loop** (i is in N_in(i) and N_out(i)): a
  worker's own model enters its Reduce. The self-loops are implicit: never list them.
* Weights, eq. (1): W_ij = 1 / |N_in(j)| for i in N_in(j) (self-loop included), else 0. Each worker
  takes the plain mean of what it receives. W is doubly stochastic on regular graphs (ring,
  ring-based, double-ring, complete), column-stochastic otherwise.
* With zero gradients, standard training is X_{k+1} = W^T X_k (row i of X is worker i's model).
* Spectral gap (footnote 2): |lambda_1(W)| - |lambda_2(W)|. The paper's Figure 21 values (0.6667,
  0.2682, 0.2688) come from W built **without** self-loops and lambda_2 the second-largest signed
  eigenvalue (:func:`spectral_gap` ``convention="paper"``); the W used in training (with
  self-loops, eigenvalues ordered by modulus) is ``convention="training"``.

Graph names (the ``graph`` argument of :func:`hetsync.Hop` and :func:`hetsync.NotifyAck`):

* ``ring``: i <-> i+-1 (mod n), n >= 3 (n = 2: the single edge 0 <-> 1);
* ``ring-based``: the ring plus i <-> i + n/2 (D-PSGD's graph), even n >= 4;
* ``double-ring``: two ring-based(n/2) graphs joined node to node (i <-> i + n/2), n/2 even, n >= 8;
* ``complete``: every pair;
* ``gateway:4,2,2`` / ``chain:4,2,2``: Figure 21(b)/(c), machines of the given sizes (complete inside
  a machine; a ring of machines through each machine's first node, resp. the ring through all nodes
  in order), sizes summing to n;
* ``edges:0-1,1-2,2>0``: a user's graph, ``a-b`` an undirected edge, ``a>b`` a directed one (a sends
  to b). It must not list self-loops and must be strongly connected.
"""
import re

import numpy as np

__all__ = ["Graph", "build", "named_graph_names", "spectral_gap", "mixing_matrix"]

#: the named families (``gateway:`` / ``chain:`` / ``edges:`` take a parameter).
NAMED = ("ring", "ring-based", "double-ring", "complete")


def named_graph_names():
    """Return the graph names :func:`build` accepts (a short str for error messages)."""
    return "ring, ring-based, double-ring, complete, gateway:SIZES, chain:SIZES, edges:EDGES"


class Graph:
    """A directed communication graph over ranks 0..n-1 with implicit self-loops.

    Args:
        n: int >= 1, the number of workers (world size).
        edges: iterable of (i, j) int pairs, i != j: i sends its updates to j.
        name: str, for messages and summaries.

    Attributes:
        n (int), name (str), out_neighbours / in_neighbours: list of n sorted lists of ints,
        **without** the node itself (the self-loop is implicit).

    Raises:
        ValueError: a node outside [0, n), a listed self-loop, or a graph that is not strongly
            connected (the message names the nodes that cannot be reached).
    """

    def __init__(self, n, edges, name="edges"):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"Hop graph: the number of workers must be an int >= 1, got {n!r}")
        self.n, self.name = int(n), name
        out = [set() for _ in range(self.n)]
        for i, j in edges:
            i, j = int(i), int(j)
            if not (0 <= i < self.n and 0 <= j < self.n):
                raise ValueError(f"Hop graph {name!r}: edge {i}->{j} names a node outside 0..{self.n - 1}")
            if i == j:
                raise ValueError(f"Hop graph {name!r}: edge {i}->{j} is a self-loop; self-loops are implicit "
                                 "(every worker reduces its own model), do not list them")
            out[i].add(j)
        self.out_neighbours = [sorted(s) for s in out]
        inn = [set() for _ in range(self.n)]
        for i, s in enumerate(out):
            for j in s:
                inn[j].add(i)
        self.in_neighbours = [sorted(s) for s in inn]
        for direction, adj in (("reach", self.out_neighbours), ("be reached from", self.in_neighbours)):
            seen = self._reachable(0, adj)
            if len(seen) != self.n:
                missing = sorted(set(range(self.n)) - seen)
                raise ValueError(f"Hop graph {name!r} on {self.n} workers is not strongly connected: node 0 cannot "
                                 f"{direction} node(s) {missing}")

    @staticmethod
    def _reachable(start, adj):
        seen, stack = {start}, [start]
        while stack:
            for j in adj[stack.pop()]:
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        return seen

    def n_in(self, i):
        """|N_in(i)|, the self-loop included (int)."""
        return len(self.in_neighbours[i]) + 1

    def is_regular(self):
        """True if every in-degree is equal and every out-degree is equal (then W is doubly stochastic)."""
        return len({len(s) for s in self.in_neighbours}) == 1 and len({len(s) for s in self.out_neighbours}) == 1

    def is_bidirectional(self):
        """True if every edge (i, j) has its reverse (j, i)."""
        return all(i in self.out_neighbours[j] for i in range(self.n) for j in self.out_neighbours[i])

    def distances(self):
        """Shortest-path lengths: int array [n, n], ``d[i, j]`` = dist(i -> j) in edges (0 on the diagonal)."""
        d = np.full((self.n, self.n), -1, np.int64)
        for s in range(self.n):
            d[s, s], frontier = 0, [s]
            while frontier:
                nxt = []
                for u in frontier:
                    for v in self.out_neighbours[u]:
                        if d[s, v] < 0:
                            d[s, v] = d[s, u] + 1
                            nxt.append(v)
                frontier = nxt
        return d

    def edges(self):
        """Return the directed edges as a sorted list of (i, j) (no self-loops)."""
        return [(i, j) for i in range(self.n) for j in self.out_neighbours[i]]

    def __repr__(self):
        return f"Graph({self.name!r}, n={self.n}, edges={len(self.edges())})"


def _undirected(pairs):
    out = []
    for a, b in pairs:
        if a != b:
            out += [(a, b), (b, a)]
    return out


def _ring_pairs(nodes):
    m = len(nodes)
    return [(nodes[i], nodes[(i + 1) % m]) for i in range(m)] if m > 1 else []


def _ring_based_pairs(nodes):
    m = len(nodes)
    return _ring_pairs(nodes) + [(nodes[i], nodes[i + m // 2]) for i in range(m // 2)]


def _sizes(text, n, name):
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"Hop graph {name!r}: machine sizes must be integers such as {name.split(':')[0]}:4,2,2") from None
    if any(s < 1 for s in sizes) or sum(sizes) != n:
        raise ValueError(f"Hop graph {name!r}: machine sizes must be >= 1 and sum to the world size {n}, got {sizes}")
    starts = np.cumsum([0] + sizes)
    return [list(range(starts[m], starts[m + 1])) for m in range(len(sizes))]


_EDGE = re.compile(r"^\s*(\d+)\s*([->])\s*(\d+)\s*$")


def check_syntax(spec):
    """Check a graph spec's form without the world size (configuration time): a known name,
    ``gateway:``/``chain:`` with positive integer machine sizes, or ``edges:`` whose edges look like ``0-1``
    or ``0>1`` and are no self-loops. :func:`build` checks the rest against the world size.

    Args:
        spec: str.

    Raises:
        ValueError: a malformed spec (the message names it and the bad piece).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"Hop graph must be a non-empty str ({named_graph_names()}), got {spec!r}")
    given, spec = spec, spec.strip()  # messages quote the spec as given
    if spec.startswith(("gateway:", "chain:")):
        sizes = spec.partition(":")[2].split(",")
        if not all(re.fullmatch(r"\s*0*[1-9]\d{0,8}\s*", t) for t in sizes):  # ints in [1, 1e9)
            raise ValueError(f"Hop graph {given!r}: machine sizes must be integers >= 1 such as "
                             f"{spec.split(':')[0]}:4,2,2")
    elif spec.startswith("edges:"):
        for part in spec[6:].split(","):
            m = _EDGE.match(part)
            if part.strip() and not m:
                raise ValueError(f"Hop graph {given!r}: edge {part.strip()!r} must look like 0-1 (both ways) or 0>1 "
                                 "(0 sends to 1)")
            if m and m.group(1) == m.group(3):
                raise ValueError(f"Hop graph {given!r}: edge {part.strip()!r} is a self-loop; self-loops are implicit")
    elif spec not in NAMED:
        raise ValueError(f"unknown graph {given!r}; use one of {named_graph_names()}")


def build(spec, n):
    """Build the graph named ``spec`` on ``n`` workers.

    Args:
        spec: str, a graph name (module docstring: ring, ring-based, double-ring, complete,
            gateway:SIZES, chain:SIZES, edges:EDGES).
        n: int >= 1, the world size.

    Returns:
        :class:`Graph`.

    Raises:
        ValueError: unknown name, a family that does not exist for ``n`` (the message says which
            n it needs), malformed edges, self-loops or a graph that is not strongly connected.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"Hop graph must be a non-empty str ({named_graph_names()}), got {spec!r}")
    spec = spec.strip()
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"Hop graph: the number of workers must be an int >= 1, got {n!r}")
    nodes = list(range(n))
    if n == 1:
        if spec.startswith("edges:") and spec[6:].strip():
            raise ValueError(f"Hop graph {spec!r}: a world of one worker has no edges")
        return Graph(1, [], spec)
    if spec == "ring":
        return Graph(n, _undirected(_ring_pairs(nodes)), spec)
    if spec == "ring-based":
        if n % 2 or n < 4:
            raise ValueError(f"Hop graph 'ring-based' needs an even number of workers >= 4, got {n}")
        return Graph(n, _undirected(_ring_based_pairs(nodes)), spec)
    if spec == "double-ring":
        h = n // 2
        if n % 2 or h % 2 or h < 4:
            raise ValueError(f"Hop graph 'double-ring' needs n = 2h workers with h even and >= 4 (8, 12, 16, ...), "
                             f"got {n}")
        pairs = _ring_based_pairs(nodes[:h]) + _ring_based_pairs(nodes[h:]) + [(i, i + h) for i in range(h)]
        return Graph(n, _undirected(pairs), spec)
    if spec == "complete":
        return Graph(n, [(i, j) for i in nodes for j in nodes if i != j], spec)
    if spec.startswith("gateway:") or spec.startswith("chain:"):
        kind, _, text = spec.partition(":")
        machines = _sizes(text, n, spec)
        pairs = [(a, b) for m in machines for a in m for b in m if a < b]
        if kind == "gateway":
            pairs += _ring_pairs([m[0] for m in machines]) if len(machines) > 2 else \
                [(machines[0][0], machines[1][0])] if len(machines) == 2 else []
        else:
            pairs += [(machines[m][-1], machines[(m + 1) % len(machines)][0])
                      for m in range(len(machines)) if len(machines) > 1]
        return Graph(n, _undirected(pairs), spec)
    if spec.startswith("edges:"):
        edges = []
        for part in spec[6:].split(","):
            if not part.strip():
                continue
            m = _EDGE.match(part)
            if not m:
                raise ValueError(f"Hop graph {spec!r}: edge {part.strip()!r} must look like 0-1 (both ways) or 0>1 "
                                 "(0 sends to 1)")
            a, kind, b = int(m.group(1)), m.group(2), int(m.group(3))
            edges += [(a, b), (b, a)] if kind == "-" else [(a, b)]
        return Graph(n, edges, spec)
    raise ValueError(f"unknown Hop graph {spec!r}; use one of {named_graph_names()}")


def mixing_matrix(graph, self_loops=True):
    """The mixing matrix W of eq. (1): float64 [n, n], W[i, j] = 1 / |N_in(j)| for i in N_in(j), else 0.

    Args:
        graph: :class:`Graph`. self_loops: bool; False builds A / in-degree without self-loops
            (the paper's spectral-gap convention).

    Returns:
        numpy float64 array [n, n]; one standard step with zero gradients is X_{k+1} = W^T X_k.
    """
    n = graph.n
    w = np.zeros((n, n))
    for j in range(n):
        senders = list(graph.in_neighbours[j]) + ([j] if self_loops or n == 1 else [])
        for i in senders:
            w[i, j] = 1.0 / len(senders)
    return w


def spectral_gap(graph, convention="training"):
    """Spectral gap |lambda_1(W)| - |lambda_2(W)| of the graph's mixing matrix (footnote 2).

    Args:
        graph: :class:`Graph`.
        convention: ``"training"`` (W with self-loops, the matrix Hop trains with; eigenvalues
            ordered by modulus) or ``"paper"`` (W without self-loops, lambda_2 the second-largest
            real eigenvalue: reproduces Figure 21's 0.6667, 0.2682, 0.2688).

    Returns:
        float.

    Raises:
        ValueError: unknown convention.
    """
    if convention not in ("training", "paper"):
        raise ValueError(f"spectral_gap: convention must be 'training' or 'paper', got {convention!r}")
    if graph.n == 1:
        return 1.0
    w = mixing_matrix(graph, self_loops=(convention == "training"))
    eig = np.linalg.eigvals(w)
    if convention == "training":
        mods = np.sort(np.abs(eig))[::-1]
        return float(mods[0] - mods[1])
    real = np.sort(eig.real)[::-1]
    return float(abs(real[0]) - abs(real[1]))
