"""Start one solo-speed process after a file barrier: ``python -m hetsync.bench.solo DIR N R TIMEOUT JOB ARGS...``.

The n solo processes of :func:`hetsync.bench.efficiency.measure_solo` each import TensorFlow and
hetsync first (the slow part, seconds of CPU each), then create ``DIR/ready.R`` and wait until all
n ``ready`` files exist, and only then run the training job ``JOB`` (a script, or ``-m MODULE``) with ``ARGS`` (as
``__main__``). So the n ranks train at the same time and share the cores as in a real run, instead
of one training while the others are still importing.

Exits with status 3 and a message if the other processes are not ready within TIMEOUT seconds.
"""
import os
import runpy
import sys
import time

__all__ = ["barrier", "main"]


def barrier(folder, world_size, rank, timeout_s, poll_s=0.02):
    """Mark ``rank`` ready in ``folder`` and wait until ``world_size`` ranks are.

    Args:
        folder: str, a folder shared by the processes (created). world_size: int n.
        rank: int in [0, n). timeout_s: float seconds. poll_s: float seconds between checks.

    Raises:
        TimeoutError: not every rank was ready within ``timeout_s`` (names the missing ones).
    """
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"ready.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world_size) if not os.path.exists(os.path.join(folder, f"ready.{r}"))]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"solo barrier in {folder}: ranks {missing} not ready after {timeout_s} s")
        time.sleep(poll_s)


def main(argv=None):
    """Entry point (see the module docstring). Returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 5:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    folder, n, r, timeout_s, job = argv[0], int(argv[1]), int(argv[2]), float(argv[3]), argv[4]
    import hetsync  # noqa: F401  (TensorFlow, Keras, horovod: imported before the barrier)
    import keras  # noqa: F401

    try:
        barrier(folder, n, r, timeout_s)
    except TimeoutError as exc:
        print(exc, file=sys.stderr)
        return 3
    if job == "-m":  # JOB given as interpreter arguments: -m MODULE (hetsync.bench.job)
        if len(argv) < 6:
            print("solo: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = [argv[5]] + argv[6:]
        runpy.run_module(argv[5], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = [job] + argv[5:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(job)))
    runpy.run_path(job, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
