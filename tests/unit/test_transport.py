"""The transport package in one process: the dispatcher under a world of one rank, allgather_object,
and the rule that only transport touches mpi4py."""
import ast
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import hetsync
from hetsync import transport
from hetsync.errors import TransportTimeout
from hetsync.transport.p2p import Dispatcher

from conftest import ROOT, _env

PACKAGE = pathlib.Path(ROOT) / "hetsync"


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


@pytest.fixture
def p2p():
    d = transport.dispatcher()
    yield d
    transport.shutdown()


def test_messages_to_oneself_by_channel_source_and_tag(p2p):
    assert transport.dispatcher() is p2p and (p2p.rank, p2p.size) == (0, 1)
    p2p.send(0, "a", {"x": 1}, tag=7)
    p2p.send(0, "a", "second")
    p2p.send(0, "b", [1, 2])
    assert p2p.recv("b", timeout_s=5).obj == [1, 2]
    assert p2p.recv("a", tag=None, timeout_s=5) == transport.Message(0, "a", 7, {"x": 1})  # oldest first
    assert p2p.recv("a", source=0, timeout_s=5).obj == "second"
    p2p.send(0, "a", "t1", tag=1)
    p2p.send(0, "a", "t2", tag=2)
    assert p2p.recv("a", tag=2, timeout_s=5).obj == "t2"  # selected by tag, the other stays queued
    assert p2p.wait("a", 5.0) and p2p.poll("a").obj == "t1" and p2p.poll("a") is None
    assert not p2p.wait(["a", "b"], 0.05)
    p2p.send(np.int64(0), "np", "numpy ranks are ranks")
    assert p2p.recv("np", source=np.int64(0), timeout_s=5).source == 0
    p2p.send(0, "c", 1, timeout_s=5.0)  # waits for completion
    p2p.flush(5.0)
    assert p2p.pending_sends() == 0
    stats = p2p.stats()
    assert stats["a"] == {"sent": 4, "received": 4, "read": 4, "discarded": 0, "undelivered": 0}
    assert stats["c"]["sent"] == 1 and stats["c"]["read"] == 0


