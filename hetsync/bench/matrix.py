"""The benchmark matrix: protocols x scenarios x seeds, each a real ``horovodrun --mpi`` launch.

Runs are *interleaved*: for every seed, for every (ranks, data set, scenario) cell,
every protocol of the cell runs once, in an order rotated from cell to cell, so slow spells of this
shared machine hit all protocols alike. Before a cell's first runs, the solo speeds of its scenario
are measured (:func:`hetsync.bench.efficiency.measure_solo`). Every figure is then put against BSP's
run *from the same seed and cell* (ratios), and summarised over seeds by the median and the min-max
spread.

The presets run on the *emulated cluster* (scenario part ``device:MS``, see :mod:`hetsync.emulation.scenario`):
every step lasts the emulated device's time, real math inside, so 4-8 ranks sharing this machine's
two cores measure the protocol, not the scheduler. Emulated runs also get E against the *analytic*
solo speeds (b / expected step time of each rank), and a run is flagged when that E exceeds
:data:`E_FLAG` (impossible on a real cluster) or more than 1% of its steps overran their device time
(the emulation does not hold for it). A few cells without ``device`` run on the real CPU with 2 ranks,
where each rank has a core of its own.
"""
import dataclasses
import re
import json
import os
import shlex
import subprocess
import sys
import time

from hetsync.emulation import scenario as _slowdown
from hetsync.emulation.cluster.spec import ClusterSpec
from hetsync.bench import alphabeta as _alphabeta, cluster_cells as _cluster_cells, efficiency, launch, \
    progress as _progress
from hetsync.bench.record import machine_description, run_key
from hetsync.bench.results import (  # noqa: F401 - the figures' names, kept importable from here
    AGG_FIELDS, E_FLAG, METRICS, add_ratios, aggregate, analyse_run, protocol_label)

__all__ = ["Preset", "PRESETS", "Cell", "parse_cell", "twin_cell", "with_device", "plan", "E_FLAG", "run_matrix", "analyse_run", "add_ratios", "reanalyse",
           "aggregate", "machine_description", "DATASETS", "ROOT", "JOB", "dataset_argv", "missing_data"]

#: the folder holding the ``hetsync`` package (a checkout's root, or site-packages when installed).
ROOT = launch.ROOT
#: the training job every run launches.
JOB = launch.JOB
#: bench data-set name -> the job's data arguments (MNIST's folder is added by :func:`dataset_argv`).
DATASETS = {
    "digits": ["--dataset", "digits"],
    "mnist": ["--dataset", "mnist-idx"],
}
#: training samples of each bench data set (80% of 1,797 digits, 80% of the 10,000 MNIST-t10k images).
TRAIN_SAMPLES = {"digits": 1437, "mnist": 8000}
#: solo-speed runs on the real CPU train this many times the epochs of the real runs (a longer, steadier
#: measurement); on the emulated device the step time is fixed, so the same epochs suffice.
SOLO_EPOCHS_FACTOR = 2


def dataset_argv(dataset):
    """Return the training job's data arguments for a bench data set.

    MNIST's folder comes from the data setting, ``HETSYNC_DATA_DIR`` (``hetsync-bench --data-dir DIR``
    sets it), never from a path inside a checkout.

    Args:
        dataset: str, a key of :data:`DATASETS` (``"digits"`` or ``"mnist"``).

    Returns:
        list of str, e.g. ``["--dataset", "mnist-idx", "--data-dir", "/data/mnist"]``.

    Raises:
        ValueError: ``"mnist"`` while the setting names no existing folder; the message names the
            setting and how to give it.
        KeyError: ``dataset`` not a key of :data:`DATASETS`.
    """
    if dataset != "mnist":
        return list(DATASETS[dataset])
    folder = launch.mnist_dir()
    if folder is None:
        from hetsync.data import DATA_DIR_ENV, data_dir

        now = data_dir()
        state = "is not set" if now is None else f"names {now!r}, not an existing folder"
        raise ValueError(f"the mnist cells need MNIST's IDX files: pass --data-dir DIR or set {DATA_DIR_ENV} "
                         f"(the folder of the *-idx*-ubyte[.gz] files; {DATA_DIR_ENV} {state}), or run digits "
                         "cells only (--scenario digits/SPEC)")
    return DATASETS[dataset] + ["--data-dir", folder]


