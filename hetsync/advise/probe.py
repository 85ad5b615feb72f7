"""The advisor's probe: measure the cluster a launch runs on, then predict (``horovodrun -np N python -m hetsync.advise``).

Every rank, in this order:

1. builds the model (``--model module:function``, a function returning a Keras model; default the example
   job's MLP on its data) and compiles it with SGD; a model that does not build or compile ends every
   rank with one clear message before any measurement (each rank checks on its own, so nothing waits
   for a rank that failed);
2. joins the world (:func:`hetsync.world.init`) and measures its own training step: ``model.train_on_batch``
   on one batch (``--batch-size``) for about half of ``--probe-s`` seconds (the first steps, tracing, are
   left out). With ``--scenario SPEC`` each step is padded as the emulated cluster pads it
   (:mod:`hetsync.emulation.scenario`: ``device:MS`` and its slowdowns), so the probe measures the
   emulated cluster;
3. times horovod's allreduce of the model's gradient size (float32, 5 repetitions, the median) and of one
   float (the fixed cost), and a point-to-point round trip of the gradient's bytes and of one byte between
   rank 0 and the rank farthest from it (another host where there is one);
4. sends its step times, its host name and those timings to rank 0 (:func:`hetsync.transport.allgather_object`).

Rank 0 then builds the network model from what was measured (hosts and slots from the ranks' host names;
alpha from the one-byte message; beta from the gradient-sized one; the collective's fixed cost from the
one-float allreduce), resamples the measured step times (:func:`hetsync.sim.workload.from_samples`) and
prints the ranking (:mod:`hetsync.advise.predict`). Every wait is bounded: the collectives by horovod's stall
shutdown, the point-to-point messages by the transport's timeouts, the whole probe by ``--timeout-s``
(default ``--probe-s`` + 120 s: a rank past it prints the stage it was in and exits, which ends the launch).
"""
import importlib
import logging
import os
import socket
import statistics
import sys
import threading
import time

import numpy as np

__all__ = ["load_model_factory", "build_model", "measure_steps", "measure_network", "network_from", "main",
           "ProbeError", "Watchdog", "GRACE_S"]

log = logging.getLogger("hetsync")

#: repetitions of each network timing (the median is kept).
REPEATS = 5
#: most training steps one rank times (the time budget ends the probe long before).
MAX_STEPS = 100_000
#: seconds a probe message waits for its peer (point-to-point timings).
P2P_TIMEOUT_S = 60.0
#: seconds the probe may take beyond ``--probe-s`` (building the model, start-up, the network timings) by default.
GRACE_S = 120.0


class Watchdog:
    """Ends this process (exit status 3) with one clear message if the probe is not done within ``timeout_s`` seconds.

    Under an MPI launch a rank that exits makes the launcher stop the others, so a probe that hangs anywhere
    (a rank that never joins, a model that never builds) ends the whole job.

    Args:
        timeout_s: float seconds > 0.
    """

    def __init__(self, timeout_s):
        self.stage = "starting"
        self.timeout_s = float(timeout_s)
        # the message goes to the stderr of the moment the probe starts: TensorFlow's import captures file
        # descriptor 2 for a while (hetsync.world.quiet_startup), and a message written there would be lost
        try:
            self._fd = os.dup(2)
        except OSError:
            self._fd = None
        self._timer = threading.Timer(self.timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self):
        text = (f"hetsync advise: the probe did not finish within --timeout-s={self.timeout_s:g} s "
                f"(stage: {self.stage}); ending this rank\n").encode()
        try:
            os.write(self._fd if self._fd is not None else 2, text)
        except OSError:
            pass
        os._exit(3)

    def cancel(self):
        """Stop the timer (the probe is done) and close the saved stderr."""
        self._timer.cancel()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ProbeError(ValueError):
    """The probe's input is bad (a model that does not build, a bad ``--model`` name); raised before any measurement."""


