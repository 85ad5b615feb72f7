"""RNA with real 4-rank mpirun / horovodrun jobs: closed-form rounds, a deterministic straggler, clean termination."""
import json


from conftest import launch, read_json



def check_rounds(r):
    """Every round's result is the mean of exactly its contributors' constants c_i = i + 1."""
    ranks = r["ranks"]
    n = r["n"]
    by_round = {}
    for rk in ranks:
        logs = rk["log"]
        assert [e["round"] for e in logs] == sorted(e["round"] for e in logs)
        for e in logs:
            assert e["w"] in (0.0, 1.0)
            if e["w"]:
                assert e["g"] == rk["c"]  # the staleness-weighted mean of a constant is that constant
                assert e["its"] and e["its"][-1] - e["its"][0] <= 3  # max_staleness
            else:
                assert e["g"] == 0.0 and e["its"] == []  # the null gradient
            by_round.setdefault(e["round"], {})[rk["rank"]] = e
    assert len(by_round) == r["stats"]["rounds"] > 0
    for rid, entries in by_round.items():
        assert sorted(entries) == list(range(n)), f"round {rid} not joined by every rank"
        contributors = [i for i, e in entries.items() if e["w"] == 1.0]
        assert contributors, f"round {rid} had no contributor (the initiator always has a gradient)"
        expected = sum(i + 1 for i in contributors) / len(contributors)
        for e in entries.values():  # every rank published the same reduced vector
            assert e["sum_w"] == len(contributors)
            assert abs(e["sum_wg"] / e["sum_w"] - expected) < 1e-5
    return by_round


def test_rounds_average_exactly_the_contributors_and_a_straggler_contributes_weight_zero(tmp_path):
    out = tmp_path / "straggler.json"
    launch(4, ["tests/jobs/rna_check.py", "straggler", str(out)], timeout=240)
    r = read_json(out)
    by_round = check_rounds(r)
    assert [rk["steps_run"] for rk in r["ranks"]] == [100] * 4  # training completed on all ranks
    missed = sum(1 for entries in by_round.values() if entries[3]["w"] == 0.0)
    assert missed >= 1  # the 20x slower rank 3 missed rounds: weight 0
    s = r["stats"]
    assert s["final_reason"] == "all ranks finished"
    assert sum(s["initiator_counts"]) == s["rounds"]
    assert sum(int(k) * v for k, v in s["contributors_histogram"].items()) == sum(
        sum(1 for e in entries.values() if e["w"]) for entries in by_round.values())
    # every written gradient is accounted for: taken into a round, dropped by the bound, or left at the end
    for pr in s["per_rank"]:
        assert pr["written"] == pr["steps"] == 100
        assert pr["written"] == pr["taken"] + pr["dropped"] + pr["undrained_at_end"]
    assert s["dropped_gradients"] == sum(pr["dropped"] for pr in s["per_rank"])
    assert sum(s["staleness_histogram"]) == sum(pr["taken"] for pr in s["per_rank"])
    assert len(set(rk["w_final"] for rk in r["ranks"])) == 1  # average_at_end: one final model
    assert s["drift_before_final_average"] > 0.0


def _samples_rule_run(tmp_path, mode):
    """Launch ``tests/jobs/rna_check.py MODE`` on 4 ranks; return (its JSON, n, lr, {round: {rank: log entry}})."""
    out = tmp_path / f"{mode}.json"
    launch(4, ["tests/jobs/rna_check.py", mode, str(out)], timeout=240)
    r = read_json(out)
    by_round = {}
    for rk in r["ranks"]:
        for e in rk["log"]:
            by_round.setdefault(e["round"], {})[rk["rank"]] = e
    return r, r["n"], 0.01, by_round


