"""Real launches across the emulated multi-host cluster (hetsync-cluster): mpirun places ranks on the hosts
by ``-H {hosts}`` with no ssh flags, and the allreduce's traffic crosses the shaped links."""
import json
import os
import subprocess
import sys

import pytest

from conftest import JOBS_DIR, PY, _env
from hetsync.emulation.cluster import check_capabilities, list_clusters
from hetsync.emulation.cluster.ssh import sshd_path
from hetsync.errors import ClusterError

try:
    check_capabilities()
    _WHY_NOT = None if sshd_path() else "openssh-server is not installed (make deps installs it)"
except ClusterError as exc:
    _WHY_NOT = str(exc)

pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"no emulated cluster here: {_WHY_NOT}")
CLI = [sys.executable, "-m", "hetsync.emulation.cluster"]
#: bytes of one gradient of the job's digits mlp (9,610 float32 weights)
GRAD_BYTES = 9_610 * 4


def test_mpirun_places_ranks_on_the_hosts_and_the_allreduce_crosses_the_links(tmp_path):
    out, nbytes = tmp_path / "probe.json", 16 * 2**20
    proc = subprocess.run(CLI + ["run", "--hosts", "2", "--slots", "2", "--link", "1gbit", "--timeout", "240", "--",
                                 "mpirun", "--allow-run-as-root", "-np", "{np}", "-H", "{hosts}", "--bind-to", "none",
                                 "-x", "PYTHONPATH", PY, os.path.join(JOBS_DIR, "cluster_probe.py"), str(out),
                                 str(nbytes)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    probe = json.loads(out.read_text())
    assert probe["hosts"] == ["h0", "h0", "h1", "h1"] and probe["sum_ok"]
    # plain mpirun passes no variable to h1: rank 0's choice of Gloo and its interface hold for every rank
    assert probe["collectives"] == "gloo" and probe["horovod_sum"] == 10.0  # 1 + 2 + 3 + 4
    down = json.loads(proc.stdout.strip().splitlines()[-1])
    links = {link["host"]: link for link in down["links"]}
    # each host must send the other at least the half it reduces and the half it gathers: nbytes in all
    for h in ("h0", "h1"):
        assert links[h]["from_host_bytes"] >= nbytes and links[h]["to_host_bytes"] >= nbytes, links
    assert json.loads(proc.stdout.splitlines()[0])["cluster"] not in list_clusters()  # torn down


def _job_across_hosts(tmp_path, launcher, protocol="bsp", cluster=(), job=()):
    out = tmp_path / "job"
    # the cluster's timeout outlasts horovod's stall shutdown (300 s), so a stalled job ends with its own error
    proc = subprocess.run(CLI + ["run", "--hosts", "2", "--slots", "2", "--link", "1gbit", "--timeout", "420"]
                          + list(cluster) + ["--"]
                          + launcher + ["-np", "{np}", "-H", "{hosts}", PY, "-m", "hetsync.bench.job", "--protocol",
                                        protocol, "--dataset", "digits", "--epochs", "2", "--quiet", "--out", str(out)]
                          + list(job),
                          env=_env(), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    down = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary, {link["host"]: link for link in down["links"]}


def _emulated_ms(out, rank):
    """Every step's emulated device time of ``rank`` after its first (unpadded) step, as a set."""
    rows = [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
    return {r["emulated_ms"] for r in rows if r["step"] > 0}


def test_horovodrun_trains_bsp_across_two_hosts_with_no_ssh_flags(tmp_path):
    """The user's form: hetsync-cluster run ... -- horovodrun -np {np} -H {hosts} python -m hetsync.bench.job;
    under --dilation 2 every rank, on both hosts, pads its steps to 2 x the device time."""
    summary, links = _job_across_hosts(tmp_path, [os.path.join(os.path.dirname(PY), "horovodrun")],
                                       cluster=["--dilation", "2"], job=["--slowdown", "device:10"])
    assert [r["host"] for r in summary["per_rank"]] == ["h0", "h0", "h1", "h1"]
    assert summary["collectives"] == "gloo"  # 4 ranks on 2 cores: the cluster puts horovod on Gloo
    assert summary["dilation"] == 2.0 and all(_emulated_ms(tmp_path / "job", r) == {20.0} for r in range(4))
    assert summary["weights_in_sync"] and summary["steps"] == 2 * 11  # 359 samples per rank: 11 steps of 32
    assert summary["gradient_bytes"] == GRAD_BYTES and sum(summary["variable_bytes"]) == GRAD_BYTES
    # each step's allreduce between 2 hosts moves at least one gradient (the mlp's 9,610 float32 weights,
    # 38,440 bytes) over each link in each direction
    assert all(link["from_host_bytes"] > summary["steps"] * GRAD_BYTES and link["to_host_bytes"] > summary["steps"]
               * GRAD_BYTES for link in links.values()), links


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["asp", "ensemble", "fedavg", "hop", "localsgd", "notifyack", "rna", "rnah",
                                      "selsync", "shat", "shatroot", "ssp", "taskalloc"])
def test_every_protocol_trains_across_two_hosts(tmp_path, protocol):
    """Every protocol other than BSP (the quick test) on 2 hosts x 2 ranks: it ends, rank 0's model learned,
    and the links carried at least one gradient per host."""
    summary, links = _job_across_hosts(tmp_path, [os.path.join(os.path.dirname(PY), "horovodrun")], protocol,
                                       job=["--epochs", "3"])
    assert {r["host"] for r in summary["per_rank"]} == {"h0", "h1"}
    assert summary["final_test_accuracy"] > 0.5, summary["final_test_accuracy"]
    assert all(link["from_host_bytes"] > GRAD_BYTES and link["to_host_bytes"] > GRAD_BYTES
               for link in links.values()), links


@pytest.mark.slow
def test_the_alpha_beta_microbenchmark_measures_the_shaped_link_and_tears_down(tmp_path):
    """2 hosts x 1 rank at 100 Mbit/s: the collective's and the point-to-point messages' fitted rates are the
    shaped link's (less what TCP and the transport lose; at most the 3% that the token bucket's 128 KiB burst adds
    to a 4 MiB message), and the model built from them gives the largest message's measured time within 10%."""
    from hetsync.bench import alphabeta
    from hetsync.emulation.cluster.spec import ClusterSpec

    spec = ClusterSpec(hosts=2, slots=1, link="100mbit")
    doc = alphabeta.measure(spec, 4 << 20, str(tmp_path / "ab"), timeout_s=240)
    fit, rate = doc["fit"], 100e6 / 8
    assert doc["host_names"] == ["h0", "h1"] and doc["peer"] == 1 and len(doc["points"]) == 11
    assert 0.5 * rate < fit["ring_bytes_per_s"] <= 1.05 * rate, fit
    assert 0.3 * rate < fit["p2p_bytes_per_s"] <= 1.05 * rate, fit
    net = alphabeta.network_from_fit(fit, 2, "h0:1,h1:1", "100mbit")
    top = doc["points"][-1]
    assert net.allreduce_s(top["bytes"]) == pytest.approx(top["allreduce_s"], rel=0.10)
    assert net.p2p_s(top["bytes"], 0, 1) == pytest.approx(top["p2p_s"], rel=0.10)
    assert doc["network"]["p2p_efficiency"] <= 1.0 and not list_clusters()


@pytest.mark.slow
def test_horovodrun_gloo_trains_bsp_across_two_hosts(tmp_path):
    summary, links = _job_across_hosts(tmp_path, [os.path.join(os.path.dirname(PY), "horovodrun"), "--gloo"])
    assert [r["host"] for r in summary["per_rank"]] == ["h0", "h0", "h1", "h1"]
    assert summary["weights_in_sync"]
    assert all(link["from_host_bytes"] > summary["steps"] * GRAD_BYTES for link in links.values()), links


@pytest.mark.slow
def test_a_host_whose_processes_are_killed_ends_the_job_naming_the_host(tmp_path):
    """Every process of host h1 (its ranks, their launcher daemon, its sshd) is killed mid-run: the job ends
    with a non-zero status and an error that names the host, within horovod's stall shutdown (300 s) + 30 s.
    OpenMPI's error names its lost daemon on h1; hetsync-cluster adds the host and the ranks it ran.)"""
    import signal
    import time

    out = tmp_path / "job"
    proc = subprocess.Popen(CLI + ["run", "--hosts", "2", "--slots", "2", "--link", "1gbit", "--timeout", "600", "--",
                                   os.path.join(os.path.dirname(PY), "horovodrun"), "-np", "{np}", "-H", "{hosts}", PY,
                                   "-m", "hetsync.bench.job", "--protocol", "bsp", "--dataset", "digits", "--epochs",
                                   "200", "--quiet", "--out", str(out)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        cid = json.loads(proc.stdout.readline())["cluster"]
        deadline = time.time() + 300
        while not (out / "rank2.jsonl").exists() or (out / "rank2.jsonl").stat().st_size == 0:
            assert time.time() < deadline and proc.poll() is None, "the job never started training on h1"
            time.sleep(1)
        pids = subprocess.run(["ip", "netns", "pids", f"hetsync-{cid}-h1"], capture_output=True,
                              text=True).stdout.split()
        assert pids
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        t_kill = time.time()
        rest, _ = proc.communicate(timeout=300 + 30 + 60)
        took = time.time() - t_kill
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode != 0, rest[-3000:]
    assert took <= 330, took
    assert "Connection to h1 closed" in rest or "Peer host:  h1" in rest, rest[-3000:]
    # hetsync-cluster's own line names the host and the ranks it ran
    assert "hetsync-cluster: host h1 was lost during the run" in rest and "it ran ranks 2, 3;" in rest, rest[-3000:]
    down = json.loads(next(line for line in rest.splitlines() if line.startswith('{"event": "down"')))
    assert down["lost_hosts"] == [{"host": "h1", "ranks": [2, 3]}]
    assert cid not in list_clusters()