def load_model_factory(text):
    """The function named by ``--model``.

    Args:
        text: str ``"module:function"`` (the module importable from the working directory or ``PYTHONPATH``).

    Returns:
        callable taking no argument and returning a Keras model.

    Raises:
        ProbeError: the text has no ``:``, the module does not import or has no such callable (names it).
    """
    mod, sep, fn = str(text).partition(":")
    if not sep or not mod or not fn:
        raise ProbeError(f"--model {text!r}: give MODULE:FUNCTION, e.g. mymodels:build")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise ProbeError(f"--model {text!r}: module {mod!r} does not import: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, fn, None)
    if not callable(factory):
        raise ProbeError(f"--model {text!r}: module {mod!r} has no callable {fn!r}")
    return factory


def build_model(model_arg, batch_size, seed=0):
    """Build and compile the probed model and one batch for it.

    Args:
        model_arg: str ``"module:function"`` or None (the example job's MLP on its data set).
        batch_size: int > 0 samples. seed: int.

    Returns:
        ``(model, x, y)``: the compiled Keras model and one batch (numpy arrays, ``x`` [b, ...] float32, ``y`` [b] int).

    Raises:
        ProbeError: the model does not build, has no defined input shape, or does not compile.
    """
    import keras

    if model_arg is None:
        from hetsync import data
        from hetsync.bench import job

        ds = data.load("mnist-idx" if data.data_dir() else "digits", data.data_dir())
        model = job.build_model("mlp", ds.x_train.shape[1:], ds.num_classes, seed)
        x, y = ds.x_train[:batch_size], ds.y_train[:batch_size]
    else:
        factory = load_model_factory(model_arg)
        try:
            model = factory()
        except Exception as exc:  # noqa: BLE001 - the user's function failed: say so before anything runs
            raise ProbeError(f"--model {model_arg!r}: the model does not build: {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, keras.Model):
            raise ProbeError(f"--model {model_arg!r} returned {type(model).__name__}, not a keras.Model")
        try:
            shape = tuple(model.inputs[0].shape[1:])
            classes = int(model.outputs[0].shape[-1])
        except Exception as exc:  # noqa: BLE001
            raise ProbeError(f"--model {model_arg!r}: the model has no defined input and output shape "
                             f"(build it with keras.Input): {exc}") from exc
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((batch_size, *shape)).astype("float32")
        y = rng.integers(0, max(classes, 1), size=batch_size)
    try:
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    except Exception as exc:  # noqa: BLE001
        raise ProbeError(f"the model does not compile with SGD and sparse categorical cross-entropy: {exc}") from exc
    return model, x, y


def measure_steps(model, x, y, seconds, scenario=None, rank=0, world_size=1, seed=0, warmup=3):
    """Time training steps for about ``seconds`` seconds.

    Args:
        model: compiled Keras model. x, y: one batch. seconds: float > 0 wall seconds of measured steps.
        scenario: a :class:`hetsync.emulation.scenario.Scenario` or None: pad each step as the emulation does
            (K x MS + extra milliseconds, never shorter than the real step).
        rank, world_size, seed: ints (the scenario's per-rank draws).
        warmup: int steps run first and not kept (tracing).

    Returns:
        float64 array of step times in milliseconds (at least one).
    """
    for _ in range(warmup):
        model.train_on_batch(x, y)
    rng = scenario.rng(seed, rank) if scenario is not None else None
    out = []
    end = time.monotonic() + seconds
    for _ in range(MAX_STEPS):
        if out and time.monotonic() >= end:
            break
        t0 = time.perf_counter()
        model.train_on_batch(x, y)
        ms = (time.perf_counter() - t0) * 1e3
        if scenario is not None and scenario.device_ms is not None:
            k, extra = scenario.draw(rng, rank, world_size)
            target = k * scenario.device_ms + extra
            if target > ms:
                time.sleep((target - ms) / 1e3)
                ms = target
        out.append(ms)
    return np.asarray(out)


def measure_network(model_bytes, peer, p2p=True):
    """Time horovod's allreduce and a point-to-point round trip (this rank's side; every rank calls it).

    Args:
        model_bytes: int bytes of the gradient. peer: int, the rank rank 0 exchanges point-to-point messages with
            (every rank gets the same value; ranks other than 0 and ``peer`` only join the collectives).
        p2p: bool, also time the point-to-point round trip (needs MPI; every rank passes the same value).

    Returns:
        dict of medians in seconds: ``allreduce_s``, ``allreduce_small_s``, ``p2p_s`` and ``p2p_small_s`` (one way;
        None on ranks other than 0 or with one rank).

    Raises:
        hetsync.transport.TransportTimeout: the peer did not answer within the transport's timeout.
    """
    import tensorflow as tf

    from hetsync import transport, world
    from hetsync.transport import channels

    big = tf.zeros([max(int(model_bytes) // 4, 1)], tf.float32)
    small = tf.zeros([1], tf.float32)

    def timed(fn):
        ts = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    res = {"allreduce_s": timed(lambda: transport.allreduce_sum([big], name="hetsync_advise_big")[0].numpy()),
           "allreduce_small_s": timed(lambda: transport.allreduce_sum([small], name="hetsync_advise_small")[0].numpy()),
           "p2p_s": None, "p2p_small_s": None}
    if world.size() < 2 or not p2p:
        return res
    d = transport.dispatcher()
    payload_big, payload_small = np.zeros(max(int(model_bytes), 1), np.uint8), b"x"
    me = world.rank()
    for key, payload in (("p2p_s", payload_big), ("p2p_small_s", payload_small)):
        ts = []
        for i in range(REPEATS):
            if me == 0:
                t0 = time.perf_counter()
                d.send(peer, channels.ADVISE_PROBE, payload, tag=i)
                d.recv(channels.ADVISE_PROBE, source=peer, tag=i, timeout_s=P2P_TIMEOUT_S)
                ts.append((time.perf_counter() - t0) / 2)
            elif me == peer:
                m = d.recv(channels.ADVISE_PROBE, source=0, tag=i, timeout_s=P2P_TIMEOUT_S)
                d.send(0, channels.ADVISE_PROBE, m.obj, tag=i)
        if me == 0:
            res[key] = statistics.median(ts)
    return res


def network_from(host_names, timings, model_bytes):
    """The alpha-beta model (:class:`hetsync.sim.network.Network`) from the probe's measurements.

    Args:
        host_names: list of str, each rank's host, in rank order. timings: rank 0's :func:`measure_network` dict.
        model_bytes: int bytes of the message timed in ``p2p_s``.

    Returns:
        Network: slots per host in order of first appearance; alpha the one-byte one-way time; beta
        ``model_bytes / (p2p_s - alpha)`` on every host link when the peer was on another host (else the
        within-host bandwidth); a collective's ring step the smaller of alpha and the one-float allreduce's time
        over its 2 (n - 1) steps (``collective_alpha_s``), its fixed cost what is left of that time.
    """
    from hetsync.sim import network

    order, slots = [], {}
    for h in host_names:
        if h not in slots:
            order.append(h)
            slots[h] = 0
        slots[h] += 1
    if any(host_names[i] != host_names[i - 1] and host_names[i] in host_names[:i] for i in range(1, len(host_names))):
        log.warning("hetsync advise: ranks of one host are not consecutive; the model places them in order")
    n = len(host_names)
    alpha = timings.get("p2p_small_s") or network.DEFAULT_ALPHA_S
    beta = None
    if timings.get("p2p_s"):
        beta = model_bytes / max(timings["p2p_s"] - alpha, 1e-9)
    small = timings.get("allreduce_small_s") or 0.0
    # a ring step's latency is at most the small allreduce's time over its 2 (n - 1) steps: hetsync's transport
    # (pickled messages, a receive thread) can make one point-to-point message cost more than a whole allreduce
    coll_alpha = min(alpha, small / (2 * (n - 1))) if n > 1 and small > 0 else alpha
    overhead = max(small - 2 * (n - 1) * coll_alpha, 0.0)
    sl = tuple(slots[h] for h in order)
    if len(sl) > 1:
        return network.Network(sl, (beta or network.DEFAULT_LOCAL_BYTES_PER_S,) * len(sl), alpha_s=alpha,
                               overhead_s=overhead, collective_alpha_s=coll_alpha)
    return network.Network(sl, (network.DEFAULT_LOCAL_BYTES_PER_S,), local_alpha_s=alpha,
                           local_bytes_per_s=beta or network.DEFAULT_LOCAL_BYTES_PER_S, overhead_s=overhead)


def main(args, protocols, parser):
    """Run the probe on every rank of the launch and print the ranking on rank 0.

    Args:
        args: the parsed command line (:func:`hetsync.advise.__main__.parser`). protocols: tuple of names to rank.
        parser: the ``argparse.ArgumentParser`` (its ``error`` reports bad input).

    Returns:
        int exit status (0; 2 through ``parser.error`` for bad input).

    Raises:
        SystemExit: bad input, before any measurement.
    """

    timeout_s = args.timeout_s if args.timeout_s is not None else args.probe_s + GRACE_S
    if not timeout_s > 0:
        parser.error(f"--timeout-s must be > 0 seconds, got {timeout_s:g}")
    dog = Watchdog(timeout_s)
    try:
        return _probe(args, protocols, parser, dog)
    finally:
        dog.cancel()


def _probe(args, protocols, parser, dog):
    from hetsync import world

    world.quiet_startup()
    batch = args.batch_size or 32
    if batch < 1:
        parser.error(f"--batch-size must be >= 1 samples, got {batch}")
    scenario = None
    if args.scenario:
        from hetsync.emulation import scenario as _scenario

        try:
            scenario = _scenario.parse_spec(args.scenario)
        except ValueError as exc:
            parser.error(str(exc))
    dog.stage = "building the model"
    try:
        model, x, y = build_model(args.model, batch, args.seed)
    except ProbeError as exc:
        parser.error(str(exc))
    dog.stage = "joining the world (every rank must start)"
    world.init()
    from hetsync import transport
    from hetsync.advise import predict as _predict
    from hetsync.sim import workload

    n, me = world.size(), world.rank()
    if scenario is not None:
        try:
            scenario.validate(n)
        except ValueError as exc:
            parser.error(str(exc))
    model_bytes = int(sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables))
    dog.stage = "timing training steps"
    steps = measure_steps(model, x, y, args.probe_s / 2, scenario, me, n, args.seed)
    dog.stage = "timing the network"
    hosts = transport.allgather_object(socket.gethostname() if not world.host_names() else world.host_name(),
                                       name="hetsync_advise_hosts")
    peer = next((r for r in range(n - 1, 0, -1) if hosts[r] != hosts[0]), n - 1 if n > 1 else 0)
    timings = measure_network(model_bytes, peer)
    gathered = transport.allgather_object(steps.tolist(), name="hetsync_advise_steps")
    dog.stage = "predicting"
    if me != 0:
        return 0
    net = network_from(hosts, timings, model_bytes)
    times = workload.from_samples(gathered, args.steps, args.seed)
    work = workload.Workload(model_bytes=model_bytes, batch_size=batch, host_ms=0.0)
    inputs = _predict.Inputs(times, net, work, args.servers)
    rows = _predict.predict(inputs, protocols)
    rec = _predict.recommend(rows, inputs)
    desc = {"probe": True, "np": n, "hosts": hosts, "network": net.describe(), "timings_s": timings,
            "batch_size": batch, "model_bytes": model_bytes,
            "step_ms_median": [float(np.median(s)) for s in gathered], "steps_measured": [len(s) for s in gathered]}
    from hetsync.advise.__main__ import report

    report(rows, rec, desc, args.json)
    return 0
