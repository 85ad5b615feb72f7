"""The judge's noise: the advisor's choices on every recorded seed, and closed-form pass probabilities."""
import json
import os

import pytest

from hetsync.bench import advisor_noise as an

SETUP = {"np": 4, "epochs": 4, "lr": 0.2, "dataset": "mnist", "target": 0.9, "dilation": 1.0}


def _doc(folder, name, times, choices=None, **setup):
    """Write a check document: ``times`` {scenario: {protocol: {seed: seconds or None}}}."""
    runs = [{"scenario": s, "protocol": p, "seed": seed, "time_to_target_s": t}
            for s, cell in times.items() for p, r in cell.items() for seed, t in r.items()]
    doc = dict(SETUP, **setup, runs=runs,
               seeds=sorted({seed for cell in times.values() for r in cell.values() for seed in r}),
               scenarios=[{"scenario": s, "choice": c} for s, c in (choices or {}).items()])
    os.makedirs(os.path.join(folder, "simulator"), exist_ok=True)
    with open(os.path.join(folder, "simulator", name), "w") as f:
        json.dump(doc, f)


def test_pass_probability_closed_form():
    # four 3-seed subsets: b's median is 9 in two (a fails at 10/9 = 1.11), 12 in the other two (b fails at 1.2)
    times = {"a": {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0}, "b": {1: 9.0, 2: 9.0, 3: 12.0, 4: 12.0}}
    assert an.pass_probability(times, "a") == 0.5
    assert an.pass_probability(times, "b") == 0.5
    # k = 1: a passes where b took 12 s (2 of 4 seeds), b where it took 9 s
    assert an.pass_probability(times, "a", k=1) == 0.5
    # a run that missed the target is later than any that reached it: c's median is missed in the two subsets
    # holding both its misses, 5 s (a at 2x: fails) in the other two
    missed = {"a": {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0}, "c": {1: None, 2: None, 3: 5.0, 4: 5.0}}
    assert an.pass_probability(missed, "a") == 0.5
    assert an.pass_probability(missed, "c") == 0.5


def test_pass_probability_only_over_complete_seeds_and_refuses_too_few():
    # seed 4 has no run of b: not complete, not used (a's 30 s there would put a's median of {1,2,4} at 30)
    times = {"a": {1: 10.0, 2: 10.0, 3: 10.0, 4: 30.0}, "b": {1: 12.0, 2: 12.0, 3: 12.0}}
    assert an.complete_seeds(times) == [1, 2, 3]
    assert an.pass_probability(times, "a") == 1.0
    with pytest.raises(ValueError, match="k=4"):
        an.pass_probability(times, "a", k=4)
    with pytest.raises(ValueError, match="'z'"):
        an.pass_probability(times, "z")


def test_second_check_probability_closed_form():
    # k = 1 over seeds 1, 2: the best of seed 1 is b (9 s), on seed 2 b took 12 s: 1.2x a's, fails; the best of
    # seed 2 is a, on seed 1 a is 10/9 = 1.11x b's, fails
    assert an.second_check_probability({"a": {1: 10.0, 2: 10.0}, "b": {1: 9.0, 2: 12.0}}, k=1) == 0.0
    assert an.second_check_probability({"a": {1: 10.0, 2: 10.0}, "b": {1: 9.0, 2: 9.5}}, k=1) == 1.0
    assert an.second_check_probability({"a": {1: 10.0, 2: 10.0}, "b": {1: 9.0, 2: 9.5}}, k=2) is None
    with pytest.raises(ValueError, match="k=0"):
        an.second_check_probability({"a": {1: 1.0}}, k=0)


def test_pooled_runs_refuses_mixed_setups_and_conflicts(tmp_path):
    with pytest.raises(FileNotFoundError, match="no advisor check or calibration document for 4 ranks"):
        an.pooled_runs(str(tmp_path), 4)
    _doc(tmp_path, "advisor_calibration.json", {"s": {"a": {4: 10.0}}})
    _doc(tmp_path, "advisor_check.json", {"s": {"a": {1: 10.0}}}, epochs=8)
    with pytest.raises(ValueError, match="epochs=8 where advisor_calibration.json has 4"):
        an.pooled_runs(str(tmp_path), 4)
    _doc(tmp_path, "advisor_check.json", {"s": {"a": {4: 11.0}}})
    with pytest.raises(ValueError, match="s/a seed 4 with different times"):
        an.pooled_runs(str(tmp_path), 4)
    _doc(tmp_path, "advisor_check.json", {"s": {"a": {1: 10.0}}}, np=8)
    with pytest.raises(ValueError, match="advisor_check.json records np=8 where 4 ranks"):
        an.pooled_runs(str(tmp_path), 4)
    (tmp_path / "simulator" / "advisor_check.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the runs of advisor_check.json"):
        an.pooled_runs(str(tmp_path), 4)
    # a calibration document without a dilation reads as dilation 1
    _doc(tmp_path, "advisor_calibration.json", {"s": {"a": {4: 10.0}}}, dilation=None)
    _doc(tmp_path, "advisor_check.json", {"s": {"a": {1: 12.0}}})
    docs, times = an.pooled_runs(str(tmp_path), 4)
    assert [name for name, _ in docs] == ["advisor_calibration.json", "advisor_check.json"]
    assert times == {"s": {"a": {4: 10.0, 1: 12.0}}}


