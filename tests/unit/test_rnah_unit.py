"""Hierarchical RNA without a launch: the grouping rule of RNA section 4 on the spec's worked examples,
the checks of explicit groups, the server's averaging rule (spec rule A) and the group controller."""
import numpy as np
import pytest

import hetsync
from hetsync.protocols import HierarchicalRNAConfig, parse_protocol_args
from hetsync.protocols.rna.groups import (DeltaSum, GroupController, SlotAverage, check_groups_fit, host_groups,
                                          speed_groups)


@pytest.mark.parametrize("times, groups", [
    ([1, 3, 9, 27], [[0, 1], [2], [3]]),                      # the example
    ([1, 1, 1, 1, 10, 10, 10, 10], [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ([1, 2, 3, 4], [[0, 1], [2, 3]]),
    ([1, 1, 1, 4], [[0, 1, 2], [3]]),
    ([1, 1, 1, 2], [[0, 1, 2, 3]]),
    ([10] * 4 + [30] * 4, [list(range(8))]),                  # zeta = 20 = v: not split
    ([10] * 4 + [31] * 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ([5.0], [[0]]),
    ([27, 9, 3, 1], [[2, 3], [1], [0]]),                      # indices follow the input order
])
def test_grouping_rule_on_the_worked_examples(times, groups):
    assert speed_groups(times) == groups


@pytest.mark.parametrize("seed", range(20))
def test_grouping_is_a_partition_and_every_group_satisfies_the_rule(seed):
    rng = np.random.default_rng(seed)
    times = rng.lognormal(0.0, 1.5, size=int(rng.integers(1, 12))).tolist()
    groups = speed_groups(times)
    assert sorted(i for g in groups for i in g) == list(range(len(times)))
    for g in groups:
        ts = [times[i] for i in g]
        assert max(ts) - min(ts) <= sum(ts) / len(ts)
    assert speed_groups([3.0] * len(times)) == [list(range(len(times)))]


@pytest.mark.parametrize("n", [3, 4, 8])
def test_one_straggler_splits_off_above_the_closed_form_threshold(n):
    k = (2 * n - 1) / (n - 1)
    assert speed_groups([1.0] * (n - 1) + [k]) == [list(range(n))]
    assert speed_groups([1.0] * (n - 1) + [k * 1.001]) == [list(range(n - 1)), [n - 1]]


@pytest.mark.parametrize("times, message", [([], "must not be empty"), ([1, float("nan")], r"times\[1\]"),
                                            ([1, -2], r"times\[1\] = -2"), ([1, "a"], r"times\[1\] = 'a'")])
def test_grouping_rejects_bad_times(times, message):
    with pytest.raises(ValueError, match=message):
        speed_groups(times)


@pytest.mark.parametrize("groups, message", [
    ("fast", "groups must be 'auto', 'host' or a non-empty list"),
    ([], "got \\[\\]"),
    ([[0, 1], []], r"groups\[1\] = \[\] is not a non-empty list"),
    ([[0, 1], [1, 2]], r"rank 1 is in both groups\[0\] and groups\[1\]"),
    ([[0, 0]], r"rank 0 is listed twice in groups\[0\]"),
    ([[0, -1]], r"groups\[0\]\[1\] = -1 is not a rank"),
    ([[0, 1.5]], r"groups\[0\]\[1\] = 1.5 is not a rank"),
    ([[True]], r"groups\[0\]\[0\] = True is not a rank"),
])
def test_malformed_groups_are_rejected_naming_the_bad_value(groups, message):
    with pytest.raises(ValueError, match=message):
        HierarchicalRNAConfig(groups=groups)


def test_groups_are_normalised_and_parsed_from_the_cli():
    assert HierarchicalRNAConfig(groups=[[1, 0], [2]]).groups == ((0, 1), (2,))
    assert HierarchicalRNAConfig().groups == "auto"
    assert parse_protocol_args("rnah", ["groups=[[0,1],[2,3]]", "sync_every=2", "servers=1"]) == {
        "groups": [[0, 1], [2, 3]], "sync_every": 2, "servers": 1}
    assert parse_protocol_args("rnah", ["groups=auto"]) == {"groups": "auto"}
    assert parse_protocol_args("rnah", ["groups=host"]) == {"groups": "host"}
    assert HierarchicalRNAConfig(groups="host").groups == "host"
    with pytest.raises(ValueError, match="groups must be auto, host or a list of lists"):
        parse_protocol_args("rnah", ["groups=fast"])
    with pytest.raises(ValueError, match="sync_every must be an integer >= 1"):
        HierarchicalRNAConfig(sync_every=0)
    assert "rnah" in hetsync.protocols.WRAPPERS and hetsync.HierarchicalRNA.protocol_class.name == "rnah"


def test_groups_must_partition_the_workers_of_the_launch():
    check_groups_fit("HierarchicalRNA", ((0, 1), (2,)), 3, 4)
    with pytest.raises(ValueError, match=r"groups\[1\] = \[2, 3\] names rank 3, which is a parameter-server rank"):
        check_groups_fit("HierarchicalRNA", ((0, 1), (2, 3)), 3, 4)
    with pytest.raises(ValueError, match="names rank 7, which is not in the launch of 4 ranks"):
        check_groups_fit("HierarchicalRNA", ((0, 1, 2), (7,)), 3, 4)
    with pytest.raises(ValueError, match=r"leave worker rank\(s\) \[2\] in no group"):
        check_groups_fit("HierarchicalRNA", ((0, 1),), 3, 4)


def test_host_groups_follow_the_launch_hosts_in_order_of_first_appearance():
    assert host_groups(["h0", "h0", "h1", "h1", "h2", "h2"]) == [[0, 1], [2, 3], [4, 5]]
    assert host_groups(["b", "a", "b", "c"]) == [[0, 2], [1], [3]]
    assert host_groups(["vm"] * 3) == [[0, 1, 2]]  # one host: one group, flat RNA
    with pytest.raises(ValueError, match="no worker host names"):
        host_groups([])


def test_the_launch_names_the_host(monkeypatch):
    from hetsync import world

    monkeypatch.delenv("HOROVOD_HOSTNAME", raising=False)
    monkeypatch.setenv("PMIX_HOSTNAME", "h3")
    assert world.host_name() == "h3"
    monkeypatch.setenv("HOROVOD_HOSTNAME", "g1")  # horovodrun's Gloo mode first
    assert world.host_name() == "g1"
    monkeypatch.delenv("HOROVOD_HOSTNAME")
    monkeypatch.delenv("PMIX_HOSTNAME")
    import socket

    assert world.host_name() == socket.gethostname()


def test_server_rule_a_pull_after_sequential_pushes_and_slot_replacement():
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(7).astype(np.float32)
    n = 3
    avg = SlotAverage(x0, n)
    xs = [rng.standard_normal(7).astype(np.float32) for _ in range(n)]
    for g in range(n):  # group g's pull is (sum_{h<=g} x_h + (N - g) x0) / N  (groups counted from 1 in the spec)
        pulled = avg.push(g, xs[g])
        expect = (sum(xs[h].astype(np.float64) for h in range(g + 1)) + (n - g - 1) * x0.astype(np.float64)) / n
        np.testing.assert_allclose(pulled, expect.astype(np.float32), rtol=0, atol=1e-6)
        assert pulled.dtype == np.float32
    x1b = rng.standard_normal(7).astype(np.float32)
    pulled = avg.push(1, x1b)  # a group pushing again replaces its own slot
    np.testing.assert_allclose(pulled, ((xs[0].astype(np.float64) + x1b + xs[2]) / 3).astype(np.float32), atol=1e-6)
    assert avg.pushes == [1, 2, 1]
    one = SlotAverage(x0, 1)  # one group: the average of a single slot is the identity
    assert np.array_equal(one.push(0, xs[0]), xs[0])
    with pytest.raises(ValueError, match="outside"):
        avg.push(3, xs[0])
    with pytest.raises(ValueError, match="shape"):
        avg.push(0, xs[0][:3])


def test_server_rule_delta_adds_each_groups_progress_since_its_last_pull():
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal(7).astype(np.float32)
    n = 3
    ds = DeltaSum(x0, n)
    xs = [rng.standard_normal(7).astype(np.float32) for _ in range(n)]
    x64 = x0.astype(np.float64)
    for g in range(n):  # every group moved from x0: group g's pull is x0 + sum_{h<=g} (x_h - x0)
        pulled = ds.push(g, xs[g])
        expect = x64 + sum(xs[h].astype(np.float64) - x64 for h in range(g + 1))
        np.testing.assert_allclose(pulled, expect.astype(np.float32), rtol=0, atol=1e-5)
        assert pulled.dtype == np.float32
    # group 0 moves by d from the model it pulled: the server's model moves by exactly d, nothing else
    base0 = (x64 + (xs[0].astype(np.float64) - x64)).astype(np.float32)  # what group 0 pulled
    d = np.full(7, 0.25, np.float32)
    before = ds.current().astype(np.float64)
    after = ds.push(0, base0 + d)
    np.testing.assert_allclose(after.astype(np.float64) - before, d, atol=1e-5)
    # pushing back exactly what was pulled changes nothing
    np.testing.assert_array_equal(ds.push(0, after), after)
    assert ds.pushes == [3, 1, 1]
    # the slot average moves the model by d / N for the same step
    avg = SlotAverage(x0, n)
    moved = avg.push(0, x0 + d)
    np.testing.assert_allclose(moved - x0, d / n, atol=1e-6)
    with pytest.raises(ValueError, match="outside"):
        ds.push(3, xs[0])
    with pytest.raises(ValueError, match="shape"):
        ds.push(0, xs[0][:3])
    with pytest.raises(ValueError, match="n_groups"):
        DeltaSum(x0, 0)


def test_server_rule_is_checked_before_training():
    with pytest.raises(ValueError, match="server_rule"):
        HierarchicalRNAConfig(server_rule="median")
    assert HierarchicalRNAConfig(server_rule="delta").server_rule == "delta"
    assert HierarchicalRNAConfig().server_rule == "average"


class _Cfg:
    probes, average_every, timeout_s, finish_timeout_s, seed = 2, 2, 10.0, 10.0, 0
    sync_every = 2


def test_group_controller_probes_and_announces_to_its_members_only():
    sent = []
    ctl = GroupController(_Cfg(), 0, 6, lambda d, m: sent.append((d, m)), 5, [2, 4, 5], n_groups=2)
    ctl.send_probes()
    assert {d for d, m in sent} <= {2, 4, 5} and all(m == ("probe", 5) for _, m in sent)
    probed = sent[0][0]
    sent.clear()
    ctl.on_message(probed, ("ready", 5))
    assert [d for d, m in sent if m[0] == "round"] == [2, 4, 5]
    assert sent[0][1] == ("round", 5, probed, False, False, False)  # several groups: no parameter average
    sent.clear()
    ctl.on_message(ctl.probed[0], ("ready", 6))
    assert sent[0][1][-1] is True and ctl.ps_rounds == 1  # every sync_every = 2nd round of the group
    ctl.on_message(0, ("done", 3))  # a non-member's report (an earlier grouping's controller) is ignored
    assert ctl.done == {}
    for r in (2, 4, 5):
        ctl.on_message(r, ("done", 10))
    assert ctl.final_sent and ctl.final_reason == "all ranks finished"


def test_group_controller_decides_once_every_member_reported_then_stashes():
    calls = []
    ctl = GroupController(_Cfg(), 0, 3, lambda d, m: None, 0, [0, 1, 2], n_groups=1,
                          decide=lambda times, r: calls.append((times, r)) or True)
    ctl.on_message(0, ("time", 4.0))
    ctl.on_message(1, ("time", 4.5))
    assert not calls
    ctl.on_message(2, ("time", 40.0))
    assert calls == [({0: 4.0, 1: 4.5, 2: 40.0}, 0)] and ctl.closed
    ctl.on_message(1, ("done", 7))
    assert ctl.stash == [(1, ("done", 7))] and ctl.done == {}
