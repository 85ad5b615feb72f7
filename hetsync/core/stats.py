"""A protocol's statistics and resumable state.

Per-step statistics are float64 scalar variables (:meth:`Statistics.add_stat`) assigned inside the
compiled step and read eagerly by :class:`hetsync.callbacks.SyncMetrics`; the semi-synchronous
protocols share one set (:meth:`Statistics.add_sync_stats`: ``sync``, ``lssr`` of SelSync eq. 4,
``bytes_sent``). :meth:`Statistics.state` / :meth:`Statistics.load_state` are what a checkpoint
keeps of a protocol. A mixin of :class:`hetsync.core.protocol.Protocol`.
"""
import numpy as np
import tensorflow as tf


class Statistics:
    """Statistics and checkpoint state of :class:`hetsync.core.protocol.Protocol` (a mixin; see the module docstring)."""

    def add_sync_stats(self):
        """Create the per-step statistics every semi-synchronous protocol reports (all float64):

        * ``sync``: 1 if this step synchronized (parameters or gradients crossed the network), else 0;
        * ``sync_steps`` / ``local_steps``: cumulative counts of synchronous / local-only steps;
        * ``lssr``: local-to-synchronous step ratio, local / (local + sync) steps (SelSync eq. 4);
        * ``bytes_sent``: cumulative payload bytes this rank handed to collectives (parameters or
          gradients, plus any flag exchange), not counting the transport's own framing.
        """
        for name in ("sync", "sync_steps", "local_steps", "lssr", "bytes_sent"):
            self.add_stat(name)

    def record_step(self, synced, nbytes):
        """Update the statistics of :meth:`add_sync_stats` inside the compiled step.

        Args:
            synced: bool scalar tensor, whether this step synchronized.
            nbytes: float64 scalar tensor, payload bytes this rank sent this step.

        Returns:
            list of the assign ops (use as control dependencies).
        """
        s = self._stats
        one = tf.cast(synced, tf.float64)
        assigns = [s["sync"].assign(one), s["sync_steps"].assign_add(one), s["local_steps"].assign_add(1.0 - one),
                   s["bytes_sent"].assign_add(tf.cast(nbytes, tf.float64))]
        with tf.control_dependencies(assigns):
            total = s["sync_steps"].read_value() + s["local_steps"].read_value()
            assigns.append(s["lssr"].assign(s["local_steps"].read_value() / tf.maximum(total, 1.0)))
        return assigns

    def sync_summary(self):
        """The end-of-run figures of :meth:`add_sync_stats` (dict of ints and ``lssr``, float)."""
        st = self.step_stats()
        return {"syncs": int(st["syncs"]), "sync_steps": int(st["sync_steps"]), "local_steps": int(st["local_steps"]),
                "lssr": st["lssr"], "bytes_sent": int(st["bytes_sent"])}

    def add_stat(self, name, initial=0.0):
        """Create (eagerly) a float64 scalar statistic variable and return it."""
        if name not in self._stats:
            with tf.init_scope():
                self._stats[name] = tf.Variable(float(initial), dtype=tf.float64, trainable=False,
                                                name=f"hetsync_{self.name}_{name}")
        return self._stats[name]

    def step_stats(self):
        """Return ``{name: float}`` of every statistic variable, read after a step.

        One compiled read of all of them (a stacked float64 vector) instead of one eager read per variable:
        :class:`hetsync.callbacks.SyncMetrics` calls this after every step, on the critical path of the
        next collective. The reader is rebuilt when a statistic is added.
        """
        names = tuple(self._stats)
        if not names:
            return {}
        reader = getattr(self, "_stats_reader", None)
        if reader is None or reader[0] != names:
            variables = [self._stats[k] for k in names]
            reader = (names, tf.function(lambda: tf.stack([v.read_value() for v in variables]), autograph=False))
            self._stats_reader = reader
        return {k: float(x) for k, x in zip(names, reader[1]().numpy())}

    def continue_from(self, other):
        """Take over the statistics of the protocol this one replaces between two steps (:func:`hetsync.Auto`'s
        switch): every statistic both have gets ``other``'s value, so the cumulative ones (``syncs``,
        ``overruns``, ...) go on counting and the step just run is reported with the values it ran with.

        Args:
            other: the :class:`hetsync.core.protocol.Protocol` replaced.
        """
        for name, var in self._stats.items():
            if name in other._stats:
                var.assign(other._stats[name].read_value())

    def summary_stats(self):
        """Return a JSON-serialisable dict of end-of-run statistics (default: ``syncs``, and the
        end-of-training average's figures if it ran)."""
        out = {"syncs": int(self._stats["syncs"].numpy())} if self._stats else {}
        out.update(self._final)
        return self.with_pool_stats(out)

    def with_pool_stats(self, out):
        """Return ``out`` (dict) with ``out["pool"]`` set to :func:`hetsync.data.pool.summary` when this rank
        used the sample pool (``data_plan="pool"``); ``out`` unchanged otherwise. For
        ``summary_stats`` overrides that build their own dict."""
        if getattr(self, "pool", None) is not None:
            from hetsync.data import pool as pool

            out["pool"] = pool.summary(self)
        return out

    def state(self):
        """Return the protocol's resumable state as a JSON-serialisable dict (checkpoints).

        Default: every statistic variable (:meth:`add_stat`: counters such as ``syncs``,
        ``sync_steps``, ``lssr``, ``bytes_sent``, ``overruns``) and every ``tf.Variable`` attribute
        of the protocol (step counters, EWMA windows, clocks: local SGD's and FedAvg's global step,
        which also fixes FedAvg's random draw; SelSync's window; RNA's and Hop's iteration), as
        ``{"stats": {name: float}, "variables": {attr: {"dtype": str, "value": nested list}}}``.
        Protocols with Python-side state (task allocation's allocation, RNA's controller RNG) add
        it. Read eagerly between steps, by :class:`hetsync.callbacks.checkpoint.BackupAndRestore`.
        """
        variables = {k: {"dtype": v.dtype.name, "value": np.asarray(v.numpy()).tolist()}
                     for k, v in sorted(vars(self).items()) if isinstance(v, tf.Variable)}
        return {"stats": self.step_stats(), "variables": variables}

    def load_state(self, state):
        """Restore :meth:`state`'s dict (eagerly, before the first step of a resumed fit).

        Args:
            state: dict from :meth:`state` of the same protocol and configuration.

        Raises:
            ValueError: a statistic or variable in ``state`` that this protocol does not have, or of
                another shape (the message names it).
        """
        for name, value in state.get("stats", {}).items():
            if name not in self._stats:
                raise ValueError(f"{self.name}: the saved state has a statistic {name!r} this protocol does not have")
            self._stats[name].assign(float(value))
        for attr, saved in state.get("variables", {}).items():
            var = getattr(self, attr, None)
            if not isinstance(var, tf.Variable):
                raise ValueError(f"{self.name}: the saved state has a variable {attr!r} this protocol does not have")
            value = np.asarray(saved["value"], dtype=saved["dtype"])
            if tuple(value.shape) != tuple(var.shape):
                raise ValueError(f"{self.name}: saved variable {attr!r} has shape {value.shape}, the protocol's "
                                 f"{tuple(var.shape)}")
            var.assign(value)
