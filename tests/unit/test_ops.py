"""The compiled op library: HetsyncDelay and HetsyncBuildInfo, eager and inside tf.function."""
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from hetsync import ops
from hetsync.ops import library as op_library


class DelayOpTest(tf.test.TestCase):
    def test_build_info_matches_running_tensorflow(self):
        self.assertEqual(ops.build_info(), tf.__version__)

    def test_passes_tensors_through_unchanged_eager(self):
        xs = [tf.constant([1.5, -2.0]), tf.constant([[1, 2], [3, 4]], tf.int64), tf.constant("a")]
        out, delay_ms, compute_ms = ops.delay(xs, [0.0, 1.0, 0.0])
        self.assertEqual(len(out), 3)
        for a, b in zip(xs, out):
            self.assertEqual(a.dtype, b.dtype)
            self.assertAllEqual(a, b)
        self.assertEqual(float(delay_ms), 0.0)
        self.assertEqual(float(compute_ms), 0.0)

    def test_extra_ms_delay_is_applied(self):
        """Every call waits at least the 80 ms asked for; the quickest of five waits at most 60 ms more
        (a loaded machine delays some wake-ups, not all five; an op that overslept would every time)."""
        elapsed = []
        for _ in range(5):
            t = time.perf_counter()
            out, delay_ms, _ = ops.delay([tf.ones([3])], [0.0, 1.0, 80.0])
            elapsed.append((time.perf_counter() - t) * 1e3)
            self.assertAllClose(out[0], np.ones(3))
            self.assertAlmostEqual(float(delay_ms), 80.0)
        self.assertGreaterEqual(min(elapsed), 79.0)
        self.assertLess(min(elapsed), 80.0 + 60.0, elapsed)

    def test_factor_multiplies_measured_compute_time_in_tf_function(self):
        @tf.function
        def step(x, start):
            (y,), delay_ms, compute_ms = ops.delay([x * 2.0], tf.stack([start, tf.constant(3.0, tf.float64),
                                                                           tf.constant(0.0, tf.float64)]))
            return y, delay_ms, compute_ms

        step(tf.ones([2]), tf.constant(0.0, tf.float64))  # trace
        start = time.time() - 0.050  # pretend the step started 50 ms ago
        before = time.time()
        t = time.perf_counter()
        y, delay_ms, compute_ms = step(tf.ones([2]), tf.constant(start, tf.float64))
        elapsed_ms = (time.perf_counter() - t) * 1e3
        after = time.time()
        self.assertAllClose(y, [2.0, 2.0])
        # the op measured its compute time (start -> the op) at a moment between the call and its return
        self.assertGreaterEqual(float(compute_ms), (before - start) * 1e3 - 1.0)
        self.assertLessEqual(float(compute_ms), (after - start) * 1e3 - float(delay_ms) + 1.0)
        self.assertAlmostEqual(float(delay_ms), 2.0 * float(compute_ms), places=6)
        self.assertGreaterEqual(elapsed_ms, float(delay_ms) - 1.0)

    def test_rejects_bad_control(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "factor must be a finite number >= 1"):
            ops.delay([tf.ones([1])], [0.0, 0.5, 0.0])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "extra_ms must be a finite number >= 0"):
            ops.delay([tf.ones([1])], [0.0, 1.0, -1.0])
        with self.assertRaisesRegex((tf.errors.InvalidArgumentError, ValueError), "rank 1|length 3|shape"):
            ops.delay([tf.ones([1])], [0.0, 1.0])

    def test_concurrent_delays_do_not_hold_threads(self):
        """Eight 200 ms delays from eight threads overlap (async kernel): the run takes about one delay
        more than the same eight threads with 0 ms delays (measured just before), not eight."""
        def run(ms):
            results, errors = [], []

            def worker(i):
                try:
                    out, d, _ = ops.delay([tf.constant(float(i))], [0.0, 1.0, ms])
                    results.append((i, float(out[0]), float(d)))
                except Exception as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=30)
            elapsed = time.perf_counter() - t
            self.assertEqual(errors, [])
            self.assertEqual(sorted(r[0] for r in results), list(range(8)))
            self.assertTrue(all(r[1] == r[0] and r[2] == ms for r in results))
            return elapsed

        run(0.0)  # warm up
        overhead = run(0.0)
        elapsed = run(200.0)
        self.assertGreaterEqual(elapsed, 0.2)
        # serialized, the eight waits alone would take 1.6 s more than the overhead
        self.assertLess(elapsed - overhead, 0.2 + 0.6, (elapsed, overhead))


def test_stale_build_is_refused_with_rebuild_instructions(tmp_path, monkeypatch):
    lib = op_library._library_path()
    shutil.copy(lib, tmp_path / os.path.basename(lib))
    (tmp_path / os.path.basename(op_library._info_path(lib))).write_text(json.dumps({"tf_version": "0.0.1"}))
    monkeypatch.setattr(op_library, "_LIBRARY_DIR", str(tmp_path))
    monkeypatch.setattr(op_library, "_library", None)
    with pytest.raises(ops.OpLibraryError, match=r"built for TensorFlow 0\.0\.1.*make build"):
        ops.load_library()


def test_missing_library_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(op_library, "_LIBRARY_DIR", str(tmp_path))
    monkeypatch.setattr(op_library, "_library", None)
    with pytest.raises(ops.OpLibraryError, match="not built"):
        ops.load_library()


def _kernels(op_name):
    from tensorflow.python.framework import kernels
    ops.load_library()
    return {k.device_type: sorted(k.host_memory_arg) for k in kernels.get_registered_kernels_for_op(op_name).kernel}


@pytest.mark.parametrize("op_name", ["HetsyncGradCacheCreate", "HetsyncGradCacheWrite", "HetsyncGradCacheRead",
                                     "HetsyncGradCacheTake", "HetsyncGradCachePublish", "HetsyncGradCacheWait",
                                     "HetsyncGradCacheWaitPublished", "HetsyncGradCacheSetReleased",
                                     "HetsyncGradCacheStatus", "HetsyncGradCacheDestroy"])
def test_gradient_cache_ops_register_gpu_kernels_with_every_argument_in_host_memory(op_name):
    """GPU variants keep the cache on the host: every input and output is pinned to host memory."""
    from tensorflow.python.framework import op_def_registry
    found = _kernels(op_name)
    assert set(found) == {"CPU", "GPU"}, found
    op_def = op_def_registry.get(op_name)
    args = sorted(a.name for a in list(op_def.input_arg) + list(op_def.output_arg))
    assert found["GPU"] == args
    assert found["CPU"] == []


def test_delay_op_gpu_kernel_forwards_tensors_in_device_memory():
    """The delay op's GPU variant keeps the delayed tensors on the device, only its scalars on the host."""
    found = _kernels("HetsyncDelay")
    assert found == {"CPU": [], "GPU": ["compute_ms", "control", "delay_ms"]}
