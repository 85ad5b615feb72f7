"""Gradient-list helpers shared by the step and the protocols (TensorFlow, no state).

A step's gradients are a list aligned with the trainable variables, with None where a variable got
no gradient and ``tf.IndexedSlices`` for sparse ones; collectives want the dense, present ones.
"""
import tensorflow as tf

__all__ = ["loss_scaling", "all_finite", "present_gradients", "scatter_gradients", "payload_bytes"]


def loss_scaling(optimizer):
    """Return True if ``optimizer`` is a Keras ``LossScaleOptimizer`` (dynamic loss scaling: overflowing
    steps are expected, skipped and the scale halved).

    Args:
        optimizer: a Keras optimizer or None.
    """
    import keras

    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def all_finite(tensors):
    """Return a bool scalar tensor: every element of every tensor in ``tensors`` is finite.

    Args:
        tensors: list of float tensors or ``tf.IndexedSlices`` (their values are checked); may be empty (True).
    """
    checks = [tf.reduce_all(tf.math.is_finite(t.values if isinstance(t, tf.IndexedSlices) else t))
              for t in tensors if t is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def present_gradients(grads):
    """Gather the gradients that exist: ``(indices, dense)``.

    Args:
        grads: list of gradient tensors, ``tf.IndexedSlices`` or None (one per variable).

    Returns:
        ``(indices, dense)``: list of the int positions of the non-None gradients and the list of
        those gradients as dense tensors (IndexedSlices converted), same order.
    """
    indices = [i for i, g in enumerate(grads) if g is not None]
    return indices, [tf.convert_to_tensor(grads[i]) for i in indices]


def scatter_gradients(grads, indices, values):
    """Put ``values`` back at ``indices`` of a copy of ``grads`` (the inverse of :func:`present_gradients`).

    Args:
        grads: list (length n). indices: list of int positions. values: list, same length as indices.

    Returns:
        a new list of length n.
    """
    out = list(grads)
    for i, g in zip(indices, values):
        out[i] = g
    return out


def payload_bytes(tensors):
    """Return the total size in bytes (python int) of a list of tensors with static shapes."""
    return int(sum(t.shape.num_elements() * t.dtype.size for t in tensors))
