"""Task allocation with real multi-process launches (mpirun, horovodrun --mpi)."""
import numpy as np
import pytest

from conftest import launch, read_json, read_jsonl


def _efficiency(h):
    """Heterogeneity efficiency in closed form from an epoch record's measurements of the epoch without its first
    step: E = (sum_i D_i / T) / sum_i (D_i / t_s^i)."""
    d, t, wall = h["steady_samples"], h["steady_t_s_s"], h["steady_wall_s"]
    assert len(d) == len(t) == len(h["w"]) and min(d) > 0 and min(t) > 0 and wall > 0, h
    return (sum(d) / wall) / sum(di / ti for di, ti in zip(d, t))


def test_update_is_the_exact_mean_over_the_round_and_every_sample_is_used_once(tmp_path):
    out = tmp_path / "cf.json"
    launch(3, ["tests/jobs/taskalloc_closed_form.py", str(out)])
    r = read_json(out)
    cf = r["closed_form"]
    # b = 4 on 3 ranks: BSP's 12 samples per round = weights 1,2,3 x micro-batch 2, then the 5 left
    # over split 1,2,2 (largest remainder)
    assert (cf["batch_size"], cf["micro_batch"], cf["global_batch"]) == (4, 2, 12)
    assert cf["counts"] == [[2, 4, 6], [1, 2, 2]]
    assert cf["rounds"] == 2 and cf["syncs"] == 2 and cf["iterations"] == 2  # the optimizer stepped once per round
    assert cf["moved"] > 0.1  # the weights really moved
    assert cf["max_err"] < 1e-5  # equals the mean gradient over every sample of each round (float32 rounding)
    assert cf["naive_err"] > 1e-2  # an unweighted average of the ranks' means would be measurably different
    assert cf["diff_ranks"] == 0.0

    acc = r["accounting"]
    n_samples, hist, served = acc["n_samples"], acc["history"], acc["served"]
    assert len(hist) == 3
    assert acc["global_batch"] == 6 * 3 * 8  # C = 6 n micro-batches of the explicit micro_batch=8
    assert len({tuple(h["w"]) for h in hist}) > 1, hist  # the allocation really changed (resharding happened)
    assert hist[0]["w"] == [6, 6, 6] and hist[-1]["w"][2] < 6  # the 4x slower rank 2 lost work
    for epoch, h in enumerate(hist):
        ids, per_rank = [], []
        for rank_log in served:
            mine = [i for e, _, batch in rank_log if e == epoch for i in batch]
            per_rank.append(len(mine))
            ids += mine
        assert sorted(ids) == list(range(n_samples)), f"epoch {epoch}: samples lost or duplicated"
        assert per_rank == h["samples"]
        share = np.asarray(per_rank) / n_samples
        assert np.allclose(share, np.asarray(h["w"]) / sum(h["w"]), atol=0.02)  # share = w_i / C
        steps = {len([1 for e, _, _ in rank_log if e == epoch]) for rank_log in served}
        assert steps == {acc["steps_per_rank"]}  # same number of steps (= rounds) on every rank


def test_adaptive_allocation_converges_to_the_speed_ratio_and_equal_speeds_stay_equal(tmp_path):
    out = tmp_path / "adaptive.json"
    # simulated device: 3 ms of (timer) compute per sample, so speeds do not depend on core sharing and
    # dominate the per-step Python overhead. b = 56 per rank: BSP's 224 samples per round in C = 28
    # micro-batches of 8 (the protocol's default micro-batch)
    launch(4, ["tests/jobs/taskalloc_adaptive.py", str(out), "--slowdown", "speeds:1,1,1,0.5;none", "--epochs", "5",
               "--total", "28", "--batch-size", "56", "--tile", "1", "--width", "8",
               "--device-ms-per-sample", "3.0"])
    r = read_json(out)
    hetero, equal = r["speeds:1,1,1,0.5"]["stats"], r["none"]["stats"]
    assert (hetero["micro_batch"], hetero["global_batch"], hetero["batch_size"]) == (8, 224, 56)
    w_by_epoch = [h["w"] for h in hetero["epochs"]] + [hetero["epochs"][-1]["next_w"]]
    assert w_by_epoch[0] == [7, 7, 7, 7]

    def ratio(w):  # the slow rank's work over a fast rank's (mean): the speed ratio is 0.5
        return w[3] / np.mean(w[:3])

    # within 5 epochs the allocation ratio is within 10% of the speed ratio, and it ends there
    close = [k for k, w in enumerate(w_by_epoch) if abs(ratio(w) - 0.5) <= 0.05]
    assert close and close[0] <= 5, w_by_epoch
    assert abs(ratio(w_by_epoch[-1]) - 0.5) <= 0.05, w_by_epoch
    # once balanced, the ranks compute for about the same time per round
    last = hetero["epochs"][-1]
    assert max(last["t_s_round_s"]) / min(last["t_s_round_s"]) < 1.5, last
    # the scenario really halved rank 3's measured speed (median over epochs; the machine is shared)
    measured = [h["speed_samples_per_s"] for h in hetero["epochs"]]
    assert 0.35 < np.median([v[3] / np.mean(v[:3]) for v in measured]) < 0.65, measured
    for stats in (hetero, equal):
        for h in stats["epochs"]:
            assert set(h) >= {"w", "t_s_s", "wait_s", "efficiency", "speed_samples_per_s", "samples", "epoch_wall_s"}
            assert h["efficiency"] == pytest.approx(_efficiency(h), rel=1e-9) and h["efficiency"] > 0
    assert all(h["w"] == [7, 7, 7, 7] for h in equal["epochs"]) and equal["final_w"] == [7, 7, 7, 7]
    assert r["speeds:1,1,1,0.5"]["weights_diff"] == 0.0 and r["none"]["weights_diff"] == 0.0


