"""Train a Keras 3 model data-parallel with a hetsync protocol, under an injected straggler scenario.

The command line of the benchmarks' training job, :mod:`hetsync.bench.job` (``python -m hetsync.bench.job``
is the same program). Launch::

    horovodrun --mpi -np 4 .venv/bin/python examples/keras_digits.py --protocol bsp --slowdown random:6

Writes ``OUT/summary.json`` (fields: the documentation's first-run page), per-rank step records ``OUT/rank*.jsonl`` and
TensorBoard scalars ``OUT/tensorboard``. TensorFlow's start-up lines are hidden; ``--verbose`` or
``HETSYNC_VERBOSE=1`` keeps them. Your own script: see ``examples/keras_mnist_convnet.py``.
"""
import sys

import hetsync

if __name__ == "__main__":  # before TensorFlow is imported: its start-up lines stay hidden unless --verbose
    hetsync.quiet_startup(verbose="--verbose" in sys.argv[1:])

from hetsync.bench.job import build_model, main, parse_args  # noqa: E402,F401 (the job's names, for scripts and tests)

if __name__ == "__main__":
    main()
    sys.exit(0)
