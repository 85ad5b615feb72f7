"""Hop and NOTIFY-ACK with real 4-rank mpirun jobs: closed forms, tokens, backup workers, skipping, staleness, the end."""
import os

import numpy as np
import pytest

from conftest import launch, read_json, read_jsonl

from hetsync.protocols.hop import graph as hop_graph



def test_ring_of_four_with_zero_updates_follows_w_transpose_powers(tmp_path):
    out = tmp_path / "closed.json"
    launch(4, ["tests/jobs/hop_check.py", "closed", str(out)], timeout=300)
    ranks = read_json(out)["ranks"]
    w = hop_graph.mixing_matrix(hop_graph.build("ring", 4))
    x0 = np.arange(4.0)
    for proto in ("hop", "notifyack"):
        per_step = np.array([r[proto]["w"] for r in ranks])  # [rank, step]
        assert per_step.shape == (4, 6)
        np.testing.assert_allclose(per_step[:, 0], [4 / 3, 1.0, 2.0, 5 / 3], rtol=0, atol=1e-6)
        for k in range(6):
            np.testing.assert_allclose(per_step[:, k], np.linalg.matrix_power(w.T, k + 1) @ x0, rtol=0, atol=1e-5)
        s = ranks[0][proto]["summary"]
        assert s["iterations"] == 6 and s["late_updates_dropped"] == 0 and s["sends_suppressed"] == 0
        assert "final_average" not in s
    hop = ranks[0]["hop"]["summary"]
    # Theorem 2's invariant at the end: size(j -> i) = Iter(j) - Iter(i) + max_ig = max_ig for every pair
    for d in hop["per_rank"]:
        assert d["tokens_at_end"] == [5, 5] and d["token_invariant_violations"] == 0
        assert d["steps"] == d["iterations"] == 6
    # standard mode: no neighbour is ever more than one iteration away
    assert set(int(g) for g in hop["gap_histogram"]) <= {-1, 0, 1}


def _per_rank(ranks, run):
    return {r["rank"]: r[run] for r in ranks}


def test_straggler_backup_workers_skipping_and_staleness_keep_the_bounds(tmp_path):
    out = tmp_path / "straggler.json"
    launch(4, ["tests/jobs/hop_check.py", "straggler", str(out)], timeout=600)
    ranks = read_json(out)["ranks"]
    max_ig = 3
    for run in ("backup", "skip", "staleness"):
        runs = _per_rank(ranks, run)
        s = runs[0]["summary"]
        finals = [runs[r]["final"] for r in range(4)]
        assert max(finals) - min(finals) < 1e-6, f"{run}: final models differ {finals}"
        # the final average of the one-weight model: w <- mean_r w_r over the weights after each rank's last step,
        # and the drift it reports is max_r |w_r - mean| of those same weights (it may be 0: every rank starts
        # from rank 0's weight and sees the same gradient, so the replicas differ only where a rank averaged
        # older neighbour models)
        last = [runs[r]["w"][-1] for r in range(4)]
        mean = sum(last) / 4
        assert finals[0] == pytest.approx(mean, rel=1e-5, abs=1e-6), (run, last, finals)
        assert s["final_average"] is True
        assert s["drift_before_final_average"] == pytest.approx(max(abs(w - mean) for w in last), rel=1e-4, abs=1e-6)
        for d in s["per_rank"]:
            assert d["iterations"] == 60, (run, d)
            # Theorem 2's invariant after the last iteration: every counter holds exactly max_ig tokens
            assert d["tokens_at_end"] == [max_ig, max_ig], (run, d)
            # ... and before every take: size(j -> i) - max_ig = Iter(j) (announced) - Iter(i), exactly
            assert d["token_invariant_violations"] == 0, (run, d)
            assert d["enqueued"] == d["dequeued"] + d["discarded_stale"] + d["discarded_superseded"] + d["left_in_queue"]
        gaps = [int(g) for g in s["gap_histogram"]]
        assert min(gaps) >= -max_ig, (run, s["gap_histogram"])  # nobody ever ran more than max_ig ahead
        if run == "backup":
            # the fast ranks ran ahead of the 20x slower rank 3 until the tokens ran out
            assert min(gaps) == -max_ig and max(gaps) == max_ig
            assert all(runs[r]["steps"] == 60 for r in range(4))
            assert s["jumps"] == 0
        if run == "skip":
            d3 = s["per_rank"][3]
            assert d3["jumps"] >= 1 and d3["iterations_skipped"] >= 1
            assert d3["steps"] == 60 - d3["iterations_skipped"]  # the straggler ran fewer steps
            # the deterministic straggler skipped the most (a loaded machine may make another rank jump too)
            assert d3["iterations_skipped"] == max(d["iterations_skipped"] for d in s["per_rank"])
        if run == "staleness":
            hist = s["staleness_weight_histogram"]
            assert set(hist) <= {"1", "2", "3", ">3"} and hist.get("3", 0) > 0  # own update: s + 1 = 3
            assert min(gaps) >= -(2 + 1)  # bounded staleness: at most s + 1 ahead of an in-neighbour
    # skipping shortens the job under a deterministic straggler
    wall = {run: max(r[run]["wall_s"] for r in ranks) for run in ("backup", "skip")}
    assert wall["skip"] < wall["backup"], wall


def test_a_rank_that_stops_early_stops_every_rank_with_the_reason(tmp_path):
    out = tmp_path / "early.json"
    proc = launch(4, ["tests/jobs/hop_check.py", "early", str(out)], timeout=240)
    reports = [read_json(f"{out}.rank{rank}") for rank in range(4) if os.path.exists(f"{out}.rank{rank}")]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3], proc.stdout[-3000:]
    for r in reports:
        assert r["error"] and "rank 1 stopped training at iteration 5 of 40" in r["error"], r
        assert r["elapsed_s"] < 50  # well before the 60 s timeout: the others were told


def test_hop_trains_digits_on_four_ranks_with_backup_workers(tmp_path):
    out = tmp_path / "run"
    launch(4, ["examples/keras_digits.py", "--protocol", "hop", "--protocol-arg", "graph=ring",
               "--protocol-arg", "backup_workers=1", "--epochs", "10", "--slowdown", "random:6", "--out", str(out),
               "--quiet"], timeout=400)
    summary = read_json(os.path.join(out, "summary.json"))
    assert summary["protocol"] == "hop"
    assert summary["final_test_accuracy"] >= 0.9, summary["final_test_accuracy"]
    assert summary["weights_in_sync"] is True
    stats = summary["stats"]
    assert stats["final_average"] is True and stats["graph"] == "ring"
    assert stats["spectral_gap"] == pytest.approx(2 / 3, abs=1e-4)
    rows = read_jsonl(os.path.join(out, "rank0.jsonl"))
    assert all("hop_update_wait_ms" in r and "hop_token_wait_ms" in r for r in rows)
