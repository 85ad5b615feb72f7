"""Quiet by default: the example under mpirun prints none of TensorFlow's, absl's or oneDNN's start-up lines on any
rank, and the progress bar on rank 0 only; ``--verbose`` brings the start-up lines back. The launches switch oneDNN
on (TF_ENABLE_ONEDNN_OPTS=1) so that its line, printed before TensorFlow applies its log level, would appear on any
x86 machine (by default only on CPUs with AVX-512 VNNI or AMX), and unset TF_CPP_MIN_LOG_LEVEL, which the test
launches otherwise set: the example's own setting is what is checked."""
import re

import pytest
from conftest import launch

#: what a start-up line looks like: absl's preamble, a C++ log line (absl's format or TensorFlow's), the notices
START_UP = re.compile(r"absl::InitializeLog|oneDNN custom operations|cpu_feature_guard|This TensorFlow binary is "
                      r"optimized|TF-TRT|cuda|TensorRT|^(?:\[\d+,\d+\]<std(?:out|err)>:)?(?:[IWEF]\d{4} \d\d:\d\d:|"
                      r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] )", re.MULTILINE)
ENV = {"TF_CPP_MIN_LOG_LEVEL": None, "HETSYNC_VERBOSE": None, "TF_ENABLE_ONEDNN_OPTS": "1",
       "OMPI_MCA_orte_tag_output": "1"}


def test_two_ranks_print_no_start_up_line_and_one_progress_bar(tmp_path):
    proc = launch(2, ["examples/keras_digits.py", "--dataset", "digits", "--epochs", "1", "--out", str(tmp_path)],
                  timeout=240, env=ENV)
    output = proc.stdout + proc.stderr
    assert (tmp_path / "summary.json").exists()
    found = START_UP.findall(output)
    assert not found, f"start-up lines printed: {found}\n{output[-3000:]}"
    # Keras' progress bar and the summary table on rank 0 only
    assert "[1,0]<stdout>:" in proc.stdout and "ms/step" in proc.stdout
    assert not any("step" in line for line in proc.stdout.replace("\r", "\n").splitlines()
                   if line.startswith("[1,1]<stdout>:")), proc.stdout[-2000:]


def test_verbose_brings_the_start_up_lines_back(tmp_path):
    quiet = launch(1, ["examples/keras_digits.py", "--help"], launcher="single", timeout=120, env=ENV)
    assert not START_UP.findall(quiet.stdout + quiet.stderr), quiet.stderr[-3000:]
    loud = launch(1, ["examples/keras_digits.py", "--verbose", "--help"], launcher="single", timeout=120, env=ENV)
    assert "--verbose" in loud.stdout
    if "oneDNN custom operations" not in loud.stderr:
        pytest.skip("this TensorFlow is built without oneDNN: it prints nothing before its log level applies")
    assert "absl::InitializeLog" in loud.stderr
