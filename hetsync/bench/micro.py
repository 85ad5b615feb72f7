"""Microbenchmarks of the compiled ops against their physical reference, in this process.

* ``delay op at 0 ms``: :func:`hetsync.ops.delay` with factor 1 and 0 extra ms (what every step pays
  when no scenario is injected) against ``tf.identity_n`` of the same tensors, both chained
  ``chain`` times inside one ``tf.while_loop`` so Python call overhead does not count.
* ``gradient cache WriteOp+ReadOp``: one write and one (non-fresh) read of 25M float32 values
  (ResNet-50's size, RNA issue) against a plain host copy of the same bytes (``numpy.copyto``).
* ``gradient cache full round``: write + take (host accumulation into one flat buffer) + publish +
  fresh read, against the same host copy.
* ``queue hand-off``: measured against a bare condition-variable hand-off only if queue ops exist;
  otherwise reported as skipped.
* the RNA initiator simulation (:mod:`hetsync.sim.rna_initiator`) if that module exists.

Every figure is the median over ``repeats`` timed repetitions after 3 warm-up calls.
"""
import importlib
import inspect
import statistics
import threading
import time

import numpy as np

__all__ = ["run_all", "delay_overhead", "grad_cache_bench", "queue_bench", "rna_initiator_sim", "median_us"]

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

    from .. import ops

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


def _has(module, names):
    return all(hasattr(module, n) for n in names)


def grad_cache_bench(repeats=30, values=CACHE_VALUES):
    """WriteOp+ReadOp (and a full round) on ``values`` float32 values vs a host copy of the same bytes.

    Returns:
        list of result dicts, or one ``{"name", "skipped"}`` dict if the ops do not exist.
    """
    from .. import ops

    needed = ("grad_cache_create", "grad_cache_write", "grad_cache_read", "grad_cache_take", "grad_cache_publish",
              "grad_cache_destroy")
    name = f"gradient cache WriteOp+ReadOp ({values / 1e6:.0f}M float32)"
    if not _has(ops, needed):
        return [{"name": name, "skipped": "hetsync.ops has no gradient-cache ops (RNA not built yet)"}]
    import tensorflow as tf

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


def _bare_handoff_us(repeats):
    """One producer -> consumer hand-off through a bare ``threading.Condition`` (microseconds)."""
    cond, box = threading.Condition(), []
    n = 2000

    def consumer():
        for _ in range(n):
            with cond:
                while not box:
                    cond.wait(1.0)
                box.pop()
                cond.notify()

    def run():
        th = threading.Thread(target=consumer)
        th.start()
        for i in range(n):
            with cond:
                while box:
                    cond.wait(1.0)
                box.append(i)
                cond.notify()
        th.join(10.0)
    return median_us(run, max(3, repeats // 5), warmup=1) / n


def queue_bench(repeats=30):
    """Queue hand-off op vs a bare condition-variable hand-off, if queue ops exist (list of dicts)."""
    from .. import ops

    names = [n for n in dir(ops) if "queue" in n.lower() and callable(getattr(ops, n))]
    if not names:
        return [{"name": "queue hand-off", "skipped": "hetsync.ops has no queue ops; "
                 f"bare condition-variable hand-off alone: {_bare_handoff_us(repeats):.1f} us"}]
    return [{"name": "queue hand-off", "skipped": f"queue ops {names} exist but have no benchmark adapter yet; "
             f"bare condition-variable hand-off: {_bare_handoff_us(repeats):.1f} us"}]


def rna_initiator_sim(iterations=2000):
    """Run the RNA initiator simulation (RNA section 8.4) if :mod:`hetsync.sim.rna_initiator` exists.

    With its ``simulate_restart`` / ``simulate_continuous`` / ``summarize`` functions: 100 ranks, task
    times U[10, 50] ms, 1-4 probes, ``iterations`` iterations each; median, 5th and 95th percentile
    response times beside the paper's medians. Otherwise the module's first zero-argument callable
    among ``benchmark``, ``table``, ``run``, ``main_table``,
    ``simulate_all`` is called; a list of dicts (or of rows with a ``HEADERS`` attribute) is rendered.

    Returns:
        ``{"title", "headers", "rows"}`` or ``{"skipped": reason}``.
    """
    try:
        mod = importlib.import_module("hetsync.sim.rna_initiator")
    except ImportError as exc:
        return {"skipped": f"hetsync.sim.rna_initiator not available ({exc})"}
    if _has(mod, ("simulate_restart", "simulate_continuous", "summarize")):
        paper = getattr(mod, "PAPER_MEDIAN_MS", {})
        rows = []
        for d in (1, 2, 3, 4):
            for model in ("restart", "continuous"):
                sim = getattr(mod, f"simulate_{model}")
                st = mod.summarize(sim(ranks=100, probes=d, low_ms=10.0, high_ms=50.0, iterations=iterations, seed=0))
                rows.append([str(d), model, f"{st['median']:.1f}", f"{st['p5']:.1f}", f"{st['p95']:.1f}",
                             str(paper.get(d, "-")) if model == "restart" else ""])
        return {"title": f"RNA initiator simulation (RNA section 8.4): 100 ranks, task times U[10, 50] ms, "
                         f"{iterations} iterations per row, response time of the initiator choice",
                "headers": ["probes", "model", "median ms", "p5 ms", "p95 ms", "paper median ms"], "rows": rows}
    for name in ("benchmark", "table", "run", "main_table", "simulate_all"):
        fn = getattr(mod, name, None)
        if callable(fn) and all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                for p in inspect.signature(fn).parameters.values()):
            out = fn()
            if isinstance(out, dict) and "rows" in out:
                out.setdefault("title", "RNA initiator simulation")
                return out
            if isinstance(out, list) and out and isinstance(out[0], dict):
                headers = list(out[0])
                return {"title": f"RNA initiator simulation (hetsync.sim.rna_initiator.{name})", "headers": headers,
                        "rows": [[_fmt(d.get(h)) for h in headers] for d in out]}
            if isinstance(out, list) and hasattr(mod, "HEADERS"):
                return {"title": "RNA initiator simulation", "headers": list(mod.HEADERS),
                        "rows": [[_fmt(v) for v in row] for row in out]}
    return {"skipped": "hetsync.sim.rna_initiator has no zero-argument table function the bench knows"}


def _fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def run_all(repeats=30):
    """Run every microbenchmark; returns ``{"ops": [result dicts], "sim": dict}`` (JSON-serialisable).

    Each op result has ``name``, ``op_us``, ``reference_us``, ``ratio`` (op / reference) and ``note``,
    or ``name`` and ``skipped`` (the reason).
    """
    results = [delay_overhead(repeats)]
    results += grad_cache_bench(repeats)
    results += queue_bench(repeats)
    return {"ops": results, "sim": rna_initiator_sim()}
