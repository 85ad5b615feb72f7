"""The statistical cost of a gradient delay, replayed in one process on the study's model and data.

No emulation and no timing: the same SGD steps as BSP, except that the gradients are computed at older
parameters. It isolates what an asynchronous protocol loses per sample from what it gains per second.
Configurations (``--configs``, comma-separated, each ``KIND:LR[:D]``):

* ``bsp:LR``: BSP, x_{t+1} = x_t - LR * mean_j g_j(x_t) over ``--ranks`` gradients of ``--batch`` samples each.
* ``delay:LR:D``: the same step with every gradient computed at x_{t-D} (a delay of D whole steps). RNA's
  samples rule without ``wait_for_round`` has D >= 1: the next step starts computing as soon as the last one
  wrote its gradient, before any round could carry it.
* ``seq:LR:D``: one gradient at a time, x_{i+1} = x_i - LR * g(x_{i-D}) with D counted in gradients: an
  asynchronous parameter server, or RNA with ``wait_for_round``, whose gradient misses only the D = n - 1
  gradients computed beside it.

For each configuration and seed (``--seeds``): the samples to ``--target`` test accuracy (evaluated every
``--eval-every`` updates of ``--ranks`` gradients' worth), and the median over the seeds with the
statistical efficiency against the first configuration (its samples over each one's, per seed, then the
median). Run from the repository root::

    python examples/benchmarks/delay_replay.py --configs bsp:0.4,delay:0.4:1,seq:0.1:3,seq:0.2:3

MNIST when ``HETSYNC_DATA_DIR`` names its folder (the same 80/20 split as the training job), else digits.
"""
import argparse
import os

import numpy as np


def parse_configs(text):
    """``KIND:LR[:D],...`` -> list of (kind str, lr float, delay int). Raises ValueError on a bad item."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        if parts[0] not in ("bsp", "delay", "seq") or len(parts) not in (2, 3):
            raise ValueError(f"--configs: {item!r}; give bsp:LR, delay:LR:D or seq:LR:D")
        lr, d = float(parts[1]), int(parts[2]) if len(parts) == 3 else 0
        if not lr > 0 or d < 0:
            raise ValueError(f"--configs: {item!r}; LR must be > 0 and D >= 0")
        out.append((parts[0], lr, d))
    return out


def samples_to_target(kind, lr, delay, seed, data, args):
    """Samples (int) to ``args.target`` for one configuration and seed, or None if not reached."""
    import tensorflow as tf
    from hetsync.bench.job import build_model

    x_tr, y_tr, x_te, y_te = data
    model = build_model(args.model, x_tr.shape[1:], int(y_tr.max()) + 1, seed)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    weights = model.trainable_variables

    @tf.function
    def grad(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, weights)

    def grad_at(params, xb, yb):
        now = [w.numpy() for w in weights]
        for w, p in zip(weights, params):
            w.assign(p)
        g = [t.numpy() for t in grad(xb, yb)]
        for w, p in zip(weights, now):
            w.assign(p)
        return g

    rng = np.random.default_rng(seed)
    order, pos = rng.permutation(len(x_tr)), 0

    def batch():
        nonlocal order, pos
        if pos + args.batch > len(order):
            order, pos = rng.permutation(len(x_tr)), 0
        idx = order[pos:pos + args.batch]
        pos += args.batch
        return x_tr[idx], y_tr[idx]

    history = [[w.numpy() for w in weights]]
    seq = kind == "seq"
    per_update = 1 if seq else args.ranks
    updates = args.max_samples // (per_update * args.batch)
    every = args.eval_every * (args.ranks if seq else 1)
    for u in range(updates):
        at = history[max(0, len(history) - 1 - delay)]
        gs = [grad_at(at, *batch()) for _ in range(per_update)]
        step = [np.mean([g[k] for g in gs], axis=0) for k in range(len(weights))]
        for w, s in zip(weights, step):
            w.assign_sub(lr * s)
        history = (history + [[w.numpy() for w in weights]])[-(delay + 1):]
        if (u + 1) % every == 0:
            acc = float(np.mean(np.argmax(model(x_te, training=False).numpy(), axis=1) == y_te))
            if acc >= args.target:
                return (u + 1) * per_update * args.batch
    return None


def main(argv=None):
    """Replay every configuration on every seed and print the table; return 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="bsp:0.4,delay:0.4:1,delay:0.4:2,seq:0.1:3,seq:0.2:3,seq:0.1:7")
    p.add_argument("--seeds", default="1,2,3,4,5,6")
    p.add_argument("--ranks", type=int, default=4, help="gradients per BSP step (n)")
    p.add_argument("--batch", type=int, default=32, help="samples per gradient")
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    p.add_argument("--target", type=float, default=0.9, help="test accuracy in (0, 1)")
    p.add_argument("--eval-every", type=int, default=2, help="evaluations every that many BSP-sized updates")
    p.add_argument("--max-samples", type=int, default=60000, help="samples at most per run")
    args = p.parse_args(argv)
    try:
        configs = parse_configs(args.configs)
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as exc:
        p.error(str(exc))
    from hetsync.data import datasets
    folder = os.environ.get("HETSYNC_DATA_DIR")
    ds = datasets.load("mnist-idx", data_dir=folder) if folder else datasets.load("digits")
    data = (ds.x_train, ds.y_train, ds.x_test, ds.y_test)
    results = {c: [samples_to_target(*c, s, data, args) for s in seeds] for c in configs}
    ref = results[configs[0]]
    print(f"| configuration | samples to {args.target:g}, seeds {args.seeds} | median | SE vs {args.configs.split(',')[0]} |")
    print("| --- | --- | --- | --- |")
    for c, v in results.items():
        reached = [x for x in v if x]
        se = [a / b for a, b in zip(ref, v) if a and b]
        print(f"| {c[0]}:{c[1]:g}" + (f":{c[2]}" if c[0] != "bsp" else "") + " | "
              + ", ".join(f"{x:,}" if x else "-" for x in v) + " | "
              + (f"{int(np.median(reached)):,}" if reached else "-") + " | "
              + (f"{np.median(se):.2f}" if se else "-") + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
