"""Soak test: many randomized short runs, reporting hangs, errors and lost samples.

``python -m hetsync.bench.soak --runs 50 --seed 0 --out runs/soak [--timeout-s 240] [--ranks 2,3,4]``

Each run is drawn from ``--seed`` (so a soak is reproducible): a protocol from the registry
:data:`hetsync.protocols.WRAPPERS` (parameter-server protocols and hierarchical RNA only on launches
with room for their servers and at least two workers), a rank count from ``--ranks``, a straggler
scenario (``none``, ``random:K``, ``deterministic:R:K``, ``uniform:A:B``, ``speeds:...``,
``device:MS+random:K``) or, when :mod:`hetsync.emulation.scenario` knows them, a fault (``pause:RANK:AT_S:FOR_S``,
``stall:RANK:AT_S:FOR_S``: 0.5-1.5 s after the rank's train begin, for 2-5 s, on a device-emulated run
so that training lasts long enough for the fault to land; a stall never hits a parameter server), a seed and 1-2 epochs. Every run is a real ``mpirun`` launch of
``python -m hetsync.bench.job`` on the ``digits`` data set, in its own process group, with a wall-clock
limit: a run over it is a **hang** (the whole group is killed, SIGKILL); a non-zero exit status, or
a run that wrote no ``summary.json``, is an **error**; **lost samples** compare the samples the worker
ranks trained on in each epoch (from :class:`hetsync.callbacks.SyncMetrics`' ``rank{r}.jsonl``: steps
x samples per step) against what the run's data plan promises:

* the run's own report, when its ``summary.json`` has ``expected_samples_per_epoch`` (top level, or in
  ``data_plan`` / ``stats``): the pool data plan reports N (every sample once per epoch);
* else, for protocols with their own data plan (task allocation, SelSync), the plan's per-rank
  samples that SyncMetrics reports (``per_rank[r]["samples"]`` / epochs);
* else the fixed share: every worker trains ``floor(floor(N / workers) / b) * b`` samples per epoch
  (:func:`hetsync.data.shard` and the full-batch sampler of ``Protocol.fit_data``).

Lost = sum over epochs of max(0, expected - trained); samples trained beyond the plan are reported
as ``extra`` (repeated samples). Output in ``--out``: ``results.jsonl`` (one JSON object per run,
written as runs finish), ``summary.json`` (the command, the totals, the soak's wall time), ``runs/NNN/`` (each run's SyncMetrics output and ``launch.log``) and the
table on stdout. Exit status 1 if any run hung, failed or lost samples, else 0.

The machine's cores are shared: give ``--timeout-s`` room (a 4-rank run of two epochs takes 20-60 s
on two busy cores; the default limit is 240 s per run).
"""
import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time

from tabulate import tabulate

from hetsync.bench import launch

__all__ = ["draw_runs", "command", "launch_run", "lost_samples", "fault_kinds", "run_soak", "table", "totals",
           "totals_line", "main", "JOB", "ROOT", "BATCH_SIZE", "FAULT_DEVICE_MS", "REAP_S", "OWN_PLAN"]

#: repository root (the folder holding ``examples/``).
ROOT = launch.ROOT
#: the training job every run launches.
JOB = launch.JOB
#: per-rank batch size of every run (samples).
BATCH_SIZE = 16
#: emulated device time per step (ms) of the runs that carry a fault, so that training lasts a few seconds.
FAULT_DEVICE_MS = 100
#: seconds granted to reap a killed run's process group.
REAP_S = 30.0


def _servers(name):
    """Default number of parameter-server ranks of protocol ``name`` (its config field ``servers``; 0 if none)."""
    from hetsync import protocols

    field = getattr(protocols.get_config_class(name), "__dataclass_fields__", {}).get("servers")
    return 0 if field is None else int(field.default)


def _protocol_min_ranks(name):
    """Smallest launch for protocol ``name``: its servers plus two workers."""
    return _servers(name) + 2


