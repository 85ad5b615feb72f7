"""Parameter-server protocols (SHAT family, SSP) in real mpirun runs: exact server updates, counters,
alpha, sharding, the SSP gate, roles and failures (``tests/jobs/ps_check.py``)."""
import math
import time

import numpy as np
import pytest

from conftest import JOBS_DIR, launch, read_json

SCRIPT = f"{JOBS_DIR}/ps_check.py"


def _run(tmp_path, mode, np_):
    out = tmp_path / f"{mode}.json"
    launch(np_, [SCRIPT, mode, str(out)], timeout=400)
    return read_json(out)["ranks"]


def _f32(x):
    return np.asarray(x, np.float32)


def _check_shards(summary, sizes):
    ranges = summary["shard_ranges"]
    assert ranges[0][0] == 0 and ranges[-1][1] == sum(sizes) == summary["num_params"]
    for (lo, hi), (lo2, _) in zip(ranges, ranges[1:]):
        assert lo < hi == lo2  # contiguous, disjoint, non-empty
    return [hi - lo for lo, hi in ranges]


def _check_conservation(summary, workers):
    for row in summary["counter_check"]:
        assert row["returned_c"] + row["final_counters"] == row["expected"]
        assert row["expected"] == (len(workers) - 1) * sum(len(w["rows"]) for w in workers)


def test_round_robin_counters_alpha_mixing_and_exact_server_update(tmp_path):
    ranks = _run(tmp_path, "roundrobin", 4)
    workers = [r for r in ranks if r["role"] == "worker"]
    server = [r for r in ranks if r["role"] == "server"]
    assert [r["rank"] for r in workers] == [0, 1, 2] and [r["rank"] for r in server] == [3]
    assert all(r["workers"] == 3 for r in ranks) and server[0]["rows"] == []
    n, steps = 3, 6
    summary = workers[0]["summary"]
    order = [tuple(p) for p in summary["server_order"][0]]
    assert order == [(i, t) for t in range(steps) for i in range(n)]  # the pushes really were round-robin
    # c: worker i's first counter is i, then n - 1 (spec section 7.2)
    for w in workers:
        assert [row["c"] for row in w["rows"]] == [w["rank"]] + [n - 1] * (steps - 1)
    # alpha with log2: c = 0 -> 0, c = 1 -> clipped to 0, c = 2 -> 1 - (3 / 2) / log2(3)
    a2 = 1 - 1.5 / math.log2(3)
    assert workers[2]["rows"][0]["alpha"] == pytest.approx(a2) and a2 == pytest.approx(0.05360, abs=1e-5)
    assert workers[0]["rows"][0]["alpha"] == 0.0 and workers[1]["rows"][0]["alpha"] == 0.0
    assert summary["alpha_clips"] == 1  # worker 1's c = 1
    # the server: w~ <- w~ - eta g, one gradient at a time in arrival order, bit for bit
    w0 = _f32(workers[0]["w0"])
    assert all(np.array_equal(_f32(r["w0"]), w0) for r in ranks)  # every rank starts from rank 0's weights
    grads = {(w["rank"], t): (_f32(row["g"]), np.float32(row["lr"])) for w in workers for t, row in enumerate(w["rows"])}
    glob = w0.copy()
    after = {}
    for key in order:
        g, lr = grads[key]
        glob = glob - lr * g
        after[key] = glob.copy()
    assert np.array_equal(_f32(workers[0]["global"]), glob)
    assert not np.allclose(glob, w0)
    # the pulled model is the post-update w~ of that push; the worker mixes (1 - alpha) (w - eta g) + alpha w~
    for w in workers:
        local = w0.copy()
        for t, row in enumerate(w["rows"]):
            assert np.array_equal(_f32(row["global"]), after[(w["rank"], t)])
            g, lr = grads[(w["rank"], t)]
            stepped = local - g * lr
            a = row["alpha"]
            expect = stepped if a == 0.0 else np.float32(1.0 - a) * stepped + np.float32(a) * after[(w["rank"], t)]
            np.testing.assert_allclose(_f32(row["w"]), expect, rtol=0, atol=1e-7)
            local = _f32(row["w"])
    # counters conserved: returned c + final counters = (n - 1) x updates, and the workers saw the same c's
    _check_conservation(summary, workers)
    per_server = summary["per_server"][0]
    assert per_server["pushes"] == per_server["pulls"] == n * steps
    for w in workers:
        assert per_server["returned_c_sum"][str(w["rank"])] == sum(row["c"] for row in w["rows"])
    # every rank leaves fit holding w~ (the server rank exited its fit normally: the launch returned 0)
    assert all(np.array_equal(_f32(r["final"]), glob) for r in ranks)


