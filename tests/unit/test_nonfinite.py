"""Issue 15, one process: a non-finite gradient stops training with the rank and the step named, and
nothing non-finite leaves the rank (counted in ``nonfinite_dropped``); non-trainable float state is
part of every parameter average. The multi-process behaviour is in test_nonfinite_mp.py."""
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import hetsync
import hetsync.core.wrapper
from hetsync.core import protocol as base
from hetsync.core.protocol import NONFINITE_MARK, NonFiniteError, Protocol

BAD_STEP = 3
BATCH = 8


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


class _Recording(Protocol):
    """A protocol whose 'send' is a counter: ``sent`` counts the gradient sets handed to transform."""

    name = "recording"
    display_name = "Recording"

    def build(self):
        with tf.init_scope():
            self.sent = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.sent_nonfinite = tf.Variable(0, dtype=tf.int64, trainable=False)

    def transform(self, grads, variables):
        # a send consumes the gradients (as every protocol's collective, cache write or push does)
        with tf.control_dependencies([g for g in grads if g is not None]):
            self.sent.assign_add(1)
            self.sent_nonfinite.assign_add(tf.cast(tf.logical_not(base.all_finite(grads)), tf.int64))
        return grads


def _data(bad_step=BAD_STEP, steps=6):
    """Inputs whose batch ``bad_step`` holds a NaN (its loss and gradients are NaN), labels, both in order."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH, 4)).astype(np.float32)
    y = rng.integers(0, 3, steps * BATCH)
    if bad_step is not None:
        x[bad_step * BATCH + 1, 2] = np.nan
    return x, y


def _model(opt, batchnorm=False):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((4,)), keras.layers.Dense(5)]
    if batchnorm:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.1)]
    model = keras.Sequential(layers + [keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    return model


def _fit(opt, x, y, batchnorm=False):
    model = _model(opt, batchnorm)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    return model


@pytest.mark.parametrize("wrapper", ["BSP", "LocalSGD", "SelSync"])
def test_nan_gradient_stops_the_step_naming_rank_and_step(wrapper):
    """The stop inside the compiled step leaves model.fit as hetsync's NonFiniteError with the clean message."""
    opt = getattr(hetsync, wrapper)(keras.optimizers.SGD(0.1))
    x, y = _data()
    model = _model(opt)
    with pytest.raises(hetsync.errors.NonFiniteError) as err:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=hetsync.callbacks.standard(opt))
    msg = str(err.value)
    assert type(err.value) is NonFiniteError and isinstance(err.value, FloatingPointError)
    assert msg.startswith(NONFINITE_MARK + ": non-finite "), msg
    assert f"at step {BAD_STEP}" in msg and f"(protocol {opt.hetsync_protocol.display_name})" in msg
    assert ("rank 0" in msg) or ("rank(s) [0]" in msg), msg
    # none of TensorFlow's wrapping: one line, no assert-op noise, no escaped quote
    assert "\n" not in msg and "assertion failed" not in msg and "[[" not in msg and "node" not in msg, msg
    assert "\\" not in msg and (msg.endswith("training stops") or msg.endswith("training stops on every rank")), msg
    # raised from None: TensorFlow's error is kept as the context, not shown as the cause
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert isinstance(err.value.__context__, tf.errors.InvalidArgumentError)
    assert NONFINITE_MARK in str(err.value.__context__)
    proto = opt.hetsync_protocol
    assert proto.step_stats()["nonfinite_dropped"] == 1.0
    # the bad step changed no weight: they equal a run of the BAD_STEP good steps alone
    ref_opt = getattr(hetsync, wrapper)(keras.optimizers.SGD(0.1))
    ref = _fit(ref_opt, x[:BAD_STEP * BATCH], y[:BAD_STEP * BATCH])
    for w, r in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_array_equal(w, r)


def test_nothing_is_sent_for_the_nonfinite_step():
    opt = hetsync.core.wrapper.wrap(keras.optimizers.SGD(0.1), _Recording())
    x, y = _data()
    with pytest.raises(NonFiniteError, match=f"rank 0 at step {BAD_STEP}"):
        _fit(opt, x, y)
    proto = opt.hetsync_protocol
    assert int(proto.sent.numpy()) == BAD_STEP  # the good steps only
    assert int(proto.sent_nonfinite.numpy()) == 0
    assert proto.step_stats()["nonfinite_dropped"] == 1.0
    assert "nonfinite_dropped=1" in proto._nonfinite_message().numpy().decode()


