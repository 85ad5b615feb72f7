"""The emulated device (scenario ``device:MS``): parser, the delay op's padding, step times, overruns."""
import os
import time
import types

import pytest
import tensorflow as tf
from hetsync import ops
from hetsync.emulation import scenario as sd


def test_device_parses_and_combines():
    s = sd.parse_spec("device:40+random:6")
    assert s.device_ms == 40.0
    assert s.components == (sd.Device(40.0), sd.RandomSlowdown(6.0))
    assert sd.parse_spec("random:6").device_ms is None
    # the other parts keep their meaning relative to the device time: E[K] MS + E[extra]
    assert s.expected_step_ms(0, 4) == pytest.approx((1 + 5 / 4) * 40)
    u = sd.parse_spec("device:30+uniform:0:50+speeds:1,0.5")
    assert u.expected_step_ms(0, 2) == pytest.approx(30 + 25)
    assert u.expected_step_ms(1, 2) == pytest.approx(2 * 30 + 25)
    # time scales with the samples of the step (task allocation's micro-batches)
    assert u.expected_step_ms(1, 2, samples=8, batch_size=32) == pytest.approx(2 * 30 * 8 / 32 + 25)
    with pytest.raises(ValueError, match="no device:MS part"):
        sd.parse_spec("random:6").expected_step_ms(0, 4)


@pytest.mark.parametrize("spec, message", [
    ("device:0", r"MS \(milliseconds per step of the run's batch size\) must be > 0, got '0'"),
    ("device:-5", "must be > 0, got '-5'"),
    ("device:abc", "must be a number, got 'abc'"),
    ("device:nan", "got 'nan'"),
    ("device", "takes 1 argument"),
    ("device:40:2", "takes 1 argument"),
    ("device:40+device:30", "more than one device:MS part"),
])
def test_bad_device_specs_name_the_value(spec, message):
    with pytest.raises(ValueError, match=message):
        sd.parse_spec(spec)


def test_slowdown_callback_scales_device_time_by_the_step_samples():
    from hetsync.callbacks import Slowdown

    class FakeProtocol:
        batch_size = 32

        def step_samples(self, batch):
            return [32, 8, 64][batch]

    cb = Slowdown("device:40", seed=0, rank=0, world_size=1)
    # the callback finds the protocol through the model's optimizer at every step
    cb.set_model(types.SimpleNamespace(optimizer=types.SimpleNamespace(hetsync_protocol=FakeProtocol())))
    assert [cb.device_ms(b) for b in range(3)] == [40.0, 10.0, 80.0]
    cb.set_model(types.SimpleNamespace(optimizer=None))  # data not from a protocol: one step = one batch
    assert cb.device_ms(1) == 40.0
    assert Slowdown("random:6", seed=0, rank=0, world_size=1).device_ms(0) == 0.0


@pytest.mark.parametrize("factor", [1.0, 6.0])
def test_delay_op_pads_the_step_to_factor_times_device_time(factor):
    """The step lasts K x MS + extra from its start to the op's output, within 5%. Scheduling noise on a
    loaded machine only adds time, so the shortest of five calls measures the op's padding; none may
    end early (the op never shortens a step)."""
    @tf.function
    def step(x, control):
        (y,), delay_ms, compute_ms = ops.delay([tf.reduce_sum(tf.matmul(x, x))], control)
        return y, delay_ms, compute_ms

    x = tf.random.normal([64, 64])
    step(x, tf.constant([0.0, 1.0, 0.0, 0.0], tf.float64))  # trace
    device_ms, extra_ms = 50.0, 5.0
    target = factor * device_ms + extra_ms
    elapsed = []
    for _ in range(5):
        start = time.time()
        _, delay_ms, compute_ms = step(x, tf.constant([start, factor, extra_ms, device_ms], tf.float64))
        elapsed.append((time.time() - start) * 1e3)
        assert float(delay_ms) == pytest.approx(target - float(compute_ms), abs=1e-6)
    assert min(elapsed) >= target - 0.5, elapsed
    assert min(elapsed) == pytest.approx(target, rel=0.05), elapsed


