"""Bad input is rejected with a clear error before training starts."""
import keras
import pytest

import hetsync
from hetsync import protocols

from conftest import launch


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


def test_wrapping_something_that_is_not_an_optimizer():
    for bad in ("sgd", 0.1, keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9), keras.optimizers.SGD):
        with pytest.raises(TypeError, match="wraps a Keras 3 optimizer instance"):
            hetsync.BSP(bad)


def test_wrapping_twice_and_bad_arguments():
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    assert opt.hetsync_protocol.name == "bsp"
    assert isinstance(opt, keras.optimizers.SGD)
    with pytest.raises(ValueError, match="already wrapped by hetsync protocol 'bsp'"):
        hetsync.BSP(opt)
    with pytest.raises(ValueError, match="BSP: compression must be one of 'none', 'fp16', got 'zip'"):
        hetsync.BSP(keras.optimizers.SGD(0.1), compression="zip")


def test_protocol_args_are_checked_against_the_signature():
    assert protocols.parse_protocol_args("bsp", ["compression=fp16"]) == {"compression": "fp16"}
    with pytest.raises(ValueError, match="protocol 'bsp' takes no argument 'delta'; its arguments: compression"):
        protocols.parse_protocol_args("bsp", ["delta=0.3"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        protocols.parse_protocol_args("bsp", ["compression"])
    with pytest.raises(ValueError, match="unknown protocol 'nope'; known protocols: asp, bsp"):
        protocols.get_wrapper("nope")


def test_slowdown_callback_checks_world_size():
    with pytest.raises(ValueError, match="gives 2 speeds, but the world size is 1"):
        hetsync.callbacks.Slowdown("speeds:1,0.5")
    with pytest.raises(ValueError, match="unknown slowdown scenario"):
        hetsync.callbacks.Slowdown("fast:2")


def test_callbacks_need_a_wrapped_optimizer():
    with pytest.raises(TypeError, match="not a hetsync-wrapped optimizer"):
        hetsync.callbacks.standard(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="root_rank must be an int in \\[0, 1\\)"):
        hetsync.callbacks.BroadcastInitialVariables(3)


@pytest.mark.parametrize("args, message", [
    (["--slowdown", "bogus:1"], "unknown slowdown scenario 'bogus'"),
    (["--slowdown", "speeds:1,1,0.5"], "gives 3 speeds, but the world size is 1"),
    (["--protocol-arg", "delta=0.3"], "takes no argument 'delta'"),
    (["--protocol", "nope"], "invalid choice: 'nope'"),
    (["--epochs", "0"], "--epochs must be a positive integer"),
    (["--dataset", "mnist-idx", "--data-dir", "/nonexistent"], "data folder not found: /nonexistent"),
])
def test_example_rejects_bad_input_before_training(args, message, tmp_path):
    proc = launch(1, ["examples/keras_digits.py", "--out", str(tmp_path)] + args, launcher="single", check=False,
                  timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert "Epoch 1" not in proc.stdout
