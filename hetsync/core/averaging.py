"""Parameter averaging shared by the protocols: inside the step, at the end of training, and the drift.

Parameter aggregation inside the compiled step (:meth:`Averaging.average_parameters`: SelSync's PA,
section III-C; local SGD; FedAvg's masked average), the end-of-training average
(:meth:`Averaging.average_at_train_end`) and the drift measure (:meth:`Averaging.parameter_drift`).
:meth:`Averaging.synchronize` times any collective and adds the scenario's network latency. A mixin
of :class:`hetsync.core.protocol.Protocol` (it uses the protocol's statistics and its non-finite guard).
"""
import numpy as np
import tensorflow as tf

from hetsync import ops, transport, world
from hetsync.core import controls
from hetsync.core.grads import all_finite
from hetsync.errors import NONFINITE_MARK, NonFiniteError


class Averaging:
    """Parameter averaging of :class:`hetsync.core.protocol.Protocol` (a mixin; see the module docstring)."""

    def set_state_variables(self, model):
        """Record the model's non-trainable floating-point variables (:attr:`state_variables`).

        These are the layers' state that no gradient updates, e.g. BatchNormalization's moving mean
        and variance; :meth:`average_parameters` and :meth:`average_at_train_end` average them with
        the trainable parameters, so every rank ends with the same full model. Integer or
        boolean non-trainable variables (counters, seed-generator states) are not averaged: an
        average of them means nothing, and they are left as each rank has them. Called by
        :meth:`check_fit` at train begin (so by :class:`hetsync.callbacks.ProtocolHooks`).

        Args:
            model: a ``keras.Model`` (its ``non_trainable_variables`` are read; the optimizer's own
                variables are not among them).

        Returns:
            list of the recorded Keras variables (float dtypes only).
        """
        state = []
        for v in getattr(model, "non_trainable_variables", None) or []:
            if tf.as_dtype(v.dtype).is_floating:
                state.append(v)
        self.state_variables = state
        return state

    #: the model's non-trainable float variables (e.g. BatchNormalization statistics), set at train
    #: begin by :meth:`set_state_variables`; averaged with the parameters.
    state_variables = ()

    def synchronize(self, fn, tensors):
        """Run the collective ``fn(tensors)`` with the scenario's network latency, timed.

        Adds ``netdelay`` latency (:func:`hetsync.core.controls.sync_control`) through the compiled
        delay op, adds the wall time from entry to result to ``sync_wait_ms`` and increments
        ``syncs``.

        Args:
            fn: callable list[Tensor] -> list[Tensor], the collective.
            tensors: list of tensors.

        Returns:
            ``fn``'s list of tensors.
        """
        tensors = list(tensors)
        with tf.control_dependencies(tensors):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            tensors, _, _ = ops.delay(tensors, controls.sync_control(), name="hetsync_sync_latency")
        out = list(fn(tensors))
        with tf.control_dependencies(out):
            t1 = tf.timestamp()
        self._stats["sync_wait_ms"].assign_add((t1 - t0) * 1e3)
        self._stats["syncs"].assign_add(tf.constant(1.0, tf.float64))
        return out

    def average_parameters(self, variables, weight=None, name=None):
        """Average the parameters over ranks (parameter aggregation) and assign the result, timed.

        With ``weight`` None, w <- (1/N) sum_n w_n (one fused averaged allreduce; SelSync's PA,
        section III-C; local SGD). With a float32 scalar ``weight`` (1 for ranks taking part, 0
        for the others; FedAvg's random fraction C), w <- sum_n weight_n w_n / sum_n weight_n on
        *every* rank, by one masked fused allreduce-sum. Runs inside :meth:`synchronize`
        (netdelay latency, ``sync_wait_ms``, ``syncs``). Usable inside the compiled step.

        The model's non-trainable float state (:attr:`state_variables`, e.g. BatchNormalization's
        moving statistics) is averaged with ``variables`` in the same collective.
        Non-finite guard: a rank whose values are not all finite (or whose step's gradients were
        not, :meth:`_guard_gradients`) sends zeros in their place and sets its flag in a [N]
        float32 vector carried by the same collective; if any flag is set, every rank raises
        (``InvalidArgumentError`` starting with :data:`NONFINITE_MARK`, naming the rank(s) and the
        step) before assigning anything. The flag vector (4 N bytes) is not counted in ``bytes_sent``.

        Args:
            variables: list of Keras variables (float). weight: None or float32 scalar tensor.
            name: op-name prefix (default ``hetsync_<name>_avg``).

        Returns:
            list of the assign ops.
        """
        name = name or f"hetsync_{self.name}_avg"
        variables = self._with_state(variables)
        values = [tf.convert_to_tensor(v.value) for v in variables]
        local_bad = tf.logical_not(all_finite(values))
        step_bad = getattr(self, "_step_bad", None)
        bad = local_bad if step_bad is None else tf.logical_or(local_bad, step_bad)
        counted = self._stats["nonfinite_dropped"].assign_add(tf.cast(local_bad, tf.float64))
        with tf.control_dependencies([counted]):
            values = self._zeros_if(bad, values)
        flags = self.nonfinite_flags(bad)
        if weight is None:
            out = self.synchronize(lambda ts: transport.allreduce_mean(ts, name=name), values + [flags])
            avg = out[:-1]
        else:
            masked = [v * tf.cast(weight, v.dtype) for v in values] + [tf.reshape(tf.cast(weight, tf.float32), [1])]
            out = self.synchronize(lambda ts: transport.allreduce_sum(ts, name=name), masked + [flags])
            summed = out[:-1]
            count = summed[-1][0]
            avg = [s / tf.cast(count, s.dtype) for s in summed[:-1]]
        check = self.check_nonfinite_flags(out[-1], "the parameter average")
        with tf.control_dependencies([check]):
            return [v.assign(a) for v, a in zip(variables, avg)]

    def _with_state(self, variables):
        """``variables`` followed by the :attr:`state_variables` not already among them (list)."""
        variables = list(variables)
        ids = {id(v) for v in variables}
        return variables + [v for v in self.state_variables if id(v) not in ids]

    def parameter_drift(self, values, mean, name, active=True):
        """The drift: the largest L2 distance ||x_r - mean|| of a rank's parameters from the mean (eager).

        Every rank calls it with its own flat parameters; ranks with ``active=False`` (e.g. RNA
        ranks that finished) do not count. One :func:`hetsync.transport.allreduce_max` of a scalar.

        Args:
            values, mean: float arrays of the same shape (this rank's parameters, the mean over ranks).
            name: str collective name (the same on every rank). active: bool.

        Returns:
            float, max over active ranks (-1.0 if none is active).
        """
        dist = float(np.linalg.norm(np.asarray(values, np.float64) - np.asarray(mean, np.float64))) if active else -1.0
        # one fixed-shape collective, no pickling (a gathered object takes two collectives)
        return float(transport.allreduce_max([tf.constant([dist], tf.float64)], name=name)[0].numpy()[0])

    def average_at_train_end(self, trainable=True):
        """Average the parameters over all ranks once, eagerly, when training ends.

        w <- (1/N) sum_n w_n, so every rank leaves ``fit`` with the same model (local steps since
        the last synchronization are kept in the average, not discarded). Run by :meth:`stop` on
        every rank when the config has ``average_at_end=True`` (RNA, SelSync, local SGD, FedAvg,
        Hop, NOTIFY-ACK); not counted as a step (LSSR is unchanged) nor delayed by ``netdelay``.
        The model's non-trainable float state (:attr:`state_variables`, BatchNormalization's moving
        statistics) is averaged in the same collective. Records ``final_average`` and
        ``drift_before_final_average`` (:meth:`parameter_drift` of the trainable parameters before
        the average; 0.0 if the ranks were equal) for :meth:`summary_stats`.

        Non-finite guard: a rank whose values are not all finite sends zeros and its flag instead;
        then every rank raises :class:`NonFiniteError` naming the rank(s) and assigns nothing.

        Args:
            trainable: bool; False averages only :attr:`state_variables` (BSP, whose trainable
                parameters are already identical) and records nothing.

        Returns:
            dict ``{"final_average": True, "drift_before_final_average": float}`` (``{}`` with
            ``trainable=False``).

        Raises:
            RuntimeError: the optimizer has no trainable variables (not built).
            NonFiniteError: some rank's parameters or state are not finite (raised on every rank).
        """
        trained = list(getattr(self.optimizer, "_trainable_variables", None) or []) if trainable else []
        if trainable and not trained:
            raise RuntimeError(f"{self.name}: no trainable variables to average at train end (optimizer not built)")
        variables = self._with_state(trained)
        if not variables:
            return {}
        values = [np.asarray(v.numpy()) for v in variables]
        bad = not all(np.isfinite(a).all() for a in values)
        if bad:
            self._stats["nonfinite_dropped"].assign_add(1.0)
            values = [np.zeros_like(a) for a in values]
        flags = np.zeros(world.size(), np.float32)
        flags[world.rank()] = float(bad)
        out = transport.allreduce_mean([tf.constant(a) for a in values] + [tf.constant(flags)],
                                       name=f"hetsync_{self.name}_final_avg" + ("" if trainable else "_state"))
        means, flags = out[:-1], np.asarray(out[-1])
        if (flags > 0).any():
            raise NonFiniteError(
                f"{NONFINITE_MARK}: non-finite parameters on rank(s) {np.flatnonzero(flags > 0).tolist()} at the end of "
                f"training (protocol {self.display_name}, step {int(self._step_index().numpy())}); not sent, no "
                "final average")
        if not trainable:
            for v, m in zip(variables, means):
                v.assign(m)
            return {}
        k = len(trained)
        flat = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in values[:k]])
        flat_mean = np.concatenate([np.ravel(np.asarray(m, np.float64)) for m in means[:k]])
        drift = self.parameter_drift(flat, flat_mean, name=f"hetsync_{self.name}_final_drift")
        for v, m in zip(variables, means):
            v.assign(m)
        self._final = {"final_average": True, "drift_before_final_average": drift}
        return dict(self._final)
