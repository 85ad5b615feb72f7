"""Hierarchical RNA in real mpirun runs (3 workers + 1 server): one group is flat RNA, rounds reduce only
within a group, parameters are bit-identical within a group after each broadcast, the automatic rule
splits a slow worker off after the warm-up, bad groups fail before training (``tests/jobs/rnah_check.py``)."""

import numpy as np
from conftest import JOBS_DIR, PY, launch, read_json, run_job

SCRIPT = f"{JOBS_DIR}/rnah_check.py"


def _run(tmp_path, mode, np_=4):
    out = tmp_path / f"{mode}.json"
    launch(np_, [SCRIPT, mode, str(out)], timeout=300)
    return read_json(out)


def check_rounds(r):
    """Each round (grouping epoch, group, round id) was joined by exactly its group's members, had a
    contributor, and every member published the same group sum; returns {key: {rank: entry}}."""
    by_round = {}
    for rk in r["ranks"]:
        for e in rk["log"]:
            assert e["w"] in (0.0, 1.0)
            if not e["w"]:
                assert e["g"] == 0.0 and e["its"] == []  # the null gradient
            by_round.setdefault((e["epoch"], e["group"], e["round"]), {})[rk["rank"]] = e
    assert by_round
    for key, entries in by_round.items():
        members = next(iter(entries.values()))["members"]
        assert sorted(entries) == members, f"round {key} joined by {sorted(entries)}, not its group {members}"
        contributors = [i for i, e in entries.items() if e["w"] == 1.0]
        assert contributors, f"round {key} had no contributor"
        assert len({(e["sum_w"], e["sum_wg"]) for e in entries.values()}) == 1  # the same bits on every member
        assert next(iter(entries.values()))["sum_w"] == len(contributors)
    return by_round


def check_overwrites(summary, group_of_round):
    """After every server exchange all members of the group hold bit-identical parameters, equal to the pulled
    model; returns the number of exchanges per (epoch, group)."""
    logs = summary["overwrites_log"]
    by_key = {}
    for rank, entries in logs.items():
        for epoch, group, rnd, initiator, digest, pulled in entries:
            assert digest == pulled  # the parameters right after the overwrite are exactly the pulled model
            by_key.setdefault((epoch, group, rnd), {})[int(rank)] = (digest, initiator)
    counts = {}
    for key, got in by_key.items():
        members = group_of_round[key]
        assert sorted(got) == members, f"exchange {key} overwrote {sorted(got)}, not the group {members}"
        assert len(set(got.values())) == 1, f"exchange {key}: members differ after the broadcast"
        assert got[members[0]][1] in members  # the initiator is a member
        counts[key[:2]] = counts.get(key[:2], 0) + 1
    return counts


def test_one_group_is_flat_rna_without_the_server(tmp_path):
    r = _run(tmp_path, "one")
    s = r["summary"]
    assert s["groups"] == [[0, 1, 2]] and s["num_groups"] == 1
    assert s["ps_exchanges"] == s["overwrites"] == 0 and s["pushes_per_server"] == [0] and s["server_clients"] == []
    by_round = check_rounds(r)
    assert len(by_round) == s["rounds"] > 0
    for entries in by_round.values():  # Algorithm 2: the mean of exactly the contributors' constants c_i = i + 1
        contributors = [i for i, e in entries.items() if e["w"]]
        assert all(entries[i]["g"] == i + 1 for i in contributors)
        e = entries[0]
        assert abs(e["sum_wg"] / e["sum_w"] - sum(i + 1 for i in contributors) / len(contributors)) < 1e-5
    workers = [rk for rk in r["ranks"] if rk["role"] == "worker"]
    assert [rk["steps_run"] for rk in workers] == [60, 60, 60]
    assert all(p["final_reason"] == "all ranks finished" for p in s["per_rank"])
    assert s["parameter_averages"] > 0  # flat RNA's average every average_every rounds inside the group
    assert len({tuple(rk["final"]) for rk in r["ranks"]}) == 1  # average_at_end, the server rank included


def test_explicit_groups_reduce_within_the_group_and_broadcast_bit_identical_parameters(tmp_path):
    r = _run(tmp_path, "groups")
    s = r["summary"]
    assert s["groups"] == [[0, 1], [2]]
    assert s["group_changes"] == [{"epoch": 1, "round": 0, "groups": [[0, 1], [2]], "source": "explicit",
                                   "times_ms": None}]
    by_round = check_rounds(r)
    assert {key[1] for key in by_round} == {0, 1}
    for (epoch, group, _), entries in by_round.items():
        assert epoch == 1 and sorted(entries) == s["groups"][group]
        assert all(e["ps"] for e in entries.values())  # sync_every = 1: every round exchanges with the server
    counts = check_overwrites(s, {key: sorted(entries) for key, entries in by_round.items()})
    assert counts == {(1, 0): len([k for k in by_round if k[1] == 0]), (1, 1): len([k for k in by_round if k[1] == 1])}
    assert s["ps_exchanges_per_group"] == {f"{e}:{g}": c for (e, g), c in counts.items()}
    server = s["per_server"][0]
    assert server["pushes"] == server["pulls"] == s["ps_exchanges"] == sum(counts.values())
    assert server["pushes_per_group"] == [counts[(1, 0)], counts[(1, 1)]]
    for epoch, group, rank in server["order"]:  # only a group's own initiators push for it
        assert rank in s["groups"][group]
    assert set(s["server_clients"]) <= {0, 1, 2}
    stats = {rk["rank"]: rk["stats"] for rk in r["ranks"]}
    assert [stats[i]["rnah_group"] for i in range(3)] == [0.0, 0.0, 1.0]
    assert all(stats[i]["rnah_groups"] == 2.0 for i in range(3))
    assert len({tuple(rk["final"]) for rk in r["ranks"]}) == 1


