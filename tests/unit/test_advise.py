"""The advisor without a launch: --predict (TF-free, fast, a JSON document), and bad input refused at once."""
import json
import os
import subprocess
import sys
import time

import pytest

from hetsync.advise import predict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _advise(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "hetsync.advise", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_predict_prints_one_json_document_for_64_ranks_in_under_5_s_without_tensorflow():
    t0 = time.perf_counter()
    p = _advise("--predict", "--scenario", "device:40+random:6", "--np", "64", "--hosts", "16x4", "--link", "10gbit",
                "--json")
    elapsed = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    names = [r["protocol"] for r in doc["protocols"]]
    assert sorted(names) == sorted(predict.DEFAULT_PROTOCOLS)
    for r in doc["protocols"]:
        assert r["samples_per_s"] > 0 and r["time_to_target_vs_bsp"] > 0
    bsp = next(r for r in doc["protocols"] if r["protocol"] == "bsp")
    assert bsp["time_to_target_vs_bsp"] == pytest.approx(1.0)
    # random stragglers at 64 ranks: BSP waits for a slow rank nearly every step; it is not the choice
    assert doc["recommended"]["protocol"] != "bsp" and doc["recommended"]["time_to_target_vs_bsp"] > 1.5
    assert doc["recommended"]["reasons"]
    assert elapsed < 5.0 + 3.0  # the interpreter's start-up on a loaded 2-core machine on top of the 5 s target


def test_predict_chooses_bsp_on_a_homogeneous_free_cluster():
    inputs = predict.inputs_from_args("device:40", 8)
    rows = predict.predict(inputs, ("bsp", "rna", "localsgd", "selsync", "taskalloc"))
    assert rows[0]["protocol"] == "bsp"
    rec = predict.recommend(rows, inputs)
    assert rec["protocol"] == "bsp" and rec["time_to_target_vs_bsp"] == pytest.approx(1.0)


def test_predict_chooses_task_allocation_or_a_non_waiting_protocol_on_a_speed_mix():
    inputs = predict.inputs_from_args("device:40+speeds:1,1,1,0.25", 4)
    rows = predict.predict(inputs)
    assert rows[0]["protocol"] != "bsp"
    ta = next(r for r in rows if r["protocol"] == "taskalloc")
    assert ta["samples_per_s_vs_bsp"] > 1.5  # ideal: (3 + 0.25) / (4 * 0.25) = 3.25


@pytest.mark.parametrize("args,message", [
    (["--predict", "--scenario", "device:40", "--np", "0"], "--np must be an integer >= 1"),
    (["--predict", "--scenario", "device:40+bogus:3", "--np", "4"], "bogus"),
    (["--predict", "--np", "4"], "needs --scenario and --np"),
    (["--predict", "--scenario", "device:40", "--np", "4", "--protocols", "bsp,nosuch"], "no timing model for 'nosuch'"),
    (["--predict", "--scenario", "device:40", "--np", "4", "--hosts", "2x3"], "hold 6 ranks but np is 4"),
    (["--predict", "--scenario", "device:40", "--np", "4", "--link", "fast"], "does not parse"),
    (["--probe-s", "90"], "--probe-s must be in (0, 60]"),
    (["--predict", "--scenario", "device:40", "--np", "4", "--samples-per-epoch", "0"], "--samples-per-epoch must"),
    (["--predict", "--scenario", "device:40", "--np", "4", "--epochs-to-target", "-1"], "--epochs-to-target must"),
])
def test_bad_input_is_refused_with_the_value(args, message):
    p = _advise(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr


def test_the_probe_refuses_a_model_that_does_not_build_before_anything_starts(tmp_path):
    (tmp_path / "badmodels.py").write_text("def build():\n    raise RuntimeError('boom: no such layer')\n")
    p = subprocess.run([sys.executable, "-m", "hetsync.advise", "--model", "badmodels:build", "--probe-s", "2"],
                       capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"))
    assert p.returncode == 2, (p.stdout, p.stderr[-2000:])
    assert "the model does not build: RuntimeError: boom" in p.stderr, p.stderr[-2000:]


def test_a_model_name_that_does_not_resolve_is_a_probe_error():
    from hetsync.advise import probe

    for spec, message in (("nosuchmodule:build", "module 'nosuchmodule' does not import"),
                          ("badformat", "give MODULE:FUNCTION"), ("json:nosuchfn", "has no callable 'nosuchfn'")):
        with pytest.raises(probe.ProbeError, match=message):
            probe.load_model_factory(spec)


def test_the_probes_network_keeps_the_measured_small_allreduce_when_a_message_costs_more():
    """A point-to-point message through the transport (3 ms one way) can cost more than a whole small allreduce
    over 8 ranks (1.4 ms): the ring's steps then get the allreduce's latency, not 14 messages' worth."""
    from hetsync.advise import probe

    hosts = ["a", "a", "b", "b", "c", "c", "d", "d"]
    net = probe.network_from(hosts, {"p2p_small_s": 3e-3, "p2p_s": 3e-3 + 1e6 / 1e9, "allreduce_small_s": 1.4e-3},
                             1_000_000)
    assert net.alpha_s == 3e-3 and net.collective_alpha_s == pytest.approx(1.4e-3 / 14)
    assert net.allreduce_s(4) == pytest.approx(1.4e-3 + 2 * 7 / 8 * 4 / 1e9)
    assert net.p2p_s(1_000_000, 0, 2) == pytest.approx(3e-3 + 1e6 / 1e9)
    # a cheap message: the ring pays it per step, the rest of the small allreduce is the fixed cost
    net = probe.network_from(hosts, {"p2p_small_s": 50e-6, "p2p_s": 50e-6 + 1e-3, "allreduce_small_s": 1.4e-3},
                             1_000_000)
    assert net.collective_alpha_s == 50e-6 and net.overhead_s == pytest.approx(1.4e-3 - 14 * 50e-6)


def test_host_shares_are_the_validation_probes_and_the_nearest_world_size_is_used():
    assert predict.host_shares_from_validation(os.path.join(ROOT, "docs", "simulator", "validation.json")) == \
        predict.HOST_SHARE
    table = {"localsgd": [{"np": 4, "share": 0.5}, {"np": 8, "share": 0.7}]}
    assert predict.host_share("localsgd", 4, table) == 0.5
    assert predict.host_share("localsgd", 6, table) == 0.5  # a tie: the smaller world size
    assert predict.host_share("localsgd", 64, table) == 0.7
    assert predict.host_share("bsp", 4, table) == 1.0 and predict.host_share("hop", 4, table) == 1.0


def test_each_protocol_is_simulated_with_its_share_of_bsps_host_time():
    from hetsync.sim import registry

    inputs = predict.inputs_from_args("device:40+random:6", 4, host_ms=20.0)
    shares = {"localsgd": [{"np": 4, "share": 0.25}]}
    rows = {r["protocol"]: r for r in predict.predict(inputs, ("bsp", "localsgd"), host_shares=shares)}
    work = inputs.work
    for proto, host in (("bsp", 20.0), ("localsgd", 5.0)):
        direct = registry.simulate(proto, inputs.times, inputs.net, type(work)(work.model_bytes, work.batch_size, host))
        assert rows[proto]["samples_per_s"] == pytest.approx(direct.samples_per_s, rel=1e-12)
    same = {r["protocol"]: r for r in predict.predict(inputs, ("bsp", "localsgd"), host_shares={})}
    assert same["bsp"]["samples_per_s"] == pytest.approx(rows["bsp"]["samples_per_s"], rel=1e-12)
    assert same["localsgd"]["samples_per_s"] < rows["localsgd"]["samples_per_s"]


def test_the_horizon_rate_in_closed_form():
    # 8,000 samples at 1,000/s then 8,000 at 2,000/s: 16,000 samples in 12 s
    assert predict.horizon_rate(2000.0, 1000.0, 8000, 16000) == pytest.approx(16000 / 12)
    assert predict.horizon_rate(2000.0, 1000.0, 8000, 4000) == pytest.approx(1000.0)  # within the first epoch
    with pytest.raises(ValueError, match="samples=0"):
        predict.horizon_rate(2000.0, 1000.0, 8000, 0)


def test_task_allocation_is_judged_over_the_samples_to_target_when_a_horizon_is_given():
    from hetsync.sim import target

    steady = predict.inputs_from_args("device:40+speeds:1,1,1,0.25", 4, samples_per_epoch=8000)
    short = predict.inputs_from_args("device:40+speeds:1,1,1,0.25", 4, samples_per_epoch=8000, epochs_to_target=1.5)
    a = {r["protocol"]: r for r in predict.predict(steady, ("bsp", "taskalloc"))}
    b = {r["protocol"]: r for r in predict.predict(short, ("bsp", "taskalloc"))}
    first = a["taskalloc"]["extra"]["first_epoch_samples_per_s"]
    assert first < a["taskalloc"]["samples_per_s"]  # the first epoch runs on equal workloads
    need = 1.5 * 8000 / target.lookup("taskalloc", n=4)[0]
    assert b["taskalloc"]["samples_per_s"] == pytest.approx(
        predict.horizon_rate(a["taskalloc"]["samples_per_s"], first, 8000, need), rel=1e-12)
    assert b["bsp"]["samples_per_s"] == pytest.approx(a["bsp"]["samples_per_s"], rel=1e-12)
