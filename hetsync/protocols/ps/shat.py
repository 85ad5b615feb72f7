"""SHAT and its baselines on parameter servers: the alpha rule and the wrappers ASP, SHAT, SHATRoot, Ensemble.

Ko & Kim (Appl. Sci. 2022) section 3: each worker i keeps a local model w^i; after every local step it
pushes its gradient, pulls the global model w~ and c_i (the updates by other workers since i's previous
one, Algorithm 1) and mixes w^i <- (1 - alpha_i) w^i + alpha_i w~ (eq. 3). The protocols differ only in
alpha (``docs/protocols/shat.md`` for the edge cases):

* ``SHAT``: alpha_i = 1 - s_i / log n with s_i = n / c_i (eq. 4; the log base is ``log_base``, natural by
  default), clipped to [0, 1]; c_i = 0 gives 0 (keep the local model), n = 1 gives 1;
* ``SHATRoot``: alpha_i = 1 - s_i / sqrt(n) (section 4.1.2), clipped the same way;
* ``ASP``: alpha = 1 (the local model is replaced by w~ after every push; Hogwild);
* ``Ensemble``: alpha = 0 (every worker trains only on its own shard; the pushes still reach the server,
  which is reported, but never change a worker).

n is the number of workers. With several servers every server keeps its own counters, so alpha is
computed per shard from that shard's c (the design notes' "most faithful" reading); the statistics report
server 0's c and alpha per step, and the mean alpha over shards. The local step uses the wrapped Keras
optimizer (its state, e.g. momentum, stays local); the server applies plain SGD w~ <- w~ - eta g with
the worker's learning rate of that step (Algorithm 1 line 21), or, with ``server_momentum``, heavy-ball
momentum of its own (:class:`hetsync.protocols.ps.server.ParameterServer`).
"""
import dataclasses
import math
import typing

import numpy as np

from hetsync.protocols.ps.worker import PSConfig, PSProtocol
from hetsync.core.config import param
from hetsync.core.wrapper import protocol_wrapper

__all__ = ["shat_alpha", "SHATConfig", "SHATRootConfig", "ASPConfig", "EnsembleConfig", "SHATProtocol",
           "SHATRootProtocol", "ASPProtocol", "EnsembleProtocol", "SHAT", "SHATRoot", "ASP", "Ensemble"]


