"""``hetsync.Auto``: train with the protocol the advisor recommends for the cluster measured in the first steps.

The advisor (:mod:`hetsync.advise.predict`) inside a training run: no separate probe launch, and the warm-up's
steps are training steps.

1. **Warm-up** (``warmup_steps`` steps): the optimizer runs BSP (:class:`hetsync.protocols.bsp.BSPProtocol`).
   Each rank records its own step time: the step's wall time (batch begin to batch end) less the time it spent
   in the allreduce (``sync_wait_ms``), i.e. what the step would take without waiting for the slowest rank.
   The first :data:`SKIP_STEPS` steps (tracing) are not kept.
2. **Decision**, after step ``warmup_steps`` on every rank (BSP keeps the ranks in step, so they arrive
   together): one allgather brings every rank's step times and host name to every rank; horovod's allreduce
   of the model's gradient size and of one float, and under MPI a point-to-point round trip, are timed
   (:func:`hetsync.advise.probe.measure_network`); rank 0 builds the alpha-beta network model
   (:func:`hetsync.advise.probe.network_from`), resamples the step times
   (:func:`hetsync.sim.workload.from_samples`), ranks the candidates by predicted time to target relative to
   BSP (:func:`hetsync.advise.predict.predict` with ``fixed_shares=True``: the data plan is kept, see below)
   and sends its choice to every rank (a second allgather), so every rank switches to the same protocol.
3. **Switch**: the chosen protocol is made with its defaults and ``data_plan="shard"`` where it has the field,
   put on the optimizer in BSP's place (:func:`hetsync.core.wrapper.rebind`: the optimizer keeps its state
   and iteration count, its class becomes the chosen protocol's, e.g. ``RNA_SGD``), given the run's data plan,
   checked and started (its ``on_train_begin`` and ``on_epoch_begin`` hooks run), and Keras' train function is
   rebuilt, so the next step is the chosen protocol's. The choice is printed on rank 0, reported in
   ``summary.json`` (``chosen_by``) and saved with the model: :func:`hetsync.load_model` returns an optimizer
   of the chosen protocol and configuration.

The candidates are the protocols that need no server ranks and keep the data plan (fixed equal shares, the
plan BSP trains on: :meth:`hetsync.core.dataplans.DataPlans.fit_data`, or the user's ``tf.data`` pipeline
through :meth:`~hetsync.core.dataplans.DataPlans.fit_dataset`): BSP, RNA, Hop, local SGD, FedAvg and
SelSync (:data:`CANDIDATES`). Task allocation changes every rank's workload and hierarchical RNA and the
parameter-server protocols need server ranks, so they are not candidates. Under ``horovodrun --gloo`` the
protocols that need MPI point-to-point messages (RNA, Hop) are left out.
"""
import dataclasses
import logging
import sys
import time
import typing

import numpy as np

from hetsync import transport, world
from hetsync.advise import predict as _predict
from hetsync.advise import probe as _probe
from hetsync.core import controls as _controls
from hetsync.core import wrapper as _wrapper
from hetsync.core.config import ProtocolConfig, param
from hetsync.core.grads import payload_bytes
from hetsync.protocols import bsp as _bsp

__all__ = ["Auto", "AutoProtocol", "AutoConfig", "CANDIDATES", "SKIP_STEPS", "PROTOCOL_CONFIGS"]

log = logging.getLogger("hetsync")

#: the protocols Auto chooses among, simplest first (a tie within the advisor's 5% band goes to the earlier one).
CANDIDATES = ("bsp", "rna", "hop", "localsgd", "fedavg", "selsync")
#: warm-up steps left out of the measurement (tracing and the first, slower steps).
SKIP_STEPS = 5
#: what each candidate is configured with besides its defaults: the kept data plan.
PROTOCOL_CONFIGS = {"rna": {"data_plan": "shard"}, "localsgd": {"data_plan": "shard"},
                    "fedavg": {"data_plan": "shard"}, "selsync": {"data_order": "defdp"}}
#: step-time draws per rank the prediction resamples the warm-up's measurements into.
SIM_STEPS = 400