def test_report_judges_each_checks_choice_on_the_pooled_medians(tmp_path):
    # pooled over seeds 1-6: a's median 10, b's median (9, 9, 9, 12, 12, 12) = 10.5: a is the pooled best
    _doc(tmp_path, "advisor_calibration.json", {"s": {"a": {4: 10.0, 5: 10.0, 6: 10.0},
                                                      "b": {4: 12.0, 5: 12.0, 6: 12.0}}})
    _doc(tmp_path, "advisor_check.json", {"s": {"a": {1: 10.0, 2: 10.0, 3: 10.0}, "b": {1: 9.0, 2: 9.0, 3: 9.0}}},
         choices={"s": "b"})
    _doc(tmp_path, "advisor_check_fresh.json", {}, choices={})
    rep = an.report(str(tmp_path), 4)
    row, = rep["rows"]
    assert row["seeds"] == 6 and row["best"] == "a" and row["medians"] == {"a": 10.0, "b": 10.5}
    # b within 5% of a on the pooled medians: the check's choice passes there (on its own seeds b was the best)
    assert row["choices"] == {"advisor_check.json": {"choice": "b", "ratio": 1.05, "ok": True}}
    assert rep["summary"]["pooled"] == {"advisor_check.json": [1, 1]}
    # 20 subsets of 3 of the 6 seeds; b's median is 9 where it holds at least two of seeds 1-3 (10 subsets:
    # a fails at 1.11), 12 in the other 10
    assert row["p_best"] == 0.5 and row["robust"] == "a" and row["p_robust"] == 0.5
    # the only 3-subset disjoint from A is its complement: where A holds two or more of seeds 1-3 its best is b,
    # which takes 12 s on the complement (fails at 1.2); otherwise its best is a, and the complement's b takes 9 s
    # (a fails at 1.11): a second check never passes
    assert row["p_second"] == 0.0


def test_main_writes_the_generated_block(tmp_path, capsys):
    # seed 5 has a run of a only (incomplete); scenario t has 3 complete seeds: nothing to hold out, left out
    _doc(tmp_path, "advisor_check.json", {"s": {"a": {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 1.0},
                                                "b": {1: 20.0, 2: 20.0, 3: None, 4: 20.0}},
                                          "t": {"a": {1: 1.0, 2: 1.0, 3: 1.0}}}, choices={"s": "a"})
    # the fresh check chose a too: on the pooled medians a (10 s) beats b (median of 5, 5, 20, 20, 20 and a miss:
    # 20 s); on the seeds the check does not record (7, 8) b took 5 s: a at 2x fails there
    _doc(tmp_path, "advisor_check_fresh.json", {"s": {"a": {7: 10.0, 8: 10.0}, "b": {7: 5.0, 8: 5.0}}},
         choices={"s": "a"})
    with open(tmp_path / "simulator.md", "w") as f:
        f.write(f"# page\n\n{an.BEGIN}\nold\n{an.END}\n\nafter\n")
    assert an.main(["--docs-dir", str(tmp_path), "--np", "4", "--update-docs"]) == 0
    text = (tmp_path / "simulator.md").read_text()
    assert "old" not in text and text.endswith("after\n")
    assert "the check's choices pass in 1 of 1; the fresh check's choices pass in 1 of 1." in text
    assert "(all but the check's) the fresh check's choices pass in 0 of 1." in text and "| 2.000 (fails)  " in text
    assert "| 6 (+1 incomplete) |" in text and "Left out (at most 3 complete seeds): t (3)." in text
    assert "a (10.0 s)" in text and "| a 1.000 " in text
    assert an.main(["--docs-dir", str(tmp_path), "--np", "8"]) == 2
    assert "no advisor check or calibration document for 8 ranks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        an.main(["--docs-dir", str(tmp_path), "--k", "0"])