def fault_kinds(world_size=2):
    """Fault parts :mod:`hetsync.emulation.scenario` accepts (subset of ``("pause", "stall")``), found by parsing them.

    Args:
        world_size: int, the world size to validate the probe specs against.
    """
    from hetsync.emulation import scenario as slowdown

    kinds = []
    for kind in ("pause", "stall"):
        try:
            slowdown.parse_spec(f"{kind}:0:1:2").validate(world_size)
            kinds.append(kind)
        except (ValueError, AttributeError, TypeError):
            pass
    return kinds


def _scenario(rng, n, faults, servers=0):
    kinds = ["none", "random", "deterministic", "uniform", "speeds", "device"] + list(faults) * 2
    kind = rng.choice(kinds)
    if kind == "random":
        return f"random:{rng.choice([2, 4, 6])}"
    if kind == "deterministic":
        return f"deterministic:{rng.randrange(n)}:{rng.choice([2, 4])}"
    if kind == "uniform":
        return f"uniform:0:{rng.choice([10, 30, 50])}"
    if kind == "speeds":
        return "speeds:" + ",".join(str(rng.choice([1, 1, 0.5])) for _ in range(n))
    if kind == "device":
        return f"device:{rng.choice([20, 40])}+random:{rng.choice([2, 4])}"
    if kind in faults:
        at, dur = rng.choice([0.5, 1, 1.5]), rng.choice([2, 3, 4, 5])
        # a stall sleeps the training thread: a parameter server (the last ranks) has none to stall
        rank = rng.randrange(n - servers if kind == "stall" else n)
        return f"device:{FAULT_DEVICE_MS}+{kind}:{rank}:{at:g}:{dur}"
    return "none"


def draw_runs(count, seed, ranks=(2, 3, 4), protocols=None, faults=None, epochs=(1, 2)):
    """Draw ``count`` runs (reproducible from ``seed``).

    Args:
        count: int >= 1. seed: int. ranks: allowed world sizes (ints >= 2).
        protocols: names to draw from (default: every registered protocol).
        faults: fault kinds to include (default: :func:`fault_kinds`). epochs: allowed epoch counts.

    Returns:
        list of dicts ``{"index", "protocol", "np", "scenario", "seed", "epochs"}``.

    Raises:
        ValueError: a bad count, rank count, unknown protocol, or no protocol fits the rank counts.
    """
    from hetsync import protocols as registry

    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"runs must be an int >= 1, got {count!r}")
    ranks = sorted(set(ranks))
    if not ranks or any(not isinstance(r, int) or r < 2 for r in ranks):
        raise ValueError(f"ranks must be ints >= 2 (a soak needs peers), got {ranks!r}")
    names = sorted(registry.WRAPPERS) if protocols is None else list(protocols)
    for p in names:
        registry.get_wrapper(p)  # ValueError naming the unknown protocol
    fits = {p: [r for r in ranks if r >= _protocol_min_ranks(p)] for p in names}
    names = [p for p in names if fits[p]]
    if not names:
        raise ValueError(f"no protocol can run on {ranks} ranks")
    faults = fault_kinds() if faults is None else list(faults)
    rng = random.Random(seed)
    runs = []
    for i in range(count):
        p = rng.choice(names)
        n = rng.choice(fits[p])
        runs.append({"index": i, "protocol": p, "np": n, "scenario": _scenario(rng, n, faults, _servers(p)),
                     "seed": rng.randrange(1000), "epochs": rng.choice(list(epochs))})
    return runs


def command(run, out):
    """The ``mpirun`` command (list of str) of one drawn run writing to folder ``out``."""
    return launch.mpirun(run["np"], [*JOB, "--protocol", run["protocol"], "--slowdown", run["scenario"],
            "--seed", str(run["seed"]), "--epochs", str(run["epochs"]), "--batch-size", str(BATCH_SIZE),
            "--dataset", "digits", "--out", out, "--quiet"])