def _check_protocols(owner, label, value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise ValueError(f"{owner}: {label} must be None or a comma-separated str of protocol names from "
                         f"{', '.join(CANDIDATES)}, got {value!r}")
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in names if v not in CANDIDATES]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"{owner}: {label} must name one or more different protocols of {', '.join(CANDIDATES)} "
                         f"(comma-separated; the others need server ranks or change the data plan), got {value!r}")
    return ",".join(names)


@dataclasses.dataclass(frozen=True)
class AutoConfig(ProtocolConfig):
    """Auto's parameters (see :func:`Auto`)."""

    owner: typing.ClassVar[str] = "Auto"

    warmup_steps: int = param(
        50, f"int >= {SKIP_STEPS + 5}, BSP steps before the choice; the first {SKIP_STEPS} are not measured.",
        ge=SKIP_STEPS + 5)
    protocols: typing.Optional[str] = param(
        None, "comma-separated protocol names to choose among (a subset of bsp, rna, hop, localsgd, fedavg, "
              "selsync; BSP is always predicted as the reference but chosen only if listed).",
        none="all of them (under Gloo: those that need no MPI point-to-point)",
        check=_check_protocols, parse=lambda text: None if text in ("None", "none", "") else text)
    compression: typing.Literal["none", "fp16"] = param(
        "none", "``\"none\"`` or ``\"fp16\"``: horovod's FP16 wire compression of the warm-up's allreduce.")


