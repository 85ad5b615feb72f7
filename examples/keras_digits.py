"""Train a Keras 3 model data-parallel with a hetsync protocol, under an injected straggler scenario.

The command line of the benchmarks' training job, :mod:`hetsync.bench.job` (``python -m hetsync.bench.job``
is the same program). Launch::

    horovodrun --mpi -np 4 .venv/bin/python examples/keras_digits.py --protocol bsp --slowdown random:6

Writes ``OUT/summary.json`` (see README), per-rank step records ``OUT/rank*.jsonl`` and
TensorBoard scalars ``OUT/tensorboard``. Your own script: see ``examples/keras_mnist_convnet.py``.
"""
import sys

from hetsync.bench.job import build_model, main, parse_args  # noqa: F401 (the job's names, for scripts and tests)

if __name__ == "__main__":
    main()
    sys.exit(0)
