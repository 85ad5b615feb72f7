"""The protocol's hook set, forwarded by ProtocolHooks; the declared capabilities record; data plans
as values (one process, a real ``model.fit``)."""
import keras
import numpy as np
import pytest

import hetsync
from hetsync.core.protocol import Capabilities, Protocol
from hetsync.data.plan import DataPlan, shard_plan
from hetsync.protocols import wrap


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


class _Hooks(Protocol):
    """Records every hook call; stops training after step ``stop_at`` of epoch 1."""

    name = "hooks"
    display_name = "Hooks"

    def __init__(self, stop_at=None):
        super().__init__()
        self.calls, self.stop_at, self.epoch = [], stop_at, None

    def on_train_begin(self, model, params):
        self.calls.append(("train_begin", params["epochs"], params["steps"]))

    def on_epoch_begin(self, epoch):
        self.epoch = epoch
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_begin(self, batch):
        self.calls.append(("batch_begin", batch))

    def on_train_batch_end(self, batch, logs):
        self.calls.append(("batch_end", batch, "loss" in logs))
        return self.epoch == 1 and batch == self.stop_at

    def on_epoch_end(self, epoch, logs):
        self.calls.append(("epoch_end", epoch))

    def on_train_end(self, model):
        self.calls.append(("train_end",))


def _fit(proto, epochs=2, steps=3):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = wrap(keras.optimizers.SGD(0.1), proto)
    model.compile(opt, "mse")
    x = np.random.default_rng(0).normal(size=(steps * 8, 4)).astype("float32")
    y = np.zeros((steps * 8, 2), "float32")
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, shuffle=False, callbacks=hetsync.callbacks.standard(opt))
    return model


def test_protocol_hooks_forward_every_keras_event_in_order():
    proto = _Hooks()
    _fit(proto, epochs=2, steps=3)
    expected = [("train_begin", 2, 3)]
    for e in range(2):
        expected.append(("epoch_begin", e))
        for b in range(3):
            expected += [("batch_begin", b), ("batch_end", b, True)]
        expected.append(("epoch_end", e))
    expected.append(("train_end",))
    assert proto.calls == expected
    assert hetsync.callbacks.standard(proto.optimizer)[2:] == [], "the protocol needs no callback of its own"


def test_a_true_from_the_batch_end_hook_stops_training_after_that_step():
    proto = _Hooks(stop_at=0)
    _fit(proto, epochs=3, steps=3)
    batch_ends = [c for c in proto.calls if c[0] == "batch_end"]
    assert len(batch_ends) == 3 + 1  # epoch 0 whole, epoch 1 stopped after its first step
    assert proto.calls[-1] == ("train_end",) and ("epoch_begin", 2) not in proto.calls
    assert int(proto.optimizer.iterations.numpy()) == 4


def test_capabilities_are_one_record_and_earlier_class_attributes_fold_into_it():
    from hetsync.protocols.bsp import BSPProtocol
    from hetsync.protocols.hop.protocol import HopProtocol

    assert Protocol.capabilities == Capabilities()
    assert BSPProtocol.capabilities.nonfinite_in_collective and not BSPProtocol.capabilities.requires_mpi
    assert HopProtocol.capabilities.requires_mpi and HopProtocol.capabilities.max_steps_per_execution == 1

    class Legacy(Protocol):
        name = "legacy"
        requires_mpi = True
        max_steps_per_execution = 1

    class Child(Legacy):
        name = "child"
        collectives_in_thread = True

    assert Legacy.capabilities == Capabilities(requires_mpi=True, max_steps_per_execution=1)
    assert Child.capabilities == Capabilities(requires_mpi=True, max_steps_per_execution=1,
                                              collectives_in_thread=True)
    with pytest.raises(Exception):
        Protocol.capabilities.requires_mpi = True  # frozen: declared, never written


def test_a_data_plan_is_a_value_the_protocol_adopts_and_model_fit_takes():
    x = np.arange(40 * 3, dtype="float32").reshape(40, 3)
    y = np.arange(40) % 2
    plan = shard_plan(x, y, 4, rank=1, num_workers=2, seed=0)
    assert isinstance(plan, DataPlan)
    assert plan.batch_size == 4 and plan["steps_per_epoch"] == 5 and plan.samples_per_epoch == 20
    assert set(plan) == {"x", "steps_per_epoch", "shuffle"} and dict(**plan)["shuffle"] is False
    proto = _Hooks()
    wrap(keras.optimizers.SGD(0.1), proto)
    assert proto.batch_size is None and proto.samples_per_epoch is None
    got = proto.fit_data(x, y, 4, seed=0)
    assert isinstance(got, DataPlan) and proto.batch_size == 4
    assert proto.samples_per_epoch == len(x) // 4 * 4  # one worker: the whole set, full batches
    with pytest.raises(TypeError, match="DataPlan"):
        proto.adopt({"x": x})
    with pytest.raises(ValueError, match="batch_size must be an int >= 1.*got 0"):
        proto.fit_data(x, y, 0)