def test_the_samples_rule_applies_every_taken_gradient_once_on_every_replica(tmp_path):
    r, n, lr, by_round = _samples_rule_run(tmp_path, "samples")
    sums = []
    for rid in sorted(by_round):
        entries = by_round[rid]
        assert sorted(entries) == list(range(n))
        # each contributor's weight is the number of gradients it took; its g' is its constant c_r
        want_w = sum(len(e["its"]) for e in entries.values())
        want_wg = sum(len(e["its"]) * (i + 1) for i, e in entries.items())
        for e in entries.values():
            assert e["sum_w"] == want_w and abs(e["sum_wg"] - want_wg) < 1e-4
        sums.append(want_wg)
    assert r["stats"]["contributors_unit"] == "gradients"
    missed = sum(1 for entries in by_round.values() if not entries[3]["its"])
    assert missed >= 1  # the straggler missed rounds
    prefix = [sum(sums[:k]) for k in range(len(sums) + 1)]
    for rk in r["ranks"]:
        # no local step and no average: the weight is -lr / n x the sum of the gradients of the rounds read so
        # far, every one of them once (a round published after the rank's last step is not applied)
        applied = -rk["w_final"] * n / lr
        assert min(abs(applied - p) for p in prefix) < 1e-3 * max(1.0, applied), (rk["rank"], applied, prefix[-5:])
    for pr in r["stats"]["per_rank"]:
        assert pr["written"] == pr["taken"] + pr["dropped"] + pr["undrained_at_end"]


def test_waiting_for_the_round_makes_every_step_read_its_own_gradient_before_the_next(tmp_path):
    r, n, lr, by_round = _samples_rule_run(tmp_path, "wait")
    sums = [sum(len(e["its"]) * (i + 1) for i, e in by_round[rid].items()) for rid in sorted(by_round)]
    st = r["stats"]
    assert st["wait_for_round"] and st["wait_unpublished"] == 0
    for pr in st["per_rank"]:  # every step read the round holding its own gradient
        assert pr["fresh_reads"] == pr["written"] == pr["steps"], pr
    assert st["staleness_histogram"][1:] == [0] * (len(st["staleness_histogram"]) - 1)  # never two pending
    for pr in st["per_rank"]:
        assert pr["undrained_at_end"] == 0 and pr["dropped"] == 0 and pr["written"] == pr["taken"] == 100
    prefix = [sum(sums[:k]) for k in range(len(sums) + 1)]
    for rk in r["ranks"]:
        own = [i for i, rid in enumerate(sorted(by_round)) if by_round[rid][rk["rank"]]["its"]]
        applied = -rk["w_final"] * n / lr
        k = min(range(len(prefix)), key=lambda j: abs(applied - prefix[j]))
        assert abs(applied - prefix[k]) < 1e-3 * max(1.0, applied), (rk["rank"], applied, prefix[-5:])
        assert k >= own[-1] + 1  # the rounds read include the one holding the rank's last gradient


def test_a_wait_lag_of_one_step_applies_each_gradient_at_most_one_step_late(tmp_path):
    r, n, lr, by_round = _samples_rule_run(tmp_path, "lag")
    sums = [sum(len(e["its"]) * (i + 1) for i, e in by_round[rid].items()) for rid in sorted(by_round)]
    assert sorted(by_round) == list(range(len(sums)))
    st = r["stats"]
    assert st["wait_for_round"] and st["wait_lag"] == 1 and st["wait_unpublished"] == 0
    assert st["staleness_histogram"][2:] == [0] * (len(st["staleness_histogram"]) - 2)  # never three pending
    prefix = [sum(sums[:k]) for k in range(len(sums) + 1)]
    overlapped = 0
    for rk in r["ranks"]:
        holding = {t: e["round"] for e in rk["log"] for t in e["its"]}
        read = rk["read_rounds"]
        assert len(read) == 100 and sorted(holding) == list(range(100))
        for t in range(1, 100):  # step t read after the round holding step t - 1's gradient was published
            assert read[t] >= holding[t - 1], (rk["rank"], t, read[t], holding[t - 1])
        overlapped += sum(read[t] < holding[t] for t in range(100))
        # every round up to the last one read, each once: the weight is -lr / n x their gradients' sum
        applied = -rk["w_final"] * n / lr
        assert abs(applied - prefix[read[-1] + 1]) < 1e-3 * max(1.0, applied), (rk["rank"], applied, read[-1])
    assert overlapped > 0  # some steps ended before their own gradient's round: the rounds overlapped compute
    for pr in st["per_rank"]:
        assert pr["dropped"] == 0 and pr["written"] == pr["taken"] == 100


