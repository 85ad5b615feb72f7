"""Local SGD: every rank steps on its own gradients; the parameters are averaged every H steps.

The baseline family of the SelSync paper (section II, "FedAvg / local SGD"): between
synchronizations no byte crosses the network; a synchronization is one averaged allreduce of the
parameters w = (1/N) sum_n w_n (parameter aggregation, section III-C).
"""
import dataclasses
import typing

import tensorflow as tf

from hetsync.core.config import ProtocolConfig, param
from hetsync.protocols.local.periodic import PeriodicAveragingProtocol, outer_param
from hetsync.core.wrapper import protocol_wrapper

__all__ = ["LocalSGD", "LocalSGDProtocol", "LocalSGDConfig"]


@dataclasses.dataclass(frozen=True)
class LocalSGDConfig(ProtocolConfig):
    """Local SGD's parameters (see :func:`LocalSGD`)."""

    owner: typing.ClassVar[str] = "LocalSGD"

    period: int = param(8, "int H >= 1, local steps between averagings; H = 1 is parameter-averaging BSP.",
                        label="period H", ge=1, unit="steps between averagings")
    average_at_end: bool = param(
        True, "bool, average the parameters once when training ends "
              "(:meth:`hetsync.core.protocol.Protocol.average_at_train_end`), so every rank holds the same final "
              "model even if the last step was local.")
    data_plan: typing.Literal["pool", "shard"] = param(
        "pool", "str, how ``fit_data`` feeds the ranks: ``\"pool\"`` (default; work conservation: each "
                "epoch is a pool of the N samples served by rank 0, faster ranks draw more batches, every sample "
                "once per epoch; the epoch's floor(B / (H n)) averaging rounds (B = N // b batches, n ranks) are "
                "scheduled by the pool's global progress, :mod:`hetsync.protocols.local.periodic`) or ``\"shard\"`` (a "
                "fixed equal share per rank, an average after every H-th local step).")
    outer_lr: float = outer_param("lr")
    outer_momentum: float = outer_param("momentum")
    outer_nesterov: bool = outer_param("nesterov")


class LocalSGDProtocol(PeriodicAveragingProtocol):
    """Average the parameters after every H-th local step (see :func:`LocalSGD`)."""

    name = "localsgd"
    display_name = "LocalSGD"
    Config = LocalSGDConfig

    def should_sync(self, step):
        """True after steps H, 2H, ... (``step`` 0-based)."""
        return tf.equal((step + 1) % self.cfg.period, 0)

    def pool_rounds(self, epoch, batches, ranks):
        """Rounds per pool epoch: floor(B / (H n)) for B batches and n ranks (the same mean number of local
        steps between averages as the fixed shares' H)."""
        return int(batches) // (self.cfg.period * int(ranks))


LocalSGD = protocol_wrapper(LocalSGDProtocol, """Wrap a Keras 3 optimizer for local SGD with periodic parameter averaging.

    Each step every rank applies its own gradients; after steps H, 2H, 3H, ... (counted from 1)
    the parameters are averaged over all N ranks, w <- (1/N) sum_n w_n, in one fused allreduce,
    so the ranks are identical right after. With ``outer_lr`` or ``outer_momentum`` set, each average
    is followed by the outer optimizer's step (DiLoCo, :mod:`hetsync.protocols.local.periodic`).
    Optimizer slots (momentum) stay local. Statistics:
    ``sync``, ``sync_steps``, ``local_steps``, ``lssr`` (= 1 - 1/H), ``bytes_sent``, and with
    ``average_at_end`` the drift before the final average (``drift_before_final_average``).

    Args:
        optimizer: a Keras 3 optimizer instance.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``LocalSGD_<optimizer class>``).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument. ValueError: bad period or
        average_at_end. RuntimeError: not initialised.
    """)
