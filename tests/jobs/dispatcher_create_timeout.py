"""Run under mpirun -np 2: the first dispatcher() call is collective; a rank that never makes it
fails the other with a TransportTimeout naming this rank and the world, instead of a hang.

    python tests/jobs/dispatcher_create_timeout.py OUT.json

Rank 1 makes its call only after rank 0 gave up (a file rank 0 writes after its timeout); rank 0
waits 2 s, records the error, then calls again (the same pending duplication: the call completes
once rank 1 joins) so that both ranks end cleanly. Rank 0 writes OUT.
"""
import json
import os
import sys
import time

import hetsync
from hetsync import transport

out_path = sys.argv[1]
flag = out_path + ".gave_up"
hetsync.init()
rank = hetsync.rank()
res = {}
if rank == 0:
    t0 = time.monotonic()
    try:
        transport.dispatcher(timeout_s=2.0)
        res["error"] = None
    except transport.TransportTimeout as exc:
        res["error"], res["waited_s"] = str(exc), time.monotonic() - t0
    with open(flag, "w") as f:
        f.write("1")
else:
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
d = transport.dispatcher(timeout_s=60.0)
d.send(1 - rank, "hello", rank)
res["hello"] = d.recv("hello", source=1 - rank, timeout_s=30.0).obj
transport.shutdown()
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(res, f)
