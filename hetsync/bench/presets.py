"""The benchmark's presets: the cells (ranks, data set, scenario, cluster) each named preset measures, and how a
cell or a preset is described on the command line (``--cell``, ``--preset``).

:mod:`hetsync.bench.matrix` runs them; its names for these (``matrix.Preset``, ``matrix.PRESETS``, ...) stay
importable from there.
"""
import dataclasses
import re

from hetsync.emulation import scenario as _slowdown
from hetsync.emulation.cluster.spec import ClusterSpec
from hetsync.bench import cluster_cells as _cluster_cells, launch, progress as _progress

__all__ = ["ROOT", "JOB", "DATASETS", "TRAIN_SAMPLES", "SOLO_EPOCHS_FACTOR", "dataset_argv", "missing_data", "Cell",
           "parse_cell", "twin_cell", "with_device", "Preset", "PRESETS", "LAUNCH_ESTIMATE_S", "SOLO_ESTIMATE_S"]

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
# random:6, RNA on the samples rule with a pipelined wait (each step waits for the round of the step before it,
# wait_lag=1: a round's 7.5 MB allreduce takes longer than a 10 ms step here, and the main job's wait for the
# step's own round would add it to every step). Hierarchical
# RNA grouped by host against flat RNA on a mixed network (h2's link 4x slower) with 6 workers on 3 hosts and
# the 2 servers on hosts of their own; its servers add the groups' progress (server_rule=delta: the average of
# 3 groups' models moved the model a third as far per step and never reached the target). Layer-wise against
# memory-wise sharding with 2 servers on 1 Gbit/s links
# (layer-wise puts 1,115,136 of the 1,126,410 parameters on one server), on fixed equal shares: on the sample
# pool the claims wait behind the servers' megabyte messages on the shaped links, inside the emulated device
# window (21-34% of the steps overran at every D from 40 to 160; none on the shard plan).
_CLUSTER_4X2 = ClusterSpec(hosts=4, slots=2, link="10gbit")
_SERVERS_APART = (("h3", 1), ("h4", 1))
_CLUSTER_CELLS = (
    Cell("mnist", "device:10+random:6", seeds=(0, 1, 2), np=8, epochs=2, cluster=_CLUSTER_4X2, model="wide",
         protocols=("bsp", "rna(update_rule=samples;wait_for_round=true;wait_lag=1)")),
    Cell("mnist", "device:10+random:6", seeds=(0, 1, 2), np=8,
         protocols=("rna", "rnah(groups=host;servers=2;server_rule=delta)"),
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
                     "ssp(servers=2)", "rnah(groups=host;servers=2;server_rule=delta)")
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
