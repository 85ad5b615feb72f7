"""Keras 3 callbacks: initial broadcast, protocol life cycle, straggler injection, metrics, accuracy.

Typical use (two lines differ from a single-process script)::

    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    model.fit(x, y, callbacks=hetsync.callbacks.standard(opt) + [...])
"""
import importlib.util
import json
import logging
import os
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from . import runtime, slowdown, transport
from .protocols.wrapper import protocol_of

__all__ = ["BroadcastInitialVariables", "ProtocolHooks", "Slowdown", "SyncMetrics", "TestAccuracy", "MetricAverage",
           "on_rank0", "standard"]

log = logging.getLogger("hetsync")


class BroadcastInitialVariables(keras.callbacks.Callback):
    """Make every rank start from ``root_rank``'s weights (and optimizer state).

    Model weights and optimizer variables are broadcast at ``on_train_begin``: the optimizer
    (built lazily by Keras 3 on the first step) is built there first, so per-rank optimizer
    state of protocols with local steps (SelSync, local SGD, ...) is never overwritten after
    step 1. If the model has no variables yet, the optimizer variables are broadcast after the
    first batch instead, as horovod's callback does on Keras 2.

    Args:
        root_rank: int in [0, world size), the rank whose values win.

    Raises:
        ValueError: ``root_rank`` outside [0, world size) (at construction).
    """

    def __init__(self, root_rank=0):
        super().__init__()
        if not isinstance(root_rank, int) or not 0 <= root_rank < runtime.size():
            raise ValueError(f"root_rank must be an int in [0, {runtime.size()}), got {root_rank!r}")
        self.root_rank = root_rank
        self._optimizer_done = False

    def on_train_begin(self, logs=None):
        transport.broadcast_variables(self.model.variables, self.root_rank, name="hetsync_bcast_model")
        opt = self.model.optimizer
        if opt is not None and not opt.built and self.model.trainable_variables:
            opt.build(self.model.trainable_variables)
        if opt is not None and opt.built:
            self._optimizer_done = True
            transport.broadcast_variables(list(opt.variables), self.root_rank, name="hetsync_bcast_opt")

    def on_train_batch_end(self, batch, logs=None):
        if not self._optimizer_done:
            self._optimizer_done = True
            opt_vars = list(getattr(self.model.optimizer, "variables", []))
            transport.broadcast_variables(opt_vars, self.root_rank, name="hetsync_bcast_opt")


class ProtocolHooks(keras.callbacks.Callback):
    """Start and stop a protocol's communication thread around ``model.fit``.

    Args:
        optimizer: an optimizer wrapped by a hetsync protocol.

    Raises:
        TypeError: ``optimizer`` is not hetsync-wrapped.
    """

    def __init__(self, optimizer):
        super().__init__()
        self.protocol = protocol_of(optimizer)

    def on_train_begin(self, logs=None):
        self.protocol.check_fit(self.model)
        self.protocol.start()

    def on_train_end(self, logs=None):
        self.protocol.stop()