def test_a_finite_run_is_unchanged_and_counts_nothing():
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    x, y = _data(bad_step=None)
    _fit(opt, x, y)
    assert int(opt.iterations.numpy()) == 6
    assert opt.hetsync_protocol.step_stats()["nonfinite_dropped"] == 0.0


def test_check_finite_arrays_raises_before_sending_and_counts():
    opt = hetsync.LocalSGD(keras.optimizers.SGD(0.1))
    _model(opt)
    proto = opt.hetsync_protocol
    proto.check_finite_arrays([np.ones(3, np.float32)], "parameters", 7)  # finite: nothing happens
    with pytest.raises(NonFiniteError, match=r"non-finite parameters on rank 0 at step 7 \(protocol LocalSGD\); not "
                                             r"sent \(nonfinite_dropped=1\)"):
        proto.check_finite_arrays([np.ones(3, np.float32), np.array([1.0, np.inf], np.float32)], "parameters", 7)
    assert proto.step_stats()["nonfinite_dropped"] == 1.0


def test_average_at_train_end_refuses_nonfinite_parameters():
    opt = hetsync.LocalSGD(keras.optimizers.SGD(0.1))
    x, y = _data(bad_step=None)
    model = _fit(opt, x, y)
    model.trainable_variables[0].assign(np.full(model.trainable_variables[0].shape, np.nan, np.float32))
    with pytest.raises(NonFiniteError, match=r"non-finite parameters on rank\(s\) \[0\] at the end of training"):
        opt.hetsync_protocol.average_at_train_end()
    assert opt.hetsync_protocol.step_stats()["nonfinite_dropped"] == 1.0


def test_state_variables_are_the_float_non_trainable_ones_and_are_averaged():
    opt = hetsync.LocalSGD(keras.optimizers.SGD(0.1), period=2)
    x, y = _data(bad_step=None)
    model = _fit(opt, x, y, batchnorm=True)
    proto = opt.hetsync_protocol
    bn = model.layers[1]
    assert {id(v) for v in proto.state_variables} == {id(bn.moving_mean), id(bn.moving_variance)}
    non_float = [v for v in model.non_trainable_variables if not tf.as_dtype(v.dtype).is_floating]
    assert all(id(v) not in {id(s) for s in proto.state_variables} for v in non_float)
    # the averaged set is the trainable parameters followed by the state
    averaged = proto._with_state(model.trainable_variables)
    assert averaged[-2:] == [bn.moving_mean, bn.moving_variance] and len(averaged) == len(model.trainable_variables) + 2
    # the moving statistics moved away from their initial values (0 and 1) during training
    assert np.abs(bn.moving_mean.numpy()).max() > 0


def test_nonfinite_flags_and_the_message():
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    _model(opt)
    proto = opt.hetsync_protocol
    np.testing.assert_array_equal(proto.nonfinite_flags(tf.constant(True)).numpy(), [1.0])
    np.testing.assert_array_equal(proto.nonfinite_flags(None).numpy(), [0.0])
    proto.check_nonfinite_flags(tf.constant([0.0]), "a test")  # no flag: passes
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"non-finite values on rank\(s\) \[0\] at step 0 "
                                                             r"\(protocol BSP\), reported in a test"):
        proto.check_nonfinite_flags(tf.constant([1.0]), "a test")


def test_a_nonfinite_loss_with_finite_gradients_stops_after_its_step():
    poison = tf.Variable(0.0, trainable=False)

    def loss(y, p):  # the poison changes the loss, not the gradients
        return keras.losses.sparse_categorical_crossentropy(y, p) + tf.stop_gradient(poison)

    class Poison(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            poison.assign(np.inf if batch == BAD_STEP else 0.0)

    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=opt, loss=loss)
    x, y = _data(bad_step=None)
    with pytest.raises(NonFiniteError, match=rf"non-finite loss inf on rank 0 at step {BAD_STEP} \(protocol BSP\)"):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[Poison()] + hetsync.callbacks.standard(opt))
    assert opt.hetsync_protocol.step_stats()["nonfinite_dropped"] == 0.0  # the gradients were finite


