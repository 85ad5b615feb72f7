"""Parameter-server protocols without a launch: the alpha rule, shard plans, the server loop on a scripted
dispatcher (exact updates, counters, SSP's gate), configuration checks and roles (single process)."""
import collections
import math

import keras
import numpy as np
import pytest

import hetsync
from hetsync import protocols, transport
from hetsync.protocols.ps.server import PULL, PUSH, ParameterServer, PSError, explicit_momentum, plan_shards
from hetsync.protocols.ps.shat import shat_alpha
from hetsync.transport.p2p import Dispatcher, Message


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


# -- alpha (SHAT eq. 4, spec section 2) ---------------------------------------------------------------------

def test_alpha_values_from_the_spec():
    assert shat_alpha(7, 8)[0] == pytest.approx(0.4504, abs=5e-5)
    assert shat_alpha(7, 8)[0] == pytest.approx(1 - (8 / 7) / math.log(8))
    assert shat_alpha(15, 16, root=True)[0] == pytest.approx(0.7333, abs=5e-5)
    assert shat_alpha(3, 4)[0] == pytest.approx(0.038, abs=5e-4)  # n = 4, homogeneous, ln
    assert shat_alpha(3, 4, log_base=2)[0] == pytest.approx(1 / 3)
    assert shat_alpha(7, 8, log_base=2)[0] == pytest.approx(0.619, abs=5e-4)
    # straggler steady state (k = 10, n = 8): c = 70 for the slow worker
    assert shat_alpha(70, 8)[0] == pytest.approx(1 - (8 / 70) / math.log(8))


def test_alpha_edge_cases_and_clipping():
    assert shat_alpha(0, 8) == (0.0, False)  # c = 0: keep the local model
    assert shat_alpha(0, 1) == (1.0, False) and shat_alpha(5, 1) == (1.0, False)  # n = 1
    assert shat_alpha(1, 2) == (0.0, True)  # n = 2: 1 - 2 / ln 2 < 0, clipped
    assert shat_alpha(1, 8) == (0.0, True)  # 1 - 8 / ln 8 < 0
    a, clipped = shat_alpha(10 ** 9, 8)
    assert 0.999 < a <= 1.0 and not clipped
    values = [shat_alpha(c, 8)[0] for c in range(0, 200)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert values == sorted(values) and values[-1] > values[10]  # monotone in c


@pytest.mark.parametrize("bad", [dict(c=-1, n=4), dict(c=1.5, n=4), dict(c=1, n=0), dict(c=True, n=4),
                                 dict(c=1, n=4, log_base=1.0), dict(c=1, n=4, log_base=0.5),
                                 dict(c=1, n=4, log_base=float("inf"))])
def test_alpha_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="SHAT alpha"):
        shat_alpha(**bad)


# -- shard plans (SHAT section 4.4) ---------------------------------------------------------------------------

def _covers(ranges, total):
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(lo < hi == lo2 for (lo, hi), (lo2, _) in zip(ranges, ranges[1:]))


def test_memory_sharding_balances_elements_and_splits_big_variables():
    sizes = [784 * 128, 128, 128 * 10, 10]
    for k in (1, 2, 3, 4, 7):
        ranges = plan_shards(sizes, k, "memory")
        _covers(ranges, sum(sizes))
        lengths = [hi - lo for lo, hi in ranges]
        assert len(ranges) == k and max(lengths) - min(lengths) <= 1
    assert plan_shards([5], 5, "memory") == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_layer_sharding_gives_whole_variables_balanced_by_count():
    sizes = [100, 10, 50, 5, 30]
    offsets = set(np.concatenate([[0], np.cumsum(sizes)]).tolist())
    for k in (1, 2, 3, 4, 5):
        ranges = plan_shards(sizes, k, "layer")
        _covers(ranges, sum(sizes))
        assert all(lo in offsets and hi in offsets for lo, hi in ranges)  # on variable boundaries
        counts = [sum(1 for v in np.cumsum(sizes) if lo < v <= hi) for lo, hi in ranges]
        assert sum(counts) == len(sizes) and max(counts) - min(counts) <= 1
    assert plan_shards(sizes, 2, "layer") == [(0, 160), (160, 195)]  # 3 + 2 variables; bytes unbalanced


