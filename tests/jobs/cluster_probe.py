"""Run under mpirun inside an emulated cluster (hetsync-cluster run ... -- mpirun -H {hosts} ...):
each rank reports its hostname, then the ranks allreduce NBYTES of float32 ones (mpi4py, no TensorFlow);
rank 0 writes ``{"hosts": [hostname per rank], "sum_ok": bool, "allreduce_s": seconds}`` to OUT.

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
if comm.rank == 0:
    with open(out, "w") as f:
        json.dump({"hosts": hosts, "sum_ok": bool(np.all(y == comm.size)), "allreduce_s": elapsed}, f)
