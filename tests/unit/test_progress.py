"""Samples to target, steady samples/s, host time and the heterogeneity tax (hetsync.bench.progress),
from hand-made step records with closed-form answers, and the step records SyncMetrics writes."""
import json
import os
import types

import keras
import numpy as np
import pytest

import hetsync
from hetsync.bench import matrix, progress, table


def _records(start_unix, step_s, steps, b, epoch_steps, last_batch=None, compute_ms=2.0, delay_ms=3.0):
    """One rank's records: ``steps`` steps of ``step_s`` seconds, ``b`` samples each, epochs of
    ``epoch_steps`` steps whose last step has ``last_batch`` samples (a partial batch)."""
    out, done = [], 0
    for i in range(steps):
        epoch, k = divmod(i, epoch_steps)
        done += (last_batch or b) if k == epoch_steps - 1 else b
        out.append({"step": i, "epoch": epoch, "unix_s": start_unix + (i + 1) * step_s, "samples_processed": done,
                    "step_ms": step_s * 1e3, "compute_ms": compute_ms, "delay_ms": delay_ms,
                    "host_ms": step_s * 1e3 - compute_ms - delay_ms})
    return out


def test_samples_to_target_counts_every_rank_up_to_the_first_evaluation_at_target():
    fast = _records(1000.0, 0.010, 40, 32, 10)   # steps end at 1000.01, 1000.02, ...
    slow = _records(1000.0, 0.025, 16, 32, 10)
    progress_ = [progress.rank_progress(fast), progress.rank_progress(slow)]
    # at 1000.105 s: the fast rank has ended 10 steps, the slow one 4 (1000.100 <= t)
    assert progress.samples_at(progress_, 1000.105) == 10 * 32 + 4 * 32
    assert progress.samples_at(progress_, 999.0) == 0
    curve = [{"accuracy": 0.5, "unix_s": 1000.05}, {"accuracy": 0.91, "unix_s": 1000.105},
             {"accuracy": 0.95, "unix_s": 1000.3}]
    assert progress.samples_to_target(progress_, curve, 0.9) == 14 * 32
    assert progress.samples_to_target(progress_, curve, 0.99) is None
    assert progress.samples_to_target(progress_, curve, None) is None
    with pytest.raises(ValueError, match="unix_s"):
        progress.samples_to_target(progress_, [{"accuracy": 0.95, "wall_s": 1.0}], 0.9)
    with pytest.raises(ValueError, match="step record 0"):
        progress.rank_progress([{"step": 0, "wall_s": 0.1}])


def test_steady_rate_after_the_first_epoch_includes_the_epoch_boundaries():
    a = _records(0.0, 0.010, 30, 32, 10, last_batch=8)  # epochs of 9 x 32 + 8 = 296 samples
    b = _records(0.0, 0.020, 30, 32, 10, last_batch=8)
    for r in b[20:]:
        r["unix_s"] += 1.0  # a 1 s stall at rank b's second epoch boundary
    # rank a: 2 epochs (592 samples) in 20 steps x 10 ms; rank b: 592 samples in 20 x 20 ms + 1 s
    expected = 592 / 0.2 + 592 / (0.4 + 1.0)
    assert progress.steady_samples_per_s([a, b]) == pytest.approx(expected)
    assert progress.steady_samples_per_s([a[:10]]) is None  # one epoch: no steady part
    # host time: 10 - 5 = 5 ms per step on rank a, 20 - 5 = 15 on rank b (first steps left out)
    assert progress.host_ms_median([a, b]) == pytest.approx(10.0)
    assert progress.host_ms_median([[{"step": 0}, {"step": 1}]]) is None


def test_homogeneous_twin_has_the_same_total_speed():
    # device:40+random:6 on n ranks: mean step 40 (1 + 5/n) ms
    assert progress.homogeneous_twin("device:40+random:6", 4, 32) == "device:90"
    assert progress.homogeneous_twin("device:40+random:6", 8, 32) == "device:65"
    # speeds 1,1,1,0.5 of a 40 ms device: 800 x 3 + 400 samples/s; 4 x 32 / 2800 s = 45.714 ms
    assert progress.homogeneous_twin("device:40+speeds:1,1,1,0.5", 4, 32) == "device:45.714"
    with pytest.raises(ValueError, match="no emulated device"):
        progress.homogeneous_twin("random:6", 4, 32)