class Slowdown(keras.callbacks.Callback):
    """Inject a straggler scenario into every training step (GUIDE section 2), optionally on an
    emulated device (``device:MS``).

    Each step it draws this rank's ``(factor K, extra_ms)`` from the seeded scenario and stamps
    the step's start time into :func:`hetsync.slowdown.step_control`; inside the compiled step the
    delay op holds the gradients back for (K - 1) x compute time + extra_ms. With a ``device:MS``
    part the step is instead padded to exactly K x MS x samples / b + extra_ms milliseconds from
    its start to its gradients (samples: :meth:`hetsync.protocols.Protocol.step_samples` of the
    step, b: the protocol's ``batch_size``; MS per step when either is unknown); a step whose real
    compute took longer is an overrun (counted by the protocol's ``overrun`` statistic). The first
    step of each ``fit`` (tracing and compilation) is neither slowed nor padded. ``netdelay:MS``
    sets :func:`hetsync.slowdown.sync_control` so every synchronization pays MS milliseconds.

    Faults (``pause``, ``stall``, ``kill``; issue 15) hitting this rank are checked at each train batch
    begin, before the step is stamped, against the seconds since this ``fit``'s train begin, and fire
    once per process (:meth:`hetsync.slowdown.Fault.fire`, recorded in :attr:`faults`). A
    parameter-server rank serves inside its train begin, so there ``pause`` and ``kill`` are armed on
    a timer thread instead (``stall`` of a server rank is refused at train begin: ValueError).

    Put it *first* in the callback list so the stamped start time excludes other callbacks.
    Under a parameter-server protocol the draws are made over the n workers (``random:K``: probability
    1/n); the spec is still checked against the whole launch.

    Args:
        spec: str slowdown spec (see :func:`hetsync.slowdown.parse_spec`) or a parsed Scenario.
        seed: int, seeds the per-rank generator ``default_rng([seed, rank])``.
        rank, world_size: optional ints to draw the scenario *as* rank ``rank`` of a world of
            ``world_size`` ranks instead of this process's own rank and world size (both or
            neither). Used to measure one rank's solo speed under a scenario
            (:mod:`hetsync.bench.efficiency`).

    Raises:
        ValueError: bad spec, a spec that does not fit the world size, or ``rank`` outside
            [0, world_size) (checked at construction, before training starts).
    """

    def __init__(self, spec, seed=0, rank=None, world_size=None):
        super().__init__()
        self.scenario = spec if isinstance(spec, slowdown.Scenario) else slowdown.parse_spec(spec)
        if (rank is None) != (world_size is None):
            raise ValueError(f"Slowdown: give both rank and world_size or neither, got rank={rank!r}, "
                             f"world_size={world_size!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1
                                       or not isinstance(rank, int) or not 0 <= rank < world_size):
            raise ValueError(f"Slowdown: need an int world_size >= 1 and an int rank in [0, world_size), "
                             f"got rank={rank!r}, world_size={world_size!r}")
        self.rank = runtime.rank() if rank is None else rank
        self.world_size = runtime.size() if world_size is None else world_size
        self._own_world = world_size is None
        self.scenario.validate(self.world_size)
        self._rng = self.scenario.rng(seed, self.rank)
        self._step = slowdown.step_control()
        self._sync = slowdown.sync_control()

    def on_train_begin(self, logs=None):
        spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if spe != 1:
            raise ValueError(f"Slowdown: model.compile(steps_per_execution={spe}) is not supported with a straggler "
                             "scenario; the scenario stamps every step's start before it runs, so it needs "
                             "steps_per_execution=1")
        if self._own_world and runtime.num_servers():
            # parameter-server ranks do not step: draw as one of the n workers (random:K is 1/n per step)
            self.world_size = runtime.num_workers()
        self._first = True
        self._sync.assign([0.0, 1.0, self.scenario.sync_latency_ms])
        self._protocol = getattr(getattr(self.model, "optimizer", None), "hetsync_protocol", None)
        self._t0 = time.time()
        self._faults = [f for f in self.scenario.faults(self.rank) if not f.fired()]
        self._timers = []
        if self._faults and self._own_world and runtime.is_server():
            stalls = [f.spec for f in self._faults if f.kind == "stall"]
            if stalls:
                raise ValueError(f"Slowdown: {stalls} stall rank {self.rank}, a parameter server, whose training thread "
                                 "is its server loop; use pause:RANK:AT_S:FOR_S to stop a server")
            for f in self._faults:  # a server rank serves inside train begin: no batch begins to check at
                timer = threading.Timer(f.at_s, f.fire, args=(f.at_s,))
                timer.daemon = True
                timer.start()
                self._timers.append(timer)
            self._faults = []

    @property
    def faults(self):
        """The faults fired in this process so far (list of dicts, :func:`hetsync.slowdown.fired_faults`)."""
        return slowdown.fired_faults()

    def device_ms(self, batch):
        """Emulated device time of step ``batch`` before the scenario's factor, in milliseconds:
        MS x samples / b (0.0 without a ``device`` part; MS if samples or b is unknown)."""
        ms = self.scenario.device_ms
        if ms is None:
            return 0.0
        p = self._protocol
        samples, b = (p.step_samples(batch), p.batch_size) if p is not None else (None, None)
        if samples is None or not b:
            return float(ms)
        return float(ms) * float(samples) / float(b)

    def on_train_batch_begin(self, batch, logs=None):
        if self._faults:
            elapsed = time.time() - self._t0
            for f in [f for f in self._faults if elapsed >= f.at_s]:
                self._faults.remove(f)
                f.fire(elapsed)
        factor, extra_ms = self.scenario.draw(self._rng, self.rank, self.world_size)
        device_ms = self.device_ms(batch)
        if self._first:
            # The first step of a fit mostly traces and compiles the step function; slowing it
            # K times would inject seconds that no real slower device would add. The draw is
            # still consumed so the per-rank sequence of later steps does not depend on this.
            self._first = False
            factor, extra_ms, device_ms = 1.0, 0.0, 0.0
        self._step.assign([time.time(), factor, extra_ms, device_ms])

    def on_train_end(self, logs=None):
        for timer in getattr(self, "_timers", []):
            timer.cancel()
        for f in getattr(self, "_faults", []):
            log.warning("hetsync: fault %s did not fire: this fit ended %.2f s after its train begin", f.spec,
                        time.time() - self._t0)
        self._step.assign([0.0, 1.0, 0.0, 0.0])
        self._sync.assign([0.0, 1.0, 0.0])


