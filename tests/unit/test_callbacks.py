"""TestAccuracy: deferred evaluation gives the same curve as evaluating in place, and bad arguments fail."""
import keras
import numpy as np
import pytest

import hetsync
from hetsync.callbacks import TestAccuracy


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


class _ZeroAtEnd(keras.callbacks.Callback):
    """Changes the model at train end, as RNA's final parameter average does, before TestAccuracy runs."""

    def on_train_end(self, logs=None):
        self.model.set_weights([np.zeros_like(w) for w in self.model.get_weights()])


def _train(defer, every_steps=4, metrics=(), **kwargs):
    """One deterministic single-process fit of a small softmax model on a separable toy problem."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy", metrics=list(metrics))
    acc = TestAccuracy(x[:128], y[:128], target=0.9, every_steps=every_steps, defer=defer, **kwargs)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[_ZeroAtEnd(), acc])
    return acc, model


def test_deferred_evaluation_equals_in_place_evaluation_point_by_point():
    now, _ = _train(defer=False)
    later, model = _train(defer=True)
    assert [p["step"] for p in later.curve] == [p["step"] for p in now.curve] == list(range(4, 33, 4))
    assert [p["accuracy"] for p in later.curve] == [p["accuracy"] for p in now.curve]
    # The snapshots are copies, not views of the live weights: the curve rises from chance level.
    accs = [p["accuracy"] for p in later.curve]
    assert accs[0] < 0.9 <= accs[-1], accs
    first = next(p for p in later.curve if p["accuracy"] >= 0.9)
    assert later.time_to_target_s == first["wall_s"]
    # The final accuracy is the model as fit leaves it (zeroed: every logit equal, argmax = class 0),
    # and the deferred pass restored those weights after evaluating the copies.
    assert later.final_accuracy == now.final_accuracy == float(np.mean(later.y == 0))
    assert all(not w.any() for w in model.get_weights())


def test_refinement_near_the_target_resolves_the_crossing_to_one_step():
    """Grid every 8 steps; near the target every step is copied: the crossing is found at the step an
    evaluation after every step finds it, with the same accuracies."""
    dense, _ = _train(defer=False, every_steps=1, metrics=["accuracy"])
    by_step = {p["step"]: p["accuracy"] for p in dense.curve}
    crossing = next(p["step"] for p in dense.curve if p["accuracy"] >= 0.9)
    grid, _ = _train(defer=True, every_steps=8, metrics=["accuracy"], refine_within=None)
    assert not any(p.get("refined") for p in grid.curve) and [p["step"] for p in grid.curve] == [8, 16, 24, 32]
    fine, _ = _train(defer=True, every_steps=8, metrics=["accuracy"], refine_within=0.3, refine_points=6)
    refined = [p for p in fine.curve if p.get("refined")]
    assert 0 < len(refined) <= 6
    assert all(by_step[p["step"]] == p["accuracy"] for p in fine.curve)
    first = next(p for p in fine.curve if p["accuracy"] >= 0.9)
    assert first["step"] == crossing < next(p["step"] for p in grid.curve if p["accuracy"] >= 0.9)
    before = fine.curve[fine.curve.index(first) - 1]
    assert first["step"] - before["step"] == 1
    assert fine.time_to_target_resolution_s == pytest.approx(first["wall_s"] - before["wall_s"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="target accuracy must be in \\(0, 1\\], got 1.5"):
        TestAccuracy(np.zeros((1, 2)), [0], target=1.5)
    with pytest.raises(ValueError, match="every_steps must be a positive int or None, got 0"):
        TestAccuracy(np.zeros((1, 2)), [0], every_steps=0)
    with pytest.raises(ValueError, match="defer must be True or False, got 'yes'"):
        TestAccuracy(np.zeros((1, 2)), [0], defer="yes")
    with pytest.raises(ValueError, match="refine_within must be a number in \\[0, 1\\] or None, got 2"):
        TestAccuracy(np.zeros((1, 2)), [0], refine_within=2)
    with pytest.raises(ValueError, match="refine_points must be an int >= 0, got -1"):
        TestAccuracy(np.zeros((1, 2)), [0], refine_points=-1)
