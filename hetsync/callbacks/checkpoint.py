"""Checkpoint and resume: a Keras callback that saves every rank's full training
state atomically every N steps and/or S seconds, and resumes a relaunch of the same command from it.

What one checkpoint of one rank holds (``BACKUP_DIR/rank{r}/step-{k:012d}/``):

* ``arrays.npz``: the model's variables (``model.variables``: trainable and non-trainable, e.g.
  BatchNormalization moving statistics) and the optimizer's variables (``optimizer.variables``: the
  wrapped optimizer's iteration counter, learning rate and slots such as momentum), in order;
* ``meta.json``: world size, rank, protocol name and configuration, the data position (epoch, step
  within the epoch, global step k, steps per epoch), the protocol's state
  (:meth:`hetsync.protocols.Protocol.state`: counters, EWMA windows, clocks, allocation, RNG
  positions) and, if given, the :class:`hetsync.callbacks.SyncMetrics` totals.

Atomicity: a checkpoint is written into a hidden temporary folder, every file is fsynced, the folder
is renamed to ``step-{k}`` with :func:`os.replace` and the parent folder fsynced; a folder named
``step-*`` is therefore always complete. The previous ``keep - 1`` checkpoints are deleted only
after the new one is complete.

The consistent cut ("the same step"): every rank saves the state it has after its own global step k
(k counts the ``model.fit`` steps of all epochs, 1-based) when k is a multiple of ``save_every_steps``;
the write happens at the step boundary, before step k + 1 starts (after the other callbacks have
finished step k and, at an epoch's end, the epoch), so a save due after the fit's last step is not
written. Under the
protocols whose ranks step together (BSP, task allocation, SelSync's synchronous steps), step k is
the same moment on every rank. Under the asynchronous protocols (local SGD, FedAvg, RNA, ...) each
rank holds its own replica and the cut is *per-rank step k*: every rank resumes from the state it
had after its own k-th step (its own model, optimizer, protocol counters and data position), which
is the state an uninterrupted run has at that rank's k-th step. Messages in flight between ranks at
that moment (e.g. an RNA round under way) are not saved; local SGD and FedAvg, whose only traffic
is the averaging collective at fixed steps, lose nothing. On restore the ranks agree (one
allgather) on the largest k for which *every* rank holds a complete checkpoint, so a rank that was
ahead when the job died steps back to the common k: it keeps its newest ``keep`` (2) checkpoints
and, when it can see the other ranks' folders (one host or a shared file system), also every
checkpoint from the newest one that the slowest rank has reached, however far ahead it runs. Time-triggered saves (``save_every_s``) are decided by each rank's own clock at a step
boundary, so they are at the same step on all ranks only if the ranks happen to cross the time
at the same step; the restore then finds no common step beyond the last step-triggered one: give
``save_every_steps`` as well for a guaranteed cut (documented limit; no extra collective is added,
so an asynchronous protocol never waits for a checkpoint decision).

Resuming mid-epoch: Keras 3.15's own ``keras.callbacks.BackupAndRestore`` records the batch but
resumes at the start of the saved epoch (``model._initial_epoch``), replaying the epoch's first
steps. This callback reuses that mechanism (``model._initial_epoch = epoch``) and skips the first
``step`` steps of the resumed epoch without running them or reading data: the model's
``train_function`` is wrapped for those calls (the other callbacks still see their batch
indices; :class:`hetsync.callbacks.SyncMetrics` ignores them), and the data set
(a :class:`hetsync.data.shards.BatchDataset`, item t = global step t) is shifted by k, so the first
batch read is exactly global step k's batch of the uninterrupted run.

Limits: the parameter-server protocols' server state (the global model held by a server rank's
thread) and a sample pool are not saved (they need :meth:`hetsync.protocols.Protocol.state` to
cover them); a user ``tf.data`` pipeline (``fit_dataset``) cannot be shifted (``dataset`` must be
a :class:`hetsync.data.shards.BatchDataset`); ``steps_per_execution`` must be 1.
"""
import json
import logging
import os
import re
import shutil
import time

import keras
import numpy as np

from hetsync import transport
from hetsync import world
from hetsync.data.shards import BatchDataset
from hetsync.core.wrapper import protocol_of
from hetsync.callbacks.core import run_state

