"""Run under mpirun -np N (N >= 3): the point-to-point dispatcher between real ranks.

    python tests/jobs/p2p_check.py OUT.json

Every rank, while a second thread ping-pongs with its neighbours on channel "pp":
  ring   sends 10 tagged messages to rank r+1 and receives those of rank r-1 in reverse tag order;
  all    sends one message to every rank (itself included) and receives N from any source;
  drain  sends 2 messages to every rank, reads only the 2 from rank r+1, drains (2N - 2 discarded),
         then one more message to every rank, which survives the drain and is read;
  miss   rank 0 waits 0.5 s for a message rank 1 never sends (the timeout names both);
  reply  recv_or_fail: rank 0 gets rank 2's reply while nobody failed; after the gathers, rank 1 reports a
         failure and rank 0's next wait ends at once naming rank 1; then a reply rank 2 never sends times out
         after 0.5 s naming the peer, channel and tag;
  gather gather_at: every rank's value on every rank through rank 0, then over ranks 1 .. N-1 through rank N-1;
  left   leaves one message to itself unread, counted by the shutdown.
Every rank's results and the shutdown report are gathered on rank 0 and written to OUT.
"""
import json
import sys
import threading
import time

import hetsync
from hetsync import transport
from hetsync.errors import PSError

out_path = sys.argv[1]
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
p2p = transport.dispatcher()
nxt, prv = (rank + 1) % n, (rank - 1) % n
res = {"rank": rank}

pp_rounds, pp_errors = 200, []


def ping_pong():
    try:
        for i in range(pp_rounds):
            p2p.send(nxt, "pp", (rank, i), tag=i)
            m = p2p.recv("pp", source=prv, tag=i, timeout_s=30)
            assert m.obj == (prv, i), m
    except Exception as exc:  # noqa: BLE001 - reported in the output
        pp_errors.append(repr(exc))


th = threading.Thread(target=ping_pong)
th.start()

for i in range(10):
    p2p.send(nxt, "ring", {"from": rank, "i": i}, tag=i)
res["ring"] = [p2p.recv("ring", source=prv, tag=i, timeout_s=30).obj for i in reversed(range(10))]

for dest in range(n):
    p2p.send(dest, "all", rank * 100 + dest)
got = [p2p.recv("all", timeout_s=30) for _ in range(n)]
res["all"] = sorted((m.source, m.obj) for m in got)

for dest in range(n):
    for k in range(2):
        p2p.send(dest, "drain", (rank, k))
res["drain_read"] = [p2p.recv("drain", source=nxt, timeout_s=30).obj for _ in range(2)]
res["drain_discarded"] = p2p.drain("drain", timeout_s=30)
for dest in range(n):
    p2p.send(dest, "drain", ("after", rank))
res["drain_after"] = sorted(p2p.recv("drain", timeout_s=30).obj for _ in range(n))

if rank == 0:
    t0 = time.monotonic()
    try:
        p2p.recv("miss", source=1, tag="x", timeout_s=0.5)
        res["miss"] = "no error"
    except transport.TransportTimeout as exc:
        res["miss"] = str(exc)
        res["miss_s"] = time.monotonic() - t0

if rank == 2:
    p2p.send(0, "reply", "ok", tag=3)
if rank == 0:
    res["reply_ok"] = p2p.recv_or_fail("reply", 2, tag=3, timeout_s=30, fail_channel="fail", error=PSError)
res["gather_all"] = p2p.gather_at(0, range(n), "gather", "gather.result", rank * 10, tag=1, timeout_s=30)
if rank > 0:  # a gather over some ranks only (as over the workers when some ranks serve), rooted elsewhere
    res["gather_sub"] = p2p.gather_at(n - 1, range(1, n), "gather", "gather.result", {"r": rank}, tag=2,
                                      timeout_s=30)
if rank == 1:  # after the first gather: rank 0 already has rank 2's reply
    p2p.send(0, "fail", "disk full")
if rank == 0:
    t0 = time.monotonic()
    try:
        p2p.recv_or_fail("reply", 2, tag=1, timeout_s=30, fail_channel="fail", error=PSError)
        res["reply_fail"] = "no error"
    except PSError as exc:
        res["reply_fail"], res["reply_fail_s"] = str(exc), time.monotonic() - t0
    t0 = time.monotonic()
    try:
        p2p.recv_or_fail("reply", 2, tag=2, timeout_s=0.5)
        res["reply_late"] = "no error"
    except transport.TransportTimeout as exc:
        res["reply_late"], res["reply_late_pending"] = str(exc), exc.pending
        res["reply_late_s"] = time.monotonic() - t0

th.join(60)
res["pp_errors"] = pp_errors
res["pp_alive"] = th.is_alive()
p2p.send(rank, "left", "unread")
p2p.flush(30)
p2p.wait("left", 30)
res["stats"] = p2p.stats()
hetsync.transport.allgather_object(None, name="p2p_check_barrier")  # every rank is done receiving
res["shutdown"] = transport.shutdown(timeout_s=10)
everything = hetsync.transport.allgather_object(res, name="p2p_check")
if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"n": n, "ranks": everything}, f)