def test_shard_plans_refuse_more_servers_than_parameters_and_bad_modes():
    with pytest.raises(ValueError, match="more servers than parameters.*2 trainable variable"):
        plan_shards([10, 3], 3, "layer")
    with pytest.raises(ValueError, match="more servers than parameters.*13 parameter"):
        plan_shards([10, 3], 14, "memory")
    with pytest.raises(ValueError, match="sharding must be one of"):
        plan_shards([10], 1, "bytes")
    with pytest.raises(ValueError, match="servers must be an int >= 1"):
        plan_shards([10], 0, "memory")


# -- the server loop on a scripted dispatcher ---------------------------------------------------------------

class ScriptedP2P:
    """Hands the server a fixed sequence of pushes and records its replies (no MPI)."""

    rank = 9

    def __init__(self, messages):
        self.inbox = collections.deque(messages)
        self.sent = []

    def poll(self, channel, source=None, tag=None):
        assert channel == PUSH
        return self.inbox.popleft() if self.inbox else None

    def recv(self, channel, source=None, tag=None, timeout_s=60.0):
        if self.inbox:
            return self.inbox.popleft()
        raise transport.TransportTimeout("nothing")

    def send(self, dest, channel, obj, tag=None, timeout_s=None):
        if channel == PULL:
            obj = (np.array(obj[0], copy=True), obj[1])  # MPI's isend pickles at once
        self.sent.append((dest, channel, tag, obj))

    def flush(self, timeout_s=60.0, channel=None):
        pass

    tell = Dispatcher.tell  # the real best-effort error send, over this double's send and flush


def _push(src, t, g, eta=0.5):
    return Message(src, PUSH, t, (eta, np.asarray(g, np.float32), 0.0))


def _done(src):
    return Message(src, PUSH, "done", None)


def test_server_applies_each_gradient_in_arrival_order_and_counts_others_updates():
    rng = np.random.default_rng(3)
    w0 = rng.normal(size=5).astype(np.float32)
    order = [0, 1, 1, 2, 0, 1, 2, 2, 0]
    grads, clocks, msgs = [], collections.Counter(), []
    for i in order:
        g = rng.normal(size=5).astype(np.float32)
        grads.append((i, g))
        msgs.append(_push(i, clocks[i], g, eta=0.25))
        clocks[i] += 1
    msgs += [_done(0), _done(1), _done(2)]
    p2p = ScriptedP2P(msgs)
    stats = ParameterServer(p2p, 0, w0, [0, 1, 2], timeout_s=5).serve()
    w, expected_c, counters = w0.copy(), [], [0, 0, 0]
    for (i, g), (dest, channel, tag, (model, c)) in zip(grads, p2p.sent):
        w = w - np.float32(0.25) * g
        expected_c.append(counters[i])
        counters = [x + 1 for x in counters]
        counters[i] = 0
        assert dest == i and channel == PULL and np.array_equal(model, w)
    assert [s[3][1] for s in p2p.sent] == expected_c == [0, 1, 0, 3, 3, 2, 2, 0, 3]
    assert stats["final_counters"] == {"0": 0, "1": 3, "2": 1}
    assert sum(expected_c) + sum(stats["final_counters"].values()) == 2 * len(order)
    assert stats["pushes"] == stats["pulls"] == len(order)


def _pushes_in_order(rng, order, size, eta):
    """Random float32 gradients [size] pushed by the workers in ``order``, each at its next iteration:
    (the gradients, the push messages)."""
    grads, clocks, msgs = [], collections.Counter(), []
    for i in order:
        grads.append(rng.normal(size=size).astype(np.float32))
        msgs.append(_push(i, clocks[i], grads[-1], eta=eta))
        clocks[i] += 1
    return grads, msgs


def test_staleness_aware_rule_divides_eta_by_each_pushs_counter():
    rng = np.random.default_rng(5)
    w0 = rng.normal(size=4).astype(np.float32)
    order = [0, 1, 1, 2, 0, 1, 2, 2, 0]  # counters c_i at the pushes: 0, 1, 0, 3, 3, 2, 2, 0, 3
    grads, msgs = _pushes_in_order(rng, order, 4, eta=0.3)
    p2p = ScriptedP2P(msgs + [_done(0), _done(1), _done(2)])
    stats = ParameterServer(p2p, 0, w0, [0, 1, 2], timeout_s=5, stale_lr="inverse").serve()
    w = w0.copy()
    for g, c in zip(grads, [0, 1, 0, 3, 3, 2, 2, 0, 3]):
        w = w - np.float32(0.3 / max(c, 1)) * g
    assert np.allclose(p2p.sent[-1][3][0], w, atol=1e-6)
    assert stats["stale_lr"] == "inverse"
    assert stats["lr_scale_mean"] == pytest.approx((4 + 1 / 3 * 3 + 1 / 2 * 2) / 9)
    with pytest.raises(ValueError, match="stale_lr must be one of constant, inverse"):
        ParameterServer(ScriptedP2P([]), 0, w0, [0, 1], stale_lr="sqrt")


