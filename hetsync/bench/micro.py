"""Microbenchmarks of the compiled ops against their physical reference, in this process.

* ``delay op at 0 ms``: :func:`hetsync.ops.delay` with factor 1 and 0 extra ms (what every step pays
  when no scenario is injected) against ``tf.identity_n`` of the same tensors, both chained
  ``chain`` times inside one ``tf.while_loop`` so Python call overhead does not count.
* ``gradient cache WriteOp+ReadOp``: one write and one (non-fresh) read of 25M float32 values
  (ResNet-50's size, as RNA's gradient cache holds it) against a plain host copy of the same bytes (``numpy.copyto``).
* ``gradient cache full round``: write + take (host accumulation into one flat buffer) + publish +
  fresh read, against the same host copy.
* the RNA initiator simulation (:mod:`hetsync.sim.rna_initiator`, RNA section 8.4).

Every figure is the median over ``repeats`` timed repetitions after 3 warm-up calls.
"""
import statistics
import time

import numpy as np

__all__ = ["run_all", "delay_overhead", "grad_cache_bench", "rna_initiator_sim", "median_us"]

#: float32 values in the gradient-cache benchmark (ResNet-50's parameter count, about 100 MB).
CACHE_VALUES = 25_000_000


def median_us(fn, repeats, warmup=3):
    """Median wall time of ``fn()`` in microseconds over ``repeats`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def delay_overhead(repeats=30, chain=2000):
    """Per-op overhead of the delay op at 0 ms vs ``tf.identity_n`` (dict, microseconds per op)."""
    import tensorflow as tf

    from hetsync import ops

    control = tf.constant([0.0, 1.0, 0.0], tf.float64)
    tensors = [tf.ones([64, 128]), tf.ones([128]), tf.ones([128, 10]), tf.ones([10])]  # the example MLP's grads

    def chained(step):
        @tf.function
        def run(ts):
            def body(i, *xs):
                return (i + 1,) + tuple(step(list(xs)))
            return tf.while_loop(lambda i, *xs: i < chain, body, (tf.constant(0),) + tuple(ts))[1:]
        return lambda: [t.numpy() for t in run(tensors)][:1]

    op = median_us(chained(lambda xs: ops.delay(xs, control)[0]), repeats) / chain
    ref = median_us(chained(lambda xs: tf.identity_n(xs)), repeats) / chain
    return {"name": "delay op at 0 ms (per op, 4 tensors)", "op_us": op, "reference_us": ref, "ratio": op / ref,
            "note": f"reference: tf.identity_n; {chain} ops chained in a tf.while_loop"}


def grad_cache_bench(repeats=30, values=CACHE_VALUES):
    """WriteOp+ReadOp (and a full round) on ``values`` float32 values vs a host copy of the same bytes.

    Returns:
        list of two result dicts (WriteOp+ReadOp, full round).
    """
    import tensorflow as tf

    from hetsync import ops

    name = f"gradient cache WriteOp+ReadOp ({values / 1e6:.0f}M float32)"

    src = np.random.default_rng(0).standard_normal(values, dtype=np.float32)
    dst = np.empty_like(src)
    ref = median_us(lambda: np.copyto(dst, src), repeats)
    grads = [tf.constant(src)]
    cache = ops.grad_cache_create([[values]], max_staleness=1000)
    it = [0]

    def write_read():
        it[0] += 1
        ops.grad_cache_write(cache, grads, it[0])
        out, fresh, _, _ = ops.grad_cache_read(cache, grads, it[0])
        return fresh.numpy()

    rnd = [0]

    def full_round():
        it[0] += 1
        rnd[0] += 1
        ops.grad_cache_write(cache, grads, it[0])
        flat, _, _ = ops.grad_cache_take(cache)
        ops.grad_cache_publish(cache, flat, rnd[0])
        out, fresh, _, _ = ops.grad_cache_read(cache, grads, it[0])
        assert bool(fresh.numpy())
        return out[0]

    try:
        wr = median_us(write_read, repeats)
        ops.grad_cache_take(cache)  # drain what write_read left pending
        fr = median_us(full_round, max(3, repeats // 3))
    finally:
        ops.grad_cache_destroy(cache)
    return [
        {"name": name, "op_us": wr, "reference_us": ref, "ratio": wr / ref,
         "note": "reference: numpy.copyto of the same bytes; eager op calls; WriteOp holds the tensor by "
                 "reference (no copy), the read is not fresh"},
        {"name": f"gradient cache full round ({values / 1e6:.0f}M float32)", "op_us": fr, "reference_us": ref,
         "ratio": fr / ref, "note": "write + take + publish + fresh read vs one host copy"},
    ]


def rna_initiator_sim(iterations=2000):
    """Run the RNA initiator simulation (RNA section 8.4, :mod:`hetsync.sim.rna_initiator`).

    100 ranks, task times U[10, 50] ms, 1-4 probes, ``iterations`` iterations each, in both models
    (ranks restart their task each iteration, or compute back to back); median, 5th and 95th
    percentile response times beside the paper's medians.

    Returns:
        ``{"title", "headers", "rows"}``.
    """
    from hetsync.sim import rna_initiator as sim

    rows = []
    for d in (1, 2, 3, 4):
        for model in ("restart", "continuous"):
            simulate = sim.simulate_restart if model == "restart" else sim.simulate_continuous
            st = sim.summarize(simulate(ranks=100, probes=d, low_ms=10.0, high_ms=50.0, iterations=iterations, seed=0))
            rows.append([str(d), model, f"{st['median']:.1f}", f"{st['p5']:.1f}", f"{st['p95']:.1f}",
                         str(sim.PAPER_MEDIAN_MS.get(d, "-")) if model == "restart" else ""])
    return {"title": f"RNA initiator simulation (RNA section 8.4): 100 ranks, task times U[10, 50] ms, "
                     f"{iterations} iterations per row, response time of the initiator choice",
            "headers": ["probes", "model", "median ms", "p5 ms", "p95 ms", "paper median ms"], "rows": rows}


def run_all(repeats=30):
    """Run every microbenchmark; returns ``{"ops": [result dicts], "sim": dict}`` (JSON-serialisable).

    Each op result has ``name``, ``op_us``, ``reference_us``, ``ratio`` (op / reference) and ``note``.
    """
    results = [delay_overhead(repeats)]
    results += grad_cache_bench(repeats)
    return {"ops": results, "sim": rna_initiator_sim()}
