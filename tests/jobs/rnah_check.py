"""Run under mpirun -np N: hierarchical RNA (the last rank a parameter server), observed round by round.

    python tests/jobs/rnah_check.py MODE OUT.json

An observer wrapped around the ops module of :mod:`hetsync.protocols.rna.hierarchical` and around the protocol's
``join_round`` records, on every worker, each round it joined (grouping epoch, group, round id,
initiator, server round or not), its take (weight w in {0, 1} and first gradient element) and the
published group sum. Rank 0 gathers every rank's log, the protocol's summary and the final weights,
and writes OUT.json.

MODE:
  one     3 workers + 1 server, groups=[[0, 1, 2]]: the one-weight model of rna_check.py (rank r's
          gradient is the constant r + 1); one group must be flat RNA (no server traffic).
  groups  3 workers + 1 server, groups=[[0, 1], [2]], an MLP on digits, rank 2 20 ms slower per step.
  auto    3 workers + 1 server, groups="auto", warmup_steps=8, an MLP on digits, rank 2 40 ms slower
          per step (20 steps; ranks 0 and 1 run 250): the measured times must split {0, 1} from {2}.
  delta   as ``groups`` with server_rule="delta": each initiator records the last element of every model it
          pushed and pulled, so the server's sums can be replayed in its service order.
  host    as ``groups`` with groups="host": the launch gives ranks 0, 1 one host name and rank 2 another
          (HOROVOD_HOSTNAME per rank in an MPMD launch), so the groups must come out [[0, 1], [2]].
  bad     3 ranks (2 workers + 1 server): wrapping with bad groups or probes fails before training;
          every rank records the messages.
"""
import json
import sys

import keras
import numpy as np
import tensorflow as tf

import hetsync
import hetsync.protocols.rna.group_rounds as rounds_module  # where the rounds take and publish the gradient cache

mode, out_path = sys.argv[1], sys.argv[2]
hetsync.init()
rank, size = hetsync.rank(), hetsync.size()

if mode == "bad":
    errors = []
    for kwargs in ({"groups": [[0], [1, 2]]}, {"groups": [[0]]}, {"groups": [[0], [1], [5]]}, {"probes": 3},
                   {"groups": [[0, 1], [1]]}):
        try:
            hetsync.HierarchicalRNA(keras.optimizers.SGD(0.1), **kwargs)
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    everything = hetsync.transport.allgather_object({"rank": rank, "errors": errors}, name="rnah_bad")
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"ranks": everything}, f)
    sys.exit(0)


class Observer:
    """Delegates to hetsync.ops; records each round's take and the published group sum."""

    def __init__(self, real):
        self.real = real
        self.log = []
        self.current = None

    def __getattr__(self, name):
        return getattr(self.real, name)

    def grad_cache_take(self, cache):
        flat, its, newest = self.real.grad_cache_take(cache)
        v = flat.numpy()
        self.log.append(dict(self.current, w=float(v[-1]), g=float(v[0]), its=its.numpy().tolist()))
        return flat, its, newest

    def grad_cache_publish(self, cache, reduced, round_id):
        if cache is proto._cache:
            r = np.asarray(reduced)
            self.log[-1].update(sum_wg=float(r[0]), sum_w=float(r[-1]))
        return self.real.grad_cache_publish(cache, reduced, round_id)


observer = Observer(rounds_module.ops)
rounds_module.ops = observer

keras.utils.set_random_seed(0)
if mode == "one":
    kwargs = {"groups": [[0, 1, 2]], "probes": 2, "max_staleness": 3, "average_every": 5}
    steps, b, spec = 60, 4, "none"
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = hetsync.HierarchicalRNA(keras.optimizers.SGD(0.01), **kwargs)
    model.compile(opt, loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
    c = float(rank + 1)
    x = np.full((steps * b, 1), c, np.float32)
    y = np.zeros((steps * b, 1), np.float32)
    fit = {"x": x, "y": y, "batch_size": b, "shuffle": False}
    if hetsync.is_server():
        fit = {"x": x[:b], "y": y[:b], "batch_size": b, "shuffle": False}
else:
    if mode in ("groups", "host", "delta"):
        kwargs = {"groups": [[0, 1], [2]] if mode != "host" else "host", "average_every": 5}
        if mode == "delta":
            kwargs["server_rule"] = "delta"
        spec, steps = "uniform:20:20@2", 40
    elif mode == "auto":
        kwargs = {"groups": "auto", "warmup_steps": 8}
        spec, steps = "uniform:40:40@2", (20 if rank == 2 else 250)  # the fast group trains on after the split
    else:
        raise SystemExit(f"unknown mode {mode!r}; use one, groups, delta, host, auto or bad")
    ds = hetsync.data.load("digits", seed=0)
    model = keras.Sequential([keras.Input(ds.input_shape), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    opt = hetsync.HierarchicalRNA(keras.optimizers.SGD(0.05), **kwargs)
    model.compile(opt, loss="sparse_categorical_crossentropy")
    fit = opt.hetsync_protocol.fit_data(ds.x_train, ds.y_train, 16)
    fit["steps_per_epoch"] = 1 if hetsync.is_server() else steps
    c = None
proto = opt.hetsync_protocol
real_join = proto.join_round


def join_round(round_id, initiator, average, drift, ps=False):
    observer.current = {"epoch": proto.epoch, "group": proto._gid, "members": list(proto._members),
                        "round": int(round_id), "initiator": int(initiator), "ps": bool(ps)}
    return real_join(round_id, initiator, average, drift, ps)


proto.join_round = join_round
exchanges = []  # (epoch, group, round, pushed[-1], pulled[-1]) of every server exchange this rank initiated
if mode == "delta":
    real_snapshot, real_overwrite = proto.snapshot, proto._overwrite
    last = {}

    def snapshot():
        x = real_snapshot()
        last["x"] = float(np.asarray(x)[-1])  # the output layer's last bias: every step moves it
        return x

    def overwrite(pulled):
        cur = observer.current
        if cur and cur["ps"] and cur["initiator"] == rank:  # the phase pushed the last snapshot and pulled this
            exchanges.append([cur["epoch"], cur["group"], cur["round"], last.pop("x"), float(np.asarray(pulled)[-1])])
        return real_overwrite(pulled)

    proto.snapshot, proto._overwrite = snapshot, overwrite
initial = float(np.ravel(model.get_weights()[-1])[-1])
cbs = [hetsync.callbacks.Slowdown(spec, seed=0)] + hetsync.callbacks.standard(opt)
model.fit(**fit, epochs=1, verbose=0, callbacks=cbs)
final = np.concatenate([np.ravel(w) for w in model.get_weights()]).tolist()
mine = {"rank": rank, "role": hetsync.role(), "c": c, "steps_run": proto.done_steps, "log": observer.log,
        "final": final, "stats": proto.step_stats(), "exchanges": exchanges, "initial": initial}
everything = hetsync.transport.allgather_object(mine, name="rnah_check")
if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"ranks": everything, "summary": proto.summary_stats(), "size": size}, f)
