"""The soak script: its draws, its lost-sample accounting, its hang
detection, and a small sample of real runs (3 runs of 2-3 ranks, fixed seed) with 0 hangs, errors
and lost samples. The full soak (50 runs) is ``python -m hetsync.bench.soak --runs 50``."""
import json
import os
import pytest
from hetsync import protocols
from hetsync.bench import soak


def test_draws_are_reproducible_and_fit_every_protocols_rank_needs():
    runs = soak.draw_runs(200, seed=3, ranks=(2, 3, 4))
    assert runs == soak.draw_runs(200, seed=3, ranks=(2, 3, 4))
    assert runs != soak.draw_runs(200, seed=4, ranks=(2, 3, 4))
    assert {r["protocol"] for r in runs} == set(protocols.WRAPPERS)  # 200 draws reach every protocol
    for r in runs:
        servers = protocols.get_config_class(r["protocol"]).__dataclass_fields__.get("servers")
        assert r["np"] >= (int(servers.default) + 2 if servers else 2), r
        assert r["np"] in (2, 3, 4) and r["epochs"] in (1, 2)
    # on 2 ranks no parameter-server protocol is drawn (a server and a single worker only)
    two = {r["protocol"] for r in soak.draw_runs(100, seed=0, ranks=(2,))}
    assert not two & {"asp", "shat", "shatroot", "ensemble", "ssp", "rnah"} and "bsp" in two


def test_fault_draws_land_in_training_and_never_stall_a_server():
    runs = soak.draw_runs(300, seed=5, ranks=(2, 3, 4), faults=["pause", "stall"])
    faulted = [r for r in runs if "pause:" in r["scenario"] or "stall:" in r["scenario"]]
    assert len(faulted) > 50 and any("stall:" in r["scenario"] for r in faulted)
    for r in faulted:
        device, fault = r["scenario"].split("+")
        kind, rank, at_s, for_s = fault.split(":")
        assert device == f"device:{soak.FAULT_DEVICE_MS}" and 0.5 <= float(at_s) <= 1.5 and 2 <= float(for_s) <= 5
        servers = protocols.get_config_class(r["protocol"]).__dataclass_fields__.get("servers")
        limit = r["np"] - (int(servers.default) if servers and kind == "stall" else 0)
        assert 0 <= int(rank) < limit, r
    assert not any("pause:" in r["scenario"] for r in soak.draw_runs(100, seed=5, faults=[]))


@pytest.mark.parametrize("bad, match", [(dict(count=0), "runs must be an int >= 1, got 0"),
                                        (dict(ranks=(1, 2)), r"ranks must be ints >= 2.*\[1, 2\]"),
                                        (dict(protocols=["nope"]), "unknown protocol 'nope'"),
                                        (dict(ranks=(2,), protocols=["asp"]), r"no protocol can run on \[2\] ranks")])
def test_bad_draw_arguments_are_refused_naming_the_value(bad, match):
    args = dict(count=3, seed=0, ranks=(2, 3))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        soak.draw_runs(args.pop("count"), args.pop("seed"), **args)


def test_scenarios_parse_for_their_world_size():
    from hetsync.emulation import scenario as slowdown

    for r in soak.draw_runs(100, seed=1):
        slowdown.parse_spec(r["scenario"]).validate(r["np"])


def _fake_run(folder, protocol, epochs, steps, b=16, roles=None, **extra):
    """A run folder as SyncMetrics writes it: steps[r][e] steps of rank r in epoch e."""
    os.makedirs(folder, exist_ok=True)
    roles = roles or ["worker"] * len(steps)
    per_rank = [{"rank": r, "role": roles[r], "samples": sum(steps[r]) * b, "steps": sum(steps[r])}
                for r in range(len(steps))]
    summary = {"protocol": protocol, "epochs": epochs, "batch_size": b, "dataset": "digits", "seed": 0,
               "per_rank": per_rank}
    summary.update(extra)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f)
    for r in range(len(steps)):
        with open(os.path.join(folder, f"rank{r}.jsonl"), "w") as f:
            for e, n in enumerate(steps[r]):
                for i in range(n):
                    f.write(json.dumps({"step": i, "epoch": e, "steps_in_call": 1}) + "\n")


def test_lost_samples_against_the_fixed_share(tmp_path):
    # digits: 1437 training samples; 2 workers -> shards of 718 -> 44 full batches of 16 per epoch
    _fake_run(tmp_path / "ok", "rna", 2, [[44, 44], [44, 44]])
    res = soak.lost_samples(str(tmp_path / "ok"))
    assert res["expected"] == [2 * 44 * 16] * 2 and res["trained"] == res["expected"]
    assert (res["lost"], res["extra"]) == (0, 0)
    _fake_run(tmp_path / "short", "rna", 2, [[44, 41], [44, 44]])  # rank 0 stopped 3 steps early in epoch 1
    res = soak.lost_samples(str(tmp_path / "short"))
    assert (res["lost"], res["extra"]) == (3 * 16, 0)
    # a parameter server trains nothing: 3 ranks, 2 workers, the same fixed share
    _fake_run(tmp_path / "ps", "asp", 1, [[44], [45], []], roles=["worker", "worker", "server"])
    assert soak.lost_samples(str(tmp_path / "ps"))["extra"] == 16


def test_lost_samples_prefer_the_runs_own_report(tmp_path):
    # a pool data plan reports N per epoch (every sample once): 1437 expected, 2 x 44 x 16 = 1408 trained
    _fake_run(tmp_path / "pool", "rna", 1, [[44], [44]], data_plan={"expected_samples_per_epoch": 1437})
    res = soak.lost_samples(str(tmp_path / "pool"))
    assert res["expected"] == [1437] and res["lost"] == 1437 - 1408 and res["basis"] == "reported by the run"
