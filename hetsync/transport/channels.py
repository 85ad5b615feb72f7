"""Every point-to-point channel name of hetsync, in one place (the dispatcher of
:mod:`hetsync.transport.p2p` routes each message to the queue of its channel).

A channel's messages from one source arrive in the order they were sent. Each entry says who sends,
who receives, the tag and the payload. :data:`ALL` lists them (no two alike); the suite checks that no
module outside this one spells a channel name.
"""

__all__ = ["ALL", "POOL_REQUEST", "POOL_REPLY", "PS_PUSH", "PS_PULL", "PS_ERROR", "RNA_CONTROL", "RNA_TO_CONTROLLER",
           "RNAH_TO_SERVER", "RNAH_FROM_SERVER", "RNAH_REDUCE", "RNAH_RESULT", "RNAH_PARAMS", "RNAH_PARAMS_BACK",
           "RNAH_BCAST", "HOP_UPDATE", "HOP_TOKEN", "HOP_ABORT", "SELSYNC_INJECT", "METRICS_GATHER", "METRICS_RESULT", "ADVISE_PROBE"]

# -- the sample pool (hetsync.data.pool) --------------------------------------------------------------
#: every rank -> the pool server: ``("claim", epoch, seq)`` or ``("confirm", epoch, indices int64 [k])``.
POOL_REQUEST = "pool.request"
#: the pool server -> the requesting rank, tag = ``seq``: ``(epoch, seq, indices int64 [b] or None once the epoch is
#: empty, batches handed out so far in the epoch int)``.
POOL_REPLY = "pool.reply"

# -- parameter servers (hetsync.protocols.ps) ----------------------------------------------------------
#: worker -> server: tag = the worker's iteration t (int), obj = ``(eta float, g shard float32 [hi - lo], sent_at
#: time.time() seconds)``; or tag ``"done"``, obj None (the worker's training ended).
PS_PUSH = "ps.push"
#: server -> worker: tag = t; obj = ``(w~ shard float32 [hi - lo], c_i int)``.
PS_PULL = "ps.pull"
#: parameter server (or hierarchical RNA's group server) -> its workers: the server's failure, obj = the message str
#: (the worker raises it at once).
PS_ERROR = "ps.error"

# -- RNA (hetsync.protocols.rna) ----------------------------------------------------------------------
#: the round controller -> every rank of its group: ``("probe", r)``, ``("round", r, initiator, average bool,
#: drift bool)``, ``("final", reason str, error str or None)``; hierarchical RNA's rank 0 -> every worker:
#: ``("regroup", epoch, groups, next round, decision dict)``.
RNA_CONTROL = "rna.control"
#: every rank -> its round controller: ``("ready", r)``, ``("done", steps int)``, ``("error", message str)``;
#: hierarchical RNA's workers -> rank 0 in the warm-up: ``("time", mean step time float milliseconds)``.
RNA_TO_CONTROLLER = "rna.to_controller"

# -- hierarchical RNA (hetsync.protocols.rna.hierarchical) ----------------------------------------------
#: worker -> group server: tag ``"push"``, obj ``(epoch, group, seq, x shard float32)``; tag ``"groups"`` (rank 0 when
#: ``groups="auto"`` splits), obj ``(epoch, groups, x0 shard float32)``; tags ``"alive"`` (a heartbeat) and ``"done"``,
#: obj None.
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
#: injecting rank -> every other rank: tag = the step t, obj = ``(t, sender rank, x [s, ...], y [s, ...])``, the s
#: samples it shares at step t.
SELSYNC_INJECT = "selsync.inject"

# -- metrics (hetsync.callbacks.metrics) ----------------------------------------------------------------
#: worker -> rank 0: this rank's epoch logs (dict), tag = the epoch.
METRICS_GATHER = "metrics.gather"
#: rank 0 -> workers: every worker's logs (list of dicts), tag = the epoch.
METRICS_RESULT = "metrics.result"

# -- the advisor's probe (hetsync.advise.probe) ---------------------------------------------------------
#: rank 0 <-> its probe peer, both ways: tag = the repetition (int), obj = the timed payload (uint8 array or bytes).
ADVISE_PROBE = "advise.probe"

#: every channel name (str), in the order above.
ALL = (POOL_REQUEST, POOL_REPLY, PS_PUSH, PS_PULL, PS_ERROR, RNA_CONTROL, RNA_TO_CONTROLLER, RNAH_TO_SERVER,
       RNAH_FROM_SERVER, RNAH_REDUCE, RNAH_RESULT, RNAH_PARAMS, RNAH_PARAMS_BACK, RNAH_BCAST, HOP_UPDATE, HOP_TOKEN,
       HOP_ABORT, SELSYNC_INJECT, METRICS_GATHER, METRICS_RESULT, ADVISE_PROBE)
