"""Run under mpirun -np N: Hop and NOTIFY-ACK observed step by step.

    python tests/jobs/hop_check.py MODE OUT.json

The model is one weight w (Dense(1, no bias) on the constant input 1, loss mean(y_pred)), so
every gradient is exactly 1 whatever w is. Rank 0 writes OUT.json with every rank's record.

MODE:
  closed     ring of N, w_0 = rank (no initial broadcast), SGD with learning rate 0, 6 steps, no final
             average: with zero updates X_k = (W^T)^k X_0 exactly (standard Hop, then NOTIFY-ACK).
  straggler  ring of N, emulated device ``device:3+deterministic:3:20`` (rank 3's steps take 60 ms, the
             others' 3 ms), SGD(0.01), 60 steps: backup_workers=1 with max_ig=3, then the same with
             skip=3, then staleness=2; the final average is on.
  early      ring of N, 40 steps; rank 1 stops training after its 5th step: every rank must fail soon
             (each rank writes OUT.json.rankR with its error and elapsed seconds)
             with the reason (not wait for a timeout).
"""
import json
import sys
import time

import keras
import numpy as np

import hetsync

mode, out_path = sys.argv[1], sys.argv[2]
hetsync.init()
rank, n = hetsync.rank(), hetsync.size()
x = np.ones((800, 1), np.float32)
y = np.zeros((800, 1), np.float32)


def make_model(w0):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False,
                                                                    kernel_initializer=keras.initializers.Constant(w0))])
    return model


class Recorder(keras.callbacks.Callback):
    def __init__(self, proto, stop_after=None):
        super().__init__()
        self.proto, self.stop_after = proto, stop_after
        self.w, self.stats = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.w.append(float(self.model.get_weights()[0].ravel()[0]))
        self.stats.append(self.proto.step_stats())
        if self.stop_after is not None and len(self.w) >= self.stop_after:
            self.model.stop_training = True


def run(opt, steps, broadcast=True, slowdown=None, stop_after=None, w0=0.5):
    model = make_model(w0)
    model.compile(opt, loss=lambda yt, yp: keras.ops.mean(yp))
    proto = opt.hetsync_protocol
    rec = Recorder(proto, stop_after)
    callbacks = hetsync.callbacks.standard(opt) if broadcast else \
        [hetsync.callbacks.ProtocolHooks(opt)]
    if slowdown:
        callbacks = [hetsync.callbacks.Slowdown(slowdown, seed=0)] + callbacks
    t0 = time.time()
    model.fit(x, y, batch_size=4, steps_per_epoch=steps, epochs=1, shuffle=False, verbose=0,
              callbacks=callbacks + [rec])
    final = float(model.get_weights()[0].ravel()[0])
    return {"w": rec.w, "final": final, "steps": len(rec.w), "summary": proto.summary_stats(),
            "wall_s": time.time() - t0, "stats": rec.stats[-1] if rec.stats else {}}


out = {"rank": rank, "n": n}
if mode == "closed":
    out["hop"] = run(hetsync.Hop(keras.optimizers.SGD(0.0), graph="ring", average_at_end=False), 6,
                     broadcast=False, w0=float(rank))
    out["notifyack"] = run(hetsync.NotifyAck(keras.optimizers.SGD(0.0), graph="ring", average_at_end=False), 6,
                           broadcast=False, w0=float(rank))
elif mode == "straggler":
    scenario = "device:3+deterministic:3:20"
    out["backup"] = run(hetsync.Hop(keras.optimizers.SGD(0.01), graph="ring", backup_workers=1, max_ig=3), 60,
                        slowdown=scenario)
    out["skip"] = run(hetsync.Hop(keras.optimizers.SGD(0.01), graph="ring", backup_workers=1, max_ig=3, skip=3), 60,
                      slowdown=scenario)
    out["staleness"] = run(hetsync.Hop(keras.optimizers.SGD(0.01), graph="ring", staleness=2, max_ig=3), 60,
                           slowdown=scenario)
elif mode == "early":
    t0 = time.time()
    try:
        run(hetsync.Hop(keras.optimizers.SGD(0.01), graph="ring", timeout_s=60), 40,
            stop_after=5 if rank == 1 else None)
        out["error"] = None
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["elapsed_s"] = time.time() - t0
    # one file per rank: lines printed by 4 ranks at once can reach mpirun's stdout interleaved
    with open(f"{out_path}.rank{rank}", "w") as f:
        json.dump({"rank": rank, "error": out["error"], "elapsed_s": out["elapsed_s"]}, f)
    sys.exit(0)  # every rank reports; the test reads the errors (a non-zero exit would let mpirun kill the others)
else:
    raise SystemExit(f"unknown mode {mode!r}")

everyone = hetsync.transport.allgather_object(out, name="hop_check_out")
if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"ranks": everyone}, f)
