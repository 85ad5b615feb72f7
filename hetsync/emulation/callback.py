"""The Keras callback that plays a heterogeneity scenario on this rank, step by step.

It draws each step's slowdown from the seeded :class:`hetsync.emulation.scenario.Scenario`,
stamps the step's start into the step control (:mod:`hetsync.core.controls`) that the compiled
step reads, fires the scenario's faults, and sets the latency every synchronization pays. It
reads the wrapped optimizer's protocol only through the attributes every protocol has
(``hetsync_protocol``, its ``roles``, ``batch_size`` and ``step_samples``), so no protocol module is
imported here.
"""
import logging
import threading
import time

import keras

from hetsync import world
from hetsync.core import controls
from hetsync.emulation import faults as emulation_faults, scenario

__all__ = ["Slowdown"]

log = logging.getLogger("hetsync")


class Slowdown(keras.callbacks.Callback):
    """Inject a straggler scenario into every training step, optionally on an
    emulated device (``device:MS``).

    Each step it draws this rank's ``(factor K, extra_ms)`` from the seeded scenario and stamps
    the step's start time into :func:`hetsync.emulation.scenario.step_control`; inside the compiled step the
    delay op holds the gradients back for (K - 1) x compute time + extra_ms. With a ``device:MS``
    part the step is instead padded to exactly K x MS x samples / b + extra_ms milliseconds from
    its start to its gradients (samples: :meth:`hetsync.protocols.Protocol.step_samples` of the
    step, b: the protocol's ``batch_size``; MS per step when either is unknown); a step whose real
    compute took longer is an overrun (counted by the protocol's ``overrun`` statistic). The first
    step of each ``fit`` (tracing and compilation) is neither slowed nor padded. ``netdelay:MS``
    sets :func:`hetsync.emulation.scenario.sync_control` so every synchronization pays MS milliseconds.

    Faults (``pause``, ``stall``, ``kill``) hitting this rank are checked at each train batch
    begin, before the step is stamped, against the seconds since this ``fit``'s train begin, and fire
    once per process (:meth:`hetsync.emulation.scenario.Fault.fire`, recorded in :attr:`faults`). A
    parameter-server rank serves inside its train begin, so there ``pause`` and ``kill`` are armed on
    a timer thread instead (``stall`` of a server rank is refused at train begin: ValueError).

    Under a time dilation D (:func:`hetsync.world.dilation`, set by ``hetsync-cluster run --dilation D``)
    every emulated time is D times longer: the device time, ``extra_ms``, ``netdelay`` and the faults'
    AT_S and FOR_S; the real compute of a step without ``device`` is not dilated.

    Put it *first* in the callback list so the stamped start time excludes other callbacks.
    Under a parameter-server protocol the draws are made over the n workers (``random:K``: probability
    1/n); the spec is still checked against the whole launch.

    Args:
        spec: str slowdown spec (see :func:`hetsync.emulation.scenario.parse_spec`) or a parsed Scenario.
        seed: int, seeds the per-rank generator ``default_rng([seed, rank])``.
        rank, world_size: optional ints to draw the scenario *as* rank ``rank`` of a world of
            ``world_size`` ranks instead of this process's own rank and world size (both or
            neither). Used to measure one rank's solo speed under a scenario
            (:mod:`hetsync.bench.efficiency`).

    Raises:
        ValueError: bad spec, a spec that does not fit the world size, or ``rank`` outside
            [0, world_size) (checked at construction, before training starts); a ``stall`` of a
            parameter-server rank (at that rank's train begin); a bad ``HETSYNC_DILATION``.
    """

    def __init__(self, spec, seed=0, rank=None, world_size=None):
        super().__init__()
        self.scenario = spec if isinstance(spec, scenario.Scenario) else scenario.parse_spec(spec)
        if (rank is None) != (world_size is None):
            raise ValueError(f"Slowdown: give both rank and world_size or neither, got rank={rank!r}, "
                             f"world_size={world_size!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1
                                       or not isinstance(rank, int) or not 0 <= rank < world_size):
            raise ValueError(f"Slowdown: need an int world_size >= 1 and an int rank in [0, world_size), "
                             f"got rank={rank!r}, world_size={world_size!r}")
        self.rank = world.rank() if rank is None else rank
        self.world_size = world.size() if world_size is None else world_size
        self._own_world = world_size is None
        #: D, the time dilation of this run (float >= 1).
        self.dilation = world.dilation()
        self.scenario.validate(self.world_size)
        self._rng = self.scenario.rng(seed, self.rank)
        self._step = controls.step_control()
        self._sync = controls.sync_control()

    def on_train_begin(self, logs=None):
        spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if spe != 1:
            raise ValueError(f"Slowdown: model.compile(steps_per_execution={spe}) is not supported with a straggler "
                             "scenario; the scenario stamps every step's start before it runs, so it needs "
                             "steps_per_execution=1")
        protocol_roles = getattr(self._protocol, "roles", None)
        if self._own_world and protocol_roles is not None and protocol_roles.num_servers:
            # parameter-server ranks do not step: draw as one of the n workers (random:K is 1/n per step)
            self.world_size = protocol_roles.num_workers
        self._first = True
        self._last_protocol = self._protocol
        self._sync.assign([0.0, 1.0, self.scenario.sync_latency_ms * self.dilation])
        self._t0 = time.time()
        self._faults = [f for f in self.scenario.faults(self.rank) if not f.fired()]
        self._timers = []
        if self._faults and self._own_world and protocol_roles is not None and protocol_roles.is_server:
            stalls = [f.spec for f in self._faults if f.kind == "stall"]
            if stalls:
                raise ValueError(f"Slowdown: {stalls} stall rank {self.rank}, a parameter server, whose training thread "
                                 "is its server loop; use pause:RANK:AT_S:FOR_S to stop a server")
            for f in self._faults:  # a server rank serves inside train begin: no batch begins to check at
                timer = threading.Timer(f.at_s * self.dilation, f.fire, args=(f.at_s * self.dilation,))
                timer.daemon = True
                timer.start()
                self._timers.append(timer)
            self._faults = []

    @property
    def _protocol(self):
        """The protocol of the model's optimizer now, or None (``hetsync.Auto`` switches it between two steps)."""
        return getattr(getattr(self.model, "optimizer", None), "hetsync_protocol", None)

    @property
    def faults(self):
        """The faults fired in this process so far (list of dicts, :func:`hetsync.emulation.scenario.fired_faults`)."""
        return emulation_faults.fired_faults()

    def device_ms(self, batch):
        """Emulated device time of step ``batch`` before the scenario's factor, in milliseconds:
        MS x samples / b (0.0 without a ``device`` part; MS if samples or b is unknown)."""
        ms = self.scenario.device_ms
        if ms is None:
            return 0.0
        p = self._protocol
        samples, b = (p.step_samples(batch), p.batch_size) if p is not None else (None, None)
        if samples is None or not b:
            return float(ms)
        return float(ms) * float(samples) / float(b)

    def on_train_batch_begin(self, batch, logs=None):
        if self._faults:
            elapsed = time.time() - self._t0
            for f in [f for f in self._faults if elapsed >= f.at_s * self.dilation]:
                self._faults.remove(f)
                f.fire(elapsed)
        factor, extra_ms = self.scenario.draw(self._rng, self.rank, self.world_size)
        device_ms = self.device_ms(batch)
        protocol = self._protocol
        if self._first or protocol is not self._last_protocol:
            # The first step of a fit mostly traces and compiles the step function; slowing it
            # K times would inject seconds that no real slower device would add. The draw is
            # still consumed so the per-rank sequence of later steps does not depend on this.
            # So does the first step after the optimizer's protocol changed (hetsync.Auto's switch):
            # Keras traces the new protocol's step.
            self._first = False
            self._last_protocol = protocol
            factor, extra_ms, device_ms = 1.0, 0.0, 0.0
        self._step.assign([time.time(), factor, extra_ms * self.dilation, device_ms * self.dilation])

    def on_train_end(self, logs=None):
        for timer in getattr(self, "_timers", []):
            timer.cancel()
        for f in getattr(self, "_faults", []):
            log.warning("hetsync: fault %s did not fire: this fit ended %.2f s after its train begin", f.spec,
                        time.time() - self._t0)
        self._step.assign([0.0, 1.0, 0.0, 0.0])
        self._sync.assign([0.0, 1.0, 0.0])
