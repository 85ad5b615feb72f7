"""The training job (hetsync.bench.job) with a test-only fault: rank R SIGKILLs itself right after its global step K.

``HETSYNC_TEST_KILL=R:K`` (read only by this script) arms it; without it the run is the plain job.
The kill comes after the step's callbacks that precede it (BackupAndRestore has saved if due), the
way a crash between two steps would. Also writes ``OUT/final_weights_rank{r}.npz`` (the final model)
so a test can compare an interrupted run with an uninterrupted one.
"""
import os
import signal
import sys

import keras
import numpy as np

import hetsync
from hetsync.bench import job


class KillAt(keras.callbacks.Callback):
    """SIGKILL this process after global step ``step`` (1-based, counted over epochs) on rank ``rank``."""

    def __init__(self, rank, step):
        super().__init__()
        self.rank, self.step, self.epoch = rank, step, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if hetsync.rank() == self.rank and self.epoch * self.params["steps"] + batch + 1 == self.step:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


class SaveFinal(keras.callbacks.Callback):
    def __init__(self, out):
        super().__init__()
        self.out = out

    def on_train_end(self, logs=None):
        np.savez(os.path.join(self.out, f"final_weights_rank{hetsync.rank()}.npz"),
                 *[v.numpy() for v in self.model.variables])


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = argv[argv.index("--out") + 1]
    extra = [SaveFinal(out)]
    spec = os.environ.get("HETSYNC_TEST_KILL")
    if spec:
        r, k = (int(v) for v in spec.split(":"))
        extra.insert(0, KillAt(r, k))
    job.main(argv, extra_callbacks=extra)
