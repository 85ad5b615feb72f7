"""Run under mpirun inside an emulated cluster (hetsync-cluster run ... -- mpirun -H {hosts} ...):
each rank reports its hostname, then the ranks allreduce NBYTES of float32 ones (mpi4py); then hetsync.init()
as the cluster launched it (plain mpirun: only rank 0 has the cluster's environment) and one horovod allreduce
of rank + 1. Rank 0 writes ``{"hosts": [hostname per rank], "sum_ok": bool, "allreduce_s": seconds,
"collectives": str, "horovod_sum": float}`` to OUT.

Usage: cluster_probe.py OUT NBYTES
"""
import json
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

out, nbytes = sys.argv[1], int(sys.argv[2])
comm = MPI.COMM_WORLD
hosts = comm.allgather(socket.gethostname())
x = np.ones(nbytes // 4, np.float32)
y = np.empty_like(x)
comm.Barrier()
t = time.time()
comm.Allreduce(x, y, op=MPI.SUM)
elapsed = time.time() - t
result = {"hosts": hosts, "sum_ok": bool(np.all(y == comm.size)), "allreduce_s": elapsed}

from hetsync import transport, world  # noqa: E402

world.init()
result["collectives"] = world.collectives()
result["horovod_sum"] = float(transport.allreduce_sum([np.array([comm.rank + 1.0], np.float32)],
                                                      name="probe_sum")[0][0])
if comm.rank == 0:
    with open(out, "w") as f:
        json.dump(result, f)
world.shutdown()
