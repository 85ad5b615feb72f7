"""WriteOp + ReadOp on ResNet-50-sized gradients (25.6M float32) vs a plain host copy of the same bytes.

    .venv/bin/python examples/benchmarks/rna_cache_bench.py [--values 25557032] [--tensors 161] [--repeats 20]

Times (median of ``--repeats``, milliseconds), all in one process:

* ``write+read (no result)``: a ``tf.function`` step doing WriteOp then ReadOp when no reduced result
  is waiting (ReadOp returns the local gradients), as most compute steps under RNA;
* ``write+read (fresh result)``: the same step right after a result was published;
* ``take`` and ``publish``: the communication thread's side (off the compute path);
* ``host copy``: ``numpy.copyto`` of the same number of bytes into a preallocated buffer.

The cache holds gradient tensors by reference (no copy: TensorFlow never mutates a buffer that has
another reference) and ReadOp hands out the published result's buffer, so the compute-side ops do
O(number of tensors) work; the copies happen on the communication side (take: one pass to combine
the pending gradients; publish: one pass to divide by sum(w)).
"""
import argparse
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

from hetsync import ops


def timeit(fn, repeats):
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--values", type=int, default=25_557_032, help="float32 values in all (ResNet-50: 25,557,032)")
    p.add_argument("--tensors", type=int, default=161, help="number of gradient tensors")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    sizes = np.full(args.tensors, args.values // args.tensors)
    sizes[-1] += args.values - sizes.sum()
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.standard_normal(int(n)).astype(np.float32)) for n in sizes]
    cache = ops.grad_cache_create([[int(n)] for n in sizes], max_staleness=4)
    it = tf.Variable(-1, dtype=tf.int64)

    @tf.function
    def step(gs):
        t = it.assign_add(1)
        d = ops.grad_cache_write(cache, gs, t)
        with tf.control_dependencies([d]):
            outs, fresh, _, _ = ops.grad_cache_read(cache, gs, t)
        return tf.reduce_sum(outs[0][:1]), fresh

    reduced = np.append(np.ones(args.values, np.float32), 1.0).astype(np.float32)
    reduced_t = tf.constant(reduced)
    round_id = [0]

    def publish():
        ops.grad_cache_publish(cache, reduced_t, round_id[0])
        round_id[0] += 1

    # time the step alone (take/publish outside the timed region)
    def timed_step(with_result):
        out = []
        for _ in range(args.repeats + 1):
            ops.grad_cache_take(cache)
            if with_result:
                publish()
            t = time.perf_counter()
            _, fresh = step(grads)
            out.append((time.perf_counter() - t) * 1e3)
            assert bool(fresh) == with_result
        return statistics.median(out[1:])

    step(grads)  # trace
    t_plain = timed_step(False)
    t_fresh = timed_step(True)
    takes = []
    for _ in range(args.repeats + 1):
        ops.grad_cache_take(cache)
        step(grads)  # one pending gradient, as in most rounds
        t = time.perf_counter()
        ops.grad_cache_take(cache)
        takes.append((time.perf_counter() - t) * 1e3)
    t_take = statistics.median(takes[1:])
    t_publish = timeit(publish, args.repeats)
    src = np.concatenate([g.numpy() for g in grads])
    dst = np.empty_like(src)
    t_copy = timeit(lambda: np.copyto(dst, src), args.repeats)
    print(f"{args.values:,} float32 values ({args.values * 4 / 1e6:.0f} MB) in {args.tensors} tensors, "
          f"median of {args.repeats}")
    rows = [("write+read (no result)", t_plain), ("write+read (fresh result)", t_fresh),
            ("take (communication side)", t_take), ("publish (communication side)", t_publish),
            ("host copy (numpy.copyto)", t_copy)]
    for name, ms in rows:
        print(f"  {name:30s} {ms:9.3f} ms   {ms / t_copy:6.3f}x host copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
