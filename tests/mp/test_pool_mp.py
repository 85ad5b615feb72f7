"""Work conservation with real mpirun jobs: the asynchronous protocols on the sample pool.

Each run: 2-3 ranks, digits (N = 1437 training samples), batch 32, an emulated device with rank 1
four times slower. Checked on the outputs: every epoch hands out exactly N samples, each index
once (the server's per-index counts; the clients' confirmations match what they were handed), the
per-rank step logs agree with the pool's per-rank batch counts, the slow rank processes fewer
batches once every rank has compiled (the epochs after the first), the final weights are equal where the protocol averages at the end, accuracy is sane.
"""
import collections

import pytest

from conftest import launch, read_json, read_jsonl


N_DIGITS = 1437
EPOCHS = 3


def run_pool(tmp_path, protocol, np_=3, extra=(), slowdown="device:20+deterministic:1:4"):
    out = tmp_path / protocol
    launch(np_, ["examples/keras_digits.py", "--protocol", protocol, "--dataset", "digits", "--epochs", str(EPOCHS),
                 "--batch-size", "32", "--slowdown", slowdown, "--out", str(out), "--quiet", *extra], timeout=420)
    return out, read_json(out / "summary.json")


def check_pool(out, s, workers):
    """The pool's accounting and the per-rank logs; returns {rank: batches in the epochs after the first}.

    The first epoch is left out of the returned counts: a rank's first, compiling step can take a second or two
    longer on a loaded machine while the others drain that epoch, which says nothing of the device speeds."""
    p = s["stats"]["pool"]
    assert p["n"] == N_DIGITS and len(p["epochs"]) == EPOCHS
    assert p["lost"] == p["repeated"] == p["missing"] == p["mismatched"] == 0
    for e in p["epochs"]:
        assert e["handed_out"] == N_DIGITS  # every sample exactly once (repeated == missing == 0 above)
        assert sum(e["per_rank_samples"].values()) == N_DIGITS
        assert e["confirmed_ranks"] == sorted(workers) and e["unconfirmed"] == 0
    # per-rank samples (SyncMetrics, from each rank's own epochs) sum to N per epoch
    per_rank = {r["rank"]: r for r in s["per_rank"]}
    assert sum(per_rank[w]["samples"] for w in workers) == N_DIGITS * EPOCHS
    batches = {}
    for w in workers:
        steps = collections.Counter(rec["epoch"] for rec in read_jsonl(out / f"rank{w}.jsonl"))
        for e in p["epochs"]:  # each rank's step log agrees with the batches the pool gave it
            assert steps.get(e["epoch"], 0) == e["per_rank_batches"][str(w)]
        assert per_rank[w]["samples"] == sum(e["per_rank_samples"][str(w)] for e in p["epochs"])
        batches[w] = sum(e["per_rank_batches"][str(w)] for e in p["epochs"][1:])
    return batches


def test_rna_on_the_pool_conserves_work_and_ends_with_one_model(tmp_path):
    out, s = run_pool(tmp_path, "rna")
    batches = check_pool(out, s, [0, 1, 2])
    # after the first epoch the 4x slower rank draws fewer batches than either fast rank (over the whole run it did
    # not always: rank 2 drew 33 batches to the slow rank's 38 when its first step ran long on a loaded machine)
    assert batches[1] < min(batches[0], batches[2])
    assert s["weights_in_sync"] and s["stats"]["final_average"]
    assert s["final_test_accuracy"] > 0.7


def test_rna_fixed_shares_remain_available(tmp_path):
    out, s = run_pool(tmp_path, "rna", np_=2, extra=["--protocol-arg", "data_plan=shard"])
    assert "pool" not in s["stats"]
    steps = [r["steps"] for r in s["per_rank"]]
    assert steps[0] == steps[1] == EPOCHS * ((N_DIGITS // 2) // 32)  # equal fixed shares


@pytest.mark.parametrize("protocol", ["asp", "shat", "shatroot", "ensemble", "ssp"])
def test_parameter_server_workers_draw_from_the_pool(tmp_path, protocol):
    """2 workers + 1 server: worker 0 serves the pool to workers 0 and 1; the server rank trains nothing."""
    out, s = run_pool(tmp_path, protocol)
    batches = check_pool(out, s, [0, 1])
    assert [r["role"] for r in s["per_rank"]] == ["worker", "worker", "server"]
    assert s["per_rank"][2]["samples"] == 0
    if protocol != "ssp":  # SSP's gate keeps a fast worker within s iterations of the slow one
        assert batches[1] < batches[0]
    if protocol != "ensemble":  # every rank leaves fit holding the servers' model
        assert s["weights_in_sync"]
    assert s["final_test_accuracy"] > 0.7


@pytest.mark.parametrize("protocol,args", [("localsgd", ["period=4"]), ("fedavg", ["syncs_per_epoch=4", "fraction=0.67"])])
def test_periodic_averaging_joins_the_same_rounds_on_every_rank(tmp_path, protocol, args):
    """Local SGD / FedAvg on the pool: rounds scheduled by the pool's global progress, so every rank
    joins exactly sum_e R_e averaging rounds (the collectives match, the job ends) and after the last
    round (after every rank's last step) all ranks hold the same model."""
    extra = [a for kv in args for a in ("--protocol-arg", kv)]
    out, s = run_pool(tmp_path, protocol, extra=extra)
    batches = check_pool(out, s, [0, 1, 2])
    b = N_DIGITS // 32  # 44 batches per epoch
    expected = EPOCHS * (b // (4 * 3) if protocol == "localsgd" else 4)
    assert s["stats"]["pool_rounds"] == expected  # rank 0's count; the others match or the job would hang
    assert s["stats"]["syncs"] == expected
    assert batches[1] < max(batches[0], batches[2])  # rounds are barriers: the slow rank still draws less
    assert s["weights_in_sync"]
    assert s["final_test_accuracy"] > 0.7


def test_pool_under_gloo_is_refused_before_training_naming_the_shard_plan(tmp_path):
    """Local SGD runs under Gloo (collectives only), but its default plan, the pool, needs MPI
    point-to-point: the job stops before any step with an error that names the way out."""
    out = tmp_path / "out"
    proc = launch(2, ["examples/keras_digits.py", "--protocol", "localsgd", "--epochs", "1", "--quiet", "--out",
                      str(out)], launcher="horovodrun-gloo", timeout=120, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "LocalSGD with data_plan='pool'" in text and "pass data_plan='shard'" in text, text[-3000:]
    assert "needs MPI point-to-point messaging" in text and "this job runs on Gloo" in text
    assert not (out / "rank0.jsonl").exists() or not (out / "rank0.jsonl").read_text().strip()  # no step ran
