"""Bad input is rejected with a clear error before training starts."""
import keras
import pytest
import hetsync
from hetsync import protocols


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