class AutoProtocol(_bsp.BSPProtocol):
    """BSP during the warm-up, then the protocol the advisor predicts reaches the target soonest (see :func:`Auto`).

    Attributes:
        choice: dict or None, after the switch: ``protocol``, ``config``, ``step``, ``predicted`` (rows of the
            ranking: protocol, samples/s, time to target vs BSP), ``reasons``, ``step_ms_median`` (per rank),
            ``allreduce_ms``; None before.
    """

    name = "auto"
    display_name = "Auto"
    Config = AutoConfig
    #: the warm-up measures every step: one step per call.
    capabilities = dataclasses.replace(_bsp.BSPProtocol.capabilities, max_steps_per_execution=1)

    def build(self):
        super().build()
        self.choice = None
        self._own_ms = []
        self._model = self._params = self._plan = None
        self._epoch = self._fit_steps = 0
        self._fit_total = None
        self._t0 = None
        self._excluded = {}

    def adopt(self, plan):
        """Take the data plan as BSP does, and keep it for the chosen protocol (see
        :meth:`hetsync.core.dataplans.DataPlans.adopt`)."""
        self._plan = super().adopt(plan)
        return self._plan

    def candidates(self):
        """The protocol names this run chooses among (tuple of str): ``protocols`` or :data:`CANDIDATES`, less
        those that cannot run this fit (:attr:`excluded`)."""
        names = self.cfg.protocols.split(",") if self.cfg.protocols else list(CANDIDATES)
        return tuple(n for n in names if n not in self._excluded)

    @property
    def excluded(self):
        """dict protocol name -> why it cannot run this fit (set at train begin): MPI point-to-point under
        ``horovodrun --gloo`` (RNA, Hop), a fit of unknown steps per epoch (Hop counts its iterations, FedAvg
        places its aggregations in the epoch), trainable variables not float32 (RNA's gradient cache, Hop's
        updates)."""
        return dict(self._excluded)

    def _exclude(self, model, params):
        from hetsync import protocols

        out = {}
        for name in CANDIDATES:
            if not world.mpi_enabled() and protocols.get_wrapper(name).protocol_class.capabilities.requires_mpi:
                out[name] = "needs MPI point-to-point messages (the launch runs on Gloo)"
            elif name in ("hop", "fedavg") and not params.get("steps"):
                out[name] = "needs a known number of steps per epoch"
            elif name in ("rna", "hop") and any(v.dtype != "float32" for v in model.trainable_variables):
                out[name] = "needs float32 trainable variables"
        return out

    def on_train_begin(self, model, params):
        """Keep the model and Keras' parameters for the switch; refuse an empty candidate set under Gloo.

        Raises:
            ValueError: every listed protocol needs MPI and the launch is ``horovodrun --gloo``.
        """
        self._excluded = self._exclude(model, params)
        if not self.candidates():
            why = "; ".join(f"{k} {v}" for k, v in self._excluded.items() if k in self.cfg.protocols.split(","))
            raise ValueError(f"Auto: none of protocols={self.cfg.protocols!r} can run this fit ({why}); add bsp, "
                             "localsgd or selsync")
        self._model, self._params = model, dict(params)
        self._fit_steps = 0  # steps of this fit (a fit that ended in the warm-up leaves the rest to the next)
        steps, epochs = params.get("steps"), params.get("epochs")
        self._fit_total = steps * epochs if steps and epochs else None
        return super().on_train_begin(model, params)

    def on_epoch_begin(self, epoch):
        self._epoch = int(epoch)

    def on_train_batch_begin(self, batch):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs):
        """Record the step's own time; after step ``warmup_steps``, choose and switch (see the module docstring).

        Returns:
            True to stop training (the chosen protocol's ``on_train_begin`` asked for it), else None.
        """
        if self._t0 is None or self.optimizer is None or _wrapper.protocol_of(self.optimizer) is not self:
            return None
        wall_ms = (time.perf_counter() - self._t0) * 1e3
        self._fit_steps += 1
        if self._fit_steps > 1 or not self._own_ms:  # a later fit's first step traces: not a measurement
            self._own_ms.append(max(wall_ms - float(self._stats["sync_wait_ms"].numpy()), 1e-3))
        if len(self._own_ms) < self.cfg.warmup_steps or self._fit_steps == self._fit_total:
            return None  # (after a fit's last step the switch waits for the next fit)
        choice = self._decide()
        return self._switch(choice)

    def on_train_end(self, model):
        if self.choice is None and world.rank() == 0:
            print(f"hetsync.Auto: training ended after {len(self._own_ms)} of the {self.cfg.warmup_steps} warm-up "
                  "steps; it ran BSP throughout", file=sys.stderr, flush=True)

    # -- the decision ---------------------------------------------------------------------------------
    def _decide(self):
        """Every rank: gather the step times and hosts, time the network; rank 0 ranks, every rank gets its choice."""
        own = [float(v) for v in self._own_ms[SKIP_STEPS:]]
        host = world.host_name()
        gathered = transport.allgather_object({"host": host, "step_ms": own}, name="hetsync_auto_steps")
        hosts = [g["host"] for g in gathered]
        model_bytes = int(payload_bytes([v.value for v in self._model.trainable_variables])) or 4
        n = len(hosts)
        peer = next((r for r in range(n - 1, 0, -1) if hosts[r] != hosts[0]), n - 1 if n > 1 else 0)
        timings = _probe.measure_network(model_bytes, peer, p2p=world.mpi_enabled())
        # the emulated network latency (netdelay) delays each synchronization of the steps, not these timings
        latency_s = float(_controls.sync_control().numpy()[2]) / 1e3
        timings = dict(timings, allreduce_s=timings["allreduce_s"] + latency_s,
                       allreduce_small_s=timings["allreduce_small_s"] + latency_s)
        choice = None
        if world.rank() == 0:
            try:
                choice = self._rank(gathered, hosts, timings, model_bytes)
            except Exception as exc:  # noqa: BLE001 - every rank must hear of it, or they wait for the choice
                choice = {"error": f"{type(exc).__name__}: {exc}"}
        choice = transport.allgather_object(choice, name="hetsync_auto_choice")[0]
        if "error" in choice:
            raise RuntimeError(f"Auto: rank 0 could not rank the protocols after the warm-up: {choice['error']}")
        return choice

    def _rank(self, gathered, hosts, timings, model_bytes):
        from hetsync.sim import workload

        candidates = self.candidates()
        net = _probe.network_from(hosts, timings, model_bytes)
        times = workload.from_samples([g["step_ms"] for g in gathered], SIM_STEPS, seed=0)
        work = workload.Workload(model_bytes=model_bytes, batch_size=int(self.batch_size or 32), host_ms=0.0)
        inputs = _predict.Inputs(times, net, work, servers=0, hosts=",".join(dict.fromkeys(hosts)))
        sim_configs = {p: dict(c) for p, c in PROTOCOL_CONFIGS.items() if p in ("localsgd", "fedavg")}
        rows = _predict.predict(inputs, candidates, configs=sim_configs, fixed_shares=True)
        chosen = _predict.first_choice([r for r in rows if r["protocol"] in candidates], CANDIDATES)
        rows = [chosen] + [r for r in rows if r is not chosen]
        rec = _predict.recommend(rows, inputs)
        return {"protocol": chosen["protocol"], "config": dict(PROTOCOL_CONFIGS.get(chosen["protocol"], {})),
                "step": int(self.optimizer.iterations.numpy()), "candidates": list(candidates),
                "excluded": dict(self._excluded),
                "predicted": [{"protocol": r["protocol"], "samples_per_s": round(r["samples_per_s"], 1),
                               "time_to_target_vs_bsp": round(r["time_to_target_vs_bsp"], 3)} for r in rows],
                "reasons": rec["reasons"],
                "step_ms_median": [round(float(np.median(g["step_ms"])), 2) if g["step_ms"] else None
                                   for g in gathered],
                "allreduce_ms": round(timings["allreduce_s"] * 1e3, 3)}

    def _switch(self, choice):
        """Every rank: make the chosen protocol, put it on the optimizer, start it, rebuild the train step."""
        from hetsync import protocols

        cls = protocols.get_wrapper(choice["protocol"]).protocol_class
        proto = cls(cls.Config(**choice["config"]))
        record = {"by": self.name, "by_config": self.config(), **choice}
        _wrapper.rebind(self.optimizer, proto, chosen_by=record)
        proto.continue_from(self)
        self.choice = choice
        if self._plan is not None:
            proto.adopt(self._plan)
        model = self._model
        proto.check_fit(model)
        proto.start()
        stop = proto.on_train_begin(model, {**self._params, "start_step": self._fit_steps})
        proto.on_epoch_begin(self._epoch)
        model.make_train_function(force=True)
        if world.rank() == 0:
            ranked = ", ".join(f"{r['protocol']} {r['time_to_target_vs_bsp']:.2f}x" for r in choice["predicted"])
            print(f"hetsync.Auto: after {choice['step']} warm-up steps, chose {choice['protocol']} "
                  f"{choice['config'] or ''} (predicted time to target vs BSP: {ranked}); "
                  + "; ".join(choice["reasons"]), file=sys.stderr, flush=True)
        return True if stop else None


