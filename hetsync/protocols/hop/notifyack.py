"""NOTIFY-ACK: the conservative decentralized baseline of Hop's section 3.3 (Kadav and Kruus' ASAP).

The serial approach of Figure 2(a): Compute -> Apply -> Send -> Recv -> Reduce. After its Reduce of
iteration k a worker sends ACK(k) to every in-neighbour; a worker does not Send(k) before it holds
ACK(k-1) from every out-neighbour. ``docs/protocols/hop.md``: an ACK is a token released
at the end of the receiver's Reduce, so NOTIFY-ACK is token queues with one initial token (ACK(-1))
and early release; the gap bounds are -2 <= Iter(u) - Iter(v) <= 1 for v in N_in(u) (Table 1).

It reuses Hop's queues, channels and end (:class:`hetsync.protocols.hop.protocol.HopProtocol`): the
compiled step only computes and applies the gradient; the Send, Recv, Reduce and the ACKs run
between steps (Hop's ``on_train_batch_end`` hook calls :meth:`NotifyAckProtocol.leave_iteration`).
"""
import dataclasses
import time
import typing

import numpy as np
import tensorflow as tf

from hetsync import ops
from hetsync.core.config import ProtocolConfig, param
from hetsync.protocols.hop.protocol import TOKEN, UPDATE, HopError, HopProtocol, hop_graph
from hetsync.core.wrapper import protocol_wrapper

__all__ = ["NotifyAck", "NotifyAckProtocol", "NotifyAckConfig"]


@dataclasses.dataclass(frozen=True)
class NotifyAckConfig(ProtocolConfig):
    """NOTIFY-ACK's parameters (see :func:`NotifyAck`)."""

    owner: typing.ClassVar[str] = "NotifyAck"

    graph: str = param("ring", "str, the communication graph (as :func:`hetsync.Hop`'s ``graph``).")
    average_at_end: bool = param(True, "bool, average the parameters once when training ends.")
    timeout_s: float = param(120.0, "float seconds (> 0): the longest wait for an update, an ACK or the other "
                                    "ranks at the end.", gt=0, unit="seconds")

    def validate(self):
        try:
            hop_graph.check_syntax(self.graph)
        except ValueError as exc:
            raise ValueError(f"NotifyAck: {exc}") from None


class NotifyAckProtocol(HopProtocol):
    """Serial decentralized training with acknowledgements (see :func:`NotifyAck`)."""

    name = "notifyack"
    display_name = "NotifyAck"
    Config = NotifyAckConfig

    def num_slots(self):
        """Update-queue slots (int): 3, since an in-neighbour is at most 2 iterations ahead (Table 1)."""
        return 3

    def initial_tokens(self):
        """ACKs each out-neighbour's counter starts with (int): 1, the implicit ACK(-1)."""
        return 1

    def enter_iteration(self):
        """Nothing to send before the step: the serial approach sends after Apply."""
        self._k.assign(self.iteration)

    def apply(self, grads, variables, local_apply):
        """Compute and Apply only (the wrapped optimizer's step); the exchange follows the step."""
        self._stats["hop_iteration"].assign(tf.cast(self._k, tf.float64))
        return local_apply(grads, variables)

    def leave_iteration(self):
        """Wait for ACK(k-1) of every out-neighbour, Send x', Recv the |N_in| updates of k, Reduce, ACK(k).

        Returns:
            bool, True once the last iteration is done.

        Raises:
            HopError: an ACK or an update did not arrive within ``timeout_s`` (names the rank awaited).
        """
        k = self.iteration
        self._local["steps"] += 1
        t0 = time.perf_counter()
        for t, j in enumerate(self.out_neighbours):
            try:
                ops.hop_token_take(self._tokens, t, count=1, timeout_ms=self._timeout_ms)
            except tf.errors.DeadlineExceededError:
                raise HopError(f"rank {self.rank}: no ACK({k - 1}) from out-neighbour rank {j} within "
                               f"{self.cfg.timeout_s:g} s") from None
        t1 = time.perf_counter()
        arrays = [v.numpy() for v in self._vars]
        self.check_finite_arrays(arrays, "parameters", k)  # never sent
        for j in self.out_neighbours:
            self._p2p.send(j, UPDATE, arrays, tag=k)
            self._local["sends"] += 1
        ops.hop_update_queue_enqueue(self._queue, arrays, k, self.rank)
        try:
            values, _, _ = ops.hop_update_queue_dequeue(self._queue, self.graph.n_in(self.rank), iteration=k,
                                                        timeout_ms=self._timeout_ms)
        except tf.errors.DeadlineExceededError as exc:
            raise HopError(f"rank {self.rank}: the updates of iteration {k} from in-neighbours "
                           f"{self.in_neighbours} did not all arrive within {self.cfg.timeout_s:g} s: {exc.message}") \
                from None
        for v, stacked in zip(self._vars, values):
            v.assign(np.mean(stacked.numpy(), axis=0))
        for j in self.in_neighbours:
            self._p2p.send(j, TOKEN, (1, k))  # ACK(k)
        t2 = time.perf_counter()
        self._local["token_wait_ms"] += (t1 - t0) * 1e3
        self._stats["hop_token_wait_ms"].assign((t1 - t0) * 1e3)
        self._stats["hop_update_wait_ms"].assign((t2 - t1) * 1e3)
        self._stats["hop_update_wait_total_ms"].assign_add((t2 - t1) * 1e3)
        self._stats["hop_updates_reduced"].assign(float(self.graph.n_in(self.rank)))
        self._stats["syncs"].assign_add(1.0)
        self.iteration = k + 1
        return self.iteration >= self.total_iterations


NotifyAck = protocol_wrapper(NotifyAckProtocol, """Wrap a Keras 3 optimizer for NOTIFY-ACK, Hop's conservative decentralized baseline (section 3.3).

    Each step computes and applies the local gradient, then sends the parameters to the
    out-neighbours once every out-neighbour acknowledged the previous ones, waits for all
    in-neighbours' parameters of the same iteration, takes the mean (eq. 1) and acknowledges them.
    Needs an MPI launch and :func:`hetsync.callbacks.standard`. Parameters must be float32.

    Args:
        optimizer: a Keras 3 optimizer instance.
        {args}

    Returns:
        keras.optimizers.Optimizer (class ``NotifyAck_<optimizer class>``).

    Raises:
        TypeError: not a Keras 3 optimizer, or an unknown argument.
        ValueError: an unknown graph or one that does not exist for the world size, a bad timeout.
        RuntimeError: hetsync not initialised, or launched under Gloo.
    """)
