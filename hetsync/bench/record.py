"""What a benchmark records about itself: the machine it ran on, and the runs a later invocation resumes from.

A matrix of launches on this 2-core machine can outlast one sitting (the full cluster matrix takes hours), and
its run folders are build outputs that do not outlive the checkout. So ``hetsync-bench --resume DOC`` takes an
earlier document of the same preset (its ``results.json``, or the summary ``--update-docs`` writes under
``docs/results/``, which keeps every run's figures): the runs it records as ``ok`` are kept as they are and not
launched again, and so are its cluster cells' calibrations (D, ``comm_fraction``, the alpha-beta fit) and solo
speeds, so the resumed runs are measured under the same cell settings. ``--time-cap-min`` stops starting new
runs after that many minutes; the results say how many were left (``left``). Free of TensorFlow.
"""
import datetime
import json
import os
import platform

__all__ = ["machine_description", "load_resume", "run_key", "compact_run", "RUN_FIELDS_DROPPED"]

#: fields of a run record a summary leaves out (launch details and long texts; the figures stay).
RUN_FIELDS_DROPPED = ("command", "out", "error", "cluster", "stats")


def machine_description():
    """dict describing this machine and software (CPU model, cores, memory, OS, versions, load)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    versions = {}
    for mod in ("tensorflow", "keras", "horovod", "mpi4py"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 - report, never fail the benchmark over a version string
            versions[mod] = f"unavailable ({type(exc).__name__})"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "os": platform.platform(),
            "python": platform.python_version(), "versions": versions,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def run_key(seed, cell, protocol):
    """The identity of one run across invocations: ``(int seed, str cell key, str protocol or variant)``."""
    return int(seed), str(cell), str(protocol)


def compact_run(run):
    """A run record without :data:`RUN_FIELDS_DROPPED` (dict), small enough for a committed summary and
    complete enough to resume from and to recompute the ratios, the medians and the pairs."""
    return {k: v for k, v in run.items() if k not in RUN_FIELDS_DROPPED}


def load_resume(path, preset_name):
    """Read the document a benchmark resumes from.

    Args:
        path: str, a ``results.json`` of ``hetsync-bench`` or its summary under ``docs/results/``.
        preset_name: str, the preset of this invocation (the document must be of the same one).

    Returns:
        dict: ``runs`` (``run_key -> record`` of the runs recorded ``ok``), ``cells`` (cell key -> the cluster
        cell's calibration dict), ``solo`` (cell key -> solo speeds dict).

    Raises:
        ValueError: the document is of another preset (names both), records no runs, or is not JSON.
        OSError: the file cannot be read.
    """
    with open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not a JSON document: {exc}") from exc
    name = doc.get("preset", {}).get("name") if isinstance(doc.get("preset"), dict) else doc.get("preset")
    if name != preset_name:
        raise ValueError(f"{path} holds a run of preset {name!r}, this invocation runs {preset_name!r}")
    if not doc.get("runs"):
        raise ValueError(f"{path} records no runs (a summary written before runs were kept in it?)")
    runs = {run_key(r["seed"], r["cell"], r["protocol"]): r for r in doc["runs"] if r.get("status") == "ok"}
    return {"runs": runs, "cells": dict(doc.get("cells") or {}), "solo": dict(doc.get("solo") or {})}
