"""The one base class every protocol shares, with the mechanisms several protocols use.

A protocol decides what happens to ``(grads, variables)`` on each step (:meth:`Protocol.apply`
or the simpler :meth:`Protocol.transform`), may run a communication thread
(:meth:`Protocol.start` / :meth:`Protocol.stop`, called by :class:`hetsync.callbacks.ProtocolHooks`)
and reports statistics. Its parameters are one frozen dataclass (:attr:`Protocol.Config`, see
:mod:`hetsync.core.config`). The Keras 3 optimizer wrapper that calls it lives in
:mod:`hetsync.core.wrapper`.

The class holds the life cycle, the hook set and the declared capabilities. The mechanisms several
protocols share are mixins in their own modules (one concern each, all in :mod:`hetsync.core`):

* the gradient-list helpers (:mod:`hetsync.core.grads`: :func:`present_gradients`,
  :func:`scatter_gradients`, re-exported here); the wrapped step (:mod:`hetsync.core.step`);
* the data plans (:mod:`hetsync.core.dataplans`, values from :mod:`hetsync.data.plan`);
* parameter averaging (:mod:`hetsync.core.averaging`) inside the step (:meth:`Protocol.average_parameters`; SelSync's PA, local
  SGD, FedAvg's masked average), end-of-training averaging (:meth:`Protocol.average_at_train_end`,
  run by :meth:`Protocol.stop` for every protocol whose config has ``average_at_end=True``) and
  the drift measure (:meth:`Protocol.parameter_drift`; RNA, end-of-training);
* statistics and checkpoint state (:mod:`hetsync.core.stats`; the semi-synchronous step statistics :meth:`Protocol.add_sync_stats`, :meth:`Protocol.record_step`);
* the non-finite guard (:mod:`hetsync.core.guard`): every step's gradients are checked before anything leaves the
  rank (:meth:`Protocol._guard_gradients`, per-rank flags in the collectives with
  :meth:`Protocol.nonfinite_flags` / :meth:`Protocol.check_nonfinite_flags`, eager senders with
  :meth:`Protocol.check_finite_arrays`), and the model's non-trainable float state is averaged with
  the parameters (:meth:`Protocol.set_state_variables`).
"""
import dataclasses

from hetsync import roles, world
from hetsync.core.averaging import Averaging
from hetsync.core.dataplans import DataPlans
from hetsync.core.grads import all_finite, payload_bytes, present_gradients, scatter_gradients
from hetsync.core.guard import NonFiniteGuard
from hetsync.core.stats import Statistics
from hetsync.errors import NONFINITE_MARK, NonFiniteError
from hetsync.roles import Roles

