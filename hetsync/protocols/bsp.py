"""BSP: bulk-synchronous data parallelism, averaged allreduce of the gradients every step.

The baseline every protocol is measured against: what horovod's ``DistributedOptimizer`` does on
Keras 2 (one fused allreduce of all gradients, divided by the world size n), written for Keras 3.
Update: w_{k+1} = w_k - gamma * (1/n) sum_i g_i(w_k).
"""
from .. import transport
from .base import Protocol, wrap

__all__ = ["BSP", "BSPProtocol"]


class BSPProtocol(Protocol):
    """Averaged allreduce of every gradient, every step (see :func:`BSP`)."""

    name = "bsp"

    def __init__(self, compression="none"):
        super().__init__()
        if compression not in ("none", "fp16"):
            raise ValueError(f"BSP: compression must be 'none' or 'fp16', got {compression!r}")
        self.compression = compression

    def config(self):
        return {"compression": self.compression}

    def transform(self, grads, variables):
        present = [i for i, g in enumerate(grads) if g is not None]
        reduced = self.synchronize(
            lambda ts: transport.allreduce_mean(ts, name="hetsync_bsp", compression=self.compression),
            [grads[i] for i in present],
        )
        out = list(grads)
        for i, g in zip(present, reduced):
            out[i] = g
        return out


def BSP(optimizer, compression="none"):
    """Wrap a Keras 3 optimizer for bulk-synchronous training (averaged allreduce each step).

    Every step, each rank's gradients g_i (float tensors, one per trainable variable, any shape)
    are averaged over the n ranks in one fused horovod ``grouped_allreduce`` and the wrapped
    optimizer applies (1/n) sum_i g_i. Use with
    :class:`hetsync.callbacks.BroadcastInitialVariables` so all ranks start equal; they then stay
    equal.

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)``.
        compression: ``"none"`` (default) or ``"fp16"``: horovod's FP16 wire compression.

    Returns:
        keras.optimizers.Optimizer (a subclass of the given optimizer's class).

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance.
        ValueError: unknown ``compression``.
        RuntimeError: :func:`hetsync.init` was not called.
    """
    return wrap(optimizer, BSPProtocol(compression=compression))