__all__ = ["BackupAndRestore", "atomic_save", "complete_checkpoints", "load_checkpoint", "FORMAT_VERSION"]

log = logging.getLogger(__name__)

#: version of the on-disk layout (int), recorded in ``meta.json``.
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{12})$")


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(rank_dir, step, arrays, meta):
    """Write one checkpoint atomically: ``rank_dir/step-{step:012d}/{arrays.npz, meta.json}``.

    The files go to a temporary folder in ``rank_dir``, are fsynced, and the folder is renamed with
    :func:`os.replace` (an existing checkpoint of the same step is replaced); the parent is fsynced.
    A reader therefore sees either no ``step-{step}`` folder or a complete one.

    Args:
        rank_dir: str folder of this rank's checkpoints (created).
        step: int >= 0, the global step the state was taken after.
        arrays: list of numpy arrays (any shapes and dtypes), stored as ``a0, a1, ...``.
        meta: JSON-serialisable dict.

    Returns:
        str path of the checkpoint folder.

    Raises:
        ValueError: ``step`` not an int >= 0. OSError: the file system refused a write.
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")
    os.makedirs(rank_dir, exist_ok=True)
    final = os.path.join(rank_dir, f"step-{int(step):012d}")
    tmp = os.path.join(rank_dir, f".tmp-step-{int(step):012d}-{os.getpid()}")
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "arrays.npz"), "wb") as f:
        np.savez(f, **{f"a{i}": np.asarray(a) for i, a in enumerate(arrays)})
        f.flush()
        os.fsync(f.fileno())
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if os.path.exists(final):  # the same step saved again (a resumed run): same content
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(rank_dir)
    return final


def complete_checkpoints(rank_dir):
    """Return the sorted list of global steps (ints) of the complete checkpoints in ``rank_dir``.

    Temporary folders (a write that was interrupted) are ignored. A missing folder gives ``[]``.
    """
    if not os.path.isdir(rank_dir):
        return []
    steps = []
    for name in os.listdir(rank_dir):
        m = _STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(rank_dir, name, "meta.json")):
            steps.append(int(m.group(1)))
    return sorted(steps)


def load_checkpoint(rank_dir, step):
    """Read checkpoint ``step`` of ``rank_dir``: ``(arrays, meta)`` (list of numpy arrays, dict)."""
    path = os.path.join(rank_dir, f"step-{int(step):012d}")
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    with np.load(os.path.join(path, "arrays.npz")) as z:
        arrays = [z[f"a{i}"] for i in range(len(z.files))]
    return arrays, meta


def _check_positive(name, value, kind):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        what = "an int >= 1 (steps)" if kind is int else "a number > 0 (seconds)"
        raise ValueError(f"BackupAndRestore: {name} must be None or {what}, got {value!r}")
    return value


class BackupAndRestore(keras.callbacks.Callback):
    """Save every rank's training state every N steps and/or S seconds; resume a relaunch from it.

    Checkpoint and resume for every protocol; modelled on ``keras.callbacks.BackupAndRestore`` and using
    its resume mechanism (``model._initial_epoch``), plus a mid-epoch resume and per-rank state
    (see the module docstring for the layout, the consistent cut and the limits). Put it in the
    callback list *before* ``hetsync.callbacks.standard(opt)``: it restores before the initial
    broadcast (which it then skips, so that per-rank replicas survive) and before the protocol
    starts. On a relaunch with a checkpoint for another world size, protocol or configuration it
    raises ValueError. When ``fit`` completes, the checkpoints are deleted
    (``delete_checkpoint=True``).

    Args:
        backup_dir: str folder for the checkpoints (``rank{r}/`` per rank; not shared with anything else).
        save_every_steps: None or int N >= 1: save after every N-th global step (steps of all
            epochs, counted from 1).
        save_every_s: None or float S > 0 (seconds): save at the first step boundary at least S
            seconds after the previous save (or the train begin). At least one of the two is needed;
            with both, either triggers a save.
        dataset: the :class:`hetsync.data.shards.BatchDataset` passed to ``model.fit`` as ``x`` (what
            ``Protocol.fit_data`` / ``hetsync.data.shards.local_fit_data`` return under ``"x"``): a
            resume shifts it to the saved global step. Needed to resume (ValueError without it).
        metrics: None or the run's :class:`hetsync.callbacks.SyncMetrics`: its totals (steps,
            samples, times) are saved and restored, so the resumed run's summary counts the whole run.
        keep: int >= 2, newest complete checkpoints kept per rank (the restore needs one that every
            rank holds; older ones that a slower rank may still need are kept too, see the module docstring).
        delete_checkpoint: bool, delete the checkpoints when ``fit`` completes on every rank (after
            the protocol's stop and one allgather, run by :class:`hetsync.callbacks.ProtocolHooks`).

    Raises:
        ValueError: neither or a non-positive ``save_every_steps`` / ``save_every_s``, an empty
            ``backup_dir``, ``keep`` < 2, a ``dataset`` that is not a BatchDataset (here); at train
            begin: the callback placed after ``standard()``, ``steps_per_execution`` > 1, a checkpoint
            of another world size / protocol / configuration / model, or a resume without ``dataset``.
        RuntimeError: at train begin, the ranks hold checkpoints but no step common to all of them.
    """

    def __init__(self, backup_dir, save_every_steps=None, save_every_s=None, dataset=None, metrics=None,
                 keep=2, delete_checkpoint=True):
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not str(backup_dir):
            raise ValueError(f"BackupAndRestore: backup_dir must be a non-empty path, got {backup_dir!r}")
        self.save_every_steps = _check_positive("save_every_steps", save_every_steps, int)
        self.save_every_s = _check_positive("save_every_s", save_every_s, (int, float))
        if self.save_every_steps is None and self.save_every_s is None:
            raise ValueError("BackupAndRestore: give save_every_steps (int >= 1) and/or save_every_s "
                             "(seconds > 0); got neither")
        if getattr(dataset, "hetsync_pool", False):
            raise ValueError("BackupAndRestore: the sample pool (data_plan='pool', hetsync.data.pool) has no resumable "
                             "data position yet (its position lives on the serving rank); checkpoint a run with "
                             "fixed shares: the protocol's data_plan='shard'")
        if dataset is not None and not isinstance(dataset, BatchDataset):
            raise ValueError(f"BackupAndRestore: dataset must be the hetsync.data.shards.BatchDataset given to "
                             f"model.fit (fit_data(...)['x']), got {type(dataset).__name__}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
            raise ValueError(f"BackupAndRestore: keep must be an int >= 2 (checkpoints per rank), got {keep!r}")
        self.backup_dir = str(backup_dir)
        self.dataset, self.metrics, self.keep = dataset, metrics, keep
        self.delete_checkpoint = bool(delete_checkpoint)
        #: the global step restored from (int), or None for a fresh start.
        self.restored_step = None
        #: number of checkpoints this rank wrote in this fit (int).
        self.saves = 0

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def rank_dir(self):
        """str folder of this rank's checkpoints."""
        return os.path.join(self.backup_dir, f"rank{world.rank()}")

    def _identity(self):
        return {"world_size": world.size(), "protocol": self.protocol.name,
                "protocol_config": json.loads(json.dumps(self.protocol.config(), default=str)),
                "model_variables": [list(v.shape) for v in self.model.variables]}

    def _optimizer(self):
        opt = self.model.optimizer
        if not opt.built:
            opt.build(self.model.trainable_variables)
        return opt

    # -- Keras hooks -----------------------------------------------------------------------------
    def set_model(self, model):
        # Keras calls this when it builds the fit's callback list, before any on_train_begin: the
        # flags of an earlier fit that stopped with an exception do not leak into this one.
        super().set_model(model)
        run_state(model, reset=True)

    def on_train_begin(self, logs=None):
        if run_state(self.model).broadcast_done:
            raise ValueError("BackupAndRestore must come before hetsync.callbacks.standard(opt) in the callback "
                             "list (it restores before the initial broadcast and the protocol's start)")
        spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if spe != 1:
            raise ValueError(f"BackupAndRestore: steps_per_execution={spe} is not supported (saves and resumes "
                             "fall on step boundaries); compile with steps_per_execution=1")
        self.protocol = protocol_of(self.model.optimizer)
        if self.protocol.name == "auto":
            raise ValueError("BackupAndRestore: hetsync.Auto switches the protocol during fit, and a resumed run "
                             "cannot return to the middle of its warm-up; checkpoint a run of the protocol it chose "
                             "(the summary's chosen_by, or the saved model's optimizer)")
        self.steps_per_epoch = int(self.params.get("steps") or 0)
        if self.steps_per_epoch < 1:
            raise ValueError("BackupAndRestore: model.fit needs a known steps_per_epoch (got "
                             f"{self.params.get('steps')!r})")
        self._global_step, self._epoch, self._t_last, self._due = 0, 0, time.time(), False
        self.restored_step, self.saves = None, 0
        os.makedirs(self.rank_dir, exist_ok=True)  # (before the allgather: then every rank's folder exists)
        mine = complete_checkpoints(self.rank_dir)
        for step in mine:  # refuse a foreign checkpoint before any collective can hang on it
            with open(os.path.join(self.rank_dir, f"step-{step:012d}", "meta.json")) as f:
                self._check_identity(json.load(f), step)
        per_rank = transport.allgather_object(mine, name="hetsync_checkpoint_steps")
        common = set(per_rank[0]).intersection(*map(set, per_rank[1:]))
        if not common:
            if any(per_rank):
                raise RuntimeError(f"BackupAndRestore: the ranks hold checkpoints in {self.backup_dir} but no step "
                                   f"common to all ranks (complete checkpoint steps per rank: {per_rank}); "
                                   "delete the folder to start afresh")
            return
        self._restore(max(common))

    def _check_identity(self, meta, step):
        mine = self._identity()
        for key in ("world_size", "protocol", "protocol_config", "model_variables"):
            if meta.get(key) != mine[key]:
                raise ValueError(f"BackupAndRestore: the checkpoint {self.rank_dir}/step-{step:012d} was written with "
                                 f"{key}={meta.get(key)!r} but this run has {key}={mine[key]!r}; relaunch the same "
                                 f"command or delete {self.backup_dir}")
        if meta.get("steps_per_epoch") != self.steps_per_epoch:
            raise ValueError(f"BackupAndRestore: the checkpoint was written with steps_per_epoch="
                             f"{meta.get('steps_per_epoch')!r} but this run has {self.steps_per_epoch}; relaunch the "
                             f"same command or delete {self.backup_dir}")

    def _restore(self, step):
        if not isinstance(self.dataset, BatchDataset):
            raise ValueError("BackupAndRestore: a checkpoint was found but no hetsync BatchDataset was given; pass "
                             "dataset=fit_kwargs['x'] (the hetsync BatchDataset given to model.fit) so the data "
                             "position can be restored")
        arrays, meta = load_checkpoint(self.rank_dir, step)
        model_vars, opt_vars = list(self.model.variables), list(self._optimizer().variables)
        if len(arrays) != len(model_vars) + len(opt_vars):
            raise ValueError(f"BackupAndRestore: checkpoint step {step} holds {len(arrays)} arrays, this model and "
                             f"optimizer have {len(model_vars)} + {len(opt_vars)} variables")
        for v, a in zip(model_vars + opt_vars, arrays):
            if tuple(v.shape) != tuple(a.shape):
                raise ValueError(f"BackupAndRestore: variable {v.path} has shape {tuple(v.shape)}, the checkpoint "
                                 f"{tuple(a.shape)}")
            v.assign(a)
        self.protocol.load_state(meta["protocol_state"])
        epoch, skip = int(meta["epoch"]), int(meta["step_in_epoch"])
        self.dataset.offset = int(meta["global_step"])
        self.model._initial_epoch = epoch
        run_state(self.model).restored = True
        if self.metrics is not None and meta.get("metrics") is not None:
            self.metrics.resume_from(meta["metrics"], epoch=epoch, step_in_epoch=skip)
        if skip > 0:
            self._skip_steps(skip)
        self._global_step, self.restored_step = int(meta["global_step"]), int(step)
        log.info("BackupAndRestore: rank %d resumed from global step %d (epoch %d, step %d of %d)",
                 world.rank(), step, epoch, skip, self.steps_per_epoch)

    def _skip_steps(self, n):
        """Make the next ``n`` calls of the model's train function no-ops that read no data."""
        model, real = self.model, self.model.train_function
        left = [n]

        def train_function(iterator):
            if left[0] > 0:
                left[0] -= 1
                if left[0] == 0:
                    model.train_function = real
                return {}
            return real(iterator)

        model.train_function = train_function

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.restored_step is not None and self._epoch * self.steps_per_epoch + batch < self.restored_step:
            return  # a skipped step of the resumed epoch
        self._global_step = self._epoch * self.steps_per_epoch + int(batch) + 1
        now = time.time()
        self._due = (self.save_every_steps is not None and self._global_step % self.save_every_steps == 0) or \
            (self.save_every_s is not None and now - self._t_last >= self.save_every_s)

    def on_train_batch_begin(self, batch, logs=None):
        # A save due after step k is written here, before step k+1 runs: the state is the same as
        # right after step k, and the other callbacks have finished step k (SyncMetrics' totals,
        # and at an epoch's end its samples and evaluation).
        if self._due:
            self._due = False
            self.save(*divmod(self._global_step, self.steps_per_epoch))
            self._t_last = time.time()

    def save(self, epoch, step_in_epoch):
        """Write this rank's checkpoint now (after step ``step_in_epoch`` of ``epoch``) and prune old ones.

        Args:
            epoch: int >= 0. step_in_epoch: int in [0, steps_per_epoch), steps done in the epoch
                (the resume starts at this step of this epoch).

        Returns:
            str path of the checkpoint folder.
        """
        opt_vars = list(self._optimizer().variables)
        arrays = [np.asarray(v.numpy()) for v in list(self.model.variables) + opt_vars]
        meta = dict(self._identity(), version=FORMAT_VERSION, rank=world.rank(), epoch=int(epoch),
                    step_in_epoch=int(step_in_epoch), global_step=int(self._global_step),
                    steps_per_epoch=self.steps_per_epoch, time=time.time(),
                    protocol_state=self.protocol.state(),
                    metrics=self.metrics.state() if self.metrics is not None else None)
        path = atomic_save(self.rank_dir, self._global_step, arrays, meta)
        self.saves += 1
        for old in self._prunable():
            shutil.rmtree(os.path.join(self.rank_dir, f"step-{old:012d}"), ignore_errors=True)
        return path

    def _prunable(self):
        """This rank's checkpoints that can go: all but the newest ``keep``, and none that a slower
        rank may still need. When the other ranks' folders are visible (one host or a shared file
        system), the oldest step kept is the newest own step <= every other rank's latest complete
        step, so a rank that runs ahead (asynchronous protocols) keeps the step the slowest rank
        will resume from."""
        mine = complete_checkpoints(self.rank_dir)
        candidates = mine[:-self.keep]
        if not candidates or world.size() == 1:
            return candidates
        latest = []
        for r in range(world.size()):
            if r != world.rank():
                steps = complete_checkpoints(os.path.join(self.backup_dir, f"rank{r}"))
                if not os.path.isdir(os.path.join(self.backup_dir, f"rank{r}")):
                    return candidates  # not visible from here (another host): keep the newest `keep` only
                latest.append(steps[-1] if steps else -1)
        floor = min(latest)
        needed = [k for k in mine if k <= floor]
        oldest_kept = needed[-1] if needed else -1
        return [k for k in candidates if k < oldest_kept]

    def on_train_end(self, logs=None):
        self.model._initial_epoch = None
        run_state(self.model).restored = False
        if self.dataset is not None:
            self.dataset.offset = 0
        # The checkpoints go only once every rank has finished: after the protocol's stop (its
        # final average under the asynchronous protocols) and one allgather, run by
        # hetsync.callbacks.ProtocolHooks.on_train_end (which comes after this callback).
        run_state(self.model).after_train.append(self._finish)

    def _finish(self):
        """Delete the checkpoints after all ranks completed ``fit`` (one allgather first)."""
        transport.allgather_object(world.rank(), name="hetsync_checkpoint_done")
        if self.delete_checkpoint:
            shutil.rmtree(self.rank_dir, ignore_errors=True)
            try:
                os.rmdir(self.backup_dir)  # the last rank to finish removes the (then empty) folder
            except OSError:
                pass
