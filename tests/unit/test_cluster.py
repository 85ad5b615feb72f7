"""The emulated multi-host cluster (hetsync.emulation.cluster): bad arguments refused before anything is
created, up/down leave nothing behind, links shaped to the set rate (with dilation), traffic between hosts
crossing the links (byte counters), hostnames and names per host, teardown on timeout and on SIGTERM, and
a clear error without the capabilities. Skipped, with the reason, where namespaces cannot be made."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from hetsync.emulation.cluster import Cluster, ClusterSpec, check_capabilities, format_rate, list_clusters, parse_rate
from hetsync.emulation.cluster.spec import parse_host_slots
from hetsync.emulation.cluster.__main__ import main as cluster_main
from hetsync.emulation.cluster.__main__ import substitute
from hetsync.emulation.cluster.ssh import sshd_path
from hetsync.errors import ClusterError

try:
    check_capabilities()
    _NO_CLUSTER = None
except ClusterError as exc:
    _NO_CLUSTER = str(exc)

needs_cluster = pytest.mark.skipif(_NO_CLUSTER is not None, reason=f"no emulated cluster here: {_NO_CLUSTER}")
CLI = [sys.executable, "-m", "hetsync.emulation.cluster"]


def _namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture
def made():
    """The ids of the clusters a test makes (it appends them): each is gone after the test (removed here,
    and the test fails, if one is left). Only these are checked: the launch tier may have a cluster of its
    own up at the same time."""
    ids = []
    yield ids
    left = [cid for cid in ids if cid in list_clusters()]
    for cid in left:
        Cluster.teardown_id(cid)
    assert not left, f"clusters left behind: {left}"


def test_rates_and_specs_are_checked_before_anything_is_created():
    assert parse_rate("1gbit") == 1e9 and parse_rate("2.5Mbit") == 2.5e6 and parse_rate("500kbit") == 5e5
    for bad in ("1gbps", "0mbit", "-1gbit", "fast", ""):
        with pytest.raises(ValueError, match="does not parse"):
            parse_rate(bad)
    with pytest.raises(ValueError, match="hosts must be an int in \\[1, 64\\], got 0"):
        ClusterSpec(hosts=0)
    with pytest.raises(ValueError, match="slots must be an int >= 1"):
        ClusterSpec(hosts=2, slots=0)
    with pytest.raises(ValueError, match="no host 'h5' in a cluster of 2 hosts"):
        ClusterSpec(hosts=2, host_links=(("h5", "1gbit"),))
    with pytest.raises(ValueError, match="dilation must be a finite number >= 1, got 0.5"):
        ClusterSpec(hosts=2, dilation=0.5)
    spec = ClusterSpec(hosts=3, slots=2, link="1gbit", host_links=(("h2", "250mbit"),), dilation=4)
    assert spec.np == 6 and spec.hosts_arg() == "h0:2,h1:2,h2:2"
    assert [spec.shaped_rate(i) for i in range(3)] == [2.5e8, 2.5e8, 6.25e7]
    assert substitute(["horovodrun", "-np", "{np}", "-H", "{hosts}", "x"], spec) == [
        "horovodrun", "-np", "6", "-H", "h0:2,h1:2,h2:2", "x"]
    with pytest.raises(ValueError, match="must place the ranks with -H \\{hosts\\}"):
        substitute(["mpirun", "-np", "6", "python", "x.py"], spec)


@needs_cluster
@pytest.mark.parametrize("argv,message", [
    (["run", "--hosts", "0", "--", "true"], "hosts must be an int in [1, 64], got 0"),
    (["run", "--hosts", "2", "--link", "1gbps", "--", "true"], "link rate '1gbps' does not parse"),
    (["run", "--hosts", "2", "--", "mpirun", "-np", "4", "true"], "must place the ranks with -H {hosts}"),
])
def test_the_command_line_refuses_bad_arguments_and_creates_nothing(argv, message, capsys, monkeypatch):
    def create(self):
        raise AssertionError("a cluster was being created")
    monkeypatch.setattr(Cluster, "up", create)
    assert cluster_main(argv) == 2
    assert message in capsys.readouterr().err


@needs_cluster
def test_links_are_shaped_to_rate_over_dilation_and_traffic_crosses_them(made):
    spec = ClusterSpec(hosts=3, slots=1, link="400mbit", host_links=(("h2", "100mbit"),), dilation=4)
    nbytes = 3 * 2**20
    c = Cluster(spec, ssh=False)
    made.append(c.cid)
    with c:
        before = c.counters()
        fast = c.measure_throughput(1, 0, nbytes=nbytes)  # 400 / 4 = 100 Mbit/s
        slow = c.measure_throughput(2, 0, nbytes=nbytes // 4)  # 100 / 4 = 25 Mbit/s
        after = c.counters()
    assert 0.9 * 100e6 <= fast <= 1.1 * 100e6, fast
    assert 0.9 * 25e6 <= slow <= 1.1 * 25e6, slow
    delta = {a["host"]: {k: a[k] - b[k] for k in ("to_host_bytes", "from_host_bytes")} for a, b in zip(after, before)}
    assert delta["h1"]["from_host_bytes"] >= nbytes and delta["h2"]["from_host_bytes"] >= nbytes // 4
    assert delta["h0"]["to_host_bytes"] >= nbytes + nbytes // 4
    assert "hetsync-" + c.cid not in _namespaces()
    assert not [n for n in os.listdir("/etc/netns") if c.cid in n] if os.path.isdir("/etc/netns") else True


@needs_cluster
def test_run_gives_each_host_its_name_substitutes_dilates_records_and_returns_the_status(made, tmp_path):
    """Names, substitution, exit status; HETSYNC_DILATION=D in COMMAND and in sessions over ssh; the record."""
    over_ssh = "ssh h1 'echo D1=$HETSYNC_DILATION'; " if sshd_path() else ""
    record = tmp_path / "cluster.json"
    proc = subprocess.run(CLI + ["run", "--hosts", "2", "--slots", "3", "--link", "1gbit", "--dilation", "2.5",
                                 "--record", str(record), "--", "sh", "-c",
                                 "hostname; echo {np} {hosts}; getent hosts h1; echo D0=$HETSYNC_DILATION; "
                                 + over_ssh + "exit 7"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7, proc.stderr
    lines = proc.stdout.splitlines()
    up = json.loads(lines[0])
    made.append(up["cluster"])
    assert up["event"] == "up" and [h["address"] for h in up["hosts"]] == ["198.18.0.1", "198.18.0.2"]
    assert up["hosts"][0]["shaped_rate_bps"] == 4e8 and up["dilation"] == 2.5
    assert lines[1:5] == ["h0", "6 h0:3,h1:3", "198.18.0.2      h1", "D0=2.5"]
    if over_ssh:
        assert lines[5] == "D1=2.5"
    down = json.loads(lines[-1])
    assert down["event"] == "down" and down["exit"] == 7 and len(down["links"]) == 2
    saved = json.loads(record.read_text())
    assert saved["dilation"] == 2.5 and saved["exit"] == 7 and saved["emulated_s"] == saved["wall_s"] / 2.5
    h1 = saved["links"][1]
    assert h1["host"] == "h1" and h1["rate_bps"] == 1e9 and h1["shaped_rate_bps"] == 4e8
    if over_ssh:  # the ssh session crossed h1's link both ways
        assert h1["to_host_bytes"] > 1000 and h1["from_host_bytes"] > 1000
    assert h1["utilisation_to_host"] == h1["to_host_bytes"] * 8 / (4e8 * saved["wall_s"])
    assert up["cluster"] not in _namespaces()


@needs_cluster
def test_teardown_on_timeout_and_on_sigterm(made):
    t = time.time()
    proc = subprocess.run(CLI + ["run", "--hosts", "2", "--timeout", "2", "--", "sleep", "60"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 124 and "ran past --timeout 2 s" in proc.stderr and time.time() - t < 30
    p = subprocess.Popen(CLI + ["run", "--hosts", "2", "--", "sleep", "60"], stdout=subprocess.PIPE, text=True)
    try:
        cid = json.loads(p.stdout.readline())["cluster"]
        made.append(cid)
        assert cid in list_clusters()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 130
    finally:
        if p.poll() is None:
            p.kill()
    assert cid not in list_clusters()
    assert not subprocess.run(["pgrep", "-f", "sleep 60"], capture_output=True).stdout.strip()


@needs_cluster
def test_down_removes_what_a_crashed_run_left_and_latency_is_refused_clearly(made):
    up = subprocess.run(CLI + ["up", "--hosts", "2"], capture_output=True, text=True, timeout=60)
    cid = json.loads(up.stdout)["cluster"]
    made.append(cid)
    assert cid in list_clusters() and json.loads(subprocess.run(CLI + ["status"], capture_output=True,
                                                                text=True).stdout)["clusters"].count(cid) == 1
    # (`down` with no --cluster removes every cluster: the launch tier may have one up now)
    down = subprocess.run(CLI + ["down", "--cluster", cid], capture_output=True, text=True, timeout=60)
    assert json.loads(down.stdout)["removed"] == [cid] and cid not in list_clusters()
    assert not os.path.exists(os.path.join("/run/hetsync-cluster", cid))
    refused = subprocess.run(CLI + ["run", "--hosts", "2", "--latency-ms", "5", "--", "true"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "latency_ms=5" in refused.stderr and "run without added latency" in refused.stderr


@needs_cluster
def test_without_cap_net_admin_the_error_names_it():
    proc = subprocess.run(["setpriv", "--bounding-set", "-net_admin"] + CLI + ["up", "--hosts", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "lacks the capabilities CAP_NET_ADMIN" in proc.stderr


needs_sshd = pytest.mark.skipif(_NO_CLUSTER is not None or sshd_path() is None,
                                reason="no emulated cluster or no sshd here (make deps installs openssh-server)")


@needs_sshd
def test_ssh_between_hosts_needs_no_flags_and_accepts_only_the_clusters_key(made, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    c = Cluster(ClusterSpec(hosts=2, slots=2), ssh=True)
    made.append(c.cid)
    with c:
        state = c.sshd.state
        assert c.describe()["ssh"] is True and os.path.isfile(c.sshd.key)

        def in_h0(*argv):
            return subprocess.run(c.exec_argv(0, list(argv)), capture_output=True, text=True, timeout=60)
        ok = in_h0("ssh", "h1", "hostname; getent hosts h0")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.split() == ["h1", "198.18.0.1", "h0"]
        # only the cluster's key is accepted
        denied = in_h0("ssh", "-F", "/dev/null", "-i", str(other), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                       "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "h1", "true")
        assert denied.returncode == 255 and "Permission denied" in denied.stderr
        # sshd listens on the host's emulated address only
        probe = "import socket; socket.create_connection(('127.0.0.1', 22), timeout=2)"
        assert subprocess.run(c.exec_argv(1, [sys.executable, "-c", probe]), capture_output=True,
                              timeout=60).returncode != 0
    assert not os.path.exists(state)
    assert not any(c.cid in n for n in (os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []))


@needs_sshd
def test_a_host_whose_processes_all_died_is_reported_lost_with_its_ranks(made):
    c = Cluster(ClusterSpec(hosts=3, slots=2, host_slots=(("h2", 1),)), ssh=True)
    made.append(c.cid)
    with c:
        assert c.lost_hosts() == []
        pids = subprocess.run(["ip", "netns", "pids", c.host_ns(1)], capture_output=True, text=True,
                              timeout=30).stdout.split()
        assert pids  # h1's sshd
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.time() + 30
        while not c.lost_hosts() and time.time() < deadline:
            time.sleep(0.1)
        assert c.lost_hosts() == [{"host": "h1", "ranks": [2, 3]}]
    assert Cluster(ClusterSpec(hosts=2, slots=1), ssh=False).lost_hosts() == []  # nothing to tell without ssh


def test_hosts_may_have_their_own_slots_and_a_link_may_be_left_unshaped():
    spec = ClusterSpec(hosts=5, slots=2, link="10gbit", host_slots=(("h3", 1), ("h4", 1)), dilation=20)
    assert spec.np == 8 and spec.hosts_arg() == "h0:2,h1:2,h2:2,h3:1,h4:1"
    assert [spec.host_of_rank(r) for r in range(8)] == ["h0", "h0", "h1", "h1", "h2", "h2", "h3", "h4"]
    with pytest.raises(ValueError, match="rank 8 is outside this cluster's 8 ranks"):
        spec.host_of_rank(8)
    assert parse_host_slots(["h3=1", " h4 = 2"]) == (("h3", 1), ("h4", 2))
    for bad in ("h3", "h3=x", "h3=-1"):
        with pytest.raises(ValueError, match="give HOST=S"):
            parse_host_slots([bad])
    with pytest.raises(ValueError, match="no host 'h7' in a cluster of 5 hosts"):
        ClusterSpec(hosts=5, host_slots=(("h7", 1),))
    with pytest.raises(ValueError, match="slots must be an int >= 1"):
        ClusterSpec(hosts=5, host_slots=(("h1", 0),))
    assert parse_rate("unshaped") == math.inf and format_rate(math.inf) == "unshaped"
    flat = ClusterSpec(hosts=2, link="unshaped", dilation=4)
    assert flat.shaped_rate(0) == math.inf


@needs_cluster
def test_an_unshaped_cluster_has_no_token_bucket_and_records_no_utilisation(made):
    c = Cluster(ClusterSpec(hosts=2, link="unshaped", host_slots=(("h1", 3),)), ssh=False)
    made.append(c.cid)
    with c:
        qdisc = subprocess.run(["tc", "-n", c.host_ns(1), "qdisc", "show", "dev", "eth0"], capture_output=True,
                               text=True, check=True).stdout
        rate = c.measure_throughput(1, 0, nbytes=4 * 2**20)
        rec = c.record(1.0)
        desc = c.describe()
    assert "tbf" not in qdisc and rate > 0
    assert desc["host_slots"] == [1, 3] and desc["hosts"][0]["rate_bps"] is None
    assert rec["links"][1]["utilisation_from_host"] is None and rec["links"][1]["from_host_bytes"] >= 4 * 2**20