def test_asp_local_model_is_the_pulled_global_model_memory_sharding(tmp_path):
    ranks = _run(tmp_path, "asp", 4)
    workers = [r for r in ranks if r["role"] == "worker"]
    assert [r["rank"] for r in workers] == [0, 1] and [r["role"] for r in ranks[2:]] == ["server", "server"]
    for w in workers:
        assert len(w["rows"]) == 12
        for row in w["rows"]:
            assert row["alpha"] == 1.0
            assert np.array_equal(_f32(row["w"]), _f32(row["global"]))
    summary = workers[0]["summary"]
    sizes = _check_shards(summary, [12, 3])
    assert sizes == [8, 7]  # memory-wise: 15 elements over 2 servers, the kernel split
    assert max(sizes) - min(sizes) <= 1
    assert summary["pushes_per_server"] == summary["pulls_per_server"] == [24, 24]
    assert all(q is not None and q["max"] > 0 for q in summary["queue_wait_ms_per_server"])
    _check_conservation(summary, workers)


def test_layer_sharding_whole_variables_and_conservation(tmp_path):
    ranks = _run(tmp_path, "layer", 4)
    workers = [r for r in ranks if r["role"] == "worker"]
    summary = workers[0]["summary"]
    assert summary["sharding"] == "layer"
    assert _check_shards(summary, [12, 3]) == [12, 3]  # one whole variable per server
    assert summary["pushes_per_server"] == [30, 30]
    _check_conservation(summary, workers)
    assert all(np.array_equal(_f32(r["final"]), _f32(r["global"])) for r in ranks)


def test_ensemble_never_changes_from_the_server(tmp_path):
    ranks = _run(tmp_path, "ensemble", 4)
    workers = [r for r in ranks if r["role"] == "worker"]
    assert len(workers) == 3
    for w in workers:
        assert all(row["alpha"] == 0.0 for row in w["rows"])
        # the local trajectory is plain SGD on the worker's shard, bit for bit, whatever the server did
        assert np.array_equal(_f32(w["final"]), _f32(w["solo"]))
        assert not np.allclose(_f32(w["final"]), _f32(w["w0"]))
    # the server did apply the pushes (its model moved), and the local models differ from each other
    assert not np.allclose(_f32(workers[0]["global"]), _f32(workers[0]["w0"]))
    assert not np.allclose(_f32(workers[0]["final"]), _f32(workers[1]["final"]))
    assert workers[0]["summary"]["local_model_distance_from_mean_max"] > 1e-4


def test_shat_gives_a_slow_worker_larger_counters_and_alpha(tmp_path):
    ranks = _run(tmp_path, "straggler", 5)
    workers = [r for r in ranks if r["role"] == "worker"]
    slow = workers[3]["rows"][2:]  # after the compiling steps, while the fast workers still run
    fast = [row for w in workers[:3] for row in w["rows"][5:40]]
    c_slow, c_fast = np.median([r["c"] for r in slow]), np.median([r["c"] for r in fast])
    a_slow, a_fast = np.median([r["alpha"] for r in slow]), np.median([r["alpha"] for r in fast])
    # spec section 7.6: c_slow ~ k (n - 1) = 15 (fewer here: the fast steps carry the exchange's overhead)
    assert c_slow >= 2 * (4 - 1) and c_fast <= 4, (c_slow, c_fast)
    assert a_slow == pytest.approx(1 - (4 / c_slow) / math.log(4), abs=0.05) and a_slow > a_fast + 0.3
    assert a_fast == 0.0  # c ~ n - 2 + 1/k gives alpha < 0 at n = 4, clipped


