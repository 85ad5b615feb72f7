"""RNA's end-of-run statistics: every rank's totals gathered, the rounds, contributors, staleness, drift, waits.

:func:`gather` is called by :meth:`hetsync.protocols.rna.protocol.RNAProtocol.stop` on every rank (it runs one
object allgather); the keys are documented on the RNA page's "Statistics".
"""
import numpy as np

from hetsync import ops, transport

__all__ = ["gather"]


def gather(proto, late):
    """Gather every rank's totals and return the summary statistics (dict) of one fit (every rank calls it).

    Args:
        proto: the :class:`hetsync.protocols.rna.protocol.RNAProtocol` whose communication thread has ended.
        late: int, control messages that arrived after this rank's loop ended.

    Returns:
        dict: ``rounds``, ``round_allreduce_ms_median`` and ``_max`` (milliseconds), contributor counts and
        histogram, ``staleness_histogram``, ``wait_for_round``, ``wait_lag`` and ``wait_unpublished`` (steps), dropped,
        undrained, unsynchronized and unread counts, ``fresh_fraction``, drift figures, ``per_rank``; with
        ``stale_lr="inverse"`` the round staleness and mean rate factor; on the controller's rank its initiator
        counts and probe response times (milliseconds).
    """
    st = ops.grad_cache_status(proto._cache)
    loc = proto._local
    mine = {"rank": proto._rank, "steps": proto.done_steps, "written": st["written"], "dropped": st["dropped"],
            "taken": st["taken"], "contributed_rounds": loc["contributed_rounds"],
            "fresh_reads": st["fresh_reads"], "undrained_at_end": st["written"] - st["taken"] - st["dropped"],
            "unread_results": (max(0, st["newest_round"] - st["last_read_round"])
                               if st["newest_round"] >= 0 else 0),
            "rounds_joined": loc["rounds_joined"], "probes_answered": proto._loop.probes_answered,
            "probes_expired": proto._loop.probes_expired, "late_messages": late,
            "staleness_histogram": [int(v) for v in loc["staleness"]], "error": proto._error,
            "round_staleness_histogram": [int(v) for v in loc["round_staleness"]],
            "lr_scale_sum": float(np.sum(loc["lr_scale"])), "lr_scale_n": len(loc["lr_scale"]),
            "wait_unpublished": int(proto._stats["rna_wait_unpublished"].numpy())}
    per_rank = transport.allgather_object(mine, name="hetsync_rna_totals")
    hist = np.sum([d["staleness_histogram"] for d in per_rank], axis=0).astype(int).tolist()
    rounds = loc["rounds_joined"]
    contrib = loc["contributors"]
    s = {
        "syncs": rounds,
        "rounds": rounds,
        "round_allreduce_ms_median": float(np.median(loc["round_ms"])) if loc["round_ms"] else None,
        "round_allreduce_ms_max": float(np.max(loc["round_ms"])) if loc["round_ms"] else None,
        "contributors_per_round_mean": (sum(k * v for k, v in contrib.items()) / rounds) if rounds else None,
        "contributors_histogram": {str(k): v for k, v in sorted(contrib.items())},
        # what the contributor counts count: ranks (Algorithm 2) or gradients (update_rule "samples")
        "contributors_unit": "gradients" if proto.update_rule == "samples" else "ranks",
        "staleness_histogram": hist,
        "stale_lr": proto.stale_lr,
        "wait_for_round": proto.wait_for_round,
        "wait_lag": proto.wait_lag,
        # steps whose wait ended without their round (a timeout, or the rounds ended first)
        "wait_unpublished": sum(d["wait_unpublished"] for d in per_rank),
        "dropped_gradients": sum(d["dropped"] for d in per_rank),
        "undrained_at_end": sum(d["undrained_at_end"] for d in per_rank),
        "unsynchronized_gradients": sum(d["written"] - d["taken"] for d in per_rank),
        "unread_results": sum(d["unread_results"] for d in per_rank),
        "fresh_fraction": (sum(d["fresh_reads"] for d in per_rank) / max(1, sum(d["steps"] for d in per_rank))),
        "drift_every": proto.drift_every,
        "drift_max": max((d for _, d in loc["drift"]), default=None),
        "drift_last": loc["drift"][-1][1] if loc["drift"] else None,
        "drift_relative_max": max(loc["drift_rel"], default=None),
        "drift_series": loc["drift"][-200:],
        "parameter_averages": loc["corrections"],
        "final_reason": proto._final_reason,
        "per_rank": per_rank,
    }
    if proto.stale_lr == "inverse":
        n_scaled = sum(d["lr_scale_n"] for d in per_rank)
        s["round_staleness_histogram"] = np.sum([d["round_staleness_histogram"] for d in per_rank],
                                                axis=0).astype(int).tolist()
        s["lr_scale_mean"] = sum(d["lr_scale_sum"] for d in per_rank) / n_scaled if n_scaled else None
    if proto._ctl is not None:
        ms = np.asarray(proto._ctl.response_ms)
        s.update({
            "initiator_counts": proto._ctl.initiators,
            "probe_response_ms": ({"median": float(np.median(ms)), "p5": float(np.percentile(ms, 5)),
                                   "p95": float(np.percentile(ms, 95)), "mean": float(ms.mean())}
                                  if ms.size else None),
            "reprobes": proto._ctl.reprobes,
            "done_steps": {str(k): v for k, v in sorted(proto._ctl.done.items())},
        })
    return s
