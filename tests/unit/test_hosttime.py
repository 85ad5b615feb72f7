"""The host-time split of lock-step collective steps, from hand-made step records."""
import json

import pytest

from hetsync.bench import hosttime


def _rec(step, epoch, start, compute, delay, sync, end):
    """A step record: start and end in seconds, the rest in milliseconds."""
    return {"step": step, "epoch": epoch, "unix_s": end, "step_ms": (end - start) * 1e3, "compute_ms": compute,
            "delay_ms": delay, "sync_wait_ms": sync, "host_ms": (end - start) * 1e3 - compute - delay}


def _records():
    # step 1 (epoch 1): rank 0 starts at 100.000 s, arrives at 100.040 (2 + 38 ms), waits 5 ms for rank 1, which
    # starts 3 ms later and arrives at 100.043; the result comes 2 ms after the last arrival on rank 0 (100.045)
    # and 3 ms after on rank 1 (100.046); each then works 1 ms.
    r0 = [_rec(0, 0, 99.0, 9, 31, 50, 99.2),  # epoch 0: left out
          _rec(1, 1, 100.000, 2, 38, 5, 100.046)]
    r1 = [_rec(0, 0, 99.0, 9, 31, 50, 99.2),
          _rec(1, 1, 100.003, 3, 37, 3, 100.047)]
    return {0: r0, 1: r1}


def test_the_split_of_one_step_in_closed_form():
    s = hosttime.split(_records())
    assert s["steps"] == 1
    # medians over the two ranks: waits 3 ms and 0 ms; collective 2 and 3 ms; after 1 and 1 ms
    assert s["wait_for_last_ms"] == pytest.approx(1.5, abs=1e-6)
    assert s["collective_ms"] == pytest.approx(2.5, abs=1e-6)
    assert s["after_ms"] == pytest.approx(1.0, abs=1e-6)
    assert s["start_spread_ms"] == pytest.approx(3.0, abs=1e-6)
    assert s["result_spread_ms"] == pytest.approx(1.0, abs=1e-6)
    assert s["sync_wait_ms"] == pytest.approx(4.0) and s["host_ms"] == pytest.approx(5.0, abs=1e-6)
    # nothing skipped: the epoch-0 step counts too
    assert hosttime.split(_records(), skip_epochs=0)["steps"] == 2


def test_records_that_cannot_be_split_are_refused(tmp_path, capsys):
    recs = _records()
    with pytest.raises(ValueError, match="recorded by all 2 ranks"):
        hosttime.split({0: recs[0], 1: recs[1][:1]})
    bad = {0: [{k: v for k, v in recs[0][1].items() if k != "sync_wait_ms"}]}
    with pytest.raises(ValueError, match="lacks sync_wait_ms"):
        hosttime.split(bad)
    # free-running ranks (RNA): rank 1 arrives 300 ms after rank 0 already had its result
    free = {0: [_rec(1, 1, 100.0, 2, 38, 0, 100.041)], 1: [_rec(1, 1, 100.3, 2, 38, 0, 100.341)]}
    with pytest.raises(ValueError, match="not lock-step"):
        hosttime.split(free)
    with pytest.raises(FileNotFoundError, match="no rank"):
        hosttime.load_records(str(tmp_path))
    for r, rs in recs.items():
        (tmp_path / f"rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rs))
    assert sorted(hosttime.load_records(str(tmp_path))) == [0, 1]
    assert hosttime.main(["split", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["collective_ms"] == pytest.approx(2.5, abs=1e-3) and out["steps"] == 1
    with pytest.raises(SystemExit):
        hosttime.main(["split", str(tmp_path), "--skip-epochs", "-1"])
    with pytest.raises(SystemExit) as exc:
        hosttime.main(["split", str(tmp_path / "missing")])
    assert exc.value.code == 2 and "no rank*.jsonl" in capsys.readouterr().err
    with pytest.raises(ValueError, match="idle_ms must be >= 0"):
        hosttime.allreduce_latency(idle_ms=-1)