def shat_alpha(c, n, log_base=math.e, root=False):
    """SHAT's mixing weight alpha_i (eq. 4) or SHAT-root's (section 4.1.2), clipped to [0, 1].

    alpha = 1 - s / log_base(n) (or 1 - s / sqrt(n) with ``root``), s = n / c. Edge cases (docs/protocols/shat.md):
    n = 1 gives 1 (local and global models are the same), c = 0 gives 0 (no other update since this
    worker's last one: keep the local model), a negative value is clipped to 0 (it would extrapolate away
    from w~). Example: c = 7, n = 8, natural log: 1 - (8 / 7) / ln 8 = 0.4504.

    Args:
        c: int >= 0, the counter c_i returned by the server. n: int >= 1, the number of workers.
        log_base: float > 1, the logarithm's base (math.e: natural log). root: bool, SHAT-root's sqrt(n).

    Returns:
        ``(alpha, clipped)``: float in [0, 1], and bool, True if the formula's value was below 0 and clipped.

    Raises:
        ValueError: c or n not an int in range, or log_base not a number > 1.
    """
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
        raise ValueError(f"SHAT alpha: the counter c must be an int >= 0, got {c!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"SHAT alpha: the number of workers n must be an int >= 1, got {n!r}")
    if isinstance(log_base, bool) or not isinstance(log_base, (int, float)) or not log_base > 1 \
            or math.isinf(log_base):
        raise ValueError(f"SHAT alpha: log_base must be a finite number > 1, got {log_base!r}")
    if n == 1:
        return 1.0, False
    if c == 0:
        return 0.0, False
    s = n / c
    denominator = math.sqrt(n) if root else math.log(n) / math.log(log_base)
    a = 1.0 - s / denominator
    if a < 0.0:
        return 0.0, True
    return min(a, 1.0), False


@dataclasses.dataclass(frozen=True)
class SHATConfig(PSConfig):
    """SHAT's parameters (see :func:`SHAT`)."""

    owner: typing.ClassVar[str] = "SHAT"

    log_base: float = param(math.e, "float > 1, the base of the logarithm in alpha_i = 1 - s_i / log n (eq. 4; the "
                                    "paper does not state it; natural log by default).", gt=1)


@dataclasses.dataclass(frozen=True)
class SHATRootConfig(PSConfig):
    """SHAT-root's parameters (see :func:`SHATRoot`)."""

    owner: typing.ClassVar[str] = "SHATRoot"


@dataclasses.dataclass(frozen=True)
class ASPConfig(PSConfig):
    """ASP's parameters (see :func:`ASP`)."""

    owner: typing.ClassVar[str] = "ASP"


@dataclasses.dataclass(frozen=True)
class EnsembleConfig(PSConfig):
    """ENSEMBLE's parameters (see :func:`Ensemble`)."""

    owner: typing.ClassVar[str] = "Ensemble"


class SHATProtocol(PSProtocol):
    """SHAT: alpha_i = 1 - s_i / log n, s_i = n / c_i (eq. 4), clipped to [0, 1]."""

    name = "shat"
    display_name = "SHAT"
    Config = SHATConfig

    def alpha(self, c):
        """``(alpha, clipped)`` of :func:`shat_alpha` with n workers and the configured log base."""
        return shat_alpha(c, self.n_workers, log_base=self.cfg.log_base)


class SHATRootProtocol(PSProtocol):
    """SHAT-root: alpha_i = 1 - s_i / sqrt(n), clipped to [0, 1] (section 4.1.2)."""

    name = "shatroot"
    display_name = "SHATRoot"
    Config = SHATRootConfig

    def alpha(self, c):
        """``(alpha, clipped)`` of :func:`shat_alpha` with ``root=True``."""
        return shat_alpha(c, self.n_workers, root=True)


class ASPProtocol(PSProtocol):
    """ASP (Hogwild): alpha = 1, the local model becomes w~ after every push."""

    name = "asp"
    display_name = "ASP"
    Config = ASPConfig
    local_step = False  # overwritten by w~ anyway

    def alpha(self, c):
        """Always ``(1.0, False)``."""
        return 1.0, False


class EnsembleProtocol(PSProtocol):
    """ENSEMBLE: alpha = 0, local training only; the end reports the mean local accuracy and the ensemble's."""

    name = "ensemble"
    display_name = "Ensemble"
    Config = EnsembleConfig

    def alpha(self, c):
        """Always ``(0.0, False)``."""
        return 0.0, False

    def finish(self, glob):
        """Keep each worker's local model; gather all of them (float32 [n, P]) for :meth:`final_evaluation`
        and report their spread. Servers take the mean of the local models."""
        from hetsync import transport

        mine = None if self.serves else self.flat_weights()
        locals_ = [w for w in transport.allgather_object(mine, name="hetsync_ensemble_locals") if w is not None]
        self.local_models = np.stack(locals_)
        mean = self.local_models.mean(axis=0)
        self._summary["local_model_distance_from_mean_max"] = float(
            max(np.linalg.norm(w.astype(np.float64) - mean) for w in self.local_models))
        if self.roles.is_server:
            self.set_flat_weights(mean.astype(np.float32))

    def final_evaluation(self, model, x, y):
        """ENSEMBLE's two accuracies (docs/protocols/ensemble.md): the mean accuracy of the n local models and the
        accuracy of their averaged predicted probabilities (a true ensemble). Restores the model's weights.

        Args:
            model: the Keras model. x: float32 test inputs [N, ...]. y: int labels [N].

        Returns:
            dict ``{"ensemble_mean_local_accuracy", "ensemble_prediction_accuracy", "ensemble_local_accuracies"}``
            (floats in [0, 1]; the last a list of n). Empty if the local models were not gathered.
        """
        if self.local_models is None:
            return {}
        current = self.flat_weights().copy()
        probs, accs = None, []
        y = np.asarray(y)
        for w in self.local_models:
            self.set_flat_weights(w)
            p = np.asarray(model.predict(x, batch_size=1024, verbose=0), np.float64)
            accs.append(float(np.mean(np.argmax(p, axis=-1) == y)))
            probs = p if probs is None else probs + p
        self.set_flat_weights(current)
        return {"ensemble_mean_local_accuracy": float(np.mean(accs)),
                "ensemble_prediction_accuracy": float(np.mean(np.argmax(probs, axis=-1) == y)),
                "ensemble_local_accuracies": accs}


_COMMON = """
    Launch with K more ranks than workers (``servers=K``: the last K ranks serve; e.g. ``horovodrun --mpi
    -np 8`` with ``servers=2`` is 6 workers and 2 servers); the script is unchanged (train on
    ``opt.hetsync_protocol.fit_data(x, y, b)``, which shards over the workers; a server rank's ``fit``
    serves until every worker finished, then returns). Needs an MPI launch and
    :func:`hetsync.callbacks.standard`. Parameters must be float32. Per-step statistics: ``ps_alpha``,
    ``ps_c`` (server 0's shard), ``ps_alpha_mean`` (over shards), ``ps_alpha_clips``, ``ps_wait_ms``;
    the summary adds pushes and pulls per server, the server queue wait (ms), alpha per worker and the
    counter conservation check.

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)`` (the local step).
        {args}

    Returns:
        keras.optimizers.Optimizer (a subclass of the given one's class).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument.
        ValueError: an argument out of range, servers leaving no worker (servers >= ranks), or (at train
            begin) more servers than parameters.
        RuntimeError: hetsync not initialised, or launched under Gloo.
        hetsync.protocols.ps.worker.PSError: (during training) a server or worker silent for ``timeout_s``.
    """

SHAT = protocol_wrapper(SHATProtocol, """Wrap a Keras 3 optimizer for SHAT on parameter servers (SHAT section 3, Algorithm 1, eq. 3-4).

    Each worker computes its gradient on its local model, pushes it, takes its local step, pulls w~ and
    c_i and mixes w <- (1 - alpha_i) w + alpha_i w~ with alpha_i = 1 - (n / c_i) / log n clipped to
    [0, 1] (n workers; c_i = 0 gives 0, n = 1 gives 1): a slow worker (large c_i) mostly takes the global
    model, a fast one keeps its own.""" + _COMMON)

SHATRoot = protocol_wrapper(SHATRootProtocol, """Wrap a Keras 3 optimizer for SHAT-root (SHAT section 4.1.2): alpha_i = 1 - (n / c_i) / sqrt(n), clipped to [0, 1].

    As :func:`SHAT` with sqrt(n) in place of log n.""" + _COMMON)

ASP = protocol_wrapper(ASPProtocol, """Wrap a Keras 3 optimizer for asynchronous parallel SGD on parameter servers (ASP, Hogwild; SHAT section 4.1.2).

    alpha = 1: each worker pushes its gradient and continues from the global model w~ the server returns
    (the local step is skipped: it would be overwritten).""" + _COMMON)

Ensemble = protocol_wrapper(EnsembleProtocol, """Wrap a Keras 3 optimizer for ENSEMBLE (SHAT section 4.1.2): alpha = 0, local training only.

    Each worker trains on its own shard and never takes the global model (the pushes still reach the
    servers, whose w~ is reported). At the end each worker keeps its local model; with
    :class:`hetsync.callbacks.TestAccuracy` rank 0 also reports the mean accuracy of the local models and
    the accuracy of their averaged predictions (``final_evaluation``).""" + _COMMON)
