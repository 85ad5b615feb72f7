"""The point-to-point dispatcher between real ranks (mpirun): channels, tags, any-source receives,
drain accounting, a timeout naming the peer, two threads at once, the counted shutdown, a receive that a
peer's failure report ends (recv_or_fail) and the gather through one rank (gather_at)."""
import pytest

from conftest import launch, read_json



@pytest.mark.parametrize("np_", [3, 4])
def test_dispatcher_between_ranks(np_, tmp_path):
    out = tmp_path / "p2p.json"
    launch(np_, ["tests/jobs/p2p_check.py", str(out)], timeout=240)
    r = read_json(out)
    n = r["n"]
    assert n == np_ and [q["rank"] for q in r["ranks"]] == list(range(n))
    for q in r["ranks"]:
        rank, nxt, prv = q["rank"], (q["rank"] + 1) % n, (q["rank"] - 1) % n
        assert q["ring"] == [{"from": prv, "i": i} for i in reversed(range(10))]  # selected by source and tag
        assert q["all"] == [[s, s * 100 + rank] for s in range(n)]  # one from every rank, itself included
        assert q["drain_read"] == [[nxt, 0], [nxt, 1]]  # per source, in the order sent
        assert q["drain_discarded"] == 2 * n - 2  # what was never read, counted
        assert q["drain_after"] == sorted([["after", s] for s in range(n)])  # sent after the drain: kept
        assert q["pp_errors"] == [] and not q["pp_alive"]  # a second thread on the same dispatcher
        st = q["shutdown"]["channels"]
        assert st["ring"] == {"sent": 10, "received": 10, "read": 10, "discarded": 0, "undelivered": 0}
        assert st["all"] == {"sent": n, "received": n, "read": n, "discarded": 0, "undelivered": 0}
        assert st["drain"] == {"sent": 3 * n, "received": 3 * n, "read": 2 + n, "discarded": 2 * n - 2,
                               "undelivered": 0}
        assert st["pp"]["sent"] == st["pp"]["read"] == 200
        assert q["shutdown"]["unread_messages"] == {"left": 1} and q["shutdown"]["undelivered_sends"] == 0
        assert q["shutdown"]["thread_stopped"]
        assert q["gather_all"] == [s * 10 for s in range(n)]  # the same list, in rank order, on every rank
        assert q.get("gather_sub") == (None if rank == 0 else [{"r": s} for s in range(1, n)])
    miss = r["ranks"][0]
    assert miss["miss"] == ("rank 0: timed out after 0.5 s waiting for a message on channel 'miss' from rank 1 "
                            "with tag 'x'")
    assert 0.5 <= miss["miss_s"] < 10.0
    assert miss["reply_ok"] == "ok"  # a reply while the failure channel is empty
    assert miss["reply_fail"] == "rank 0: rank 1 failed: disk full" and miss["reply_fail_s"] < 10.0  # not 30 s
    assert miss["reply_late"] == ("rank 0: nothing on channel 'reply' from rank 2 with tag 2 within 0.5 s "
                                  "(the peer is dead or stalled)")
    assert miss["reply_late_pending"] == [[2, "reply", 2]] and 0.5 <= miss["reply_late_s"] < 10.0
    st = miss["shutdown"]["channels"]
    assert st["reply"]["read"] == st["fail"]["read"] == 1  # the failure report was read, not left over


def test_collectives_on_gloo_with_point_to_point_on_mpi(tmp_path):
    """HETSYNC_COLLECTIVES=gloo on rank 0 only: every rank runs horovod on Gloo (rank 0's choice), the
    allreduce has its closed form, the dispatcher's ring arrives in order, and BSP ends with equal weights."""
    out = tmp_path / "gloo.json"
    launch(3, ["tests/jobs/gloo_over_mpi_check.py", str(out)], timeout=240)
    rows = read_json(out)
    assert [r["rank"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert (r["size"], r["mode"], r["collectives"], r["gloo"], r["mpi_p2p"]) == (3, "mpi", "gloo", True, True)
        assert r["sum"] == 6.0  # 1 + 2 + 3
        assert r["max"] == [3.0, 0.0]  # element-wise over ranks: max(r + 1), max(-r)
        assert r["ring"] == [{"from": (r["rank"] - 1) % 3, "i": i} for i in range(5)]
        assert r["weights_diff"] == 0.0