class TestAccuracy(keras.callbacks.Callback):
    """Test accuracy of rank 0's model during training: the curve, time to target, final accuracy.

    Wall time counts from ``on_train_begin`` and excludes the time this callback spends, so it
    measures training. With protocols that let replicas drift apart (RNA, local SGD) the evaluated
    model is rank 0's.

    By default the evaluation is *deferred*: at each evaluation point rank 0 only copies its
    weights (``model.get_weights()``, microseconds for the example models) and every copy is
    evaluated at ``on_train_end``. Evaluating in place would stop rank 0 for the length of a
    prediction pass while, under the asynchronous protocols (RNA, local SGD, FedAvg between
    averages), the other ranks keep training, and that excluded time would count as free progress
    and make rank 0 the straggler of the run. Memory: one weight copy per evaluation point.

    Args:
        x, y: test inputs (float32 array [N, ...]) and integer labels (int array [N]).
        target: float in (0, 1], accuracy whose first crossing is ``time_to_target_s``; or None.
        every_steps: int > 0 to also evaluate every that many steps; None: only at epoch ends.
        defer: bool, True (default) evaluates the weight copies at train end; False evaluates at
            once (the curve is then available during training, at the cost described above).

    Attributes (after training, meaningful on rank 0):
        curve: list of dicts ``{"step", "epoch", "wall_s", "accuracy"}``.
        time_to_target_s: float seconds, or None if the target was never reached.
        final_accuracy: float, accuracy of the model as ``fit`` leaves it (evaluated at
            ``on_train_end``, after callbacks placed before this one, such as the protocol's
            stop hook, have run).
        extra: dict, the protocol's own final figures when it has a ``final_evaluation(model, x, y)``
            method (ENSEMBLE: the mean accuracy of the local models and of their averaged predictions).

    Raises:
        ValueError: ``target`` outside (0, 1], ``every_steps`` not a positive int, or ``defer`` not a bool.
    """

    __test__ = False  # not a pytest class

    def __init__(self, x, y, target=None, every_steps=None, defer=True):
        super().__init__()
        if target is not None and not 0 < target <= 1:
            raise ValueError(f"target accuracy must be in (0, 1], got {target!r}")
        if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                        or every_steps <= 0):
            raise ValueError(f"every_steps must be a positive int or None, got {every_steps!r}")
        if not isinstance(defer, bool):
            raise ValueError(f"defer must be True or False, got {defer!r}")
        self.x, self.y = x, np.asarray(y)
        self.target, self.every_steps, self.defer = target, every_steps, defer
        self.curve, self.time_to_target_s, self.final_accuracy = [], None, None
        self.extra = {}
        self._is_root = runtime.rank() == 0
        self._epoch, self._steps = 0, 0
        self._pending = []

    def accuracy(self):
        """Return the current model's test accuracy (float in [0, 1])."""
        logits = self.model.predict(self.x, batch_size=1024, verbose=0)
        return float(np.mean(np.argmax(logits, axis=-1) == self.y))

    def _record(self, point, acc):
        point = dict(point, accuracy=acc)
        self.curve.append(point)
        if self.target is not None and self.time_to_target_s is None and acc >= self.target:
            self.time_to_target_s = point["wall_s"]
        self.final_accuracy = acc

    def _evaluate(self):
        if not self._is_root:
            return
        t = time.time()
        point = {"step": self._steps, "epoch": self._epoch, "wall_s": t - self._t0 - self._eval_s}
        if self.defer:
            self._pending.append((point, self.model.get_weights()))
        else:
            self._record(point, self.accuracy())
        self._eval_s += time.time() - t

    def on_train_begin(self, logs=None):
        self._t0, self._eval_s = time.time(), 0.0
        self._pending = []

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self.every_steps and self._steps % self.every_steps == 0:
            self._evaluate()

    def on_epoch_end(self, epoch, logs=None):
        if not (self.every_steps and self._steps % self.every_steps == 0):
            self._evaluate()

    def on_train_end(self, logs=None):
        if not self._is_root:
            return
        # Protocols may change the model when they stop (RNA's final parameter average), so the
        # final accuracy is taken here, after the deferred points; the curve keeps the in-training points.
        if self._pending:
            current = self.model.get_weights()
            for point, weights in self._pending:
                self.model.set_weights(weights)
                self._record(point, self.accuracy())
            self._pending = []
            self.model.set_weights(current)
        self.final_accuracy = self.accuracy()
        hook = getattr(getattr(self.model.optimizer, "hetsync_protocol", None), "final_evaluation", None)
        if callable(hook):
            self.extra = dict(hook(self.model, self.x, self.y))


