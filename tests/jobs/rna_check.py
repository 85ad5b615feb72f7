"""Run under mpirun -np N: RNA with constant per-rank gradients, observed round by round.

    python tests/jobs/rna_check.py MODE OUT.json

The model is one weight w (Dense(1, no bias) on an input of constant c_r = r + 1 with loss
mean(y_pred)), so rank r's gradient is exactly c_r at every step whatever w is. The real
protocol runs inside ``model.fit``; an observer wrapped around the ops module the protocol uses
records, on every rank, each round's take (this rank's weight w_r in {0, 1}) and the allreduced
vector it publishes. Rank 0 gathers every rank's log and writes OUT.json.

MODE:
  straggler  every rank 100 steps, ``deterministic:3:20`` (rank 3 is 20x slower); rank 3 also
             sleeps 60 ms after each step, so its steps outlast a round (a step of this one-weight
             model computes in well under 1 ms, and 20x that can be shorter than a round).
  samples    as straggler, with ``update_rule="samples"``, no parameter average and none at the end: every
             rank's final weight is -lr / n times the sum of the gradients of the rounds it read.
  wait       as samples, with ``wait_for_round=True``: every step waits for the round that takes its gradient
             before it reads, so every step reads a fresh result and nothing is left pending at the end.
  lag        as wait, with ``wait_lag=1``: step t waits for the round holding step t - 1's gradient; every rank
             also reports the last round each step read (``read_rounds``, from the step's ``rna_round``).
  stalelr    as samples, with ``stale_lr="inverse"`` and the fast ranks 10 ms per step (their rounds go on for
             most of the straggler's steps); every rank also reports r(t), the last round each of its steps'
             gradients included (the ring the contributions' staleness is read from).
  uneven     rank r runs 40 + 40 r steps (ranks finish at different times).
  stall      rank 2 stops stepping after its 10th step until its communication thread has ended
             (at most 60 s) while the others run 60 steps; finish_timeout_s=3, so the controller
             ends without it, and rank 2's last 50 steps all come after the final round.
  stuck      every rank 30 steps; rank 1's communication thread keeps running 40 s after the final
             round (timeout_s=4, finish_timeout_s=2: stop() waits 16 s for it). stop() must still
             gather the statistics and raise the same RNAError on every rank, long before
             horovod's stall shutdown. Each rank records its error and how long its stop took.
"""
import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import hetsync
import hetsync.protocols.rna.protocol as rna_module

mode, out_path = sys.argv[1], sys.argv[2]
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
c = float(rank + 1)


class Observer:
    """Delegates to hetsync.ops, recording takes and the gradient cache's publications (not the parameter cache's)."""

    def __init__(self, real):
        self.real = real
        self.log = []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def grad_cache_take(self, cache):
        flat, its, newest = self.real.grad_cache_take(cache)
        self.log.append({"w": float(flat.numpy()[-1]), "g": float(flat.numpy()[0]), "its": its.numpy().tolist()})
        return flat, its, newest

    def grad_cache_publish(self, cache, reduced, round_id, accumulate=False):
        if cache is proto._cache:
            r = np.asarray(reduced)
            self.log[-1].update(round=int(round_id), sum_wg=float(r[0]), sum_w=float(r[-1]))
        return self.real.grad_cache_publish(cache, reduced, round_id, accumulate=accumulate)


observer = Observer(rna_module.ops)
rna_module.ops = observer

kwargs = {"probes": 2, "max_staleness": 3, "average_every": 5}
steps = 100
spec = "none"
if mode in ("straggler", "samples", "stalelr", "wait", "lag"):
    spec = "deterministic:3:20"
    if mode in ("samples", "stalelr", "wait", "lag"):
        kwargs.update(update_rule="samples", average_every=0, drift_every=0, average_at_end=False)
    if mode in ("wait", "lag"):
        kwargs.update(wait_for_round=True, wait_lag=1 if mode == "lag" else 0)
    if mode == "stalelr":
        kwargs.update(stale_lr="inverse")
elif mode == "uneven":
    steps = 40 + 40 * rank
elif mode == "stall":
    steps = 60
    kwargs.update(finish_timeout_s=3.0, timeout_s=30.0)
elif mode == "stuck":
    steps = 30
    kwargs.update(finish_timeout_s=2.0, timeout_s=4.0)
else:
    raise SystemExit(f"unknown mode {mode!r}; use straggler, samples, wait, lag, stalelr, uneven, stall or stuck")


class Stall(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.read = []  # lag: the last round each step read

    def on_train_batch_end(self, batch, logs=None):
        if mode == "lag":
            self.read.append(int(proto._stats["rna_round"].numpy()))
        if mode == "stall" and rank == 2 and batch == 9:
            proto._thread.join(60.0)  # until the controller has ended the rounds without this rank
        if mode in ("straggler", "samples", "stalelr", "wait", "lag") and rank == 3:
            time.sleep(0.06)
        elif mode == "stalelr":  # the fast ranks' rounds go on for many of the straggler's steps, also under load
            time.sleep(0.01)


class StopTimer(keras.callbacks.Callback):
    """First in the list: its on_train_end runs just before the protocol's stop."""

    def on_train_end(self, logs=None):
        self.t = time.time()


keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
opt = hetsync.RNA(keras.optimizers.SGD(0.01), **kwargs)
model.compile(opt, loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
proto = opt.hetsync_protocol
b = 4
x = np.full((steps * b, 1), c, np.float32)
y = np.zeros((steps * b, 1), np.float32)


if mode == "stuck" and rank == 1:
    real_run = proto._run

    def stuck_run():
        real_run()
        time.sleep(40.0)  # the thread does not end with the final round

    proto._run = stuck_run

t0 = time.time()
timer = StopTimer()
cbs = [timer, hetsync.callbacks.Slowdown(spec, seed=0)] + hetsync.callbacks.standard(opt)
stall = Stall()
cbs.append(stall)
error = None
try:
    model.fit(x, y, batch_size=b, epochs=1, shuffle=False, verbose=0, callbacks=cbs)
except hetsync.protocols.rna.protocol.RNAError as exc:
    error = str(exc)
stop_s = time.time() - timer.t
wall = time.time() - t0
mine = {"rank": rank, "c": c, "steps_run": int(proto.done_steps), "log": observer.log, "wall_s": wall,
        "w_final": float(model.get_weights()[0].ravel()[0]), "error": error, "stop_s": stop_s,
        "read_rounds": proto._read_rounds.numpy()[:steps].tolist() if mode == "stalelr" else
        stall.read if mode == "lag" else None}
everything = hetsync.transport.allgather_object(mine, name="rna_check")
if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"ranks": everything, "stats": proto.summary_stats(), "n": n}, f)
