"""Transport: horovod's core collectives (never its broken Keras 3 layer) and mpi4py point-to-point.

Protocols send nothing except through this module, so the wire is visible in one place:

* collectives (allreduce, allgather, broadcast) go through ``horovod.tensorflow``'s core ops and
  may run inside a compiled ``tf.function``;
* point-to-point messages go through mpi4py on a communicator duplicated from ``COMM_WORLD``
  (:func:`p2p_comm`), used from communication threads; every receive has a timeout
  (:func:`recv_with_timeout`).
"""
import time

import tensorflow as tf

from . import runtime

__all__ = [
    "allreduce_mean", "allreduce_sum", "allgather", "broadcast_variables", "p2p_comm",
    "recv_with_timeout", "TransportTimeout", "max_abs_difference_across_ranks",
]


class TransportTimeout(TimeoutError):
    """A point-to-point wait exceeded its timeout."""


def _hvd():
    import horovod.tensorflow as hvd

    if not runtime.is_initialized():
        raise RuntimeError("hetsync is not initialised: call hetsync.init() before any collective")
    return hvd


def _dense(t):
    return tf.convert_to_tensor(t) if isinstance(t, tf.IndexedSlices) else t


def allreduce_mean(tensors, name=None, compression="none"):
    """Average a list of tensors over all ranks in one fused (grouped) allreduce.

    Args:
        tensors: list of float tensors (any shapes; ``tf.IndexedSlices`` are densified).
        name: optional op-name prefix.
        compression: ``"none"`` or ``"fp16"`` (horovod's FP16 wire compression).

    Returns:
        list of tensors, same shapes and dtypes: element-wise mean over ranks.

    Raises:
        ValueError: unknown compression.
        RuntimeError: hetsync is not initialised.
    """
    return _grouped(tensors, "Average", name, compression)


def allreduce_sum(tensors, name=None, compression="none"):
    """Sum a list of tensors over all ranks in one fused allreduce (see :func:`allreduce_mean`)."""
    return _grouped(tensors, "Sum", name, compression)


def _grouped(tensors, op, name, compression):
    hvd = _hvd()
    comp = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}.get(compression)
    if comp is None:
        raise ValueError(f"compression must be 'none' or 'fp16', got {compression!r}")
    tensors = [_dense(t) for t in tensors]
    if not tensors:
        return []
    if hvd.size() == 1:
        return [tf.identity(t) for t in tensors]
    return list(hvd.grouped_allreduce(tensors, op=getattr(hvd, op), compression=comp, name=name))


def allgather(tensor, name=None):
    """Concatenate ``tensor`` from every rank along axis 0 (rank order).

    Args:
        tensor: tensor of shape [d0, ...]; d0 may differ per rank, the other dims may not.

    Returns:
        tensor of shape [sum_r d0_r, ...].
    """
    hvd = _hvd()
    return hvd.allgather(tensor, name=name)


def broadcast_variables(variables, root_rank=0, name="hetsync_bcast"):
    """Overwrite every variable with its value on ``root_rank``.

    Args:
        variables: list of Keras 3 or tf variables.
        root_rank: int in [0, world size).

    Raises:
        ValueError: root_rank outside [0, world size).
    """
    hvd = _hvd()
    if not 0 <= root_rank < hvd.size():
        raise ValueError(f"root_rank must be in [0, {hvd.size()}), got {root_rank}")
    if hvd.size() == 1:
        return
    for i, v in enumerate(variables):
        v.assign(hvd.broadcast(tf.convert_to_tensor(v), root_rank, name=f"{name}_{i}"))


def max_abs_difference_across_ranks(variables, name="hetsync_weights_check"):
    """Return the largest |w_r - w_s| over all ranks r, s and all elements (float, eager).

    Used to check that BSP leaves identical weights on every rank (``weights_in_sync``).
    """
    hvd = _hvd()
    flat = tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(v), tf.float64), [-1]) for v in variables], 0)
    if hvd.size() == 1:
        return 0.0
    hi = hvd.allreduce(flat, op=hvd.Max, name=f"{name}_max")
    lo = hvd.allreduce(flat, op=hvd.Min, name=f"{name}_min")
    return float(tf.reduce_max(hi - lo).numpy())


_comm = {}


def p2p_comm():
    """Return this process's mpi4py communicator for point-to-point traffic (a Dup of COMM_WORLD).

    Raises:
        RuntimeError: launched under Gloo (no MPI) or not initialised.
    """
    runtime.require_mpi("point-to-point messaging")
    if "comm" not in _comm:
        from mpi4py import MPI

        _comm["comm"] = MPI.COMM_WORLD.Dup()
    return _comm["comm"]


def recv_with_timeout(comm, source, tag, timeout_s, what, poll_s=0.0005):
    """Receive one pickled message, failing clearly if none arrives in time.

    Args:
        comm: mpi4py communicator. source, tag: int (MPI.ANY_SOURCE / MPI.ANY_TAG allowed).
        timeout_s: float seconds (> 0). what: str naming the wait, used in the error.

    Returns:
        ``(message, status_source, status_tag)``.

    Raises:
        TransportTimeout: nothing arrived within ``timeout_s`` seconds.
    """
    from mpi4py import MPI

    status = MPI.Status()
    deadline = time.monotonic() + timeout_s
    while not comm.iprobe(source=source, tag=tag, status=status):
        if time.monotonic() > deadline:
            raise TransportTimeout(f"rank {comm.Get_rank()}: timed out after {timeout_s:g} s waiting for {what} "
                                   f"(source={source}, tag={tag})")
        time.sleep(poll_s)
    msg = comm.recv(source=status.Get_source(), tag=status.Get_tag())
    return msg, status.Get_source(), status.Get_tag()