Auto = _wrapper.protocol_wrapper(AutoProtocol, """Wrap a Keras 3 optimizer to train with the protocol the advisor chooses.

    Runs BSP for ``warmup_steps`` steps while measuring every rank's step time, then times the network,
    predicts each candidate's time to target relative to BSP with hetsync's timing simulator and the measured
    statistical efficiencies (:mod:`hetsync.advise.predict`), and switches every rank to the first choice
    (BSP, RNA, Hop, local SGD, FedAvg or SelSync; see :mod:`hetsync.advise.auto`). The data plan is kept
    (train on ``opt.hetsync_protocol.fit_data(x, y, b)`` or ``fit_dataset``, or pass batches to ``fit``
    yourself as for BSP). The choice is printed on rank 0, reported by
    :class:`hetsync.callbacks.SyncMetrics` (``chosen_by``) and saved with the model;
    :func:`hetsync.load_model` returns the chosen protocol. Not with
    :class:`hetsync.callbacks.BackupAndRestore` (a resume cannot return into the warm-up).

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)``.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``Auto_<optimizer class>``; after the switch the chosen protocol's
        class, e.g. ``RNA_SGD``, a subclass of the given one).

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance, or an unknown argument.
        ValueError: ``warmup_steps`` below 10, an unknown or repeated protocol name, ``steps_per_execution`` > 1
            (at train begin), only MPI protocols listed under Gloo (at train begin).
        RuntimeError: :func:`hetsync.init` was not called.
    """)