def test_server_momentum_is_heavy_ball_on_the_pushes_in_arrival_order():
    rng = np.random.default_rng(6)
    w0 = rng.normal(size=3).astype(np.float32)
    order = [0, 1, 1, 0, 2, 2, 0]  # counters c_i at the pushes: 0, 1, 0, 2, 4, 0, 2
    grads, msgs = _pushes_in_order(rng, order, 3, eta=0.1)
    for stale_lr in ("constant", "inverse"):
        p2p = ScriptedP2P(msgs + [_done(0), _done(1), _done(2)])
        stats = ParameterServer(p2p, 0, w0, [0, 1, 2], timeout_s=5, stale_lr=stale_lr, momentum=0.5).serve()
        w, u = w0.astype(np.float64), np.zeros(3)
        for (dest, _, _, (model, c)), g in zip(p2p.sent, grads):
            u = 0.5 * u + (1.0 / c if stale_lr == "inverse" and c > 1 else 1.0) * g
            w = w - 0.1 * u
            assert np.allclose(model, w, atol=1e-6)
        assert [s[3][1] for s in p2p.sent] == [0, 1, 0, 2, 4, 0, 2]
        assert stats["momentum"] == 0.5
    with pytest.raises(ValueError, match=r"server momentum must be in \[0, 1\), got 1.0"):
        ParameterServer(ScriptedP2P([]), 0, w0, [0, 1], momentum=1.0)


@pytest.mark.parametrize("mu, n, correction, expected", [
    (0.9, 4, "none", 0.9), (0.9, 1, "asynchrony", 0.9), (0.9, 4, "asynchrony", 0.15), (0.9, 2, "asynchrony", 0.4),
    (0.9, 10, "asynchrony", 0.0), (0.0, 4, "asynchrony", 0.0),
])
def test_explicit_momentum_subtracts_the_implicit_momentum_of_n_asynchronous_workers(mu, n, correction, expected):
    assert explicit_momentum(mu, n, correction) == pytest.approx(expected)


def test_explicit_momentum_refuses_bad_values():
    with pytest.raises(ValueError, match="momentum_correction must be one of none, asynchrony, got 'nesterov'"):
        explicit_momentum(0.9, 4, "nesterov")
    with pytest.raises(ValueError, match="number of workers must be an int >= 1, got 0"):
        explicit_momentum(0.9, 0, "asynchrony")


def test_server_gate_holds_replies_until_the_slowest_clock_allows_the_next_iteration():
    g = np.ones(2, np.float32)
    # worker 0 pushes iterations 0, 1, 2 while worker 1 has pushed nothing; s = 1
    msgs = [_push(0, 0, g), _push(0, 1, g), _push(0, 2, g), _push(1, 0, g), _push(1, 1, g), _done(0), _push(1, 2, g),
            _done(1)]
    p2p = ScriptedP2P(msgs)
    server = ParameterServer(p2p, 0, np.zeros(2, np.float32), [0, 1], staleness=1, timeout_s=5)
    stats = server.serve()
    replies = [(dest, tag) for dest, _, tag, _ in p2p.sent]
    # reply to (0, 0) at once (start of iteration 1 needs min clock >= 0); (0, 1) needs min >= 1: after (1, 0);
    # (0, 2) needs min >= 2: after (1, 1)
    assert replies == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (1, 2)]
    assert stats["gate_max_lead"] == 1 and stats["gate_held_replies"] == 2
    # the held reply carries the model as it is when it leaves: (0, 1)'s reply includes worker 1's first push
    assert np.array_equal(p2p.sent[1][3][0], np.full(2, -2.0, np.float32))


def test_server_gate_with_zero_staleness_is_lockstep():
    g = np.ones(1, np.float32)
    msgs = [_push(0, 0, g), _push(1, 0, g), _push(1, 1, g), _push(0, 1, g), _done(0), _done(1)]
    p2p = ScriptedP2P(msgs)
    ParameterServer(p2p, 0, np.zeros(1, np.float32), [0, 1], staleness=0, timeout_s=5).serve()
    # round 0's replies both leave after the second push, with the same model (both updates of round 0)
    assert [(d, t) for d, _, t, _ in p2p.sent] == [(0, 0), (1, 0), (1, 1), (0, 1)]
    assert [float(s[3][0][0]) for s in p2p.sent] == [-1.0, -1.0, -2.0, -2.0]