def test_the_delta_rule_adds_each_groups_progress_to_one_model_on_the_server(tmp_path):
    """server_rule="delta" with groups [[0, 1], [2]]: replayed in the server's service order, every pull is the
    server's model plus the pushing group's progress since its own last pull (x += x_g - b_g; b_g = x), in float64
    from the initial model, on the last parameter (a bias of the output layer); the average rule would give
    (x_0 + x_1) / 2 instead."""
    r = _run(tmp_path, "delta")
    s = r["summary"]
    assert s["groups"] == [[0, 1], [2]] and s["server_rule"] == "delta"
    by_round = check_rounds(r)
    check_overwrites(s, {key: sorted(entries) for key, entries in by_round.items()})
    per_group = {}
    for rk in r["ranks"]:
        for epoch, group, rnd, pushed, pulled in rk["exchanges"]:
            per_group.setdefault(group, []).append((rnd, pushed, pulled))
    for v in per_group.values():
        v.sort()
    order = s["per_server"][0]["order"]
    assert sorted(per_group) == [0, 1] and len(order) == sum(len(v) for v in per_group.values()) == s["ps_exchanges"]
    x0 = np.float32(r["ranks"][0]["initial"])
    model, base, seen, moved = np.float64(x0), {0: x0, 1: x0}, {0: 0, 1: 0}, 0
    for epoch, group, _ in order:
        _, pushed, pulled = per_group[group][seen[group]]
        seen[group] += 1
        model += np.float64(np.float32(pushed)) - np.float64(base[group])
        assert np.float32(pulled) == np.float32(model), (epoch, group, seen[group], pulled, model)
        moved += np.float32(pushed) != base[group]
        base[group] = np.float32(model)
    assert moved > 0.5 * len(order)  # the groups did learn between their exchanges
    assert len({tuple(rk["final"]) for rk in r["ranks"]}) == 1


def test_groups_by_host_follow_the_launch_host_names(tmp_path):
    """groups="host": an MPMD mpirun launch names the host of each rank (HOROVOD_HOSTNAME: h0 for ranks 0
    and 1, h1 for rank 2, h2 for the server); the groups are the workers of each host, and the rounds
    and exchanges behave as with the same groups given explicitly."""
    out = tmp_path / "host.json"
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl_tcp_if_include", "lo"]
    for n, host in ((2, "h0"), (1, "h1"), (1, "h2")):
        cmd += ["-np", str(n), "env", f"HOROVOD_HOSTNAME={host}", PY, SCRIPT, "host", str(out), ":"]
    proc = run_job(cmd[:-1], 300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    r = read_json(out)
    s = r["summary"]
    assert s["groups"] == [[0, 1], [2]]
    change = s["group_changes"][0]
    assert change["source"] == "host" and change["hosts"] == ["h0", "h0", "h1", "h2"] and change["groups"] == [[0, 1], [2]]
    by_round = check_rounds(r)
    assert {key[1] for key in by_round} == {0, 1}
    counts = check_overwrites(s, {key: sorted(entries) for key, entries in by_round.items()})
    assert sum(counts.values()) == s["ps_exchanges"] > 0
    assert len({tuple(rk["final"]) for rk in r["ranks"]}) == 1


def test_auto_groups_split_the_slow_worker_off_after_the_warm_up(tmp_path):
    r = _run(tmp_path, "auto")
    s = r["summary"]
    d = s["auto_decision"]
    assert d["groups"] == [[0, 1], [2]]
    t = {int(k): v for k, v in d["times_ms"].items()}
    assert t[2] > 40.0 > max(t[0], t[1])  # rank 2's injected 40 ms per step was measured
    assert s["groups"] == [[0, 1], [2]] and s["regroups"] == 1
    (change,) = s["group_changes"]
    assert change["source"] == "auto" and change["groups"] == [[0, 1], [2]] and change["round"] == d["round"] + 1
    by_round = check_rounds(r)
    for (epoch, group, rnd), entries in by_round.items():
        if epoch == 0:  # the warm-up: one group of every worker, flat RNA, no server exchange
            assert sorted(entries) == [0, 1, 2] and rnd <= d["round"] and not any(e["ps"] for e in entries.values())
        else:
            assert sorted(entries) == s["groups"][group] and rnd > d["round"]
    counts = check_overwrites(s, {key: sorted(entries) for key, entries in by_round.items()})
    assert counts.get((1, 0), 0) > 0  # the fast group exchanged with the server after the split
    first = s["rounds_per_group"][0]
    assert first["members"] == [0, 1, 2] and first["closed_by_regroup"] and first["ps_rounds"] == 0
    assert s["per_server"][0]["regroups"] == 1
    assert len({tuple(rk["final"]) for rk in r["ranks"]}) == 1


def test_bad_groups_are_rejected_before_training(tmp_path):
    r = _run(tmp_path, "bad", np_=3)
    expected = [r"groups\[1\] = \[1, 2\] names rank 2, which is a parameter-server rank; the workers are ranks 0..1",
                r"leave worker rank\(s\) \[1\] in no group",
                r"groups\[2\] = \[5\] names rank 5, which is not in the launch of 3 ranks",
                r"probes=3 exceeds the 2 worker\(s\)",
                r"rank 1 is in both groups\[0\] and groups\[1\]"]
    import re
    for rk in r["ranks"]:
        assert len(rk["errors"]) == len(expected)
        for message, pattern in zip(rk["errors"], expected):
            assert message is not None and re.search(pattern, message), message
