"""Keras 3 callbacks: initial broadcast, protocol life cycle, straggler injection, metrics, accuracy.

Typical use (two lines differ from a single-process script)::

    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    model.fit(x, y, callbacks=hetsync.callbacks.standard(opt) + [...])
"""
import contextlib
import dataclasses
import logging
import weakref

import keras
import numpy as np

from hetsync import transport
from hetsync import world
from hetsync.core.wrapper import protocol_of
from hetsync.errors import NONFINITE_MARK, NonFiniteError

__all__ = ["BroadcastInitialVariables", "ProtocolHooks", "RunState", "run_state",
           "on_rank0", "standard"]

log = logging.getLogger("hetsync")


@dataclasses.dataclass
class RunState:
    """What hetsync's callbacks share during one ``model.fit`` (one object per model).

    Attributes:
        broadcast_done: bool, :class:`BroadcastInitialVariables` ran its train-begin broadcast
            (a callback that must come before it checks this).
        restored: bool, :class:`hetsync.callbacks.BackupAndRestore` restored every rank's replica
            from a checkpoint (the initial broadcast is then skipped).
        after_train: list of callables run by :class:`ProtocolHooks` at train end, after the
            protocol's stop on this rank (a checkpoint's deletion, which waits for every rank).
    """

    broadcast_done: bool = False
    restored: bool = False
    after_train: list = dataclasses.field(default_factory=list)


# The run state of every model being fit, keyed weakly by the model: callbacks listed before
# ProtocolHooks (BackupAndRestore) need it before ProtocolHooks' own train begin, and nothing is
# written on the Keras model.
_RUN_STATES = weakref.WeakKeyDictionary()


def run_state(model, reset=False):
    """Return the :class:`RunState` of ``model`` (created on first use).

    Args:
        model: a ``keras.Model``.
        reset: bool, start a fresh state (a new ``fit``: flags of an earlier fit that stopped with
            an exception do not leak into it).

    Returns:
        the model's :class:`RunState`.
    """
    if reset or model not in _RUN_STATES:
        _RUN_STATES[model] = RunState()
    return _RUN_STATES[model]


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
        if not isinstance(root_rank, int) or not 0 <= root_rank < world.size():
            raise ValueError(f"root_rank must be an int in [0, {world.size()}), got {root_rank!r}")
        self.root_rank = root_rank
        self._optimizer_done = False

    def on_train_begin(self, logs=None):
        state = run_state(self.model)
        state.broadcast_done = True
        if state.restored:
            # resumed by hetsync.callbacks.checkpoint.BackupAndRestore: every rank restored its own replica
            self._optimizer_done = True
            return
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
    """Forward Keras' training events to a protocol's hook set, and run its life cycle around ``model.fit``.

    At train begin it checks the set-up (:meth:`hetsync.core.protocol.Protocol.check_fit`) and
    starts the protocol (:meth:`~hetsync.core.protocol.Protocol.start`); at train end it stops it.
    In between every Keras event goes to the protocol hook of the same name
    (``on_train_begin``, ``on_epoch_begin``, ``on_train_batch_begin``, ``on_train_batch_end``,
    ``on_epoch_end``, ``on_train_end``); a ``True`` from ``on_train_begin`` or ``on_train_batch_end``
    stops training.

    Also stops training on a non-finite loss: after a step whose ``loss`` log is NaN or
    inf it raises :class:`hetsync.errors.NonFiniteError` naming the rank and the step (the
    loss of a step is Keras' running mean, so a non-finite one stays non-finite for the epoch).

    A non-finite stop inside the compiled step (TensorFlow's ``InvalidArgumentError`` carrying
    :data:`hetsync.errors.NONFINITE_MARK`) leaves ``model.fit`` as a :class:`hetsync.errors.NonFiniteError`
    with hetsync's message (:meth:`~hetsync.errors.NonFiniteError.from_exception`), raised ``from None``:
    at train begin this callback wraps the model's ``train_function`` (Keras makes it before
    ``on_train_begin``; the wrapper stays, so ``train_on_batch`` raises the same; a function another
    callback puts in its place is wrapped at the next batch), and the protocol's hooks are translated
    alike. Other exceptions pass unchanged.

    Args:
        optimizer: an optimizer wrapped by a hetsync protocol.

    Raises:
        TypeError: ``optimizer`` is not hetsync-wrapped.
    """

    def __init__(self, optimizer):
        super().__init__()
        protocol_of(optimizer)
        self._optimizer = optimizer

    @property
    def protocol(self):
        """The optimizer's protocol now (``hetsync.Auto`` switches it between two steps)."""
        return protocol_of(self._optimizer)

    def _wrap_train_function(self):
        """Wrap the model's train function once (:class:`_RaisingNonFinite`); again if another callback
        replaced it since (``BackupAndRestore`` swaps it while a resumed epoch skips its done steps)."""
        train_function = getattr(self.model, "train_function", None)
        if train_function is not None and not isinstance(train_function, _RaisingNonFinite):
            self.model.train_function = _RaisingNonFinite(train_function)

    def on_train_begin(self, logs=None):
        self._wrap_train_function()
        with _nonfinite_raised():
            self.protocol.check_fit(self.model)
            self.protocol.start()
            if self.protocol.on_train_begin(self.model, dict(self.params or {})):
                self.model.stop_training = True

    def on_epoch_begin(self, epoch, logs=None):
        with _nonfinite_raised():
            self.protocol.on_epoch_begin(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self._wrap_train_function()
        with _nonfinite_raised():
            self.protocol.on_train_batch_begin(batch)

    def on_train_batch_end(self, batch, logs=None):
        """Stop on a non-finite loss (a non-finite gradient already stopped the step), then the hook."""
        loss = (logs or {}).get("loss")
        if loss is not None and not np.isfinite(float(loss)):
            raise NonFiniteError(f"{NONFINITE_MARK}: non-finite loss {float(loss)} on rank {world.rank()} at step "
                                 f"{int(self.protocol.optimizer.iterations.numpy()) - 1} (protocol "
                                 f"{self.protocol.display_name}), training stops")
        with _nonfinite_raised():
            if self.protocol.on_train_batch_end(batch, logs if logs is not None else {}):
                self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        with _nonfinite_raised():
            self.protocol.on_epoch_end(epoch, logs if logs is not None else {})

    def on_train_end(self, logs=None):
        state = run_state(self.model)
        state.broadcast_done = False
        with _nonfinite_raised():
            self.protocol.stop()
            self.protocol.on_train_end(self.model)
        # then what must wait until every rank has stopped (hetsync.callbacks.checkpoint.BackupAndRestore's deletion)
        after, state.after_train = state.after_train, []
        for fn in after:
            fn()


@contextlib.contextmanager
def _nonfinite_raised():
    """Re-raise an exception carrying hetsync's non-finite stop (TensorFlow's error of an assert op) as a
    :class:`NonFiniteError` with the clean message, ``from None``; other exceptions pass unchanged."""
    try:
        yield
    except NonFiniteError:
        raise
    except Exception as exc:
        stop = NonFiniteError.from_exception(exc)
        if stop is None:
            raise
        raise stop from None


class _RaisingNonFinite:
    """Keras' ``train_function``, a non-finite stop raised as :class:`NonFiniteError` (:func:`_nonfinite_raised`)."""

    def __init__(self, train_function):
        self.train_function = train_function

    def __call__(self, *args, **kwargs):
        with _nonfinite_raised():
            return self.train_function(*args, **kwargs)


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
    return list(callbacks) if world.rank() == 0 else []


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