def test_every_wait_times_out_naming_the_rank_peer_and_channel(p2p):
    t0 = time.monotonic()
    with pytest.raises(transport.TransportTimeout,
                       match="rank 0: timed out after 0.2 s waiting for a message on channel 'rna.control' "
                             "from rank 0 with tag 3") as exc:
        p2p.recv("rna.control", source=0, tag=3, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 5.0 and exc.value.pending == [(0, "rna.control", 3)]
    with pytest.raises(transport.TransportTimeout, match="from any rank"):
        p2p.recv("x", timeout_s=0.0)
    for bad, message in (((1, "a", 0), "send: dest must be a rank in \\[0, 1\\), got 1"),
                         ((0, "", 0), "channel must be a non-empty str, got ''"),
                         ((0, "a", 0, None, -1), "timeout_s must be a number of seconds >= 0, got -1")):
        with pytest.raises(ValueError, match=message):
            p2p.send(*bad)


def test_drain_discards_and_counts_what_was_never_read_but_keeps_later_messages(p2p):
    for i in range(3):
        p2p.send(0, "inject", i, tag=i)
    assert p2p.recv("inject", tag=1, timeout_s=5).obj == 1
    assert p2p.drain("inject", timeout_s=5.0) == 2  # tags 0 and 2 were never read
    p2p.send(0, "inject", "next fit", tag=0)
    assert p2p.drain("inject", timeout_s=5.0) == 1
    p2p.send(0, "inject", "after")
    assert p2p.recv("inject", timeout_s=5).obj == "after"
    assert p2p.stats()["inject"] == {"sent": 5, "received": 5, "read": 2, "discarded": 3, "undelivered": 0}


def test_shutdown_counts_unread_messages_joins_the_thread_and_refuses_later_use():
    d = transport.dispatcher()
    d.send(0, "left", 1)
    d.send(0, "left", 2)
    d.flush(5.0)
    assert d.wait("left", 5.0)
    time.sleep(0.05)
    report = transport.shutdown(timeout_s=5.0)
    assert report["unread_messages"] == {"left": 2} and report["undelivered_sends"] == 0
    assert report["thread_stopped"] and not d._thread.is_alive()
    assert report["channels"]["left"]["discarded"] == 2
    assert d.shutdown() is report  # idempotent
    with pytest.raises(transport.TransportError, match="rank 0: the point-to-point dispatcher was shut down"):
        d.send(0, "left", 3)
    assert transport.shutdown() is None
    fresh = transport.dispatcher()  # a new one, on a new communicator
    assert fresh is not d
    fresh.send(0, "left", 4)
    assert fresh.recv("left", timeout_s=5).obj == 4
    transport.shutdown()


def test_a_send_that_never_completes_times_out_and_is_counted_at_shutdown():
    d = transport.dispatcher()

    class Stuck:  # an MPI request whose receiver never matches it
        cancelled = False

        def Test(self):
            return False

        def Cancel(self):
            Stuck.cancelled = True

    from hetsync.transport.p2p import _Send

    with d._cv:
        d._sends.append(_Send(Stuck(), 0, "hop.update", 12, False))
    with pytest.raises(transport.TransportTimeout, match="rank 0: 1 send\\(s\\) of channel 'hop.update' not completed "
                                                         "within 0.1 s \\(to rank 0 on channel 'hop.update'\\)") as exc:
        d.flush(0.1, channel="hop.update")
    assert exc.value.pending == [(0, "hop.update", 12)]
    d.flush(0.1, channel="other")  # other channels are not held up
    report = transport.shutdown(timeout_s=0.1)
    assert report["undelivered_sends"] == 1 and Stuck.cancelled
    assert report["channels"]["hop.update"]["undelivered"] == 1


class _Poison:
    def __reduce__(self):
        return (_explode, ())


def _explode():
    raise RuntimeError("cannot unpickle this")


def test_a_failed_receive_thread_is_reported_to_every_waiter():
    d = transport.dispatcher()
    d.send(0, "x", _Poison())
    with pytest.raises(transport.TransportError, match="receive thread failed: RuntimeError\\('cannot unpickle this'"):
        d.recv("x", timeout_s=10.0)
    with pytest.raises(transport.TransportError, match="receive thread failed"):
        d.send(0, "x", 1)
    transport.shutdown()


def test_allgather_object_in_a_world_of_one():
    assert transport.allgather_object({"r": 0, "v": [1.5]}, name="t_gather") == [{"r": 0, "v": [1.5]}]
    with pytest.raises(ValueError, match="needs a non-empty str name"):
        transport.allgather_object(1, name="")


def test_allreduce_max_in_a_world_of_one_returns_the_values():
    out = transport.allreduce_max([np.array([2.5, -1.0]), np.array([[3.0]], np.float32)], name="t_max")
    assert [o.numpy().tolist() for o in out] == [[2.5, -1.0], [[3.0]]]
    assert out[1].dtype.name == "float32"


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "mpi4py" for a in node.args):
            yield "mpi4py"  # importlib.import_module("mpi4py") / __import__("mpi4py")


def test_only_world_and_transport_import_mpi4py():
    """MPI is initialised by hetsync.world.init (with thread support, shared with horovod); every
    message after that goes through hetsync.transport."""
    offenders, found = [], []
    mpi_methods = {"isend", "irecv", "iprobe", "Iprobe", "improbe", "Isend", "Irecv", "Dup", "Sendrecv"}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        allowed = rel.startswith("transport/") or rel == "world.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        mods = [m for m in _imports(tree) if m == "mpi4py" or m.startswith("mpi4py.")]
        calls = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in mpi_methods})
        if mods:
            found.append(rel)
        if (mods or calls) and not allowed:
            offenders.append(f"{rel}: {mods + calls}")
    assert not offenders, offenders
    assert sorted(found) == ["transport/endpoint.py", "transport/p2p.py", "world.py"]  # it sees the real imports
    assert not hasattr(transport, "p2p_comm")  # no raw communicator is handed out


def test_importing_hetsync_changes_no_process_wide_setting():
    code = ("import os, sys; before = dict(os.environ); si = sys.getswitchinterval(); import hetsync; "
            "changed = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)); "
            "print(changed, sys.getswitchinterval() == si)")
    env = _env()
    env.pop("TF_CPP_MIN_LOG_LEVEL")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[] True"