class SyncMetrics(keras.callbacks.Callback):
    """Per-step records on every rank as JSON lines, TensorBoard scalars and ``summary.json`` on rank 0.

    Each rank writes ``log_dir/rank{r}.jsonl``, one object per step: ``step`` (int), ``epoch``,
    ``wall_s`` (seconds since training began), ``step_ms`` (wall time of the step, milliseconds),
    ``loss``, ``delay_ms`` (injected delay), ``compute_ms``, ``sync_wait_ms`` (time inside
    synchronization), and every protocol statistic (:meth:`hetsync.protocols.Protocol.step_stats`).
    On an emulated device (``device:MS``) each rank also counts its emulated steps and its
    *overrun* steps (real compute longer than the emulated time); the summary holds them per rank
    (``emulated_steps``, ``overrun_steps``) and in total (``overrun_fraction``, ``emulation_valid``:
    at most :data:`hetsync.slowdown.OVERRUN_WARN_FRACTION` overran), and rank 0 logs a warning when
    more than that fraction overran. Rank 0 also writes TensorBoard scalars under ``log_dir/tensorboard`` (when the ``tensorboard`` package is installed; else a warning). Samples are counted per
    completed epoch from the protocol's ``samples_per_epoch`` (set by ``Protocol.fit_data``; 0 if
    the data did not come from it). Faults fired in the process (:func:`hetsync.slowdown.fired_faults`)
    appear as ``faults`` in the record of the step they hit, in the rank's ``per_rank`` row and, from every
    rank, in the summary's ``faults``. A parameter-server rank writes no step records (its row in
    ``per_rank`` has ``role: "server"`` and zero steps; ``workers`` counts the others). At the end, all ranks allgather their totals and rank 0 writes ``log_dir/summary.json`` (see :meth:`write_summary`).

    Args:
        log_dir: str path of the output folder (created).
        optimizer: the hetsync-wrapped optimizer (its protocol supplies statistics); None takes
            the model's optimizer at ``on_train_begin``.

    Raises:
        TypeError: the optimizer is not hetsync-wrapped (at ``on_train_begin``).
    """

    #: per-rank totals gathered at the end (one dict per rank, :func:`hetsync.transport.allgather_object`).
    TOTALS = ("steps", "samples", "wall_s", "step_ms_mean", "delay_ms_total", "compute_ms_total", "sync_wait_ms_total",
              "emulated_steps", "overrun_steps")

    def __init__(self, log_dir, optimizer=None):
        super().__init__()
        self.log_dir = log_dir
        self._optimizer = optimizer
        self.summary = {}
        self.per_rank = []

    def on_train_begin(self, logs=None):
        os.makedirs(self.log_dir, exist_ok=True)
        self.protocol = protocol_of(self._optimizer or self.model.optimizer)
        self.rank = runtime.rank()
        self._file = open(os.path.join(self.log_dir, f"rank{self.rank}.jsonl"), "w")
        self._writer = None
        if self.rank == 0:
            if importlib.util.find_spec("tensorboard") is None:
                # tensorflow-cpu >= 2.20 no longer depends on tensorboard; the JSON records are written anyway
                log.warning("SyncMetrics: tensorboard is not installed, so no TensorBoard scalars are written "
                            "under %s (pip install tensorboard); rank*.jsonl and summary.json are", self.log_dir)
            else:
                self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "tensorboard"))
        self._t0 = time.time()
        self._step, self._epoch, self._epoch_steps = 0, 0, 0
        self._totals = dict.fromkeys(self.TOTALS, 0.0)
        # a parameter-server rank trains nothing (its fit serves, then runs one step that changes nothing)
        self._serves = bool(getattr(self.protocol, "serves", False))
        self._faults_seen = len(slowdown.fired_faults())

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_steps = 0

    def on_epoch_end(self, epoch, logs=None):
        self._totals["samples"] += self.protocol.samples_per_epoch or 0

    def on_train_batch_begin(self, batch, logs=None):
        self._tb = time.time()

    def on_train_batch_end(self, batch, logs=None):
        if self._serves:
            return
        now = time.time()
        rec = {"step": self._step, "epoch": self._epoch, "wall_s": now - self._t0,
               "step_ms": (now - self._tb) * 1e3}
        for k, v in (logs or {}).items():
            try:
                rec[k] = float(v)
            except (TypeError, ValueError):
                pass
        rec.update(self.protocol.step_stats())
        faults = slowdown.fired_faults()
        if len(faults) > self._faults_seen:  # fired at this step's begin (Slowdown)
            rec["faults"], self._faults_seen = faults[self._faults_seen:], len(faults)
        # With steps_per_execution k > 1 Keras calls this once per k steps, with the last step's index.
        done = max(1, int(batch) + 1 - self._epoch_steps)
        self._epoch_steps = int(batch) + 1
        rec["steps_in_call"] = done
        self._file.write(json.dumps(rec) + "\n")
        self._step += done
        t = self._totals
        t["steps"] += done
        t["step_ms_mean"] += rec["step_ms"]
        t["delay_ms_total"] += rec.get("delay_ms", 0.0)
        t["compute_ms_total"] += rec.get("compute_ms", 0.0)
        t["sync_wait_ms_total"] += rec.get("sync_wait_ms", 0.0)
        t["emulated_steps"] += 1.0 if rec.get("emulated_ms", 0.0) > 0 else 0.0
        t["overrun_steps"] += rec.get("overrun", 0.0)
        if self._writer is not None:
            with self._writer.as_default(step=self._step):
                for k in ("loss", "step_ms", "delay_ms", "sync_wait_ms"):
                    if k in rec:
                        tf.summary.scalar(k, rec[k])

    def on_train_end(self, logs=None):
        self._file.close()
        if self._writer is not None:
            self._writer.flush()
        t = self._totals
        t["wall_s"] = time.time() - self._t0
        t["step_ms_mean"] = t["step_ms_mean"] / max(1.0, t["steps"])
        row = {k: float(t[k]) for k in self.TOTALS}
        row["role"] = "server" if self._serves else "worker"
        row["faults"] = slowdown.fired_faults()
        gathered = transport.allgather_object(row, name="hetsync_metrics_totals")
        self.per_rank = [dict(row, rank=r) for r, row in enumerate(gathered)]
        for row in self.per_rank:
            for k in ("steps", "samples", "emulated_steps", "overrun_steps"):
                row[k] = int(row[k])
        emulated = sum(r["emulated_steps"] for r in self.per_rank)
        overruns = sum(r["overrun_steps"] for r in self.per_rank)
        self.summary = {
            "protocol": self.protocol.name,
            "protocol_config": self.protocol.config(),
            "world_size": runtime.size(),
            "workers": sum(1 for r in self.per_rank if r["role"] == "worker"),
            "steps": max(r["steps"] for r in self.per_rank),
            "wall_s": max(r["wall_s"] for r in self.per_rank),
            "per_rank": self.per_rank,
            "stats": self.protocol.summary_stats(),
            "emulated_steps": emulated,
            "overrun_steps": overruns,
            "overrun_fraction": overruns / emulated if emulated else 0.0,
            "emulation_valid": (overruns <= slowdown.OVERRUN_WARN_FRACTION * emulated) if emulated else None,
            "faults": [f for r in self.per_rank for f in r["faults"]],
        }
        if self.rank == 0 and emulated and overruns > slowdown.OVERRUN_WARN_FRACTION * emulated:
            log.warning("hetsync: %d of %d emulated steps (%.1f%%) overran their device time (per rank: %s): the "
                        "real compute took longer than device:MS allows, so this run does not measure the emulated "
                        "cluster; raise MS or lower the load", overruns, emulated, 100.0 * overruns / emulated,
                        [r["overrun_steps"] for r in self.per_rank])
        self.write_summary()

    def write_summary(self, **extra):
        """Merge ``extra`` fields into :attr:`summary` and write ``log_dir/summary.json`` (rank 0 only).

        Returns:
            dict, the summary.
        """
        self.summary.update(extra)
        if runtime.rank() == 0:
            path = os.path.join(self.log_dir, "summary.json")
            with open(path + ".tmp", "w") as f:
                json.dump(self.summary, f, indent=2, sort_keys=True)
            os.replace(path + ".tmp", path)
        return self.summary


