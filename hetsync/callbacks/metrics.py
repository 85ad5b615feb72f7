"""Keras callbacks that record and average what a run measured.

:class:`SyncMetrics` writes every rank's per-step records (``steps_rank<i>.jsonl``: step time, the
protocol's statistics, the emulated device's figures) and the run's ``summary.json``;
:class:`MetricAverage` averages the logged metrics over the worker ranks at each epoch end.
"""
import importlib.util
import json
import logging
import os
import queue
import socket
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from hetsync import transport, world
from hetsync.transport import channels
from hetsync.core.controls import OVERRUN_WARN_FRACTION
from hetsync.core.wrapper import chosen_by, protocol_of
from hetsync.emulation import faults as emulation_faults

__all__ = ["SyncMetrics", "MetricAverage", "ScalarWriter"]

log = logging.getLogger("hetsync")


class ScalarWriter:
    """TensorBoard scalars written by a background thread, off the training loop.

    ``tf.summary.scalar`` costs about a quarter of a millisecond per value on a shared core; four per step on
    rank 0 made rank 0 the last to reach every collective (1-2 ms per step on the emulated cluster). The
    training thread only queues ``(step, {name: value})``; the thread writes them while the step's device work
    (or its emulated time) leaves the CPU idle. The thread ends after ``idle_s`` seconds without scalars (a fit
    that raised never calls :meth:`close`) and the next :meth:`add` starts a new one.

    Args:
        logdir: str, the TensorBoard folder (created by ``tf.summary.create_file_writer``).
        close_timeout_s: float seconds :meth:`close` waits for the queued scalars to be written.
        idle_s: float seconds without a queued scalar after which the thread ends.
    """

    def __init__(self, logdir, close_timeout_s=60.0, idle_s=30.0):
        self._writer = tf.summary.create_file_writer(logdir)
        self._queue = queue.SimpleQueue()
        self._close_timeout_s, self._idle_s = float(close_timeout_s), float(idle_s)
        self._lock = threading.Lock()
        self._thread = None

    def _put(self, item):
        """Queue ``item`` and make sure a thread will take it (under the lock the thread exits under)."""
        with self._lock:
            self._queue.put_nowait(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hetsync-tensorboard", daemon=True)
                self._thread.start()
            return self._thread

    def add(self, step, values):
        """Queue the scalars ``values`` (dict str -> float) of ``step`` (int); returns at once."""
        self._put((int(step), dict(values)))

    def _run(self):
        while True:
            try:
                item = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():  # idle: end; the next add starts a thread again
                        self._thread = None
                        return
                continue
            if item is None:
                break
            step, values = item
            try:
                with self._writer.as_default(step=step):
                    for name, value in values.items():
                        tf.summary.scalar(name, value)
            except Exception:  # noqa: BLE001 (logging must never stop training)
                log.exception("SyncMetrics: writing TensorBoard scalars of step %d failed", step)
        self._writer.flush()
        with self._lock:
            self._thread = None

    def close(self):
        """Write what is queued, flush, and end the thread (at most ``close_timeout_s`` seconds; a warning names a
        thread that did not finish: the scalars it had not written are lost, the JSON records are not)."""
        thread = self._put(None)
        thread.join(self._close_timeout_s)
        if thread.is_alive():
            log.warning("SyncMetrics: the TensorBoard writer did not finish within %.0f s; scalars still queued were "
                        "not written (rank*.jsonl holds every step)", self._close_timeout_s)


class SyncMetrics(keras.callbacks.Callback):
    """Per-step records on every rank as JSON lines, TensorBoard scalars and ``summary.json`` on rank 0.

    Each rank writes ``log_dir/rank{r}.jsonl``, one object per step: ``step`` (int), ``epoch``,
    ``wall_s`` (seconds since training began), ``unix_s`` (the step's end, seconds since the epoch of
    ``time.time()``: one clock for all ranks of a host), ``step_ms`` (wall time of the step,
    milliseconds), ``samples_processed`` (int, the samples this rank has processed since training
    began, this step included), ``host_ms`` (milliseconds per step outside the device time: ``step_ms`` less the
    compute and the injected or emulated delay, so synchronization waits, the optimizer's update and
    Keras' own per-step work), ``loss``, ``delay_ms`` (injected delay), ``compute_ms``, ``sync_wait_ms``
    (time inside synchronization), and every protocol statistic
    (:meth:`hetsync.protocols.Protocol.step_stats`). ``samples_processed`` adds, per step, the protocol's
    :meth:`~hetsync.core.dataplans.DataPlans.step_samples` (capped by the epoch's known sample count, so
    a last, partial batch is not over-counted) and is set to the exact total at each epoch end; a
    protocol that knows no batch size (data not from its data plan) leaves it out.
    On an emulated device (``device:MS``) each rank also counts its emulated steps and its
    *overrun* steps (real compute longer than the emulated time); the summary holds them per rank
    (``emulated_steps``, ``overrun_steps``) and in total (``overrun_fraction``, ``emulation_valid``:
    at most :data:`hetsync.emulation.scenario.OVERRUN_WARN_FRACTION` overran), and rank 0 logs a warning when
    more than that fraction overran. Rank 0 also writes TensorBoard scalars under ``log_dir/tensorboard`` (when the
    ``tensorboard`` package is installed; else a warning), from a background thread (:class:`ScalarWriter`). Samples
    are counted per completed epoch from the protocol's ``samples_per_epoch`` (set by ``Protocol.fit_data``; 0 if
    the data did not come from it). Faults fired in the process (:func:`hetsync.emulation.scenario.fired_faults`)
    appear as ``faults`` in the record of the step they hit, in the rank's ``per_rank`` row and, from every rank, in
    the summary's ``faults``. A parameter-server rank writes no step records (its row in ``per_rank`` has ``role:
    "server"`` and zero steps; ``workers`` counts the others). Each ``per_rank`` row names the rank's ``host`` (its
    hostname) and the ``protocol`` it ended with. A run of :func:`hetsync.Auto` is reported as ``protocol: "auto"``
    with Auto's configuration; the summary's ``chosen_by`` (None otherwise) holds the choice
    (:func:`hetsync.core.wrapper.chosen_by`: the chosen ``protocol`` and ``config``, the ``step`` after which it was
    made, the ``predicted`` ranking, the ``reasons``), and ``stats`` are the chosen protocol's. The summary also
    holds the model's ``gradient_bytes`` (int, bytes of one gradient of its trainable variables) and
    ``variable_bytes`` (list of int, per trainable variable in model order). At the end, all ranks allgather their
    totals and rank 0 writes ``log_dir/summary.json`` (see :meth:`write_summary`).

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
        self._resume = None

    @property
    def protocol(self):
        """The optimizer's protocol now (``hetsync.Auto`` switches it between two steps)."""
        return protocol_of(self._optimizer or self.model.optimizer)

    def state(self):
        """The running totals as a JSON-able dict (saved by :class:`hetsync.callbacks.checkpoint.BackupAndRestore`).

        Flushes and fsyncs ``rank{r}.jsonl`` first, so the step records up to the checkpoint survive a kill."""
        self._file.flush()
        os.fsync(self._file.fileno())
        return {"totals": dict(self._totals), "step": self._step, "wall_s": time.time() - self._t0}

    def resume_from(self, state, epoch, step_in_epoch):
        """Continue a checkpointed run: at the next ``on_train_begin`` start from ``state``
        (:meth:`state`), keep this rank's step records of the steps before it (later ones, run
        after the checkpoint by the killed run, are dropped from ``rank{r}.jsonl``) and ignore the
        batch indices below ``step_in_epoch`` of ``epoch`` (steps the resumed fit skips).

        Args:
            state: dict from :meth:`state`. epoch: int >= 0. step_in_epoch: int >= 0.
        """
        self._resume = (dict(state), int(epoch), int(step_in_epoch))

    def on_train_begin(self, logs=None):
        os.makedirs(self.log_dir, exist_ok=True)
        self._began_as = protocol_of(self._optimizer or self.model.optimizer).name  # "auto" until Auto switches
        self.rank = world.rank()
        path = os.path.join(self.log_dir, f"rank{self.rank}.jsonl")
        kept = []
        if self._resume is not None and os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        break  # the killed run's last line, cut mid-write (after the checkpoint's fsync)
                    if rec["step"] < self._resume[0]["step"]:
                        kept.append(line if line.endswith("\n") else line + "\n")
        self._file = open(path, "w")
        self._file.writelines(kept)
        self._writer = None
        if self.rank == 0:
            if importlib.util.find_spec("tensorboard") is None:
                # tensorflow-cpu >= 2.20 no longer depends on tensorboard; the JSON records are written anyway
                log.warning("SyncMetrics: tensorboard is not installed, so no TensorBoard scalars are written "
                            "under %s (pip install tensorboard); rank*.jsonl and summary.json are", self.log_dir)
            else:
                self._writer = ScalarWriter(os.path.join(self.log_dir, "tensorboard"))
        self._t0 = time.time()
        self._step, self._epoch, self._epoch_steps, self._epoch_samples = 0, 0, 0, 0
        self._totals = dict.fromkeys(self.TOTALS, 0.0)
        if self._resume is not None:
            state = self._resume[0]
            self._totals.update(state["totals"])
            self._step, self._t0 = int(state["step"]), self._t0 - float(state["wall_s"])
        # a parameter-server rank trains nothing (its fit serves, then runs one step that changes nothing)
        self._serves = bool(getattr(self.protocol, "serves", False))
        self._faults_seen = len(emulation_faults.fired_faults())

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_steps = 0
        self._epoch_samples = 0
        if self._resume is not None and self._resume[1] == epoch:
            self._epoch_steps = self._resume[2]  # batches below it are skipped by the resumed fit
            b = self.protocol.batch_size
            self._epoch_samples = self._epoch_steps * int(b) if b else 0  # processed before the checkpoint

    def on_epoch_end(self, epoch, logs=None):
        self._totals["samples"] += self.protocol.samples_per_epoch or 0

    def on_train_batch_begin(self, batch, logs=None):
        self._tb = time.time()

    def on_train_batch_end(self, batch, logs=None):
        if self._serves or int(batch) < self._epoch_steps:
            return  # (a step skipped by a resumed fit)
        now = time.time()
        rec = {"step": self._step, "epoch": self._epoch, "wall_s": now - self._t0,
               "step_ms": (now - self._tb) * 1e3}
        for k, v in (logs or {}).items():
            try:
                rec[k] = float(v)
            except (TypeError, ValueError):
                pass
        rec.update(self.protocol.step_stats())
        faults = emulation_faults.fired_faults()
        if len(faults) > self._faults_seen:  # fired at this step's begin (Slowdown)
            rec["faults"], self._faults_seen = faults[self._faults_seen:], len(faults)
        # With steps_per_execution k > 1 Keras calls this once per k steps, with the last step's index.
        done = max(1, int(batch) + 1 - self._epoch_steps)
        rec["steps_in_call"] = done
        rec["unix_s"] = now
        samples = self._count_samples(int(batch) + 1 - done, done)
        self._epoch_steps = int(batch) + 1
        if samples is not None:
            rec["samples_processed"] = samples
        if "compute_ms" in rec:  # the stats hold the call's last step; the call ran `done` steps
            rec["host_ms"] = max(0.0, rec["step_ms"] / done - rec["compute_ms"] - rec.get("delay_ms", 0.0))
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
            keys = ("loss", "step_ms", "delay_ms", "sync_wait_ms")
            self._writer.add(self._step, {k: rec[k] for k in keys if k in rec})

    def _count_samples(self, first, count):
        """This rank's cumulative samples after batches ``first .. first + count - 1`` of the epoch
        (int), or None when the protocol knows no batch size."""
        p = self.protocol
        if not p.batch_size:
            return None
        for batch in range(first, first + count):
            n = p.step_samples(batch)
            self._epoch_samples += int(n) if n is not None else int(p.batch_size)
        known = p.samples_per_epoch if p.pool is None else None  # the pool knows its epoch's count at its end
        if known:
            self._epoch_samples = min(self._epoch_samples, int(known))
        return int(self._totals["samples"]) + self._epoch_samples

    def on_train_end(self, logs=None):
        self._resume = None
        self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        t = self._totals
        t["wall_s"] = time.time() - self._t0
        t["step_ms_mean"] = t["step_ms_mean"] / max(1.0, t["steps"])
        row = {k: float(t[k]) for k in self.TOTALS}
        row["role"] = "server" if self._serves else "worker"
        row["protocol"] = self.protocol.name  # the protocol this rank ended with (hetsync.Auto's choice)
        row["host"] = socket.gethostname()
        row["faults"] = emulation_faults.fired_faults()
        gathered = transport.allgather_object(row, name="hetsync_metrics_totals")
        self.per_rank = [dict(row, rank=r) for r, row in enumerate(gathered)]
        for row in self.per_rank:
            for k in ("steps", "samples", "emulated_steps", "overrun_steps"):
                row[k] = int(row[k])
        emulated = sum(r["emulated_steps"] for r in self.per_rank)
        overruns = sum(r["overrun_steps"] for r in self.per_rank)
        chosen = chosen_by(self._optimizer or self.model.optimizer)
        # a fit that began as hetsync.Auto is named for it; chosen_by names the protocol it switched to (a later
        # fit of the switched optimizer is the chosen protocol's run, and keeps the record)
        auto_run = chosen is not None and self._began_as == chosen["by"]
        self.summary = {
            "protocol": chosen["by"] if auto_run else self.protocol.name,
            "protocol_config": chosen["by_config"] if auto_run else self.protocol.config(),
            "world_size": world.size(),
            "workers": sum(1 for r in self.per_rank if r["role"] == "worker"),
            "steps": max(r["steps"] for r in self.per_rank),
            "wall_s": max(r["wall_s"] for r in self.per_rank),
            "per_rank": self.per_rank,
            "stats": self.protocol.summary_stats(),
            "chosen_by": chosen,
            "emulated_steps": emulated,
            "overrun_steps": overruns,
            "overrun_fraction": overruns / emulated if emulated else 0.0,
            "emulation_valid": (overruns <= OVERRUN_WARN_FRACTION * emulated) if emulated else None,
            "faults": [f for r in self.per_rank for f in r["faults"]],
            **self._gradient_size(),
        }
        if self.rank == 0 and emulated and overruns > OVERRUN_WARN_FRACTION * emulated:
            log.warning("hetsync: %d of %d emulated steps (%.1f%%) overran their device time (per rank: %s): the "
                        "real compute took longer than device:MS allows, so this run does not measure the emulated "
                        "cluster; raise MS or lower the load", overruns, emulated, 100.0 * overruns / emulated,
                        [r["overrun_steps"] for r in self.per_rank])
        self.write_summary()

    def _gradient_size(self):
        """``variable_bytes`` (list of int, bytes of each trainable variable in model order) and ``gradient_bytes``
        (int, their sum: one gradient's bytes), from the model's trainable variables; ``{}`` without a model."""
        model = getattr(self, "model", None)
        if model is None:
            return {}
        sizes = [int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in model.trainable_variables]
        return {"variable_bytes": sizes, "gradient_bytes": int(sum(sizes))}

    def write_summary(self, **extra):
        """Merge ``extra`` fields into :attr:`summary` and write ``log_dir/summary.json`` (rank 0 only).

        Returns:
            dict, the summary.
        """
        self.summary.update(extra)
        if world.rank() == 0:
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
        with_servers = proto.roles.num_servers > 0
        if (not proto.capabilities.collectives_in_thread and not with_servers) or world.size() == 1:
            return transport.allgather_object(mine, name=f"hetsync_metric_average_{epoch}")
        # over the workers only (ranks 0 .. n - 1) when some ranks serve parameters
        return transport.dispatcher().gather_at(0, range(proto.roles.num_workers), channels.METRICS_GATHER,
                                                channels.METRICS_RESULT, mine, tag=epoch, timeout_s=self.timeout_s)

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
