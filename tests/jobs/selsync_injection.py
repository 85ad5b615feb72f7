"""Run under mpirun -np N: data injection (alpha, beta) on a label-skew partition, checked sample by sample.

Each sample's input is its global index, so rank 0 can check every batch exactly. Every rank
reads items 0..T-1 of an InjectionDataset (plus item 0 again: the cache must not exchange
twice), then all batches and counters are gathered on rank 0 and written to OUT with what the
partition functions predict.
"""
import json
import sys

import numpy as np

import hetsync
from hetsync.data import shards as partition

out_path, steps, b, alpha, beta, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5]), int(sys.argv[6])
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
y = np.random.default_rng(5).integers(0, 10, size=2000)
x = np.arange(len(y), dtype=np.float32)[:, None]
parts, labels = partition.label_skew(y, n, k, seed=1)
mine = parts[rank]
b_local = partition.local_batch_size(b, alpha, beta, n)
sampler = partition.LocalSampler(np.arange(len(mine)), b_local, seed=1, rank=rank)
ds = partition.InjectionDataset(x[mine], y[mine], sampler, alpha, beta, seed=1, timeout_s=60)
batches = [ds[t] for t in range(steps)]
again = ds[0]
exchanges_after = ds.exchanges
dropped = ds.close()
mine_out = {
    "ids": [bx[:, 0].astype(int).tolist() for bx, _ in batches],
    "labels": [by.astype(int).tolist() for _, by in batches],
    "own": [mine[sampler(t)].tolist() for t in range(steps)],
    "again_equal": bool(np.array_equal(again[0], batches[0][0])),
    "exchanges": exchanges_after, "dropped": dropped, "stats": ds.stats(),
}
gathered = hetsync.transport.allgather_object(mine_out, name="selsync_injection")
if rank == 0:
    out = {"ranks": gathered, "world_size": n, "b_local": b_local,
           "shared": partition.shared_per_injector(b_local, beta),
           "injectors": [partition.injectors(t, alpha, n, seed=1).tolist() for t in range(steps)],
           "labels_per_rank": labels, "y": y.tolist(), "partition_sizes": [len(p) for p in parts],
           "sample_bytes": int(x[:1].nbytes + y[:1].nbytes)}
    with open(out_path, "w") as f:
        json.dump(out, f)