def test_a_users_except_clause_catches_the_stop_and_train_on_batch_raises_it_too():
    """``except hetsync.errors.NonFiniteError`` in a script; Keras' train function stays wrapped (once) after fit."""
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    x, y = _data()
    model = _model(opt)
    caught = None
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    except hetsync.errors.NonFiniteError as exc:
        caught = exc
    assert caught is not None and str(caught).startswith(NONFINITE_MARK)
    wrapped = model.train_function
    bad = slice(BAD_STEP * BATCH, (BAD_STEP + 1) * BATCH)
    with pytest.raises(NonFiniteError, match=r"^hetsync non-finite stop: non-finite values on rank\(s\) \[0\] at "):
        model.train_on_batch(x[bad], y[bad])
    # a finite fit after it: the wrapper is not wrapped again and passes results through
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0, callbacks=hetsync.callbacks.standard(opt))
    assert model.train_function is wrapped and not isinstance(wrapped.train_function, type(wrapped))


def test_a_train_function_swapped_by_an_earlier_callback_is_wrapped_at_the_next_batch():
    """A callback before ProtocolHooks that swaps the train function for one step and puts the raw one back
    (as BackupAndRestore does while a resumed epoch skips its done steps): the stop still leaves fit as
    NonFiniteError."""
    class SwapOnce(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            model, real = self.model, self.model.train_function

            def once(iterator):
                model.train_function = real  # the unwrapped function, from before ProtocolHooks' train begin
                return real(iterator)

            model.train_function = once

    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    x, y = _data()
    model = _model(opt)
    with pytest.raises(NonFiniteError, match=r"^hetsync non-finite stop: non-finite values on rank\(s\) \[0\] at "):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[SwapOnce()] + hetsync.callbacks.standard(opt))


def _assert_error(data, eager):
    """TensorFlow's InvalidArgumentError of an assert op carrying ``data`` (eagerly, or in a tf.function)."""
    def check(x):
        message = tf.strings.format(data + " {}", tf.constant([1, 2]))
        with tf.control_dependencies([tf.debugging.Assert(x > 0, [message])]):
            return tf.identity(x)

    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        (check if eager else tf.function(check))(tf.constant(0))
    return err.value


@pytest.mark.parametrize("eager", [True, False])
def test_from_exception_takes_the_clean_message_out_of_tensorflows_wrapping(eager):
    text = NONFINITE_MARK + ": non-finite gradient on rank 1 at step 5 (protocol RNA); this step's gradients held"
    tf_error = _assert_error(text, eager)
    assert ("Summarized data" if eager else "assertion failed: [") in str(tf_error)
    stop = NonFiniteError.from_exception(tf_error)
    assert type(stop) is NonFiniteError and str(stop) == text + " [1 2]"
    assert NonFiniteError.from_exception(stop) is stop
    assert NonFiniteError.from_exception(ValueError("something else")) is None
    assert NonFiniteError.from_exception(_assert_error("another assert", eager)) is None


def test_an_uncaught_stop_prints_one_line_and_other_exceptions_keep_their_traceback(monkeypatch, capsys):
    """hetsync.init()'s excepthook: a NonFiniteError (or TensorFlow's error carrying the mark) prints hetsync's
    message as one line; HETSYNC_VERBOSE=1 prints the tracebacks, TensorFlow's included; others are untouched."""
    from hetsync import world

    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda t, e, tb: seen.append((e, e.__suppress_context__)))
    monkeypatch.delenv(world.VERBOSE_ENV, raising=False)
    world._install_excepthook(abort_job=False)
    hook = sys.excepthook
    assert hook.hetsync_nonfinite
    world._install_excepthook(abort_job=False)
    assert sys.excepthook is hook  # idempotent

    tf_error = _assert_error(NONFINITE_MARK + ": non-finite gradient on rank 0 at step 2 (protocol BSP)", eager=False)
    try:
        try:
            raise tf_error
        except tf.errors.InvalidArgumentError as exc:
            raise NonFiniteError.from_exception(exc) from None  # as hetsync's callbacks do
    except NonFiniteError as exc:
        stop = exc
    for exc in (stop, tf_error):
        hook(type(exc), exc, exc.__traceback__)
        assert capsys.readouterr().err == "hetsync non-finite stop: non-finite gradient on rank 0 at step 2 " \
                                         "(protocol BSP) [1 2]\n"
    assert seen == []
    other = ValueError("not a stop")
    hook(ValueError, other, None)
    assert seen == [(other, False)] and capsys.readouterr().err == ""
    monkeypatch.setenv(world.VERBOSE_ENV, "1")
    hook(type(stop), stop, stop.__traceback__)
    assert seen[-1] == (stop, False) and stop.__context__ is tf_error  # the previous hook prints both tracebacks
    assert capsys.readouterr().err == ""
