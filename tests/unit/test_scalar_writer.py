"""SyncMetrics' TensorBoard scalars, written by a background thread (single process)."""
import glob
import threading

import pytest
import tensorflow as tf

from hetsync.callbacks.metrics import ScalarWriter

pytest.importorskip("tensorboard")


def _read(logdir):
    out = {}
    for path in glob.glob(str(logdir / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, float(tf.make_ndarray(v.tensor))))
    return out


def test_every_queued_scalar_is_written_in_order_by_close(tmp_path):
    writer = ScalarWriter(str(tmp_path))
    for step in range(1, 51):
        writer.add(step, {"loss": 1.0 / step, "step_ms": 40.0 + step})
    thread = writer._thread
    writer.close()
    got = _read(tmp_path)
    assert [s for s, _ in got["loss"]] == list(range(1, 51)) and [s for s, _ in got["step_ms"]] == list(range(1, 51))
    assert got["loss"][9][1] == pytest.approx(0.1) and got["step_ms"][-1][1] == pytest.approx(90.0)
    assert not thread.is_alive() and writer._thread is None


def test_an_idle_thread_ends_and_the_next_scalar_starts_another(tmp_path):
    """A fit that raised never closes its writer: the thread ends when idle, and nothing queued is lost."""
    writer = ScalarWriter(str(tmp_path), idle_s=0.2)
    writer.add(1, {"loss": 1.0})
    first = writer._thread
    first.join(10)
    assert not first.is_alive() and writer._thread is None  # ended after 0.2 s without scalars
    writer.add(2, {"loss": 0.5})
    assert writer._thread is not None and writer._thread is not first
    writer.close()
    assert _read(tmp_path)["loss"] == [(1, 1.0), (2, 0.5)]


def test_add_does_not_write_on_the_callers_thread(tmp_path, monkeypatch):
    """The training thread only queues: the summary op runs on the writer's thread."""
    threads = []
    real = tf.summary.scalar

    def spy(name, value, **kw):
        threads.append(threading.current_thread().name)
        return real(name, value, **kw)

    monkeypatch.setattr(tf.summary, "scalar", spy)
    writer = ScalarWriter(str(tmp_path))
    writer.add(1, {"loss": 0.5})
    writer.close()
    assert threads == ["hetsync-tensorboard"]
