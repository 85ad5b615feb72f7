"""Keras 3 callbacks: the initial broadcast, the protocol's hooks, metrics, accuracy, checkpoints.

Typical use (two lines differ from a single-process script)::

    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    model.fit(x, y, callbacks=hetsync.callbacks.standard(opt) + [...])

* :mod:`hetsync.callbacks.core`: :class:`BroadcastInitialVariables`, :class:`ProtocolHooks` (the one
  callback that forwards Keras events to the protocol's hook set), :func:`standard`, :func:`on_rank0`;
* :mod:`hetsync.callbacks.metrics`: :class:`SyncMetrics`, :class:`MetricAverage`;
* :mod:`hetsync.callbacks.accuracy`: :class:`TestAccuracy`;
* :mod:`hetsync.callbacks.checkpoint`: :class:`BackupAndRestore`;
* :class:`Slowdown` lives with the emulation (:mod:`hetsync.emulation.callback`) and is offered here
  because users put it in the same callback list.
"""
from hetsync.callbacks.accuracy import TestAccuracy
from hetsync.callbacks.checkpoint import BackupAndRestore
from hetsync.callbacks.core import BroadcastInitialVariables, ProtocolHooks, on_rank0, standard
from hetsync.callbacks.metrics import MetricAverage, SyncMetrics
from hetsync.emulation.callback import Slowdown

__all__ = ["BackupAndRestore", "BroadcastInitialVariables", "ProtocolHooks", "Slowdown", "SyncMetrics",
           "TestAccuracy", "MetricAverage", "on_rank0", "standard"]