def test_the_staleness_dependent_rate_scales_each_contribution_by_its_rounds_of_staleness(tmp_path):
    out = tmp_path / "stalelr.json"
    launch(4, ["tests/jobs/rna_check.py", "stalelr", str(out)], timeout=240)
    r = read_json(out)
    n, lr = r["n"], 0.01
    by_round, factors, hist = {}, [], [0] * 64
    for rk in r["ranks"]:
        read = rk["read_rounds"]
        assert read[0] == -1 and read == sorted(read)  # the first step saw no round; rounds are read in order
        for e in rk["log"]:
            by_round.setdefault(e["round"], {})[rk["rank"]] = e
            if e["its"]:  # c_t = R - 1 - r(t) rounds; f_t = 1 / max(c_t, 1); weights a_t = t - t_0 + 1
                c = [max(e["round"] - 1 - read[t], 0) for t in e["its"]]
                a = [t - e["its"][0] + 1 for t in e["its"]]
                e["f"] = sum(ai / max(ci, 1) for ai, ci in zip(a, c)) / sum(a)
                factors.append(e["f"])
                for ci in c:
                    hist[min(ci, 15)] += 1
    sums = []
    for rid in sorted(by_round):
        entries = by_round[rid]
        want_w = sum(len(e["its"]) for e in entries.values())
        want_wg = sum(len(e["its"]) * e["f"] * (i + 1) for i, e in entries.items() if e["its"])
        for e in entries.values():  # w counts the gradients; w g' carries m x the mean factor
            assert e["sum_w"] == want_w and abs(e["sum_wg"] - want_wg) < 1e-4 * max(1.0, want_wg)
        sums.append(want_wg)
    s = r["stats"]
    assert s["stale_lr"] == "inverse"
    assert s["round_staleness_histogram"] == hist[:16]
    assert sum(hist[2:]) >= 1 and min(factors) < 1.0  # the straggler's gradients were stale by 2 rounds or more
    assert abs(s["lr_scale_mean"] - sum(factors) / len(factors)) < 1e-9
    prefix = [sum(sums[:k]) for k in range(len(sums) + 1)]
    for rk in r["ranks"]:  # every replica applied -lr / n x the scaled sums of the rounds it read, once each
        applied = -rk["w_final"] * n / lr
        assert min(abs(applied - p) for p in prefix) < 1e-3 * max(1.0, applied), (rk["rank"], applied, prefix[-5:])


def test_ranks_with_different_step_counts_end_cleanly(tmp_path):
    out = tmp_path / "uneven.json"
    launch(4, ["tests/jobs/rna_check.py", "uneven", str(out)], timeout=240)
    r = read_json(out)
    check_rounds(r)
    s = r["stats"]
    assert [rk["steps_run"] for rk in r["ranks"]] == [40, 80, 120, 160]
    assert s["final_reason"] == "all ranks finished"
    assert s["done_steps"] == {"0": 40, "1": 80, "2": 120, "3": 160}
    for pr in s["per_rank"]:
        assert pr["written"] == pr["taken"] + pr["dropped"] + pr["undrained_at_end"]


