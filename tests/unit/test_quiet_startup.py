"""Quiet by default: hetsync.quiet_startup() hides TensorFlow's start-up lines (environment where unset, and a
filter of the first ``import tensorflow``'s stderr); HETSYNC_VERBOSE=1 (the scripts' --verbose) keeps them.
The launch of an example is checked in tests/e2e/test_example_quiet_mp.py."""
import os
import subprocess
import sys

import pytest
from conftest import ROOT

import hetsync
from hetsync import world
from hetsync.bench import launch

ONEDNN = "oneDNN custom operations are on"
PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


@pytest.fixture
def environ(monkeypatch):
    """A private copy of the environment (quiet_startup writes os.environ) without the variables under test, and a
    private sys.meta_path (where quiet_startup installs its import filter)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", world.VERBOSE_ENV)}
    monkeypatch.setattr(os, "environ", env)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return env


def test_it_sets_the_variables_only_where_unset(environ):
    assert hetsync.quiet_startup is world.quiet_startup
    assert world.QUIET_ENV == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    assert world.quiet_startup() == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    assert environ["TF_CPP_MIN_LOG_LEVEL"] == "2" and world.VERBOSE_ENV not in environ
    assert world.quiet_startup() == {}  # set already: nothing more
    environ["TF_CPP_MIN_LOG_LEVEL"] = "0"  # the user's own value wins
    assert world.quiet_startup() == {} and environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    # the launched jobs' environment: the same setting, where the caller's environment has none
    assert launch.job_env()["TF_CPP_MIN_LOG_LEVEL"] == "0"
    del environ["TF_CPP_MIN_LOG_LEVEL"]
    assert launch.job_env()["TF_CPP_MIN_LOG_LEVEL"] == "2"


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_verbose_leaves_every_variable_alone(environ, value):
    environ[world.VERBOSE_ENV] = value
    assert world.is_verbose() and world.quiet_startup() == {}
    assert "TF_CPP_MIN_LOG_LEVEL" not in environ
    assert not any(type(f).__name__ == "_QuietTensorFlowImport" for f in sys.meta_path)
    assert "TF_CPP_MIN_LOG_LEVEL" not in launch.job_env()  # the launched jobs are verbose too


def test_the_verbose_flag_sets_the_variable_for_this_process_and_its_launches(environ):
    assert not world.is_verbose() and not world.is_verbose({world.VERBOSE_ENV: "0"})
    assert world.quiet_startup(verbose=True) == {}
    assert environ[world.VERBOSE_ENV] == "1" and "TF_CPP_MIN_LOG_LEVEL" not in environ
    assert launch.job_env()[world.VERBOSE_ENV] == "1"


def test_the_filter_drops_start_up_lines_below_the_level_and_keeps_the_rest():
    text = (PREAMBLE + "\n"
            "I0000 00:00:1795638093.472284    9425 port.cc:153] " + ONEDNN + ". You may see ...\n"
            "I0000 00:00:1795638093.597426    9425 cpu_feature_guard.cc:227] This TensorFlow binary is optimized.\n"
            "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow.\n"
            "2024-01-01 12:00:00.000001: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: "
            "Could not find TensorRT\n"
            "/x/y.py:3: UserWarning: a Python warning\n"
            "  warnings.warn(...)\n"
            "E0000 00:00:1795638093.600000    9425 cuda_dnn.cc:8310] an error stays\n"
            "plain text stays\n")
    kept = world._drop_startup_lines(text, 2)
    assert kept == ("/x/y.py:3: UserWarning: a Python warning\n  warnings.warn(...)\n"
                    "E0000 00:00:1795638093.600000    9425 cuda_dnn.cc:8310] an error stays\nplain text stays\n")
    assert "cuda_dnn" not in world._drop_startup_lines(text, 3)
    assert ONEDNN not in world._drop_startup_lines(text, 1) and "TF-TRT" in world._drop_startup_lines(text, 1)


def test_the_filter_writes_back_what_it_keeps_and_everything_when_the_import_fails(environ, capfd):
    environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    noise = "I0000 00:00:1795638093.597426    9425 cpu_feature_guard.cc:227] This TensorFlow binary ...\n"
    with world._startup_lines_filtered():
        os.write(2, ("kept\n" + PREAMBLE + "\n" + noise + "its continuation line\n").encode())
    assert capfd.readouterr().err == "kept\n"
    with pytest.raises(ImportError):
        with world._startup_lines_filtered():
            os.write(2, (noise + "why it failed\n").encode())
            raise ImportError("no")
    assert capfd.readouterr().err == noise + "why it failed\n"


def _import_tensorflow(extra_env):
    """Stderr of a fresh interpreter that calls quiet_startup() and imports TensorFlow and Keras. oneDNN is switched
    on (TF_ENABLE_ONEDNN_OPTS=1), so that its line, printed before TensorFlow applies its log level, is printed on
    any x86 machine (by default only on CPUs with AVX-512 VNNI or AMX)."""
    code = ("import sys, hetsync\nhetsync.quiet_startup()\nimport keras, tensorflow as tf\n"
            "assert tf.__loader__ is tf.__spec__.loader and type(tf.__loader__).__name__ != '_FilteredLoader'\n"
            "assert not any(type(f).__name__ == '_QuietTensorFlowImport' for f in sys.meta_path)\n"
            "print(float(tf.reduce_sum(tf.ones((2, 2)))))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", world.VERBOSE_ENV)}
    env.update(TF_ENABLE_ONEDNN_OPTS="1", PYTHONPATH=ROOT, **extra_env)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "4.0", proc.stderr[-3000:]
    return proc.stderr


def test_a_real_import_prints_no_start_up_line_unless_verbose():
    quiet = _import_tensorflow({})
    assert quiet == "", quiet[-3000:]
    loud = _import_tensorflow({world.VERBOSE_ENV: "1"})
    if ONEDNN not in loud:
        pytest.skip("this TensorFlow is built without oneDNN: nothing is printed before its log level applies")
    assert PREAMBLE in loud