def test_twins_are_planned_and_give_the_heterogeneity_tax():
    p = matrix.Preset("t", np=4, cells=(matrix.parse_cell("digits/device:40+random:6"),
                                        matrix.parse_cell("digits/device:40")), seeds=(0,),
                      epochs={"digits": 2}, twins=True)
    order = [(cell.key, proto) for _, cell, proto in matrix.plan(p, ["bsp", "rna"])]
    # the homogeneous cell has no twin (it is its own)
    assert order == [("digits/device:40+random:6", "bsp"), ("digits/device:40+random:6", "rna"),
                     ("digits/device:90~twin", "bsp"), ("digits/device:40", "rna"), ("digits/device:40", "bsp")]

    def run(proto, cell, ttt, stt, twin_of=None):
        return {"protocol": proto, "seed": 0, "cell": cell, "dataset": "digits", "scenario": "x", "status": "ok",
                "time_to_target_s": ttt, "samples_to_target": stt, "samples_per_s": 1.0, "steps_per_s": 1.0,
                "efficiency": 1.0, "final_test_accuracy": 0.9, "twin_of": twin_of}
    runs = [run("bsp", "c", 20.0, 4000), run("rna", "c", 10.0, 5000), run("bsp", "c~twin", 8.0, 4000, twin_of="c")]
    matrix.add_ratios(runs)
    assert runs[1]["statistical_efficiency"] == pytest.approx(0.8)
    assert runs[1]["heterogeneity_tax"] == pytest.approx(10.0 / 8.0)
    assert runs[0]["heterogeneity_tax"] == pytest.approx(20.0 / 8.0)
    md = table.markdown_table({"aggregate": matrix.aggregate(runs), "preset": {"np": 4}})
    header = [c.strip() for c in md.splitlines()[0].strip("|").split("|")]
    row = next([c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if "| rna" in line)
    assert row[header.index("samples to target")] == "5000"
    assert row[header.index("statistical efficiency")] == "0.80"
    assert row[header.index("heterogeneity tax")] == "1.25"


def test_run_progress_of_a_run_folder(tmp_path):
    recs = [_records(100.0, 0.01, 20, 32, 10), _records(100.0, 0.02, 10, 32, 5)]
    for r, rr in enumerate(recs):
        (tmp_path / f"rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rr))
    (tmp_path / "summary.json").write_text(json.dumps({
        "per_rank": [{"rank": 0, "role": "worker"}, {"rank": 1, "role": "worker"}, {"rank": 2, "role": "server"}],
        "target_accuracy": 0.9, "accuracy_curve": [{"accuracy": 0.92, "unix_s": 100.105}]}))
    fig = progress.run_progress(str(tmp_path))
    assert fig["samples_to_target"] == 10 * 32 + 5 * 32
    assert fig["samples_per_s_steady"] == pytest.approx(320 / 0.1 + 160 / 0.1)
    assert fig["host_ms_median"] == pytest.approx(5.0)  # 19 steps of 5 ms against 9 of 15 ms
    assert fig["time_to_target_after_first_step_s"] is None  # the summary says no time to target


def test_time_to_target_counts_from_the_end_of_rank_0s_first_step(tmp_path):
    from hetsync.bench import report
    # rank 0's first (compiling) step ended 1.2 s into training; the target was reached 6.0 s in: 4.8 s
    recs = [dict(r, wall_s=1.2 + 0.05 * i) for i, r in enumerate(_records(100.0, 0.05, 10, 32, 10))]
    assert progress.time_after_first_step(6.0, recs) == pytest.approx(4.8)
    assert progress.time_after_first_step(None, recs) is None and progress.time_after_first_step(6.0, []) is None
    assert progress.time_after_first_step(1.0, recs) == 0.0  # never negative
    runs = {}
    for name, first, ttt in (("bsp", 0.7, 10.7), ("rna", 1.2, 6.2)):
        d = tmp_path / name
        d.mkdir()
        (d / "rank0.jsonl").write_text(json.dumps({"step": 0, "wall_s": first, "unix_s": 1.0,
                                                   "samples_processed": 32}) + "\n")
        (d / "summary.json").write_text(json.dumps({
            "protocol": name, "per_rank": [{"rank": 0, "role": "worker"}], "target_accuracy": 0.9,
            "time_to_target_s": ttt, "accuracy_curve": [{"accuracy": 0.95, "unix_s": 1.0}]}))
        runs[name] = str(d)
    assert progress.run_progress(runs["rna"])["time_to_target_after_first_step_s"] == pytest.approx(5.0)
    # a summary written before the field: the table reads rank0.jsonl beside it; BSP 10.0 s over RNA's 5.0 s
    summaries = report.load_summaries([runs["bsp"], runs["rna"]])
    assert [report.time_to_target(s) for s in summaries] == [pytest.approx(10.0), pytest.approx(5.0)]
    _, rows = report.comparison_rows(summaries)
    assert [(r[6], r[7]) for r in rows] == [("10.0", "1.00x"), ("5.0", "2.00x")]
    # a summary with the field uses it as it is
    assert report.time_to_target({"time_to_target_after_first_step_s": 3.5, "time_to_target_s": 9.0}) == 3.5


@pytest.fixture(scope="module")
def _initialised():
    hetsync.init()


@pytest.mark.usefixtures("_initialised")
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_step_records_count_samples_exactly_and_time_outside_the_device(tmp_path, steps_per_execution):
    """One process, BSP's shard plan: 200 samples in batches of 32 are 6 equal steps per epoch (the plan's
    shards are equally long: 192 samples per epoch)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    opt = hetsync.BSP(keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", steps_per_execution=steps_per_execution)
    fit = opt.hetsync_protocol.fit_data(x, y, 32, seed=0)
    metrics = hetsync.callbacks.SyncMetrics(str(tmp_path), opt)
    model.fit(**fit, epochs=2, verbose=0, callbacks=hetsync.callbacks.standard(opt) + [metrics])
    with open(os.path.join(tmp_path, "rank0.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    expected = [32 * (i + 1) for i in range(12)]
    if steps_per_execution == 2:  # one record per call of 2 steps
        expected = expected[1::2]
    assert [r["samples_processed"] for r in recs] == expected
    assert metrics.per_rank[0]["samples"] == 384
    assert all(b["unix_s"] > a["unix_s"] for a, b in zip(recs, recs[1:]))
    assert all(0.0 <= r["host_ms"] <= r["step_ms"] / r["steps_in_call"] for r in recs)
    # the gradient's size, per variable and in all: Dense(4 -> 2) is a [4, 2] kernel and a [2] bias of float32
    with open(os.path.join(tmp_path, "summary.json")) as f:
        summary = json.load(f)
    assert summary["variable_bytes"] == [32, 8] and summary["gradient_bytes"] == 40


def test_a_partial_last_batch_is_not_over_counted():
    """7 steps of 32 on an epoch of 200 samples: the 7th step counts the 8 samples left."""
    proto = types.SimpleNamespace(batch_size=32, samples_per_epoch=200, pool=None, step_samples=lambda b: 32)
    # SyncMetrics reads the protocol through the optimizer it was given, at every use
    m = hetsync.callbacks.SyncMetrics("unused", types.SimpleNamespace(hetsync_protocol=proto))
    m._totals, m._epoch_samples = {"samples": 1000.0}, 0
    assert [m._count_samples(i, 1) for i in range(7)] == [1032, 1064, 1096, 1128, 1160, 1192, 1200]
    proto.batch_size = None  # data not from the protocol's plan: no count
    assert m._count_samples(7, 1) is None
