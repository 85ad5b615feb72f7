"""Run under mpirun -np N: the parameter-server protocols observed step by step.

    python tests/jobs/ps_check.py MODE OUT.json

Rank 0 writes OUT.json with every rank's record (servers included). The model is a Dense(3) on 4 random
inputs with a squared loss, plain SGD, so the gradients differ every step and the local step is exact
float32 arithmetic the test can replay.

MODE:
  roundrobin  SHAT (log_base=2) with the pushes forced into round-robin order (worker i waits for worker
              i - 1's turn message on the dispatcher), 1 server; records every pushed gradient, every c and
              alpha, the weights after each mixing, the server's order and the final global model.
  asp         ASP over 2 servers (memory-wise); records the local weights and the pulled global model after
              every step.
  ensemble    Ensemble over 1 server; records the initial and final local weights and replays plain SGD on
              the same data from the same start.
  layer       SHAT over 2 servers, layer-wise sharding, free-running (counter conservation, shard plan).
  straggler   SHAT (natural log) on 4 workers, worker 3 five times slower: its c and alpha against the others'.
  ssp         SSP (staleness=2) with worker 2 ten times slower (emulated device), free-running.
  ssp0 / bsp  SSP with staleness 0 and learning rate eta (N - 1 workers + 1 server) / BSP with learning rate
              (N) x eta on N ranks: the final weights.
  deadserver  ASP, timeout_s=6; the server rank stops itself (SIGSTOP) 15 s after start (training runs by then): every worker must
              fail with an error naming the server. Prints ERROR lines and exits 1 on the workers.
  killserver  as deadserver, but the server kills itself (SIGKILL): the launcher must end the job, no hang.
  deadworker  ASP, timeout_s=6; worker 1 stops itself (SIGSTOP) after 5 steps: the server must name it and
              tell worker 0.
  toomany     SHAT, sharding=layer, servers=3 on a model of 2 variables (5 ranks): a clear error at train begin.
"""
import json
import os
import signal
import sys
import threading
import time

import keras
import numpy as np

import hetsync

mode, out_path = sys.argv[1], sys.argv[2]
hetsync.init()
rank, size = hetsync.rank(), hetsync.size()
rng = np.random.default_rng(0)
X = rng.normal(size=(960, 4)).astype(np.float32)
Y = rng.normal(size=(960, 3)).astype(np.float32)
ETA = 0.05


def make_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])


def flat(model):
    return np.concatenate([np.ravel(w) for w in model.get_weights()]).astype(np.float32)


class Turns(keras.callbacks.Callback):
    """Round-robin pushes: worker i steps after worker i - 1 finished its exchange."""

    def __init__(self, n):
        super().__init__()
        self.n, self.t = n, 0
        self.p2p = hetsync.transport.dispatcher()

    def on_train_batch_begin(self, batch, logs=None):
        if not (rank == 0 and self.t == 0):
            self.p2p.recv("test.turn", source=(rank - 1) % self.n, timeout_s=60)

    def on_train_batch_end(self, batch, logs=None):
        self.t += 1
        nxt = (rank + 1) % self.n
        if not (nxt == 0 and self.t == self.total):
            self.p2p.send(nxt, "test.turn", self.t)


class Barrier(keras.callbacks.Callback):
    """After its first (compiling) step every worker waits for the others, so that steps overlap."""

    def __init__(self, n):
        super().__init__()
        self.n, self.done = n, False
        self.p2p = hetsync.transport.dispatcher()

    def on_train_batch_end(self, batch, logs=None):
        if self.done:
            return
        self.done = True
        for j in range(self.n):
            if j != rank:
                self.p2p.send(j, "test.ready", rank)
        for j in range(self.n):
            if j != rank:
                self.p2p.recv("test.ready", source=j, timeout_s=120)


class Recorder(keras.callbacks.Callback):
    def __init__(self, proto):
        super().__init__()
        self.proto = proto
        self.rows = []

    def on_train_begin(self, logs=None):
        self.w0 = flat(self.model).tolist()

    def on_train_batch_end(self, batch, logs=None):
        if self.proto.serves:
            return
        st = self.proto.step_stats()
        self.rows.append({"t": time.time(), "g": self.proto._grad.numpy().tolist(), "lr": float(self.proto._lr.numpy()),
                          "w": flat(self.model).tolist(), "c": st["ps_c"], "alpha": st["ps_alpha"],
                          "global": None if self.proto.last_global is None else self.proto.last_global.tolist()})