class MetricAverage(keras.callbacks.Callback):
    """Average the epoch's logged metrics over all ranks at every epoch end (horovod's
    ``MetricAverageCallback``).

    Each rank's ``logs`` (loss, metrics, and ``val_*`` after validation) hold its own data's values;
    at ``on_epoch_end`` every numeric entry is replaced *in place* by its mean over the ranks
    (one :func:`hetsync.transport.allgather_object` per epoch), so callbacks placed after this one
    (``ModelCheckpoint(save_best_only=True)``, ``EarlyStopping``, ``ReduceLROnPlateau``, the
    progress bar, the ``History`` returned by ``fit``) see the same values on every rank and
    decide alike. Place it before them. A key present on some ranks only is left unaveraged and
    named in a ``ValueError``, since the ranks would otherwise disagree.

    The exchange is horovod's ``allgather_object``, except under a protocol whose communication
    thread runs horovod collectives of its own while training (RNA: rounds, drift and parameter
    averages): eager horovod collectives issued from two threads are matched across ranks by
    their order, so they could pair the metrics with RNA's round. There the metrics go through
    the point-to-point dispatcher (mpi4py on its own communicator): every rank sends them to rank
    0, which sends everyone the list (channels ``metrics.gather`` and ``metrics.result``, tagged
    by epoch, ``timeout_s`` each). Under a parameter-server protocol the mean is over the n
    workers, by the same point-to-point path; a server rank (whose ``fit`` serves and runs one
    step that trains nothing) leaves its logs alone.

    Args:
        timeout_s: float seconds > 0 a rank waits for the others' metrics (point-to-point path).

    Raises:
        ValueError: the ranks logged different metric names (at the epoch end); bad ``timeout_s``.
        hetsync.transport.TransportTimeout: a rank's metrics did not arrive within ``timeout_s``.
    """

    def __init__(self, timeout_s=300.0):
        super().__init__()
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"MetricAverage: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)

    def _gather(self, mine, epoch, proto):
        with_servers = runtime.num_servers() > 0
        if (not getattr(proto, "collectives_in_thread", False) and not with_servers) or runtime.size() == 1:
            return transport.allgather_object(mine, name=f"hetsync_metric_average_{epoch}")
        # over the workers only (ranks 0 .. n - 1) when some ranks serve parameters
        d, rank, n = transport.dispatcher(), runtime.rank(), runtime.num_workers()
        if rank != 0:
            d.send(0, "metrics.gather", mine, tag=epoch)
            return d.recv("metrics.result", source=0, tag=epoch, timeout_s=self.timeout_s).obj
        rows = [mine] + [d.recv("metrics.gather", source=r, tag=epoch, timeout_s=self.timeout_s).obj
                         for r in range(1, n)]
        for r in range(1, n):
            d.send(r, "metrics.result", rows, tag=epoch)
        return rows

    def on_epoch_end(self, epoch, logs=None):
        proto = getattr(getattr(self.model, "optimizer", None), "hetsync_protocol", None)
        if logs is None or getattr(proto, "serves", False):  # a server rank's logs are not training's
            return
        mine = {}
        for k, v in logs.items():
            try:
                mine[k] = float(v)
            except (TypeError, ValueError):
                pass
        gathered = self._gather(mine, epoch, proto)
        keys = set(gathered[0])
        if any(set(g) != keys for g in gathered):
            raise ValueError(f"MetricAverage: the ranks logged different metrics at epoch {epoch}: "
                             f"{[sorted(g) for g in gathered]}")
        for k in keys:
            logs[k] = float(np.mean([g[k] for g in gathered]))


