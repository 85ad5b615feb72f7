"""Hop without MPI: graphs, the mixing matrix and its closed forms, spectral gaps, eq. (2), configuration errors."""
import numpy as np
import pytest
import tensorflow as tf

from hetsync.protocols.hop import graph as hop_graph
from hetsync.protocols.hop.protocol import HopConfig, staleness_reduce, staleness_weights
from hetsync.protocols.hop.notifyack import NotifyAckConfig


@pytest.mark.parametrize("name,n,degree", [("ring", 4, 2), ("ring", 8, 2), ("ring-based", 8, 3), ("ring-based", 16, 3),
                                           ("double-ring", 8, 4), ("double-ring", 16, 4), ("complete", 5, 4)])
def test_degrees_and_doubly_stochastic(name, n, degree):
    g = hop_graph.build(name, n)
    assert all(len(s) == degree for s in g.out_neighbours) and all(len(s) == degree for s in g.in_neighbours)
    assert g.is_bidirectional() and g.is_regular()
    w = hop_graph.mixing_matrix(g)
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    assert np.all(np.diag(w) == 1.0 / (degree + 1))


def test_ring_of_four_one_step_and_n_steps_closed_form():
    g = hop_graph.build("ring", 4)
    w = hop_graph.mixing_matrix(g)
    x0 = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(w.T @ x0, [4 / 3, 1.0, 2.0, 5 / 3])
    x = x0
    for _ in range(7):
        x = w.T @ x
    np.testing.assert_allclose(x, np.linalg.matrix_power(w.T, 7) @ x0)
    assert x.mean() == pytest.approx(1.5)  # regular graph: the mean is preserved


def test_ring_based_neighbours_are_ring_plus_most_distant():
    g = hop_graph.build("ring-based", 8)
    assert g.out_neighbours[0] == [1, 4, 7] and g.in_neighbours[5] == [1, 4, 6]


def test_double_ring_joins_two_ring_based_node_to_node():
    g = hop_graph.build("double-ring", 8)
    assert g.out_neighbours[0] == [1, 2, 3, 4]  # ring-based(4) on 0..3 is K4, plus 0 <-> 4
    assert g.out_neighbours[5] == [1, 4, 6, 7]


@pytest.mark.parametrize("name,n,training,paper", [
    ("ring", 4, 0.6667, 1.0), ("ring", 8, 0.1953, 0.2929), ("ring", 16, 0.0507, 0.0761),
    ("ring-based", 8, 0.5, 0.6667), ("ring-based", 16, 0.1464, 0.1953), ("double-ring", 8, 0.4, 0.5),
    ("double-ring", 16, 0.4, 0.5), ("gateway:4,2,2", 8, 0.1808, 0.2682), ("chain:4,2,2", 8, 0.1885, 0.2688),
])
def test_spectral_gaps_reproduce_the_spec_table_and_figure_21(name, n, training, paper):
    g = hop_graph.build(name, n)
    assert hop_graph.spectral_gap(g) == pytest.approx(training, abs=6e-5)
    assert hop_graph.spectral_gap(g, "paper") == pytest.approx(paper, abs=6e-5)


def test_figure_21_graphs_are_irregular_and_column_stochastic_only():
    for name in ("gateway:4,2,2", "chain:4,2,2"):
        g = hop_graph.build(name, 8)
        w = hop_graph.mixing_matrix(g)
        assert not g.is_regular()
        np.testing.assert_allclose(w.sum(axis=0), 1.0)
        assert not np.allclose(w.sum(axis=1), 1.0)


def test_user_edges_directed_and_undirected():
    g = hop_graph.build("edges:0>1,1>2,2>0", 3)
    assert g.out_neighbours == [[1], [2], [0]] and g.in_neighbours == [[2], [0], [1]]
    assert not g.is_bidirectional()
    assert hop_graph.build("edges:0-1, 1-2", 3).out_neighbours == [[1], [0, 2], [1]]
    d = hop_graph.build("edges:0>1,1>2,2>0", 3).distances()
    assert d[0, 2] == 2 and d[2, 0] == 1


@pytest.mark.parametrize("spec,n,msg", [
    ("edges:0-1,1-1", 2, "self-loop"),
    ("edges:0>1,1>2", 3, "not strongly connected"),
    ("edges:0-1,2-3", 4, "not strongly connected"),
    ("edges:0-5", 3, "outside 0..2"),
    ("edges:0+1", 2, "must look like"),
    ("ring-based", 7, "even number"),
    ("double-ring", 6, "h even"),
    ("gateway:4,2", 8, "sum to the world size 8"),
    ("torus", 4, "unknown Hop graph"),
])
def test_bad_graphs_raise_naming_the_problem(spec, n, msg):
    with pytest.raises(ValueError, match=msg):
        hop_graph.build(spec, n)


def test_eq2_weights_and_reduce():
    iters = tf.constant([10, 8, 5, 4], tf.int64)
    found = tf.constant([True, True, True, True])
    w = staleness_weights(iters, found, tf.constant(10, tf.int64), 5)
    assert w.numpy().tolist() == [6, 4, 1, 0]
    assert staleness_weights(iters, [True, False, True, True], 10, 5).numpy().tolist() == [6, 0, 1, 0]
    x_self, u8, u5, u4 = 1.0, 2.0, 5.0, 100.0
    values = [tf.constant([[x_self], [u8], [u5], [u4]], tf.float32)]
    out = staleness_reduce(values, w)[0].numpy()
    assert out[0] == pytest.approx((6 * x_self + 4 * u8 + u5) / 11)
    # an update from a neighbour ahead of k weighs more than s + 1
    assert staleness_weights([12], [True], 10, 5).numpy().tolist() == [8]


@pytest.mark.parametrize("kwargs,msg", [
    ({"skip": 2}, "needs backup_workers >= 1 or a staleness bound"),
    ({"skip": 6, "backup_workers": 1, "max_ig": 5}, "exceeds max_ig=5"),
    ({"backup_workers": 1, "staleness": 3}, "not both"),
    ({"max_ig": 0}, "max_ig must be"),
    ({"backup_workers": -1}, "backup_workers N_buw must be"),
    ({"staleness": -2}, "staleness s must be"),
    ({"graph": "torus"}, "unknown graph 'torus'"),
    ({"timeout_s": 0}, "timeout_s must be"),
])
def test_config_errors_name_the_value(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        HopConfig(**kwargs)


def test_configs_accept_the_papers_settings():
    c = HopConfig(graph="ring-based", backup_workers=1, skip=5, max_ig=10)
    assert c.as_dict()["skip"] == 5
    assert HopConfig(staleness=5).staleness == 5
    with pytest.raises(ValueError, match="unknown graph"):
        NotifyAckConfig(graph="star")