def test_at_least_and_convolve_closed_form():
    # two independent scenarios at 0.5 each: counts 0, 1, 2 with 0.25, 0.5, 0.25; 0.8 of 2 rounds up to 2
    two = an.convolve([0.5, 0.5], [0.5, 0.5])
    assert two == [0.25, 0.5, 0.25]
    assert an.at_least(two) == 0.25 and an.at_least(two, share=0.5) == 0.75
    # 0.4 of 2 is 0.8: rounded up to 1 scenario (not down to 0)
    assert an.at_least(two, share=0.4) == 0.75
    # 7 of 8 at 0.9 each, 13 of 16 at 0.5 each, 7 of 10 (0.7 x 10 is 7.000000000000001 in floating point)
    eight = [1.0]
    for _ in range(8):
        eight = an.convolve(eight, [0.1, 0.9])
    assert an.at_least(eight) == pytest.approx(0.9 ** 8 + 8 * 0.9 ** 7 * 0.1)
    sixteen = [1.0]
    for _ in range(16):
        sixteen = an.convolve(sixteen, [0.5, 0.5])
    assert an.at_least(sixteen) == pytest.approx((1 + 16 + 120 + 560) / 2 ** 16)
    ten = [0.0] * 11
    ten[7] = 1.0
    assert an.at_least(ten, share=0.7) == 1.0
    for bad, share in (([1.0], 0.8), ([0.5, 0.5], 0.0)):
        with pytest.raises(ValueError, match="a distribution over at least one scenario"):
            an.at_least(bad, share)


def test_held_out_probability_and_pass_counts_closed_form():
    # seeds 1-4; a always 10 s; b 9 s under seeds 1-2, 12 s under 3-4. Check {1,2,3}: the other seed is 4, where
    # b took 12: a is its best, and on {1,2,3} b's median is 9 (a at 1.11 fails). Check {1,3,4}: the other seed
    # is 2 (b best), and b's median on {1,3,4} is 12 (fails at 1.2). Every check fails: the held-out best is
    # always the wrong one here
    flip = {"a": {s: 10.0 for s in range(1, 5)}, "b": {1: 9.0, 2: 9.0, 3: 12.0, 4: 12.0}}
    assert an.held_out_probability(flip) == 0.0
    # a clear winner passes every check
    clear = {"a": {s: 10.0 for s in range(1, 5)}, "b": {s: 20.0 for s in range(1, 5)}}
    assert an.held_out_probability(clear) == 1.0
    assert an.held_out_probability({"a": {1: 1.0, 2: 1.0, 3: 1.0}}) is None
    with pytest.raises(ValueError, match="k=0"):
        an.held_out_probability(clear, k=0)
    # on one check the two scenarios share seeds: clear passes all 4 checks, flip none: exactly 1 of 2 always
    dist, shared = an.pass_counts({"clear": clear, "flip": flip})
    assert shared == 4 and dist == [0.0, 1.0, 0.0]
    # the pooled best of flip is a (median 10 against 10.5): it passes where b's median is 12 (2 of 4 checks)
    dist, _ = an.pass_counts({"clear": clear, "flip": flip}, held_out=False)
    assert dist == [0.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="share 2"):
        an.pass_counts({"clear": clear, "few": {"a": {1: 1.0, 2: 1.0}}})
    with pytest.raises(ValueError, match="scenario few has no seed besides"):
        an.pass_counts({"clear": clear, "few": {"a": {1: 1.0, 2: 1.0, 3: 1.0}}})
    with pytest.raises(ValueError, match="no scenario"):
        an.pass_counts({})


def test_combined_over_world_sizes(tmp_path):
    seeds = range(1, 5)
    _doc(tmp_path, "advisor_check.json", {"s": {"a": {i: 10.0 for i in seeds}, "b": {i: 20.0 for i in seeds}}},
         choices={"s": "a"})
    _doc(tmp_path, "advisor_check_np8.json", {"s": {"a": {i: 10.0 for i in seeds}, "b": {i: 5.0 for i in seeds}}},
         choices={"s": "a"}, np=8, dilation=3)
    with open(tmp_path / "simulator.md", "w") as f:
        f.write(f"{an.BEGIN}\n{an.END}\n")
    assert an.main(["--docs-dir", str(tmp_path), "--update-docs"]) == 0
    # the best (a at 4 ranks, b at 8) wins every check of its world size; the check chose a in both: the best at
    # 4 ranks, 2x b's time at 8 (fails)
    assert ("Over 4 and 8 ranks together (2 scenarios, world sizes independent): a perfect advisor passes at least "
            "80% (2) with probability 1.00 (the best of the other seeds; the pooled best: 1.00); pooled judge: the "
            "check's choices 1 of 2.") in (tmp_path / "simulator.md").read_text()
    with pytest.raises(ValueError, match="no report"):
        an.combined([])