__all__ = ["Protocol", "Capabilities", "NonFiniteError", "present_gradients", "scatter_gradients", "payload_bytes",
           "all_finite", "NONFINITE_MARK"]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a protocol needs and allows: one declared record per protocol class, read by name.

    Attributes:
        requires_mpi: bool, the protocol needs MPI point-to-point messages (it fails under
            ``horovodrun --gloo`` with a message naming the protocol).
        collectives_in_thread: bool, its communication thread issues horovod collectives while
            training (RNA): other eager collectives during ``fit`` must then avoid horovod (see
            :class:`hetsync.callbacks.MetricAverage`).
        max_steps_per_execution: int >= 1 or None (any), the largest ``steps_per_execution`` of
            ``model.compile`` it supports. With k > 1 Keras runs k steps inside one compiled call
            and calls the batch hooks once per call; a protocol whose hooks feed every step (task
            allocation's m_i, Hop's tokens, the parameter-server exchange) needs 1.
        nonfinite_in_collective: bool, every step runs one collective that carries the non-finite
            flags (:meth:`hetsync.core.guard.NonFiniteGuard.nonfinite_flags`; BSP, SelSync, task
            allocation): a bad rank sends zeros in place of its gradients and every rank stops
            after that collective. False: the bad rank stops before its step does anything
            (nothing enters a cache, a queue or a message).
    """

    requires_mpi: bool = False
    collectives_in_thread: bool = False
    max_steps_per_execution: int = None
    nonfinite_in_collective: bool = False


class Protocol(NonFiniteGuard, Averaging, Statistics, DataPlans):
    """Base class of every hetsync protocol (BSP, RNA, task allocation, SelSync, ...).

    Subclasses set :attr:`name` (the lowercase CLI name), :attr:`display_name`, :attr:`Config`
    (their frozen configuration dataclass) and :attr:`capabilities`, then override
    :meth:`transform` (gradients in, gradients out) or :meth:`apply` (full control over the local
    step), plus :meth:`build`, :meth:`start`, :meth:`stop` and :meth:`callbacks` as needed.

    Per-step statistics are float64 scalar variables (:meth:`add_stat`) assigned inside the
    compiled step and read by :class:`hetsync.callbacks.SyncMetrics`. Every protocol has:

    * ``delay_ms``: injected slowdown of this step in milliseconds;
    * ``compute_ms``: compute time of this step up to the gradients, in milliseconds;
    * ``sync_wait_ms``: time spent inside synchronization this step, in milliseconds
      (including ``netdelay`` latency);
    * ``syncs``: cumulative number of synchronizations (collective rounds) this rank joined;
    * ``emulated_ms``: on an emulated device (``device:MS``), the step's emulated duration in
      milliseconds (K x MS x samples / b + extra); 0 otherwise;
    * ``overrun``: 1 if the step's real compute exceeded its emulated duration (the step was not
      shortened, so the emulation is off for it), else 0; ``overruns``: their cumulative count.
    * ``nonfinite_dropped``: cumulative number of non-finite gradient sets or parameter sets this
      rank held back instead of sending (each one then stops training, see :meth:`_guard_gradients`).

    Non-finite guard: every step checks its gradients before anything leaves the rank.
    A non-finite gradient (NaN or inf, also from a non-finite loss) is never sent: it is counted
    in ``nonfinite_dropped`` and training stops with an error naming the rank, the step
    (the optimizer's ``iterations`` before the step) and the protocol. Protocols with
    :attr:`Capabilities.nonfinite_in_collective` fold a per-rank flag into their own collective, so every rank
    stops in the same synchronization naming the source rank(s); the others stop on the failing
    rank (its process exits non-zero and ``mpirun`` ends the job). Parameters are checked the same
    way before every parameter average (:meth:`average_parameters`, :meth:`average_at_train_end`)
    and, by the point-to-point protocols, before they are sent (:meth:`check_finite_arrays`).

    Args:
        config: an instance of :attr:`Config` (or None: build it from ``kwargs``, all defaults
            without them).
        **kwargs: fields of :attr:`Config` (with ``config``: replace those fields).

    Raises:
        ValueError: a bad configuration value (before training).
        TypeError: a ``config`` of another class, or arguments for a protocol without ``Config``.
    """

    #: lowercase protocol name used by ``--protocol`` and in summaries.
    name = "base"
    #: the wrapper's name (e.g. ``"RNA"``): names the wrapped optimizer class (``RNA_SGD``) and messages.
    display_name = "Protocol"
    #: what the protocol needs and allows, read by name (:class:`Capabilities`); subclasses declare
    #: their own (``dataclasses.replace(Base.capabilities, ...)`` keeps a base class's declarations).
    capabilities = Capabilities()
    #: the protocol's configuration dataclass (a :class:`hetsync.core.config.ProtocolConfig`), or None.
    Config = None

    def __init_subclass__(cls, **kwargs):
        # a protocol written for an earlier release declares its capabilities as class attributes
        # (``requires_mpi = True``): fold them into the record, so they keep their effect
        super().__init_subclass__(**kwargs)
        legacy = {f.name: cls.__dict__[f.name] for f in dataclasses.fields(Capabilities) if f.name in cls.__dict__}
        if legacy:
            cls.capabilities = dataclasses.replace(cls.capabilities, **legacy)

    def __init__(self, config=None, **kwargs):
        if self.Config is None:
            if config is not None or kwargs:
                raise TypeError(f"{type(self).__name__} has no configuration; got {config!r}, {kwargs!r}")
        elif config is None:
            config = self.Config(**kwargs)
        elif not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(config).__name__}")
        elif kwargs:
            config = dataclasses.replace(config, **kwargs)
        #: the frozen configuration (an instance of :attr:`Config`), or None.
        self.cfg = config
        self.optimizer = None
        self._stats = {}
        self._final = {}
        #: a ValueError for a launch too small for the protocol's servers (raised by :meth:`check_roles`), or None.
        self.role_error = None
        #: this protocol's :class:`hetsync.roles.Roles` (workers and servers), made by :meth:`attach`.
        self.roles = None

    # -- life cycle ---------------------------------------------------------------------------
    def attach(self, optimizer):
        """Bind to the wrapped optimizer and create state. Called once by the wrapper (eagerly).

        Raises:
            RuntimeError: hetsync not initialised, or an MPI-only protocol launched under Gloo.
        """
        if not world.is_initialized():
            raise RuntimeError(f"hetsync.{self.display_name}: call hetsync.init() before wrapping an optimizer")
        if self.capabilities.requires_mpi:
            world.require_mpi(f"protocol {self.name!r}")
        try:
            self.roles = Roles.of_world(self.server_count())
        except ValueError as exc:
            # Wrapping only configures: a launch too small for the servers fails when the roles are
            # first used (fit_data, train begin), before any step.
            self.role_error = ValueError(f"{self.display_name}: {exc}")
            self.roles = Roles.of_world(0)
        roles.set_current(self.roles)
        self.optimizer = optimizer
        for stat in ("delay_ms", "compute_ms", "sync_wait_ms", "syncs", "emulated_ms", "overrun", "overruns",
                     "nonfinite_dropped"):
            self.add_stat(stat)
        self.build()

    def server_count(self):
        """Return the number K of parameter-server ranks this protocol uses (int; 0 here, the
        parameter-server protocols return their ``servers`` argument). :meth:`attach` makes
        :attr:`roles` from it (:class:`hetsync.roles.Roles`, which raises ValueError if it leaves no worker)."""
        return 0

    def check_roles(self):
        """Raise the ValueError of a launch too small for the protocol's servers (no worker left), if any.

        Raises:
            ValueError: ``servers`` >= the number of ranks (the message names both).
        """
        if self.role_error is not None:
            raise self.role_error

    def build(self):
        """Create protocol state (variables, resources). Runs eagerly, before any step is traced."""

    def start(self):
        """Start communication threads (called at ``on_train_begin``)."""

    def stop(self):
        """End of training (``on_train_end``, every rank): with ``average_at_end=True`` in the
        config, average the parameters once (:meth:`average_at_train_end`). Protocols with threads
        stop them first and drain or count what is in flight."""
        if getattr(self.cfg, "average_at_end", False):
            self.average_at_train_end()

    def callbacks(self):
        """Return the list of Keras callbacks this protocol needs besides the common ones (kept for
        protocols defined outside hetsync; hetsync's own protocols use the hook set below and return [])."""
        return []

    # -- the hook set: Keras' training events, forwarded by hetsync.callbacks.ProtocolHooks ----------
    # Each runs eagerly on every rank, in ProtocolHooks' place in the callback list. Defaults do nothing.

    def on_train_begin(self, model, params):
        """Training begins: after :meth:`check_fit` and :meth:`start`, before the first step.

        Args:
            model: the ``keras.Model`` being fit.
            params: dict, Keras' callback parameters (``epochs``, ``steps`` per epoch or None, ``verbose``), and
                ``start_step`` (int >= 0) when the protocol takes over a fit that has already run that many
                steps (:func:`hetsync.Auto`'s switch; absent otherwise, meaning 0). A protocol that counts the
                fit's steps starts there (Hop's iterations, the global step of local SGD and FedAvg).

        Returns:
            True to stop training before the first step (``model.stop_training``; a parameter-server
            rank that served until every worker finished), else None or False.
        """

    def on_epoch_begin(self, epoch):
        """An epoch begins. Args: epoch: int >= 0, Keras' epoch index."""

    def on_train_batch_begin(self, batch):
        """A step (or, with ``steps_per_execution`` k, a call of k steps) begins.

        Args:
            batch: int >= 0, the step's index within the epoch.
        """

    def on_train_batch_end(self, batch, logs):
        """A step ended (after the non-finite loss check).

        Args:
            batch: int >= 0, the step's index within the epoch. logs: dict of Keras' step logs.

        Returns:
            True to stop training after this step (``model.stop_training``), else None or False.
        """

    def on_epoch_end(self, epoch, logs):
        """An epoch ended. Args: epoch: int >= 0. logs: dict of Keras' epoch logs (mutable)."""

    def on_train_end(self, model):
        """Training ended: after :meth:`stop` on this rank. Args: model: the ``keras.Model``."""

    def check_fit(self, model):
        """Check the model's training set-up against the protocol at train begin (before any step).

        Called by :class:`hetsync.callbacks.ProtocolHooks`. Checks that the model trains with this
        protocol's optimizer (not a ``keras.optimizers.LossScaleOptimizer`` wrapped *around* it)
        and that ``steps_per_execution`` is at most :attr:`Capabilities.max_steps_per_execution`.

        Args:
            model: the ``keras.Model`` being fit.

        Raises:
            ValueError: either check fails (the message names the value and what is allowed).
        """
        opt = getattr(model, "optimizer", None)
        inner = getattr(opt, "inner_optimizer", None)
        if opt is not self.optimizer and inner is self.optimizer:
            raise ValueError(
                f"{self.display_name}: the model's optimizer is a {type(opt).__name__} around the "
                f"hetsync-wrapped {type(self.optimizer).__name__}; wrap the other way round, "
                f"hetsync.{self.display_name}(keras.optimizers.LossScaleOptimizer(base_optimizer)) (Keras adds a "
                "LossScaleOptimizer itself under the mixed_float16 policy unless the optimizer already is one)")
        self.set_state_variables(model)
        spe = int(getattr(model, "steps_per_execution", 1) or 1)
        limit = self.capabilities.max_steps_per_execution
        if limit is not None and spe > limit:
            raise ValueError(
                f"{self.display_name}: model.compile(steps_per_execution={spe}) is not supported; this protocol "
                f"allows steps_per_execution <= {limit} (its hooks sets every step's "
                "workload); compile with steps_per_execution=1")

    # -- the step -------------------------------------------------------------------------------
    def apply(self, grads, variables, local_apply):
        """Apply one step. Default: ``local_apply(self.transform(grads, variables), variables)``.

        Args:
            grads: list of gradient tensors (or None), aligned with ``variables``.
            variables: list of the model's trainable Keras variables.
            local_apply: callable ``(grads, variables)`` running the wrapped optimizer's own update.

        Returns:
            whatever ``local_apply`` returns.
        """
        return local_apply(self.transform(grads, variables), variables)

    def transform(self, grads, variables):
        """Return the gradients to apply locally (default: unchanged)."""
        return grads



    def config(self):
        """Return the protocol's configuration as a JSON-serialisable dict (:func:`dataclasses.asdict`
        of :attr:`cfg`; ``{}`` without one): exactly the wrapper's arguments, so the wrapper
        called with them builds an equal protocol (``summary.json``, saved models)."""
        return self.cfg.as_dict() if self.cfg is not None else {}