class _TellDouble:
    """Records sends; ``refuse`` ranks raise on send; ``stuck`` makes flush time out."""

    def __init__(self, refuse=(), stuck=False):
        self.refuse, self.stuck, self.sent = set(refuse), stuck, []

    def send(self, dest, channel, obj, tag=None, timeout_s=None):
        if dest in self.refuse:
            raise transport.TransportError(f"rank {dest} gone")
        self.sent.append((dest, channel, obj))

    def flush(self, timeout_s=60.0, channel=None):
        if self.stuck:
            raise transport.TransportTimeout(f"sends on {channel!r} not completed within {timeout_s:g} s")

    tell = Dispatcher.tell


def test_tell_is_best_effort_and_names_who_may_not_know():
    d = _TellDouble(refuse={2})
    assert d.tell([1, 2, 3], "ps.error", "server stopped") == [2]
    assert d.sent == [(1, "ps.error", "server stopped"), (3, "ps.error", "server stopped")]
    d = _TellDouble(stuck=True)  # never raises, even when the flush times out: every rank may not know
    assert d.tell((r for r in [4, 5]), "ps.error", "x", timeout_s=0.1) == [4, 5]


def test_recv_or_fail_returns_the_message_raises_on_a_failure_report_and_on_the_deadline(p2p):
    from hetsync.errors import PSError

    p2p.send(0, "t.data", "payload", tag=3)
    assert p2p.recv_or_fail("t.data", 0, tag=3, timeout_s=5, fail_channel="t.fail") == "payload"
    p2p.send(0, "t.fail", "disk full")
    with pytest.raises(PSError, match="server 0 died: disk full"):
        p2p.recv_or_fail("t.data", 0, tag=4, timeout_s=5, fail_channel="t.fail", error=PSError,
                         failed=lambda src, obj: f"server {src} died: {obj}")
    t0 = time.monotonic()
    with pytest.raises(TransportTimeout, match=r"rank 0: nothing on channel 't.data' from rank 0 with tag 5 within 0.2 s"):
        p2p.recv_or_fail("t.data", 0, tag=5, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 2.0


def test_gather_at_returns_every_ranks_value_in_rank_order(p2p):
    assert p2p.gather_at(0, [0], "t.gather", "t.result", {"loss": 1.5}, tag=7, timeout_s=5) == [{"loss": 1.5}]
    with pytest.raises(ValueError, match="root 1 must be in ranks"):
        p2p.gather_at(1, [0], "t.gather", "t.result", 1)


def test_recv_or_fail_names_the_channel_and_tag_after_the_callers_text_and_lists_the_awaited_peer(p2p):
    from hetsync.errors import RNAHError

    with pytest.raises(TransportTimeout) as info:
        p2p.recv_or_fail("t.data", 0, tag=6, timeout_s=0.1)
    assert info.value.pending == [(0, "t.data", 6)]
    with pytest.raises(RNAHError, match=r"^no reply from rank 0 within 0.1 s \(channel 't.data' from rank 0 with tag 6\)$"):
        p2p.recv_or_fail("t.data", 0, tag=6, timeout_s=0.1, error=RNAHError, late="no reply from rank 0 within 0.1 s")


def test_recv_or_fail_ends_the_wait_when_check_raises_and_not_before(p2p):
    import threading

    closed = threading.Event()

    def check():
        if closed.is_set():
            raise RuntimeError("closed while waiting")

    threading.Timer(0.3, closed.set).start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="^closed while waiting$"):
        p2p.recv_or_fail("t.data", 0, tag=8, timeout_s=30, check=check)
    assert 0.3 <= time.monotonic() - t0 < 0.3 + 5  # ended by the close, one wait slice after it, not the deadline
    calls = []
    threading.Timer(0.2, p2p.send, (0, "t.data", "reply"), {"tag": 9}).start()
    assert p2p.recv_or_fail("t.data", 0, tag=9, timeout_s=30, check=lambda: calls.append(1)) == "reply"
    assert calls  # checked while waiting


def test_p2p_still_exports_the_endpoint_it_was_split_from():
    from hetsync.transport import endpoint, p2p

    assert (p2p.dispatcher, p2p.shutdown, p2p.CREATE_TIMEOUT_S) == (endpoint.dispatcher, endpoint.shutdown, 120.0)
    assert {"dispatcher", "shutdown", "CREATE_TIMEOUT_S"} <= set(p2p.__all__)
