"""FedAvg and LocalSGD with real multi-process launches (mpirun)."""
import pytest

from conftest import launch, read_json



def test_fedavg_c1_equals_per_epoch_model_averaging_and_subset_rounds(tmp_path):
    out = tmp_path / "fed.json"
    epochs = 3
    launch(2, ["tests/jobs/selsync_fedavg.py", str(out), str(epochs)])
    r = read_json(out)
    spe = r["steps_per_epoch"]
    assert r["moved"] > 1e-2
    # C = 1, one aggregation per epoch == train an epoch locally, then average the models by hand
    assert r["diff_vs_reference"] < 1e-6
    # DiLoCo's outer Nesterov step: the numpy reference, every rank the same model, not plain averaging's model
    assert r["diff_outer_vs_reference"] < 1e-5 and r["outer_spread"] == 0.0 and r["outer_vs_plain"] > 1e-3
    fed = r["fed"]
    assert len(fed) == epochs * spe
    assert [s for s, _ in fed] == ([0.0] * (spe - 1) + [1.0]) * epochs  # sync at each epoch's last step
    assert all(d == 0.0 for s, d in fed if s) and max(d for s, d in fed if not s) > 1e-3
    assert r["fed_summary"]["sync_steps"] == epochs and r["fed_summary"]["lssr"] == pytest.approx(1 - 1 / spe)
    # C = 0.5 of 2 ranks (1 participant), 4 aggregations per epoch at uniform intervals; all adopt the average
    half = r["half"]
    assert r["half_participants"] == 1
    assert r["half_summary"]["sync_steps"] == 4 * epochs
    sync_steps = [i for i, (s, _) in enumerate(half) if s]
    assert all(half[i][1] == 0.0 for i in sync_steps)
    assert sync_steps[3] == spe - 1 and all(1 <= b - a <= spe // 4 + 1 for a, b in zip(sync_steps, sync_steps[1:]))
    # LocalSGD H = 5: averaging after steps 5, 10, ...
    local = r["local"]
    assert [i for i, (s, _) in enumerate(local) if s] == list(range(4, len(local), 5))
    assert all(d == 0.0 for s, d in local if s)
    ls = r["local_summary"]
    assert ls["sync_steps"] == len(local) // 5 and ls["bytes_sent"] == ls["sync_steps"] * (64 * 24 + 24 + 24 * 10 + 10) * 4