def test_ssp_gate_holds_with_a_straggler(tmp_path):
    ranks = _run(tmp_path, "ssp", 4)
    workers = [r for r in ranks if r["role"] == "worker"]
    assert [len(w["rows"]) for w in workers] == [40, 40, 40]
    summary = workers[0]["summary"]
    # every iteration t + 1 started only when min clock >= t + 1 - s: the lead at a reply is at most s = 2,
    # and with worker 2 ten times slower the bound is reached and replies were held back
    assert summary["gate_max_lead"] == 2
    assert summary["gate_held_replies"] > 10
    hist = summary["per_server"][0]["gate_lead_histogram"]
    assert set(hist) <= {"0", "1", "2"} and sum(hist.values()) == 120
    assert summary["staleness_histogram"] == hist and hist.get("2", 0) > 0
    # the fast workers could not run ahead: their last step ends within a few slow steps of the straggler's
    slow_end = workers[2]["rows"][-1]["t"]
    slow_step = (workers[2]["rows"][-1]["t"] - workers[2]["rows"][10]["t"]) / 29
    for w in workers[:2]:
        assert w["rows"][-1]["t"] > slow_end - 4 * slow_step
    _check_conservation(summary, workers)


def test_ssp_with_zero_staleness_matches_bsp(tmp_path):
    ssp = _run(tmp_path, "ssp0", 4)
    bsp = _run(tmp_path, "bsp", 3)
    a, b = _f32(ssp[0]["final"]), _f32(bsp[0]["final"])
    assert ssp[0]["summary"]["gate_max_lead"] == 0
    assert not np.allclose(a, _f32(ssp[0]["w0"]), atol=1e-3)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def _failing(tmp_path, mode, np_):
    t0 = time.time()
    proc = launch(np_, [SCRIPT, mode, str(tmp_path / "x.json")], timeout=240, check=False)
    return proc, proc.stdout + proc.stderr, time.time() - t0


def test_a_stalled_server_gives_the_workers_a_clear_error(tmp_path):
    proc, text, elapsed = _failing(tmp_path, "deadserver", 3)
    assert proc.returncode != 0
    for r in (0, 1):
        assert f"worker rank {r}: no reply from parameter server 0 (rank 2)" in text, text[-3000:]
    assert "FINISHED" not in text and elapsed < 200


def test_a_killed_server_ends_the_job_with_the_launchers_error_not_a_hang(tmp_path):
    proc, text, elapsed = _failing(tmp_path, "killserver", 3)
    assert proc.returncode != 0 and "FINISHED" not in text
    # mpirun names the dead rank and its signal; the workers do not wait out their timeouts
    assert "rank 2" in text and "signal 9" in text, text[-3000:]
    assert elapsed < 120


def test_a_stalled_worker_is_named_by_the_server_which_tells_the_others(tmp_path):
    proc, text, elapsed = _failing(tmp_path, "deadworker", 3)
    assert proc.returncode != 0
    assert "parameter server 0 (rank 2): no message from worker rank(s) [1] within 6 s" in text, text[-3000:]
    assert "ERROR rank 0" in text and "parameter server rank 2 failed" in text, text[-3000:]
    assert elapsed < 200


def test_more_servers_than_variables_fails_at_train_begin_on_every_rank(tmp_path):
    proc = launch(5, [SCRIPT, "toomany", str(tmp_path / "x.json")], timeout=240)
    for r in range(5):
        assert f"ERROR rank {r}: more servers than parameters" in proc.stdout, proc.stdout[-3000:]


def test_example_script_unchanged_with_ensemble_reports_both_accuracies(tmp_path):
    out = tmp_path / "run"
    launch(3, ["examples/keras_digits.py", "--protocol", "ensemble", "--protocol-arg", "servers=1",
               "--protocol-arg", "data_plan=shard", "--epochs", "2",
               "--out", str(out), "--quiet"], timeout=400)
    s = read_json(out / "summary.json")
    assert s["world_size"] == 3 and s["workers"] == 2
    assert [r["role"] for r in s["per_rank"]] == ["worker", "worker", "server"]
    assert s["per_rank"][2]["steps"] == 0 and s["per_rank"][2]["samples"] == 0
    assert s["per_rank"][0]["samples"] == s["per_rank"][1]["samples"] > 0  # the data went to the 2 workers only
    assert 0.5 < s["ensemble_mean_local_accuracy"] <= 1 and 0.5 < s["ensemble_prediction_accuracy"] <= 1
    assert len(s["ensemble_local_accuracies"]) == 2
    assert s["final_test_accuracy"] == pytest.approx(s["ensemble_local_accuracies"][0])
    st = s["stats"]
    steps = s["per_rank"][0]["steps"]
    assert st["pushes_per_server"] == st["pulls_per_server"] == [2 * steps]
    assert st["alpha_mean_per_worker"] == [0.0, 0.0] and not s["weights_in_sync"]