def test_server_rejects_out_of_order_pushes_and_wrong_shapes():
    p2p = ScriptedP2P([_push(0, 1, np.ones(2))])
    with pytest.raises(PSError, match="pushed iteration 1, expected 0"):
        ParameterServer(p2p, 0, np.zeros(2, np.float32), [0], timeout_s=5).serve()
    p2p = ScriptedP2P([_push(0, 0, np.ones(3))])
    with pytest.raises(PSError, match=r"shape \(3,\)"):
        ParameterServer(p2p, 0, np.zeros(2, np.float32), [0], timeout_s=5).serve()
    assert [c for _, c, _, _ in p2p.sent] == ["ps.error"]  # the unfinished worker is told


def test_server_names_a_silent_worker_after_the_timeout():
    p2p = ScriptedP2P([_push(0, 0, np.ones(2)), _done(0)])
    with pytest.raises(PSError, match=r"no message from worker rank\(s\) \[1\] within 0.3 s"):
        ParameterServer(p2p, 0, np.zeros(2, np.float32), [0, 1], timeout_s=0.3).serve()


# -- configuration and roles --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, kwargs, match", [
    ("shat", {"servers": 0}, "servers K must be an integer >= 1"),
    ("asp", {"servers": 1.5}, "servers K must be an integer"),
    ("shat", {"sharding": "bytes"}, "sharding must be one of 'layer', 'memory'"),
    ("shat", {"log_base": 1.0}, "log_base must be a number > 1"),
    ("ensemble", {"timeout_s": 0}, "timeout_s must be a number > 0"),
    ("ssp", {"staleness": -1}, "staleness s must be an integer >= 0"),
    ("ssp", {"staleness": 2.5}, "staleness s must be an integer"),
    ("asp", {"stale_lr": "sqrt"}, "stale_lr must be one of 'constant', 'inverse'"),
    ("asp", {"server_momentum": 1.0}, r"ASP: server_momentum must be a number in \[0, 1\), got 1.0"),
    ("ssp", {"server_momentum": -0.1}, r"SSP: server_momentum must be a number in \[0, 1\), got -0.1"),
    ("shat", {"momentum_correction": "dana"}, "momentum_correction must be one of 'none', 'asynchrony'"),
])
def test_bad_configuration_values_are_refused_before_training(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        protocols.get_wrapper(name)(keras.optimizers.SGD(0.1), **kwargs)


def test_cli_arguments_are_typed_by_the_config():
    assert protocols.parse_protocol_args("ssp", ["servers=2", "staleness=3", "sharding=layer"]) == \
        {"servers": 2, "staleness": 3, "sharding": "layer"}
    assert protocols.parse_protocol_args("shat", ["log_base=2"]) == {"log_base": 2.0}
    with pytest.raises(ValueError, match="takes no argument 'staleness'"):
        protocols.parse_protocol_args("shat", ["staleness=3"])
    for name in ("asp", "shat", "ensemble", "shatroot", "ssp"):
        assert name in protocols.WRAPPERS


def test_a_launch_without_a_worker_left_fails_before_training():
    opt = hetsync.SHAT(keras.optimizers.SGD(0.1), servers=1)  # a world of one rank: no worker would be left
    assert hetsync.num_workers() == 1 and not hetsync.is_server()
    with pytest.raises(ValueError, match="SHAT: servers=1 leaves no worker: the launch has 1 rank"):
        opt.hetsync_protocol.fit_data(np.zeros((8, 2), np.float32), np.zeros(8, np.int64), 4)
    with pytest.raises(ValueError, match="leaves no worker"):
        hetsync.roles.Roles.of_world(1)
    with pytest.raises(ValueError, match="servers must be an int >= 0"):
        hetsync.roles.Roles.of_world(-1)
    assert opt.hetsync_protocol.roles == hetsync.roles.Roles(size=1, servers=0, rank=0)  # fell back: every rank works


def test_roles_follow_the_wrapped_protocol():
    hetsync.BSP(keras.optimizers.SGD(0.1))
    assert (hetsync.num_servers(), hetsync.num_workers(), hetsync.role(), hetsync.worker_rank()) == (0, 1, "worker", 0)
