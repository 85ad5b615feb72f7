"""Collectives over all ranks through horovod's core ops (never its Keras layer, broken on Keras 3).

Every function here is a thin wrapper in the style of horovod's ``mpi_ops.py``: it names the
shapes and dtypes it takes and returns and the errors it raises, and runs eagerly or inside a
compiled ``tf.function`` (:func:`allgather_object` eagerly only). Under a world of one rank the
tensor collectives return their input.
"""
import tensorflow as tf

from hetsync import world

__all__ = ["allreduce_mean", "allreduce_sum", "allgather", "allgather_object", "broadcast_variables",
           "max_abs_difference_across_ranks"]


def _hvd():
    import horovod.tensorflow as hvd

    if not world.is_initialized():
        raise RuntimeError("hetsync is not initialised: call hetsync.init() before any collective")
    return hvd


def _dense(t):
    return tf.convert_to_tensor(t) if isinstance(t, tf.IndexedSlices) else t


def allreduce_mean(tensors, name=None, compression="none"):
    """Average a list of tensors over all ranks in one fused (grouped) allreduce.

    Args:
        tensors: list of float tensors (any shapes; ``tf.IndexedSlices`` are densified).
        name: optional op-name prefix (str), the same on every rank.
        compression: ``"none"`` or ``"fp16"`` (horovod's FP16 wire compression).

    Returns:
        list of tensors, same shapes and dtypes: element-wise mean over ranks.

    Raises:
        ValueError: unknown compression.
        RuntimeError: hetsync is not initialised.
    """
    return _grouped(tensors, "Average", name, compression)


def allreduce_sum(tensors, name=None, compression="none"):
    """Sum a list of tensors over all ranks in one fused allreduce.

    Args and raises: as :func:`allreduce_mean`. Returns the element-wise sums (same shapes, dtypes).
    """
    return _grouped(tensors, "Sum", name, compression)


def allreduce_max(tensors, name=None):
    """Element-wise maximum of a list of tensors over all ranks in one grouped allreduce.

    One collective of fixed shape and no pickling, where :func:`allgather_object` pickles and makes two
    (4 ms against 1.8 ms for a scalar at 4 idle ranks on a 2-core machine): the drift measure
    (:meth:`hetsync.core.averaging.Averaging.parameter_drift`) gathers its maximum with it.

    Args:
        tensors: list of numeric tensors (any shapes), the same shapes on every rank.
        name: optional op-name prefix (str), the same on every rank.

    Returns:
        list of tensors, same shapes and dtypes: element-wise maximum over ranks.

    Raises:
        RuntimeError: hetsync is not initialised.
    """
    return _grouped(tensors, "Max", name, "none")


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
        name: optional op name (str), the same on every rank.

    Returns:
        tensor of shape [sum_r d0_r, ...].

    Raises:
        RuntimeError: hetsync is not initialised.
    """
    hvd = _hvd()
    return hvd.allgather(tensor, name=name)


def allgather_object(obj, name):
    """Gather one picklable Python object from every rank, in rank order (eager, every rank calls it).

    The helper for every cross-rank statistics exchange (end-of-run totals, per-epoch measurements,
    drift): each rank passes a dict (or any picklable value) and every rank gets the list of all of
    them, so no code depends on the position of a value in a float row. Implemented by horovod's
    ``allgather_object`` (cloudpickle, two allgathers: the sizes, then the bytes), so it works under
    MPI, Gloo and a world of one rank.

    Args:
        obj: any picklable object (typically a dict of numbers, lists and strings).
        name: str, the collective's name, the same on every rank (distinct per call site).

    Returns:
        list of ``size()`` objects, element r from rank r.

    Raises:
        ValueError: ``name`` is not a non-empty string.
        RuntimeError: hetsync is not initialised, or called inside a ``tf.function`` (it needs the
            gathered bytes on the host).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"allgather_object needs a non-empty str name (the same on every rank), got {name!r}")
    hvd = _hvd()
    if not tf.executing_eagerly():
        raise RuntimeError(f"allgather_object({name!r}) runs eagerly only, not inside a tf.function")
    return list(hvd.allgather_object(obj, name=name))


def broadcast_variables(variables, root_rank=0, name="hetsync_bcast"):
    """Overwrite every variable with its value on ``root_rank``.

    Args:
        variables: list of Keras 3 or tf variables (any shapes and dtypes).
        root_rank: int in [0, world size).
        name: op-name prefix (str).

    Raises:
        ValueError: root_rank outside [0, world size).
        RuntimeError: hetsync is not initialised.
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

    Args:
        variables: list of variables or tensors (any shapes), the same list on every rank.
        name: op-name prefix (str).

    Returns:
        float >= 0 (0.0 under a world of one rank).

    Raises:
        RuntimeError: hetsync is not initialised.
    """
    hvd = _hvd()
    flat = tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(v), tf.float64), [-1]) for v in variables], 0)
    if hvd.size() == 1:
        return 0.0
    hi = hvd.allreduce(flat, op=hvd.Max, name=f"{name}_max")
    lo = hvd.allreduce(flat, op=hvd.Min, name=f"{name}_min")
    return float(tf.reduce_max(hi - lo).numpy())