def run(opt, steps, extra=(), slowdown=None, batch=8):
    model = make_model()
    model.compile(opt, loss="mse")
    proto = opt.hetsync_protocol
    rec = Recorder(proto)
    cbs = hetsync.callbacks.standard(opt) + list(extra) + [rec]
    if slowdown:
        cbs = [hetsync.callbacks.Slowdown(slowdown, seed=0)] + cbs
    fit = proto.fit_data(X, Y, batch)
    fit["steps_per_epoch"] = steps if not proto.serves else 1
    t0 = time.time()
    model.fit(**fit, epochs=1, verbose=0, callbacks=cbs)
    return {"rank": rank, "role": hetsync.role(), "workers": hetsync.num_workers(), "rows": rec.rows,
            "w0": rec.w0, "final": flat(model).tolist(), "summary": proto.summary_stats(),
            "global": proto.global_model.tolist(), "wall_s": time.time() - t0}


def dump(out):
    everyone = hetsync.transport.allgather_object(out, name="ps_check_out")
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"ranks": everyone}, f)


if mode == "roundrobin":
    n = size - 1
    opt = hetsync.SHAT(keras.optimizers.SGD(ETA), data_plan="shard", servers=1, log_base=2.0)
    steps = 6
    turns = Turns(n)
    turns.total = steps
    dump(run(opt, steps, extra=[turns] if rank < n else []))
elif mode == "asp":
    dump(run(hetsync.ASP(keras.optimizers.SGD(ETA), data_plan="shard", servers=2, sharding="memory"), 12))
elif mode == "layer":
    dump(run(hetsync.SHAT(keras.optimizers.SGD(ETA), data_plan="shard", servers=2, sharding="layer"), 15))
elif mode == "ensemble":
    opt = hetsync.Ensemble(keras.optimizers.SGD(ETA), data_plan="shard", servers=1)
    out = run(opt, 10)
    if not hetsync.is_server():  # replay: plain SGD alone on this worker's data from the same start
        model = make_model()
        model.set_weights([np.reshape(np.asarray(out["w0"][:12], np.float32), (4, 3)),
                           np.asarray(out["w0"][12:], np.float32)])
        model.compile(keras.optimizers.SGD(ETA), loss="mse")
        fit = opt.hetsync_protocol.fit_data(X, Y, 8)
        fit["steps_per_epoch"] = 10
        model.fit(**fit, epochs=1, verbose=0)
        out["solo"] = flat(model).tolist()
    dump(out)
elif mode == "straggler":
    # 4 workers, worker 3 five times slower (100 ms against 20 ms steps); it runs 10 steps, the others 60
    opt = hetsync.SHAT(keras.optimizers.SGD(ETA), data_plan="shard", servers=1)
    steps = 10 if rank == 3 else 60
    barrier = Barrier(4)  # made on every rank: the dispatcher's first use is collective
    dump(run(opt, steps, extra=[barrier] if rank < 4 else [], slowdown="device:20+deterministic:3:5"))
elif mode == "ssp":
    dump(run(hetsync.SSP(keras.optimizers.SGD(ETA), data_plan="shard", staleness=2, servers=1), 40, slowdown="device:3+deterministic:2:10"))
elif mode == "ssp0":
    dump(run(hetsync.SSP(keras.optimizers.SGD(ETA), data_plan="shard", staleness=0, servers=1), 10))
elif mode == "bsp":
    model = make_model()
    opt = hetsync.BSP(keras.optimizers.SGD(ETA * size))
    model.compile(opt, loss="mse")
    fit = opt.hetsync_protocol.fit_data(X, Y, 8)
    fit["steps_per_epoch"] = 10
    model.fit(**fit, epochs=1, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    dump({"rank": rank, "final": flat(model).tolist()})
elif mode in ("deadserver", "killserver", "deadworker"):
    victim = 1 if mode == "deadworker" else size - 1
    opt = hetsync.ASP(keras.optimizers.SGD(ETA), data_plan="shard", servers=1, timeout_s=6.0)

    class Stopper(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if mode == "deadworker" and rank == victim and self.steps == 5:
                os.kill(os.getpid(), signal.SIGSTOP)

    if mode in ("deadserver", "killserver") and rank == victim:  # a server's callbacks run after it served
        sig = signal.SIGSTOP if mode == "deadserver" else signal.SIGKILL
        threading.Timer(15.0, lambda: os.kill(os.getpid(), sig)).start()
    t0 = time.time()
    try:
        run(opt, 100000, extra=[Stopper()], slowdown="device:20")
        print(f"FINISHED rank {rank}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        print(f"ERROR rank {rank} after {time.time() - t0:.1f} s: {type(exc).__name__}: {exc}", flush=True)
        sys.stdout.flush()
        os._exit(1)
elif mode == "toomany":
    try:
        run(hetsync.SHAT(keras.optimizers.SGD(ETA), data_plan="shard", servers=3, sharding="layer"), 5)
    except ValueError as exc:
        print(f"ERROR rank {rank}: {exc}", flush=True)
        sys.exit(0)
    print(f"NO ERROR rank {rank}", flush=True)
else:
    raise SystemExit(f"unknown mode {mode!r}")
