"""Every point-to-point channel name of hetsync, in one place (the dispatcher of
:mod:`hetsync.transport.p2p` routes each message to the queue of its channel).

A channel's messages from one source arrive in the order they were sent. Each entry says who sends,
who receives, the tag and the payload. :data:`ALL` lists them (no two alike); the suite checks that no
module outside this one spells a channel name.
"""

__all__ = ["ALL", "POOL_REQUEST", "POOL_REPLY", "PS_PUSH", "PS_PULL", "PS_ERROR", "RNA_CONTROL", "RNA_TO_CONTROLLER",
           "RNAH_TO_SERVER", "RNAH_FROM_SERVER", "RNAH_REDUCE", "RNAH_RESULT", "RNAH_PARAMS", "RNAH_PARAMS_BACK",
           "RNAH_BCAST", "HOP_UPDATE", "HOP_TOKEN", "HOP_ABORT", "SELSYNC_INJECT", "METRICS_GATHER", "METRICS_RESULT"]

# -- the sample pool (hetsync.data.pool) --------------------------------------------------------------
#: every rank -> the pool server: ``("claim", epoch, seq)`` or ``("confirm", epoch, indices int64 [k])``.
POOL_REQUEST = "pool.request"
#: the pool server -> the requesting rank, tagged with ``seq``: the claimed batch's indices, or "empty".
POOL_REPLY = "pool.reply"

# -- parameter servers (hetsync.protocols.ps) ----------------------------------------------------------
#: worker -> server: tag = the worker's iteration t (int) or ``"done"``; obj = ``(eta, g shard, sent_at)``.
PS_PUSH = "ps.push"
#: server -> worker: tag = t; obj = ``(w~ shard float32 [hi - lo], c_i int)``.
PS_PULL = "ps.pull"
#: server -> worker: a server's failure, obj = the message (the worker raises it at once).
PS_ERROR = "ps.error"

# -- RNA (hetsync.protocols.rna) ----------------------------------------------------------------------
#: the round controller -> every rank: the round's initiator and decision.
RNA_CONTROL = "rna.control"
#: every rank -> the round controller: readiness and its own state.
RNA_TO_CONTROLLER = "rna.to_controller"

# -- hierarchical RNA (hetsync.protocols.rna.hierarchical) ----------------------------------------------
#: worker -> group server (tags "push", "groups", "alive", "done").
RNAH_TO_SERVER = "rnah.server"
#: group server -> the pushing initiator: tag = the push's sequence number, obj = float32 shard of the mean.
RNAH_FROM_SERVER = "rnah.server_reply"
#: group member -> round initiator: ``[w g', w]`` float32 [P + 1], tag ``(epoch, round)``.
RNAH_REDUCE = "rnah.reduce"
#: round initiator -> group members: the sum over the group, float32 [P + 1], tag ``(epoch, round)``.
RNAH_RESULT = "rnah.result"
#: group member -> initiator in a parameter round (average / drift): ``(x float32 [P], active bool)``.
RNAH_PARAMS = "rnah.params"
#: initiator -> members in a parameter round: ``(mean float32 [P] or None, drift float)``.
RNAH_PARAMS_BACK = "rnah.params_back"
#: initiator -> members after the server exchange: the pulled model, float32 [P].
RNAH_BCAST = "rnah.bcast"

# -- Hop (hetsync.protocols.hop) ----------------------------------------------------------------------
#: rank -> out-neighbour: the parameter update (tag: the iteration; object: list of arrays).
HOP_UPDATE = "hop.update"
#: rank -> in-neighbour: tokens (object: ``(count, iteration)``).
HOP_TOKEN = "hop.token"
#: rank -> every rank: an early stop, ``(rank, iteration, total)``; closes every queue on the receiver.
HOP_ABORT = "hop.abort"

# -- SelSync's data injection (hetsync.data.shards) ------------------------------------------------------
#: injecting rank -> every other rank: shared samples ``(x, y)`` of one step, tag = the step.
SELSYNC_INJECT = "selsync.inject"

# -- metrics (hetsync.callbacks.metrics) ----------------------------------------------------------------
#: worker -> rank 0: this rank's epoch logs (dict), tag = the epoch.
METRICS_GATHER = "metrics.gather"
#: rank 0 -> workers: every worker's logs (list of dicts), tag = the epoch.
METRICS_RESULT = "metrics.result"

#: every channel name (str), in the order above.
ALL = (POOL_REQUEST, POOL_REPLY, PS_PUSH, PS_PULL, PS_ERROR, RNA_CONTROL, RNA_TO_CONTROLLER, RNAH_TO_SERVER,
       RNAH_FROM_SERVER, RNAH_REDUCE, RNAH_RESULT, RNAH_PARAMS, RNAH_PARAMS_BACK, RNAH_BCAST, HOP_UPDATE, HOP_TOKEN,
       HOP_ABORT, SELSYNC_INJECT, METRICS_GATHER, METRICS_RESULT)