def test_digits_accuracy_within_one_point_of_bsp_with_the_same_global_batch(tmp_path):
    common = ["examples/keras_digits.py", "--epochs", "20", "--lr", "0.2", "--quiet", "--batch-size", "32"]
    # the same --batch-size 32 for both. BSP: 2 ranks x 32 samples = 64 per step; task allocation with its
    # defaults (adaptive: C = n b = 64 single-sample micro-batches): 64 per round as well,
    # under a 2x slower rank 1, so the shares become unequal
    launch(2, common + ["--protocol", "bsp", "--out", str(tmp_path / "bsp")], launcher="horovodrun-mpi")
    launch(2, common + ["--protocol", "taskalloc", "--protocol-arg", "mode=adaptive", "--slowdown", "speeds:1,0.5",
                        "--out", str(tmp_path / "ta")], launcher="horovodrun-mpi")
    bsp, ta = read_json(tmp_path / "bsp" / "summary.json"), read_json(tmp_path / "ta" / "summary.json")
    assert bsp["final_test_accuracy"] >= 0.9
    assert abs(ta["final_test_accuracy"] - bsp["final_test_accuracy"]) <= 0.01, (ta["final_test_accuracy"],
                                                                                bsp["final_test_accuracy"])
    assert ta["protocol"] == "taskalloc" and ta["weights_in_sync"] is True
    stats = ta["stats"]
    assert stats["mode"] == "adaptive" and stats["total"] == 64 and stats["micro_batch"] == 1
    assert stats["global_batch"] == 64 and stats["batch_size"] == 32 and ta["protocol_config"]["micro_batch"] is None
    assert len(stats["epochs"]) == 20 and all(sum(h["w"]) == 64 and min(h["w"]) >= 1 for h in stats["epochs"])
    for h in stats["epochs"]:  # per-epoch statistics in summary.json: w, t_s, waiting time per rank, E
        assert len(h["w"]) == len(h["t_s_s"]) == len(h["wait_s"]) == 2 and min(h["t_s_s"]) > 0
        assert min(h["wait_s"]) >= 0 and h["epoch_wall_s"] > 0
        assert h["efficiency"] == pytest.approx(_efficiency(h), rel=1e-9) and h["efficiency"] > 0
        assert sum(h["samples"]) == 1437
    # same number of steps (= synchronization rounds) on every rank, one sync per step
    steps = ta["steps"]
    assert [r["steps"] for r in ta["per_rank"]] == [steps] * 2 and stats["syncs"] == steps
    assert steps == 20 * stats["rounds_per_epoch"]
    n_train = 1437
    assert sum(r["samples"] for r in ta["per_rank"]) == 20 * n_train  # every sample once per epoch
    # C = n b = 64 single samples, equal shares first; then the 2x slower rank 1 loses work
    assert [h["w"] for h in stats["epochs"]][0] == [32, 32] and stats["final_w"][1] < 32
    recs = read_jsonl(tmp_path / "ta" / "rank1.jsonl")
    assert len(recs) == steps and {"w", "samples", "round_samples", "sync_wait_ms"} <= set(recs[0])
    assert all(r["round_samples"] in (64.0, float(n_train - 64 * (stats["rounds_per_epoch"] - 1))) for r in recs)


def test_adaptive_allocation_from_a_users_tf_data_pipeline(tmp_path):
    """fit_dataset under adaptive mode: the user's per-rank pipeline is batched by the epoch's w_i."""
    out = tmp_path / "adaptive_dataset.json"
    # 2 ranks, b = 32: BSP's 64 samples per round in C = 16 micro-batches of 4; rank 1 half as fast
    launch(2, ["tests/jobs/taskalloc_adaptive.py", str(out), "--slowdown", "speeds:1,0.5", "--epochs", "4",
               "--total", "16", "--batch-size", "32", "--tile", "1", "--width", "8",
               "--device-ms-per-sample", "3.0", "--fit-dataset"])
    st = read_json(out)["speeds:1,0.5"]
    stats = st["stats"]
    assert (stats["micro_batch"], stats["global_batch"]) == (4, 64)
    epochs = stats["epochs"]
    assert epochs[0]["w"] == [8, 8]
    rounds = stats["rounds_per_epoch"]
    for h in epochs:  # every step of an epoch took exactly w_i micro-batches of the user's pipeline
        assert h["samples"] == [w * 4 * rounds for w in h["w"]], h
        assert sum(h["w"]) == 16
    final = stats["final_w"]
    assert 0.4 <= final[1] / final[0] <= 0.65, [h["w"] for h in epochs]  # speed ratio 0.5: [11, 5] or [10, 6]
    assert st["weights_diff"] <= 1e-6