def on_rank0(*callbacks):
    """Return ``callbacks`` as a list on rank 0 and ``[]`` on every other rank.

    For callbacks that write files (``keras.callbacks.ModelCheckpoint``, ``TensorBoard``,
    ``CSVLogger``, ``BackupAndRestore``): one writer, no clobbering. Under the protocols that
    leave every rank with the same model (BSP, task allocation, and the others after their
    end-of-training average) rank 0's model is the model; under RNA, SelSync, local SGD and FedAvg
    a checkpoint taken during training holds rank 0's replica. Put :class:`MetricAverage` before
    them in the callback list so ``save_best_only`` compares averaged metrics.

    Args:
        *callbacks: ``keras.callbacks.Callback`` instances.

    Returns:
        list of keras.callbacks.Callback.

    Raises:
        TypeError: an argument is not a Keras callback.
    """
    for cb in callbacks:
        if not isinstance(cb, keras.callbacks.Callback):
            raise TypeError(f"on_rank0 takes Keras callbacks, got {type(cb).__name__}: {cb!r}")
    return list(callbacks) if runtime.rank() == 0 else []


def standard(optimizer, root_rank=0):
    """Return the callbacks every hetsync run needs: initial broadcast + the protocol's hooks
    and its own callbacks.

    Args:
        optimizer: a hetsync-wrapped optimizer. root_rank: int, broadcast source.

    Returns:
        list of keras.callbacks.Callback.

    Raises:
        TypeError: ``optimizer`` is not hetsync-wrapped.
    """
    proto = protocol_of(optimizer)
    return [BroadcastInitialVariables(root_rank), ProtocolHooks(optimizer)] + list(proto.callbacks())