def test_a_rank_that_stops_stepping_does_not_hang_the_others(tmp_path):
    out = tmp_path / "stall.json"
    proc = launch(4, ["tests/jobs/rna_check.py", "stall", str(out)], timeout=240)
    r = read_json(out)
    check_rounds(r)
    s = r["stats"]
    assert "ranks [2] did not finish within finish_timeout_s=3 s" in s["final_reason"]
    assert "ranks [2] did not finish within finish_timeout_s=3 s" in proc.stderr + proc.stdout
    assert [rk["steps_run"] for rk in r["ranks"]] == [60] * 4
    stalled = s["per_rank"][2]
    # rank 2 trained its last 50 steps after the final round (it waited for it): counted, never silent
    assert stalled["written"] - stalled["taken"] >= 50
    assert stalled["written"] == stalled["taken"] + stalled["dropped"] + stalled["undrained_at_end"]
    assert s["unsynchronized_gradients"] >= 50
    # nobody waited for timeout_s (30 s) on top of the stall, let alone horovod's stall shutdown
    assert r["ranks"][0]["wall_s"] < 60.0


def test_a_rank_whose_thread_does_not_end_makes_every_rank_fail_the_same_way_after_the_gather(tmp_path):
    """Rank 1's communication thread outlives its 16 s join budget: stop() records that, the statistics
    are still gathered from every rank, and every rank raises the same RNAError naming rank 1, within
    the budget (not after horovod's stall shutdown, 120 s in the tests)."""
    out = tmp_path / "stuck.json"
    launch(4, ["tests/jobs/rna_check.py", "stuck", str(out)], timeout=240)
    r = read_json(out)
    errors = {rk["error"] for rk in r["ranks"]}
    assert len(errors) == 1 and None not in errors, errors  # the same error on every rank
    (error,) = errors
    assert error.startswith("RNA failed on rank(s) 1: rank 1: RNA communication thread did not end within 16 s")
    budget = 2.0 + 4.0 + 10.0
    stops = [rk["stop_s"] for rk in r["ranks"]]
    assert stops[1] >= budget  # rank 1 waited its whole join budget
    assert max(stops) < budget + 30.0, stops  # and nobody waited much longer
    s = r["stats"]  # gathered before the error was raised
    assert [pr["rank"] for pr in s["per_rank"]] == [0, 1, 2, 3]
    assert [pr["error"] is not None for pr in s["per_rank"]] == [False, True, False, False]
    assert s["final_reason"] == "all ranks finished"
    for pr in s["per_rank"]:
        assert pr["steps"] == pr["written"] == 30
        assert pr["written"] == pr["taken"] + pr["dropped"] + pr["undrained_at_end"]
    assert "drift_before_final_average" not in s  # no final average after a failure


def test_rna_trains_digits_under_random_slowdown_with_statistics(tmp_path):
    launch(4, ["examples/keras_digits.py", "--protocol", "rna", "--epochs", "8", "--lr", "0.2", "--quiet",
               "--slowdown", "random:6", "--out", str(tmp_path), "--protocol-arg", "probes=2"],
           launcher="horovodrun-mpi", timeout=300)
    s = read_json(tmp_path / "summary.json")
    assert s["protocol"] == "rna" and s["protocol_config"]["probes"] == 2
    assert s["final_test_accuracy"] >= 0.85
    assert s["weights_in_sync"] is True  # average_at_end
    st = s["stats"]
    for key in ("rounds", "contributors_histogram", "initiator_counts", "probe_response_ms", "staleness_histogram",
                "dropped_gradients", "drift_max", "drift_before_final_average"):
        assert key in st, key
    assert st["rounds"] > 10 and len(st["initiator_counts"]) == 4
    rec = json.loads(open(tmp_path / "rank1.jsonl").readline())
    assert {"rna_fresh", "rna_round", "rna_contributors", "rna_dropped", "rna_rounds", "rna_drift"} <= set(rec)


def test_rna_refused_under_gloo_before_training(tmp_path):
    proc = launch(2, ["examples/keras_digits.py", "--protocol", "rna", "--epochs", "1", "--quiet", "--out",
                      str(tmp_path)], launcher="horovodrun-gloo", timeout=120, check=False)
    assert proc.returncode != 0
    assert "needs MPI point-to-point messaging" in proc.stdout + proc.stderr