def launch_run(run, out, timeout_s):
    """Launch one run in its own process group; kill the group (SIGKILL) after ``timeout_s`` seconds.

    Args:
        run: dict from :func:`draw_runs`. out: str folder (created). timeout_s: float seconds > 0.

    Returns:
        dict: ``status`` ("ok", "hang" or "error"), ``returncode``, ``pid`` (of mpirun, also the process
        group id), ``wall_s``, ``error`` (str or None), ``command``; the run's output is in
        ``out/launch.log``.
    """
    os.makedirs(out, exist_ok=True)
    cmd = command(run, out)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=launch.job_env(stall_shutdown_s=120), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    hung = False
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        hung = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            output, _ = proc.communicate(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            output = f"(the killed process group {proc.pid} did not exit within {REAP_S:g} s)"
    wall = time.monotonic() - t0
    with open(os.path.join(out, "launch.log"), "w") as f:
        f.write(" ".join(shlex.quote(a) for a in cmd) + "\n" + (output or ""))
    rec = {"returncode": proc.returncode, "pid": proc.pid, "wall_s": round(wall, 1), "command": " ".join(shlex.quote(a) for a in cmd),
           "error": None}
    if hung:
        rec.update(status="hang", error=f"no exit within {timeout_s:g} s; process group killed")
    elif proc.returncode != 0:
        tail = [ln for ln in (output or "").splitlines() if ln.strip()][-3:]
        rec.update(status="error", error=f"exit status {proc.returncode}: " + " | ".join(tail)[-600:])
    elif not os.path.isfile(os.path.join(out, "summary.json")):
        rec.update(status="error", error="exit status 0 but no summary.json")
    else:
        rec["status"] = "ok"
    return rec


_N_TRAIN = {}


def _n_train(dataset, seed):
    if (dataset, seed) not in _N_TRAIN:
        from hetsync.data import datasets as data

        _N_TRAIN[(dataset, seed)] = len(data.load(dataset, seed=seed).x_train)
    return _N_TRAIN[(dataset, seed)]


def _reported_expectation(summary):
    for where in (summary, summary.get("data_plan") or {}, summary.get("stats") or {}):
        if isinstance(where, dict) and where.get("expected_samples_per_epoch") is not None:
            return int(where["expected_samples_per_epoch"]), "reported by the run"
    pool = (summary.get("stats") or {}).get("pool")
    if isinstance(pool, dict) and pool.get("n") is not None:  # the sample pool: every sample once per epoch
        return int(pool["n"]), "the sample pool (N per epoch)"
    return None


#: protocols whose ``fit_data`` is their own data plan (the fixed-share formula does not apply).
OWN_PLAN = ("taskalloc", "selsync")


def lost_samples(out):
    """Compare the samples each epoch's worker ranks trained on with the run's data plan.

    Args:
        out: str, the run's output folder (``summary.json`` and ``rank{r}.jsonl``).

    Returns:
        dict: ``trained`` (list, per epoch, samples summed over worker ranks), ``expected`` (list, per
        epoch), ``lost`` and ``extra`` (ints, summed over epochs), ``basis`` (str, where the expectation
        came from), ``faults_fired`` (int, the faults the run's summary reports as fired; None if it
        reports none).

    Raises:
        OSError / ValueError / KeyError: missing or malformed outputs.
    """
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    epochs, b = int(s["epochs"]), int(s["batch_size"])
    workers = [row["rank"] for row in s["per_rank"] if row.get("role", "worker") == "worker"]
    trained = [0] * epochs
    for r in workers:
        with open(os.path.join(out, f"rank{r}.jsonl")) as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                per_step = rec["samples"] if s["protocol"] == "taskalloc" and "samples" in rec else b
                e = int(rec["epoch"])
                if 0 <= e < epochs:
                    trained[e] += int(round(per_step)) * int(rec.get("steps_in_call", 1))
                else:
                    raise ValueError(f"{out}/rank{r}.jsonl: a step of epoch {e}, but the run had {epochs} epochs")
    pool = (s.get("stats") or {}).get("pool")
    if isinstance(pool, dict) and pool.get("epochs"):
        # the sample pool: batches differ in size (the epoch's last holds N mod b more), so the samples
        # trained come from the pool's confirmations; the ranks' step records must match its batch count
        steps = [0] * epochs
        for r in workers:
            with open(os.path.join(out, f"rank{r}.jsonl")) as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        steps[int(rec["epoch"])] += int(rec.get("steps_in_call", 1))
        trained = [0] * epochs
        for e in pool["epochs"]:
            k = int(e["epoch"])
            if 0 <= k < epochs:
                batches = sum(int(v) for v in e.get("per_rank_batches", {}).values())
                confirmed = sum(int(v) for v in e.get("per_rank_samples", {}).values())
                # a batch handed out but never stepped on counts as lost (b samples each)
                trained[k] = confirmed - max(0, batches - steps[k]) * b - int(e.get("unconfirmed", 0))
    reported = _reported_expectation(s)
    if reported is not None:
        per_epoch, basis = reported
    elif s["protocol"] in OWN_PLAN:
        per_epoch = sum(int(row["samples"]) for row in s["per_rank"] if row["rank"] in workers) // max(1, epochs)
        basis = "the protocol's own plan (SyncMetrics per_rank samples)"
    else:
        share = _n_train(s.get("dataset", "digits"), int(s.get("seed", 0))) // len(workers)
        per_epoch = len(workers) * (share // b) * b
        basis = f"fixed share: {len(workers)} workers x floor({share}/{b})*{b}"
    faults = s.get("faults")
    fired = len(faults) if isinstance(faults, list) else None
    expected = [per_epoch] * epochs
    lost = sum(max(0, e - t) for e, t in zip(expected, trained))
    extra = sum(max(0, t - e) for e, t in zip(expected, trained))
    return {"trained": trained, "expected": expected, "lost": lost, "extra": extra, "basis": basis,
            "faults_fired": fired}


def run_soak(runs, out_dir, timeout_s, log=print):
    """Launch every run of ``runs`` in turn, each in ``out_dir/runs/NNN``.

    Args:
        runs: list of dicts from :func:`draw_runs`. out_dir: str folder (created).
        timeout_s: float seconds > 0, each run's wall-clock limit. log: callable(str), one line per run.

    Returns:
        list of dicts, one per run: the drawn fields, :func:`launch_run`'s and :func:`lost_samples`'
        fields, and ``status`` ("ok", "hang", "error" or "lost"). Each is also written to
        ``out_dir/results.jsonl`` as soon as its run ends.
    """
    os.makedirs(out_dir, exist_ok=True)
    results = []
    with open(os.path.join(out_dir, "results.jsonl"), "w") as f:
        for run in runs:
            folder = os.path.join(out_dir, "runs", f"{run['index']:03d}")
            rec = dict(run, out=folder, lost=None, extra=None)
            rec.update(launch_run(run, folder, timeout_s))
            if rec["status"] == "ok":
                try:
                    rec.update(lost_samples(folder))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    rec.update(status="error", error=f"unusable output: {type(exc).__name__}: {exc}")
            if rec["status"] == "ok" and rec["lost"]:
                rec["status"] = "lost"
            results.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            log(f"[{run['index'] + 1}/{len(runs)}] {run['protocol']} np={run['np']} {run['scenario']} "
                f"seed={run['seed']} epochs={run['epochs']}: {rec['status']} ({rec['wall_s']} s)"
                + (f" lost={rec['lost']} extra={rec['extra']}" if rec.get("lost") is not None else "")
                + (f" -- {rec['error']}" if rec.get("error") else ""))
    return results


def table(results):
    """The per-run table (tabulate: protocol, ranks, scenario, seed, epochs, status, wall s, lost, extra,
    faults fired) followed by :func:`totals_line` (str), for ``results`` from :func:`run_soak`."""
    def dash(v):
        return "-" if v is None else v

    rows = [[r["index"], r["protocol"], r["np"], r["scenario"], r["seed"], r["epochs"], r["status"], r["wall_s"],
             dash(r.get("lost")), dash(r.get("extra")), dash(r.get("faults_fired"))] for r in results]
    text = tabulate(rows, headers=["#", "protocol", "ranks", "scenario", "seed", "epochs", "status", "wall s", "lost",
                                   "extra", "faults fired"])
    return text + "\n\n" + totals_line(results)


def totals(results):
    """Count ``results`` (from :func:`run_soak`): ``{"runs", "hangs", "errors", "lost_runs", "lost_samples",
    "extra_samples"}`` (ints; samples summed over runs)."""
    return {"runs": len(results), "hangs": sum(r["status"] == "hang" for r in results),
            "errors": sum(r["status"] == "error" for r in results),
            "lost_runs": sum(r["status"] == "lost" for r in results),
            "lost_samples": sum(r.get("lost") or 0 for r in results),
            "extra_samples": sum(r.get("extra") or 0 for r in results)}


def totals_line(results):
    """One line of totals (str): runs, hangs, errors, lost samples (and the runs losing them), extra samples."""
    t = totals(results)
    return (f"{t['runs']} runs: {t['hangs']} hangs, {t['errors']} errors, {t['lost_samples']} lost samples "
            f"(in {t['lost_runs']} runs), {t['extra_samples']} samples beyond the plan")


def _int_list(text):
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def main(argv=None):
    """Entry point (see the module docstring). Returns the exit code (0: no hang, error or loss)."""
    p = argparse.ArgumentParser(prog="python -m hetsync.bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50, help="number of randomized runs (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws")
    p.add_argument("--out", default=os.path.join("runs", "soak"), help="output folder")
    p.add_argument("--timeout-s", type=float, default=240.0, help="wall-clock limit per run; over it: a hang")
    p.add_argument("--ranks", type=_int_list, default=[2, 3, 4], help="allowed rank counts, e.g. 2,3,4")
    p.add_argument("--epochs", type=_int_list, default=[1, 2], help="allowed epoch counts, e.g. 1,2")
    p.add_argument("--protocols", default=None, help="comma-separated protocol names (default: all registered)")
    p.add_argument("--no-faults", action="store_true", help="leave pause/stall faults out of the draws")
    p.add_argument("--dry-run", action="store_true", help="print the drawn runs and exit")
    args = p.parse_args(argv)
    if args.timeout_s <= 0:
        p.error(f"--timeout-s must be > 0 seconds, got {args.timeout_s}")
    try:
        runs = draw_runs(args.runs, args.seed, ranks=args.ranks, epochs=args.epochs,
                         protocols=None if args.protocols is None else args.protocols.split(","),
                         faults=[] if args.no_faults else None)
    except ValueError as exc:
        p.error(str(exc))
    if args.dry_run:
        print(tabulate([[r["index"], r["protocol"], r["np"], r["scenario"], r["seed"], r["epochs"]] for r in runs],
                       headers=["#", "protocol", "ranks", "scenario", "seed", "epochs"]))
        return 0
    t0 = time.monotonic()
    results = run_soak(runs, args.out, args.timeout_s)
    print(table(results))
    t = totals(results)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"command": " ".join(shlex.quote(a) for a in ["python", "-m", "hetsync.bench.soak"] + list(
            sys.argv[1:] if argv is None else argv)), "timeout_s": args.timeout_s, "totals": t,
            "wall_s": round(time.monotonic() - t0, 1)}, f, indent=2)
    return 1 if t["hangs"] or t["errors"] or t["lost_runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