def test_delay_op_never_shortens_an_overrun_step():
    start = time.time() - 0.050  # the step's compute already took 50 ms
    _, delay_ms, compute_ms = ops.delay([tf.ones([2])], [start, 1.0, 0.0, 10.0])
    assert float(compute_ms) >= 50.0
    assert float(delay_ms) == 0.0
    with pytest.raises(tf.errors.InvalidArgumentError, match="device_ms must be a finite number >= 0"):
        ops.delay([tf.ones([1])], [0.0, 1.0, 0.0, -1.0])


def test_time_dilation_scales_every_emulated_time_and_every_timeout(monkeypatch):
    """Under HETSYNC_DILATION=D the stamped device time, extra milliseconds, netdelay and fault times are D
    times longer, the point-to-point timeouts too; a bad value is refused naming it."""
    from hetsync import world
    from hetsync.callbacks import Slowdown
    from hetsync.transport.p2p import Dispatcher

    assert world.dilation() == 1.0 or "HETSYNC_DILATION" in os.environ
    for bad in ("0.5", "abc", "inf", "nan", "-2"):
        monkeypatch.setenv("HETSYNC_DILATION", bad)
        with pytest.raises(ValueError, match=f"HETSYNC_DILATION='{bad}': the time dilation must be a finite"):
            world.dilation()
        with pytest.raises(ValueError, match="HETSYNC_DILATION"):
            Slowdown("device:40", seed=0, rank=0, world_size=1)
    stamped = {}
    for d in ("1", "3"):
        monkeypatch.setenv("HETSYNC_DILATION", d)
        assert world.dilated(2.0) == 2.0 * float(d) and Dispatcher._check_timeout(5) == 5.0 * float(d)
        cb = Slowdown("device:40+uniform:10:10+netdelay:7+pause:0:2:1", seed=0, rank=0, world_size=1)
        cb._step, cb._sync = _Var(), _Var()
        cb.set_model(_FakeModel())
        cb.on_train_begin()
        stamped[d + "sync"] = cb._sync.value[2]
        fired = []
        cb._faults = [_FakeFault(f, fired) for f in cb._faults]
        cb._t0 = time.time() - 2.5  # 2.5 s after train begin: pause:0:2 is due at D=1, not yet at D=3
        cb.on_train_batch_begin(0)  # the first step of a fit: not padded
        cb.on_train_batch_begin(1)
        stamped[d] = list(cb._step.value)
        stamped[d + "fired"] = bool(fired)
    assert stamped["1"][1:] == [1.0, 10.0, 40.0] and stamped["3"][1:] == [1.0, 30.0, 120.0]
    assert stamped["1sync"] == 7.0 and stamped["3sync"] == 21.0
    assert stamped["1fired"] and not stamped["3fired"]


def test_host_side_idle_waits_scale_with_the_dilation(monkeypatch):
    """The point-to-point receive thread's idle sleep and RNA's round-loop idle wait are latencies of the
    emulated cluster: D times longer under HETSYNC_DILATION=D (D times fewer wake-ups on shared cores)."""
    from hetsync import world
    from hetsync.protocols.rna.control import RoundLoop
    from hetsync.transport import endpoint, p2p

    made = []

    class FakeDispatcher:
        def __init__(self, comm, poll_s=p2p.POLL_S):
            made.append(poll_s)

    monkeypatch.setattr(p2p, "Dispatcher", FakeDispatcher)
    monkeypatch.setattr(endpoint, "_duplicate_world", lambda timeout_s: object())
    monkeypatch.setattr(world, "require_mpi", lambda what: None)
    monkeypatch.setattr(world, "register_shutdown", lambda fn: None)
    monkeypatch.setitem(endpoint._state, "dispatcher", None)
    monkeypatch.setenv("HETSYNC_DILATION", "4")
    endpoint.dispatcher()
    assert made == [4 * p2p.POLL_S]
    loop = RoundLoop(None, 0, None, None, timeout_s=10.0, poll_ms=1.0)
    assert loop.poll_ms == 4.0 and loop.timeout_s == 40.0


class _Var:
    def assign(self, value):
        self.value = value


class _FakeModel:
    steps_per_execution = 1
    optimizer = None


class _FakeFault:
    def __init__(self, fault, fired):
        self.at_s, self.spec, self.fired_list = fault.at_s, fault.spec, fired

    def fire(self, elapsed):
        self.fired_list.append(elapsed)
