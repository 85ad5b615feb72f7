"""Time-dilation calibration (hetsync.bench.calibrate): the smallest D under 1% overrun steps is chosen,
the trials stop there, and bad arguments are refused before any launch. The real launches on the
emulated cluster are in tests/mp/test_cluster_mp.py."""
import pytest

from hetsync.bench import calibrate

JOB = ["--protocol", "bsp", "--slowdown", "device:20+random:6", "--model", "mlp"]


def test_choose_takes_the_smallest_dilation_under_the_overrun_bound():
    trials = [{"dilation": 1.0, "ok": True, "emulated_steps": 100, "overrun_fraction": 0.05},
              {"dilation": 2.0, "ok": False, "error": "exited 1"},
              {"dilation": 3.0, "ok": True, "emulated_steps": 100, "overrun_fraction": 0.01},  # 1% is not under 1%
              {"dilation": 6.0, "ok": True, "emulated_steps": 100, "overrun_fraction": 0.0},
              {"dilation": 4.0, "ok": True, "emulated_steps": 100, "overrun_fraction": 0.009}]
    assert calibrate.choose(trials) == 4.0
    assert calibrate.choose(trials, max_overrun=0.02) == 3.0
    assert calibrate.choose(trials[:3]) is None
    assert calibrate.choose([{"dilation": 1.0, "ok": True, "emulated_steps": 0, "overrun_fraction": None}]) is None


def test_calibrate_tries_dilations_in_order_and_stops_at_the_first_that_keeps_up(monkeypatch, tmp_path):
    overrun = {1.0: 0.2, 1.5: 0.04, 2.0: 0.003, 3.0: 0.0}
    tried = []

    def fake_trial(spec, job_args, out, timeout_s):
        tried.append(spec.dilation)
        assert job_args == JOB and spec.hosts == 2 and spec.slots == 3 and spec.shaped_rate(0) == 1e9 / spec.dilation
        return {"dilation": spec.dilation, "ok": True, "emulated_steps": 1000, "overrun_steps": int(1000 * overrun[spec.dilation]),
                "overrun_fraction": overrun[spec.dilation], "command": ["x"]}

    monkeypatch.setattr(calibrate, "trial", fake_trial)
    result = calibrate.calibrate(2, 3, "1gbit", JOB, str(tmp_path), candidates=(3, 1, 2, 1.5), log=lambda m: None)
    assert tried == [1.0, 1.5, 2.0] and result["dilation"] == 2.0
    assert [t["overrun_steps"] for t in result["trials"]] == [200, 40, 3] and "command" not in result["trials"][0]


@pytest.mark.parametrize("kwargs,message", [
    ({"candidates": ()}, "candidates must be dilations >= 1"),
    ({"candidates": (0.5, 2)}, "candidates must be dilations >= 1"),
    ({"job_args": ["--protocol", "bsp", "--slowdown", "random:6"]}, "needs the job's --slowdown with a device:MS"),
    ({"job_args": ["--protocol", "bsp"]}, "needs the job's --slowdown with a device:MS"),
    ({"max_overrun": 0}, "max_overrun must be in"),
    ({"link": "1gbps"}, "link rate '1gbps' does not parse"),
])
def test_bad_arguments_are_refused_before_any_launch(monkeypatch, tmp_path, kwargs, message):
    monkeypatch.setattr(calibrate, "trial", lambda *a, **k: pytest.fail("a trial was launched"))
    args = dict(hosts=2, slots=1, link="1gbit", job_args=JOB, out_dir=str(tmp_path))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        calibrate.calibrate(**args)