def missing_data(preset):
    """Check, before any launch, that every cell of ``preset`` has its data.

    Args:
        preset: :class:`Preset` whose ``cells`` are checked (with :func:`dataset_argv`).

    Returns:
        the ValueError of :func:`dataset_argv` for the first cell whose data is not there (its
        message names the missing setting), or None when every cell's data is there.

    Raises:
        nothing (the error is returned, so the caller reports it as a usage error).
    """
    for cell in preset.cells:
        try:
            dataset_argv(cell.dataset)
        except ValueError as exc:
            return exc
    return None


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (data set, scenario) pair of the matrix.

    Attributes:
        dataset: str, a key of :data:`DATASETS`. scenario: str slowdown spec.
        seeds: tuple of int, this cell's seeds, or None for the preset's.
        np: int ranks of this cell's runs, or None for the preset's.
        protocols: tuple of protocol names run in this cell (BSP is always one), or None for all.
        epochs: int epochs of this cell's runs, or None for the preset's for the data set.
        twin_of: str key of the cell whose homogeneous twin this is (:func:`twin_cell`), or None.
        cluster: :class:`hetsync.emulation.cluster.ClusterSpec` (its dilation is calibrated, not taken) to
            run every launch on the emulated multi-host cluster (:mod:`hetsync.bench.cluster_cells`), or None
            for one host. Its ranks (``cluster.np``) are the cell's ``np``.
        model: str, the job's model for this cell (:data:`hetsync.bench.job.MODELS`), or None for the preset's.

    ``protocols`` of a cluster cell are run exactly as listed (BSP only where listed) and may be variants,
    ``NAME(KEY=VALUE;...)`` (:func:`hetsync.bench.cluster_cells.parse_variant`).
    """

    dataset: str
    scenario: str
    seeds: tuple = None
    np: int = None
    protocols: tuple = None
    epochs: int = None
    twin_of: str = None
    cluster: object = None
    model: str = None

    @property
    def key(self):
        """``"[npN:]dataset/scenario[@CLUSTER][[MODEL]]"``, the cell's name in results and on the command line
        (``"...~twin"`` for a homogeneous twin, so it never meets a cell of the same scenario; CLUSTER is
        :func:`hetsync.bench.cluster_cells.cluster_label`)."""
        twin = "~twin" if self.twin_of else ""
        where = "@" + _cluster_cells.cluster_label(self.cluster) if self.cluster is not None else ""
        model = f"[{self.model}]" if self.model else ""
        return (f"np{self.np}:" if self.np else "") + f"{self.dataset}/{self.scenario}{where}{model}{twin}"

    @property
    def emulated(self):
        """True if the scenario runs on the emulated device (has a ``device:MS`` part)."""
        return _slowdown.parse_spec(self.scenario).device_ms is not None


def parse_cell(text, default_dataset="digits", seeds=None, protocols=None, epochs=None):
    """Parse ``"[npN:][DATASET/]SPEC"`` (e.g. ``"mnist/device:40+random:6"``, ``"np8:mnist/random:6"``
    or ``"speeds:1,1,1,0.5"``) into a :class:`Cell` (``seeds``: tuple of int or None for the
    preset's; ``protocols``: tuple of names or None for every protocol of the benchmark; ``epochs``:
    int or None for the preset's).

    Raises:
        ValueError: a bad ``npN`` prefix, an unknown data set (lists the known ones) or a bad
            slowdown spec.
    """
    np_ = None
    m = re.match(r"^np(\d+):", text)
    if m:
        np_ = int(m.group(1))
        if np_ < 2:
            raise ValueError(f"{text!r}: a cell needs at least 2 ranks, got np{np_}")
        text = text[m.end():]
    dataset, sep, spec = text.partition("/")
    if not sep:
        dataset, spec = default_dataset, text
    if dataset not in DATASETS:
        raise ValueError(f"unknown data set {dataset!r} in {text!r}; known: {', '.join(DATASETS)}")
    spec = _slowdown.parse_spec(spec).spec
    return Cell(dataset, spec, None if seeds is None else tuple(seeds), np_,
                None if protocols is None else tuple(protocols), epochs)


def twin_cell(preset, cell):
    """The homogeneous twin of ``cell`` (:func:`hetsync.bench.progress.homogeneous_twin`): its data set,
    ranks, seeds and epochs, BSP only, on ``device:MS`` with MS the scenario's mean step; the reference of
    the heterogeneity tax. None when ``cell`` is not emulated or already homogeneous (its twin is itself).

    Args:
        preset: :class:`Preset` (the cell's ranks and the batch size). cell: :class:`Cell`.

    Returns:
        :class:`Cell` with ``twin_of=cell.key``, or None.
    """
    if not cell.emulated or cell.twin_of:
        return None
    spec = _slowdown.parse_spec(_progress.homogeneous_twin(cell.scenario, preset.cell_np(cell),
                                                          preset.batch_size)).spec
    if spec == _slowdown.parse_spec(cell.scenario).spec:
        return None
    return dataclasses.replace(cell, scenario=spec, protocols=("bsp",), twin_of=cell.key)


def with_device(cell, device_ms):
    """Return ``cell`` on the emulated device of ``device_ms`` milliseconds per step (a ``device:MS``
    part prepended to its scenario), or unchanged if it has one already or ``device_ms`` is 0/None.

    Raises:
        ValueError: ``device_ms`` negative or not finite.
    """
    if device_ms is None or device_ms == 0 or cell.emulated:
        return cell
    spec = f"device:{device_ms:g}" + ("" if cell.scenario == "none" else "+" + cell.scenario)
    return dataclasses.replace(cell, scenario=_slowdown.parse_spec(spec).spec)


@dataclasses.dataclass(frozen=True)
class Preset:
    """Settings of a benchmark.

    Attributes:
        name: str. np: int, ranks per run (a cell's own ``np`` overrides it). cells: tuple of
        :class:`Cell`. seeds: tuple of int. epochs: dict data set -> int epochs. batch_size: int,
        per-rank samples per step. lr: float SGD learning rate. momentum: float SGD momentum in [0, 1) of
        the wrapped optimizer (every protocol's). target: dict data set -> float
        target test accuracy. model: "mlp" or "cnn". timeout_s: float seconds allowed per launch.
        evals: int, test evaluations per run (``--eval-every`` is set so that a run of the cell's
        ranks evaluates about this often; 0: once per epoch).
        twins: bool, also run BSP on every emulated heterogeneous cell's homogeneous twin
        (:func:`twin_cell`), for the heterogeneity tax.
    """

    name: str
    np: int
    cells: tuple
    seeds: tuple
    epochs: dict
    batch_size: int = 32
    lr: float = 0.2
    momentum: float = 0.0
    target: dict = dataclasses.field(default_factory=lambda: {"digits": 0.9, "mnist": 0.9})
    model: str = "mlp"
    timeout_s: float = 600.0
    evals: int = 0
    twins: bool = False

    def cell_np(self, cell):
        """Ranks of ``cell``'s runs (int)."""
        return cell.np or self.np

    def cell_epochs(self, cell):
        """Epochs of ``cell``'s runs (int)."""
        return cell.epochs or self.epochs[cell.dataset]

    def eval_every(self, cell):
        """``--eval-every`` steps for ``cell`` (int), or None for once per epoch."""
        if not self.evals:
            return None
        steps_per_epoch = TRAIN_SAMPLES[cell.dataset] // (self.cell_np(cell) * self.batch_size)
        return max(1, steps_per_epoch * self.cell_epochs(cell) // self.evals)

    def job_argv(self, cell, epochs_factor=1, eval_every=None):
        """The training job's arguments shared by every run of ``cell`` (list of str); the solo
        runs pass ``epochs_factor`` = :data:`SOLO_EPOCHS_FACTOR` to measure over more steps."""
        dataset = cell.dataset
        return [*JOB] + dataset_argv(dataset) + [
            "--model", cell.model or self.model, "--epochs", str(self.cell_epochs(cell) * epochs_factor),
            "--batch-size", str(self.batch_size),
            "--lr", repr(self.lr), "--target-accuracy", repr(self.target[dataset])] + (
            ["--eval-every", str(eval_every)] if eval_every else []) + (
            ["--momentum", repr(self.momentum)] if self.momentum else [])

    def cell_seeds(self, cell):
        """The seeds ``cell`` runs with (tuple of int)."""
        return self.seeds if cell.seeds is None else cell.seeds

    def validate(self):
        """Check every cell against ``np`` before anything runs.

        Raises:
            ValueError: np < 2, no seeds or cells, or a scenario that does not fit np ranks.
        """
        if self.np < 2 or any(c.np is not None and c.np < 2 for c in self.cells):
            raise ValueError(f"the benchmark needs at least 2 ranks, got np={self.np}")
        if not self.seeds or not self.cells or any(not self.cell_seeds(c) for c in self.cells):
            raise ValueError("the benchmark needs at least one seed and one scenario, and every scenario a seed")
        if len({c.key for c in self.cells}) != len(self.cells):
            raise ValueError(f"scenario listed twice in {[c.key for c in self.cells]}")
        for c in self.cells:
            try:
                _slowdown.parse_spec(c.scenario).validate(self.cell_np(c))
            except ValueError as exc:
                raise ValueError(f"scenario {c.key} does not fit {self.cell_np(c)} ranks: {exc}") from None
            if c.cluster is not None:
                _cluster_cells.device_only(c.scenario)
                if c.cluster.np != self.cell_np(c):
                    raise ValueError(f"cell {c.key}: its cluster runs {c.cluster.np} ranks, the cell {self.cell_np(c)}")
                for p in c.protocols or ():
                    _cluster_cells.parse_variant(p)
            if c.epochs is None and c.dataset not in self.epochs:
                raise ValueError(f"preset {self.name!r} has no epoch count for data set {c.dataset!r}")


# The report (``make bench``): the emulated cluster (device:40, 40 ms per 32-sample step) in every cell
# but the real-CPU ones, which run 2 ranks so each rank has a core of its own. The headline cells
# (RNA's random:6 on MNIST with 4 and 8 ranks) get 3 seeds for the median and range; the others one.
# Each scenario of the papers appears, plus the no-heterogeneity cell (time per step against
# BSP's) and netdelay:50 (SelSync's slow network). Task allocation's own comparison against equal
# allocation lives in examples/benchmarks/taskalloc_bench.py.
_FULL_CELLS = (
    parse_cell("np4:mnist/device:40+random:6", seeds=(0, 1, 2), epochs=5),
    parse_cell("np8:mnist/device:40+random:6", seeds=(0, 1, 2), protocols=("rna",), epochs=8),
    parse_cell("np4:digits/device:40"),
    parse_cell("np4:digits/device:40+netdelay:50"),
    parse_cell("np4:digits/device:40+speeds:1,1,1,0.5", protocols=("rna", "taskalloc")),
    parse_cell("np4:digits/device:40+deterministic:3:4", protocols=("rna", "selsync", "localsgd", "fedavg")),
    parse_cell("np8:mnist/device:40+speeds:1,1,1,1,1,1,0.5,0.25", protocols=("taskalloc",), epochs=4),
    parse_cell("np2:digits/random:6", protocols=("rna",)),
    parse_cell("np2:digits/none", protocols=("rna",)),
)

# The emulated multi-host cluster (``--preset cluster``): 8 ranks on hosts of their own joined by shaped links,
# the wide MLP (1.86M parameters, 7.5 MB of gradients a step on MNIST; 1.13M on digits), device:10 (10 ms
# per 32-sample step), D calibrated per cell. Headline: RNA against BSP on 4 hosts x 2 at 10 Gbit/s under
# random:6, RNA in the main job's setting (the samples rule, each step waiting for its round). Hierarchical
# RNA grouped by host against flat RNA on a mixed network (h2's link 4x slower) with 6 workers on 3 hosts and
# the 2 servers on hosts of their own. Layer-wise against memory-wise sharding with 2 servers on 1 Gbit/s links
# (layer-wise puts 1,115,136 of the 1,126,410 parameters on one server), on fixed equal shares: on the sample
# pool the claims wait behind the servers' megabyte messages on the shaped links, inside the emulated device
# window (21-34% of the steps overran at every D from 40 to 160; none on the shard plan).
_CLUSTER_4X2 = ClusterSpec(hosts=4, slots=2, link="10gbit")
_SERVERS_APART = (("h3", 1), ("h4", 1))
_CLUSTER_CELLS = (
    Cell("mnist", "device:10+random:6", seeds=(0, 1, 2), np=8, epochs=2, cluster=_CLUSTER_4X2, model="wide",
         protocols=("bsp", "rna(update_rule=samples;wait_for_round=true)")),
    Cell("mnist", "device:10+random:6", seeds=(0, 1, 2), np=8, protocols=("rna", "rnah(groups=host;servers=2)"),
         epochs=2, cluster=ClusterSpec(hosts=5, slots=2, link="10gbit", host_slots=_SERVERS_APART,
                                       host_links=(("h2", "2.5gbit"),)), model="wide"),
    Cell("digits", "device:10", seeds=(0, 1, 2), np=8, epochs=2,
         protocols=tuple(f"shat(sharding={s};servers=2;data_plan=shard)" for s in ("layer", "memory")),
         cluster=ClusterSpec(hosts=5, slots=2, link="1gbit", host_slots=_SERVERS_APART), model="wide"),
)

# The full matrix on the emulated multi-host cluster (``--preset cluster-full``, resumable with ``--resume``): every
# protocol on 8 ranks, 10 Gbit/s links, the wide MLP on MNIST, under random:6 and under a fixed speed mix (two
# ranks at half and quarter speed, among the first six so that they are workers in every cell). Collective and
# peer-to-peer protocols on 4 hosts x 2; the parameter servers and hierarchical RNA on 6 workers (3 hosts x 2)
# with their 2 servers on hosts of their own; each group against BSP on its own hosts. Plus the mixed network and
# sharding cells of the headline preset.
_FULL_MIX = "device:10+speeds:1,1,1,1,0.5,0.25,1,1"
_PEER_PROTOCOLS = ("bsp", "rna", "hop", "hop(backup_workers=1)", "hop(staleness=2)", "hop(skip=2)", "notifyack",
                   "localsgd", "fedavg", "selsync", "taskalloc(mode=adaptive)")
_SERVER_PROTOCOLS = ("bsp", "asp(servers=2)", "shat(servers=2)", "shatroot(servers=2)", "ensemble(servers=2)",
                     "ssp(servers=2)", "rnah(groups=host;servers=2)")
_CLUSTER_SERVERS = ClusterSpec(hosts=5, slots=2, link="10gbit", host_slots=_SERVERS_APART)
_CLUSTER_FULL_CELLS = tuple(
    Cell("mnist", spec, seeds=(0, 1, 2), np=8, protocols=protos, epochs=2, cluster=cluster, model="wide")
    for spec in ("device:10+random:6", _FULL_MIX)
    for protos, cluster in ((_PEER_PROTOCOLS, _CLUSTER_4X2), (_SERVER_PROTOCOLS, _CLUSTER_SERVERS))) + \
    _CLUSTER_CELLS[1:]

#: rough cost on a quiet 2-core machine, for the ``--dry-run`` estimate (seconds per launch, per solo).
LAUNCH_ESTIMATE_S, SOLO_ESTIMATE_S = 45.0, 40.0

#: the named presets. ``quick``: a smoke check on the emulated cluster (about 5 min with every
#: protocol); ``full``: the documentation's results report; ``cluster``: the emulated multi-host cluster's headline
#: cells (about 80 min); ``cluster-full``: every protocol there (hours: resumable, ``--resume``, ``--time-cap-min``).
PRESETS = {
    "quick": Preset("quick", np=4, cells=(parse_cell("digits/device:30+random:6"),), seeds=(0,),
                    epochs={"digits": 6, "mnist": 2}, target={"digits": 0.85, "mnist": 0.85}),
    "full": Preset("full", np=4, cells=_FULL_CELLS, seeds=(0,), epochs={"digits": 20, "mnist": 5},
                   target={"digits": 0.95, "mnist": 0.9}, evals=24),
    "cluster": Preset("cluster", np=8, cells=_CLUSTER_CELLS, seeds=(0, 1, 2), epochs={"digits": 2, "mnist": 2},
                      target={"digits": 0.85, "mnist": 0.85}, evals=12, timeout_s=1200.0),
    "cluster-full": Preset("cluster-full", np=8, cells=_CLUSTER_FULL_CELLS, seeds=(0, 1, 2),
                           epochs={"digits": 2, "mnist": 2}, target={"digits": 0.85, "mnist": 0.85}, evals=12,
                           timeout_s=1200.0),
}


def plan(preset, protocols):
    """The interleaved run order.

    Args:
        preset: :class:`Preset`. protocols: list of protocol names (BSP first is not required).

    Returns:
        list of ``(seed, cell, protocol)``: for each seed, for each cell that has this seed, every
        protocol once (only BSP and the cell's own ``protocols`` where it names some); the protocol
        order is rotated by one from cell to cell. With ``preset.twins``, BSP on the cell's
        homogeneous twin (:func:`twin_cell`) follows the cell's runs.
    """
    order, k = [], 0
    for seed in sorted({s for c in preset.cells for s in preset.cell_seeds(c)}):
        for cell in [c for c in preset.cells if seed in preset.cell_seeds(c)]:
            if cell.cluster is not None:  # exactly the cell's list, variants included
                mine = [p for p in cell.protocols or protocols if _cluster_cells.parse_variant(p)[0] in protocols]
            else:
                mine = [p for p in protocols if cell.protocols is None or p == "bsp" or p in cell.protocols]
            if not mine:  # every protocol of the cell filtered out
                continue
            rot = k % len(mine)
            order += [(seed, cell, p) for p in mine[rot:] + mine[:rot]]
            k += 1
            twin = twin_cell(preset, cell) if preset.twins else None
            if twin is not None:
                order.append((seed, twin, "bsp"))
    return order


def _env():
    return launch.job_env(stall_shutdown_s=120)


def launch_command(preset, seed, cell, protocol, out, protocol_args=(), dilation=None):
    """The launch (list of str) of one run: ``horovodrun --mpi`` on this machine, or, for a cluster cell,
    ``hetsync-cluster run`` at time dilation ``dilation`` (float >= 1) around ``horovodrun -H {hosts}``
    (the cluster's record goes to ``out/`` :data:`hetsync.bench.launch.CLUSTER_RECORD`). ``protocol`` may be
    a variant ``NAME(KEY=VALUE;...)``; its arguments come before ``protocol_args``."""
    name, own = _cluster_cells.parse_variant(protocol)
    argv = preset.job_argv(cell, eval_every=preset.eval_every(cell)) + [
        "--protocol", name, "--slowdown", cell.scenario, "--seed", str(seed), "--out", out, "--quiet"] \
        + launch.protocol_args(tuple(own) + tuple(protocol_args))
    if cell.cluster is not None:
        return _cluster_cells.launch_command(_cluster_cells.with_dilation(cell.cluster, dilation or 1.0), argv,
                                             os.path.join(out, launch.CLUSTER_RECORD), preset.timeout_s)
    return launch.horovodrun(preset.cell_np(cell), argv)



def reanalyse(results, out_dir):
    """Recompute every figure of ``results`` from the run folders on disk, in place, and return it.

    Solo speeds are re-read from ``out_dir/solo/<cell>/rank*`` where those folders exist. Runs whose
    folder is gone keep their stored figures.
    """
    for cell, solo in results["solo"].items():
        folder = os.path.join(out_dir, "solo", _slug(cell))
        n = len(solo.get("samples_per_s", ()))
        if n and all(os.path.isfile(os.path.join(folder, f"rank{r}", "summary.json")) for r in range(n)):
            rates = [efficiency.run_rates(os.path.join(folder, f"rank{r}")) for r in range(n)]
            solo["samples_per_s"] = [rt["samples_per_s"] for rt in rates]
            solo["steps_per_s"] = [rt["steps_per_s"] for rt in rates]
            solo["bsp_expected_e"] = efficiency.bsp_expected_efficiency(solo["samples_per_s"])
    for r in results["runs"]:
        if r["status"] == "ok" and os.path.isfile(os.path.join(r["out"], "summary.json")):
            r.update(analyse_run(r["out"], results["solo"][r["cell"]]))
    add_ratios(results["runs"])
    results["aggregate"] = aggregate(results["runs"])
    return results


def run_matrix(preset, protocols, out_dir, protocol_args=None, progress=True, log=print, resume=None,
               time_cap_s=None):
    """Run the whole matrix and return the results dict (also written to ``out_dir/results.json``, after every
    run as well, so an interrupted matrix keeps what it measured).

    Args:
        preset: :class:`Preset` (validated here). protocols: list of protocol names; must contain
            "bsp" (the reference of every ratio). out_dir: str output folder.
        protocol_args: dict protocol -> list of ``"KEY=VALUE"`` (passed as ``--protocol-arg``).
        progress: bool, show a tqdm bar. log: callable(str) for messages.
        resume: dict from :func:`hetsync.bench.record.load_resume` or None: its ``ok`` runs are kept, not
            launched, and its cluster cells' calibrations and solo speeds are reused.
        time_cap_s: float seconds or None: start no new run after this long (the runs left are counted).

    Returns:
        dict with ``preset``, ``protocols``, ``machine``, ``command``, ``solo`` (cell -> solo dict),
        ``runs`` (list of per-run dicts), ``aggregate`` (see :func:`aggregate`), ``wall_s``, ``cells``
        (cluster cell -> its calibration), ``resumed`` (runs taken from ``resume``) and ``left`` (runs not
        started: the time cap).

    A failed run or solo measurement is recorded (``status``/``error``) and logged; the matrix goes on.

    Raises:
        ValueError: bad preset, or "bsp" missing from ``protocols``.
    """
    from tqdm import tqdm

    preset.validate()
    if "bsp" not in protocols:
        raise ValueError(f"the protocol list must include 'bsp' (every ratio is against it), got {protocols}")
    protocol_args = protocol_args or {}
    os.makedirs(out_dir, exist_ok=True)
    order = plan(preset, list(protocols))
    t0 = time.time()
    results = {"preset": _preset_dict(preset), "protocols": list(protocols), "machine": machine_description(),
               "command": " ".join(shlex.quote(a) for a in ["hetsync-bench"] + sys.argv[1:]),
               "solo": {}, "runs": []}
    bar = tqdm(total=len(order) + len(preset.cells), desc=f"hetsync-bench {preset.name}", unit="launch",
               disable=not progress, file=sys.stderr)
    cluster_cache = {}
    resume = resume or {"runs": {}, "cells": {}, "solo": {}}
    results.update(resumed=0, left=0)
    keys = {c.key for c in preset.cells}
    # a resumed cell keeps its calibration (D, comm_fraction, alpha-beta) and solo speeds: no second calibration
    results["cells"] = {k: v for k, v in resume["cells"].items() if k in keys}
    results["solo"].update({k: v for k, v in resume["solo"].items() if k in keys})
    try:
        for seed, cell, proto in order:
            done = resume["runs"].get(run_key(seed, cell.key, proto))
            if done is not None:
                results["runs"].append(dict(done))
                results["resumed"] += 1
                bar.update(1)
                continue
            if time_cap_s is not None and time.time() - t0 > time_cap_s:
                results["left"] += 1
                continue
            if cell.cluster is not None and cell.key not in results["cells"]:
                bar.set_postfix_str(f"calibration {cell.key}")
                results["cells"][cell.key] = _cluster_cells.prepare(
                    cell, preset.job_argv(cell), os.path.join(out_dir, "cells", _slug(cell.key)), cluster_cache,
                    timeout_s=preset.timeout_s, log=log)
            if cell.cluster is not None and cell.key not in results["solo"]:
                results["solo"][cell.key] = {"error": "not measured on the emulated cluster: E against the devices' "
                                                      "analytic speeds only"}
            if cell.key not in results["solo"] and cell.twin_of:
                results["solo"][cell.key] = {"error": "not measured: a homogeneous twin (the tax's reference)"}
            if cell.key not in results["solo"]:
                bar.set_postfix_str(f"solo speeds {cell.key}")
                solo_dir = os.path.join(out_dir, "solo", _slug(cell.key))
                try:
                    results["solo"][cell.key] = efficiency.measure_solo(
                        preset.job_argv(cell, 1 if cell.emulated else SOLO_EPOCHS_FACTOR), cell.scenario,
                        preset.cell_np(cell),
                        solo_dir, env=_env(), timeout_s=preset.timeout_s)
                except (efficiency.SoloError, OSError, ValueError) as exc:
                    # keep going: the cell's runs still give every figure but E (reported as missing)
                    results["solo"][cell.key] = {"error": str(exc)[-3000:]}
                    log(f"solo measurement FAILED for {cell.key} (E will be missing): {str(exc)[:500]}")
                bar.update(1)
            bar.set_postfix_str(f"seed {seed} {cell.key} {proto}")
            run_dir = os.path.join(out_dir, "runs", f"seed{seed}", _slug(cell.key), proto)
            results["runs"].append(_one_run(preset, seed, cell, proto, run_dir,
                                            protocol_args.get(_cluster_cells.parse_variant(proto)[0], ()),
                                            results["solo"][cell.key], log, results["cells"].get(cell.key)))
            bar.update(1)
            with open(os.path.join(out_dir, "results.json"), "w") as f:  # what is measured so far
                json.dump(results, f, indent=1, sort_keys=True, default=str)
    finally:
        bar.close()
    add_ratios(results["runs"])
    results["aggregate"] = aggregate(results["runs"])
    results["wall_s"] = time.time() - t0
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    return results


def _one_run(preset, seed, cell, proto, run_dir, proto_args, solo, log, prepared=None):
    dilation = None
    if prepared is not None:
        dilation = prepared["dilation"] or max(_cluster_cells.CANDIDATES)
    cmd = launch_command(preset, seed, cell, proto, run_dir, proto_args, dilation=dilation)
    rec = {"protocol": proto, "seed": seed, "cell": cell.key, "dataset": cell.dataset, "scenario": cell.scenario,
           "np": preset.cell_np(cell), "out": run_dir, "twin_of": cell.twin_of, "command": " ".join(shlex.quote(a) for a in cmd)}
    if prepared is not None:
        rec.update(comm_fraction=prepared.get("comm_fraction"), calibrated=prepared["dilation"] is not None,
                   cluster_label=_cluster_cells.cluster_label(cell.cluster), model=cell.model or preset.model)
    os.makedirs(run_dir, exist_ok=True)
    t = time.time()
    try:
        # a cluster launch ends itself at the preset's timeout (its --timeout) and tears the hosts down
        proc = launch.run(cmd, preset.timeout_s + (60.0 if cell.cluster is not None else 0.0), stall_shutdown_s=120)
        output = proc.stdout + proc.stderr
        failed = f"exited {proc.returncode}" if proc.returncode != 0 else None
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        failed = f"timed out after {preset.timeout_s:.0f} s"
    rec["launch_s"] = time.time() - t
    with open(os.path.join(run_dir, "launch.log"), "w") as f:
        f.write(rec["command"] + "\n" + output)
    if failed is None:
        try:
            rec.update(analyse_run(run_dir, solo))
            if prepared is not None:
                rec["protocol_label"] = proto
                if (prepared.get("alphabeta") or {}).get("fit"):
                    name, vargs = _cluster_cells.parse_variant(proto)
                    args = dict(kv.split("=", 1) for kv in (*proto_args, *vargs))
                    rec.update(_alphabeta.model_figures(prepared["alphabeta"], _cluster_cells.with_dilation(
                        cell.cluster, dilation), name, args, run_dir, rec.get("efficiency_analytic")))
        except (OSError, ValueError, KeyError, IndexError) as exc:
            failed = f"unusable output: {type(exc).__name__}: {exc}"
    rec["status"] = "ok" if failed is None else "failed"
    if failed:
        rec["error"] = f"{failed}; see {os.path.join(run_dir, 'launch.log')}\n{output[-1500:]}"
        log(f"run FAILED: {proto} seed {seed} {cell.key}: {failed} (log: {run_dir}/launch.log)")
    return rec


def _slug(text):
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def _preset_dict(preset):
    d = dataclasses.asdict(preset)
    d["cells"] = [c.key for c in preset.cells]
    d["cell_np"] = {c.key: preset.cell_np(c) for c in preset.cells}
    d["cell_protocols"] = {c.key: list(c.protocols) if c.protocols else None for c in preset.cells}
    d["cell_cluster"] = {c.key: (dataclasses.asdict(c.cluster) if c.cluster is not None else None) for c in preset.cells}
    d["cell_seeds"] = {c.key: list(preset.cell_seeds(c)) for c in preset.cells}
    d["seeds"] = sorted({s for c in preset.cells for s in preset.cell_seeds(c)})
    return d
