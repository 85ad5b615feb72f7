"""Test accuracy during training, on rank 0's model: the figure behind time to target."""
import time

import keras
import numpy as np

from hetsync import world

__all__ = ["TestAccuracy"]


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

    *Refinement near the target* (deferred, with a target): so that the evaluation grid does not set
    time to target, rank 0 also copies its weights after every step (every call of
    ``steps_per_execution`` steps) once its own training accuracy, per batch and smoothed
    (exponential average, weight 0.3 on the newest batch), comes within ``refine_within`` of the
    target, for at most ``refine_points`` steps. At train end the grid points are evaluated first;
    the refined copies inside the first grid interval whose end reached the target are then
    evaluated and join the curve with ``"refined": True`` (the others are dropped unevaluated: a
    transient crossing between two grid points below the target is not searched for).
    :attr:`time_to_target_resolution_s` says how finely the crossing was resolved.

    Args:
        x, y: test inputs (float32 array [N, ...]) and integer labels (int array [N]).
        target: float in (0, 1], accuracy whose first crossing is ``time_to_target_s``; or None.
        every_steps: int > 0 to also evaluate every that many steps; None: only at epoch ends.
        defer: bool, True (default) evaluates the weight copies at train end; False evaluates at
            once (the curve is then available during training, at the cost described above).
        refine_within: float in [0, 1] (accuracy points below the target where refinement starts;
            default 0.1), or None for no refinement. Needs ``"accuracy"`` among the compiled metrics.
        refine_points: int >= 0, the most refined points (weight copies) a run takes (default 64).

    The attributes below are set after training and are meaningful on rank 0.

    Attributes:
        curve: list of dicts ``{"step", "epoch", "wall_s", "unix_s", "accuracy"}``: ``wall_s`` seconds of
            training (this callback's own time excluded), ``unix_s`` the moment of the evaluation point
            (``time.time()``, the clock of :class:`hetsync.callbacks.SyncMetrics`' step records, so the
            samples all ranks had processed by then can be counted from them).
        time_to_target_s: float seconds, or None if the target was never reached.
        time_to_target_resolution_s: float seconds between the first point at or above the target
            and the point before it (the bound on how early the target could have been reached), or
            None (target not reached, or reached at the first point).
        final_accuracy: float, accuracy of the model as ``fit`` leaves it (evaluated at
            ``on_train_end``, after callbacks placed before this one, such as the protocol's
            stop hook, have run).
        extra: dict, the protocol's own final figures when it has a ``final_evaluation(model, x, y)``
            method (ENSEMBLE: the mean accuracy of the local models and of their averaged predictions).

    Raises:
        ValueError: ``target`` outside (0, 1], ``every_steps`` not a positive int, ``defer`` not a bool,
            ``refine_within`` outside [0, 1], or ``refine_points`` not an int >= 0.
    """

    __test__ = False  # not a pytest class

    def __init__(self, x, y, target=None, every_steps=None, defer=True, refine_within=0.1, refine_points=64):
        super().__init__()
        if target is not None and not 0 < target <= 1:
            raise ValueError(f"target accuracy must be in (0, 1], got {target!r}")
        if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                        or every_steps <= 0):
            raise ValueError(f"every_steps must be a positive int or None, got {every_steps!r}")
        if not isinstance(defer, bool):
            raise ValueError(f"defer must be True or False, got {defer!r}")
        if refine_within is not None and (isinstance(refine_within, bool) or not isinstance(refine_within, (int, float))
                                          or not 0 <= refine_within <= 1):
            raise ValueError(f"refine_within must be a number in [0, 1] or None, got {refine_within!r}")
        if isinstance(refine_points, bool) or not isinstance(refine_points, int) or refine_points < 0:
            raise ValueError(f"refine_points must be an int >= 0, got {refine_points!r}")
        self.x, self.y = x, np.asarray(y)
        self.target, self.every_steps, self.defer = target, every_steps, defer
        self.refine_within, self.refine_points = refine_within, refine_points
        self.curve, self.time_to_target_s, self.final_accuracy = [], None, None
        self.time_to_target_resolution_s = None
        self.extra = {}
        self._is_root = world.rank() == 0
        self._epoch, self._steps = 0, 0
        self._pending = []

    def accuracy(self):
        """Return the current model's test accuracy (float in [0, 1]).

        The model is called directly on slices of 1024 samples (inference mode): ``model.predict``
        builds a data pipeline per call, tens of milliseconds that every deferred point would pay."""
        correct = 0
        for i in range(0, len(self.y), 1024):
            logits = np.asarray(self.model(self.x[i:i + 1024], training=False))
            correct += int(np.sum(np.argmax(logits, axis=-1) == self.y[i:i + 1024]))
        return correct / max(1, len(self.y))

    def _record(self, point, acc):
        point = dict(point, accuracy=acc)
        self.curve.append(point)
        if self.target is not None and self.time_to_target_s is None and acc >= self.target:
            self.time_to_target_s = point["wall_s"]
            if len(self.curve) > 1:
                self.time_to_target_resolution_s = point["wall_s"] - self.curve[-2]["wall_s"]
        self.final_accuracy = acc

    def _near_target(self, batch, logs):
        """True while refinement runs: rank 0's smoothed per-batch training accuracy is within
        ``refine_within`` of the target (from Keras' running epoch mean of ``accuracy``)."""
        if self.refine_within is None or not self.defer or self.target is None or self._refined >= self.refine_points:
            return False
        if self._refining:
            return True
        mean = (logs or {}).get("accuracy")
        if mean is None:
            return False
        seen = int(batch) + 1  # batches of this epoch the running mean covers
        batch_acc = (seen * float(mean) - self._seen * self._mean) / max(1, seen - self._seen)
        self._seen, self._mean = seen, float(mean)
        self._smooth = batch_acc if self._smooth is None else 0.7 * self._smooth + 0.3 * batch_acc
        self._refining = self._smooth >= self.target - self.refine_within
        return self._refining

    def _evaluate(self, refined=False):
        if not self._is_root:
            return
        t = time.time()
        point = {"step": self._steps, "epoch": self._epoch, "wall_s": t - self._t0 - self._eval_s, "unix_s": t}
        if refined:
            point["refined"] = True
            self._refined += 1
        if self.defer:
            self._pending.append((point, self.model.get_weights()))
        else:
            self._record(point, self.accuracy())
        self._eval_s += time.time() - t

    def on_train_begin(self, logs=None):
        self._t0, self._eval_s = time.time(), 0.0
        self._pending = []
        self._refined, self._refining, self._smooth = 0, False, None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._seen, self._mean = 0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self.every_steps and self._steps % self.every_steps == 0:
            self._evaluate()
        elif self._is_root and self._near_target(batch, logs):
            self._evaluate(refined=True)

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
            grid = [(p, w) for p, w in self._pending if not p.get("refined")]
            accs = {}
            for point, weights in grid:
                self.model.set_weights(weights)
                accs[id(point)] = self.accuracy()
            # refined points are evaluated only in the first grid interval whose end reached the target
            # (where the crossing is), so refinement costs at most one interval's worth of evaluations
            end = next((p["step"] for p, _ in grid if self.target is not None and accs[id(p)] >= self.target), None)
            start = max([p["step"] for p, _ in grid if end is not None and p["step"] < end], default=0)
            for point, weights in self._pending:
                if point.get("refined"):
                    if end is None or not start < point["step"] < end:
                        continue
                    self.model.set_weights(weights)
                    accs[id(point)] = self.accuracy()
                self._record(point, accs[id(point)])
            self._pending = []
            self.model.set_weights(current)
        self.final_accuracy = self.accuracy()
        hook = getattr(getattr(self.model.optimizer, "hetsync_protocol", None), "final_evaluation", None)
        if callable(hook):
            self.extra = dict(hook(self.model, self.x, self.y))
