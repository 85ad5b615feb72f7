"""BSP: bulk-synchronous data parallelism, averaged allreduce of the gradients every step.

The baseline every protocol is measured against: what horovod's ``DistributedOptimizer`` does on
Keras 2 (one fused allreduce of all gradients, divided by the world size n), written for Keras 3.
Update: w_{k+1} = w_k - gamma * (1/n) sum_i g_i(w_k).
"""
import dataclasses
import typing

import tensorflow as tf

from hetsync import transport
from hetsync.core.protocol import Capabilities, Protocol, present_gradients, scatter_gradients
from hetsync.core.config import ProtocolConfig, param
from hetsync.core.wrapper import protocol_wrapper

__all__ = ["BSP", "BSPProtocol", "BSPConfig"]


@dataclasses.dataclass(frozen=True)
class BSPConfig(ProtocolConfig):
    """BSP's parameters (see :func:`BSP`)."""

    owner: typing.ClassVar[str] = "BSP"

    compression: typing.Literal["none", "fp16"] = param(
        "none", "``\"none\"`` or ``\"fp16\"``: horovod's FP16 wire compression of the allreduce.")


class BSPProtocol(Protocol):
    """Averaged allreduce of every gradient, every step (see :func:`BSP`)."""

    name = "bsp"
    display_name = "BSP"
    Config = BSPConfig

    #: the gradient allreduce carries every rank's non-finite flag: all ranks stop together.
    capabilities = Capabilities(nonfinite_in_collective=True)

    def transform(self, grads, variables):
        """Return (1/n) sum_i g_i for every present gradient (one fused allreduce, timed by
        :meth:`hetsync.core.protocol.Protocol.synchronize`). The allreduce also carries the [n]
        non-finite flags (:meth:`~hetsync.core.protocol.Protocol.nonfinite_flags`); a set flag
        stops every rank before the update, naming the rank."""
        present, dense = present_gradients(grads)
        out = self.synchronize(
            lambda ts: transport.allreduce_mean(ts, name="hetsync_bsp", compression=self.cfg.compression),
            dense + [self.nonfinite_flags(self._step_bad)])
        with tf.control_dependencies([self.check_nonfinite_flags(out[-1], "the gradient allreduce")]):
            reduced = [tf.identity(t) for t in out[:-1]]
        return scatter_gradients(grads, present, reduced)

    def stop(self):
        """End of training: average the model's non-trainable float state (BatchNormalization's
        moving statistics, which every rank updates from its own batches) once over the ranks, so
        every rank ends with the same full model; the trainable parameters are identical already
        and are left untouched.

        Raises:
            hetsync.core.protocol.NonFiniteError: some rank's state is not finite (on every rank).
        """
        super().stop()
        if self.state_variables:
            self.average_at_train_end(trainable=False)


BSP = protocol_wrapper(BSPProtocol, """Wrap a Keras 3 optimizer for bulk-synchronous training (averaged allreduce each step).

    Every step, each rank's gradients g_i (float tensors, one per trainable variable, any shape)
    are averaged over the n ranks in one fused horovod ``grouped_allreduce`` and the wrapped
    optimizer applies (1/n) sum_i g_i. Use with
    :class:`hetsync.callbacks.BroadcastInitialVariables` so all ranks start equal; they then stay
    equal.

    Args:
        optimizer: a Keras 3 optimizer instance, e.g. ``keras.optimizers.SGD(0.1)``.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``BSP_<optimizer class>``, a subclass of the given one).

    Raises:
        TypeError: ``optimizer`` is not a Keras 3 optimizer instance, or an unknown argument.
        ValueError: unknown ``compression``.
        RuntimeError: :func:`hetsync.init` was not called.
    """)
