"""hetsync.Auto under real launches: every rank measures its warm-up, the ranks agree on one protocol, switch
between the same two steps and train on; the run's summary names the choice."""
import pytest

from conftest import launch, read_json, read_jsonl


def run_auto(tmp_path, np_, extra, slowdown):
    out = tmp_path / "auto"
    launch(np_, ["examples/keras_digits.py", "--protocol", "auto", "--dataset", "digits", "--epochs", "3",
                 "--batch-size", "32", "--slowdown", slowdown, "--out", str(out), "--quiet",
                 *[a for kv in extra for a in ("--protocol-arg", kv)]], timeout=420)
    return out, read_json(out / "summary.json")


def test_every_rank_switches_to_the_same_choice_after_the_warm_up(tmp_path):
    # 3 ranks on digits, 14 steps per epoch per rank; rank 2 three times slower on its emulated device
    out, s = run_auto(tmp_path, 3, ["warmup_steps=16", "protocols=rna,localsgd"], "device:20+deterministic:2:3")
    chosen = s["chosen_by"]
    assert s["protocol"] == "auto" and s["protocol_config"]["warmup_steps"] == 16
    assert chosen["by"] == "auto" and chosen["step"] == 16 and chosen["candidates"] == ["rna", "localsgd"]
    assert chosen["protocol"] in ("rna", "localsgd") and chosen["config"] == {"data_plan": "shard"}
    assert [r["protocol"] for r in s["per_rank"]] == [chosen["protocol"]] * 3  # every rank switched to it
    # the warm-up measured each rank's own step: rank 2's emulated device is 3x slower (60 ms vs 20 ms)
    med = chosen["step_ms_median"]
    assert med[2] > 2.0 * max(med[0], med[1]) and min(med[0], med[1]) >= 20.0
    assert {r["protocol"] for r in chosen["predicted"]} == {"bsp", "rna", "localsgd"}
    assert chosen["allreduce_ms"] > 0
    steps = [len(read_jsonl(out / f"rank{r}.jsonl")) for r in range(3)]
    assert steps == [3 * (1437 // 3 // 32)] * 3  # the kept plan: equal fixed shares, every step run
    assert s["weights_in_sync"]  # both end with the parameters averaged over the ranks
    assert s["final_test_accuracy"] > 0.8


@pytest.mark.parametrize("protocol", ["hop", "rna", "fedavg", "selsync"])
def test_a_switch_to_each_candidate_trains_on(tmp_path, protocol):
    """Each candidate taken over mid-epoch from BSP (its threads, queues or schedule started at the switch)."""
    out, s = run_auto(tmp_path, 3, ["warmup_steps=10", f"protocols={protocol}"], "device:10")
    assert s["chosen_by"]["protocol"] == protocol and s["chosen_by"]["step"] == 10
    assert [r["protocol"] for r in s["per_rank"]] == [protocol] * 3
    assert [len(read_jsonl(out / f"rank{r}.jsonl")) for r in range(3)] == [3 * (1437 // 3 // 32)] * 3
    assert s["weights_in_sync"]  # each ends with one model (FedAvg: its schedule kept its place in the epoch)
    assert s["final_test_accuracy"] > 0.8
