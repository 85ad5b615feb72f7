"""Issue 15 with real mpirun launches: a NaN on one rank stops the job (exit status non-zero) naming the
rank and the step, the other ranks never receive it; BatchNormalization statistics end equal on every rank.
The script is tests/jobs/nonfinite_check.py (rank 1's loss becomes NaN at its step 5). A rank that dies of the
stop prints hetsync's message as one line, no traceback (OpenMPI tags each rank's lines: ``[1,R]<stderr>:``)."""
import json
import re

import numpy as np
import pytest

from conftest import launch


SCRIPT = "tests/jobs/nonfinite_check.py"


def _records(out, ranks):
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in ranks if (out / f"rank{r}.json").exists()}


#: OpenMPI's --tag-output as an MCA setting (mpirun's command line is conftest's): "[1,R]<stderr>:" before each line
TAGGED = {"OMPI_MCA_orte_tag_output": "1"}


def _stderr_of(stderr, rank):
    """The lines rank ``rank`` wrote on stderr, without OpenMPI's tag (list of str)."""
    tag = re.compile(rf"^\[\d+,{rank}\]<stderr>:")
    return [tag.sub("", line) for line in stderr.splitlines() if tag.match(line)]


def _assert_one_line_stop(stderr, rank):
    """Rank ``rank`` died of the non-finite stop: the first of its stderr lines that carries the mark is hetsync's
    message (naming the rank, the step and the protocol), and no traceback is printed for it."""
    lines = _stderr_of(stderr, rank)
    marked = [line for line in lines if "hetsync non-finite stop" in line]
    assert marked, f"rank {rank} printed no non-finite stop on stderr:\n{stderr[-3000:]}"
    assert marked[0].startswith("hetsync non-finite stop: non-finite "), marked[0]
    assert re.search(r"rank(\(s\) \[[\d, ]+\]| \d+) at step \d+ .*\(protocol \w+\)", marked[0]), marked[0]
    assert not any("Traceback" in line for line in lines), "\n".join(lines)[-3000:]


@pytest.mark.parametrize("protocol,np_,args,every_rank_raises", [
    ("bsp", 2, [], True),            # the gradient allreduce carries the flag: both ranks stop at step 5
    # asynchronous: rank 1 stops, MPI_Abort ends rank 0. Fixed shares (data_plan=shard): under the
    # sample pool a rank that starts late can find the pool drained before its step 5.
    ("rna", 2, ["data_plan=shard"], False),
    ("localsgd", 2, ["period=4", "data_plan=shard"], False),
    ("asp", 3, ["servers=1", "data_plan=shard"], False),  # ranks 0, 1 workers, rank 2 the server
])
def test_nan_on_one_rank_stops_the_job_naming_rank_and_step(protocol, np_, args, every_rank_raises, tmp_path):
    proc = launch(np_, [SCRIPT, "nan", protocol, str(tmp_path)] + args, timeout=240, check=False, env=TAGGED)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    rec = _records(tmp_path, range(np_))
    bad = rec[1]
    assert bad["step"] == -1 and bad["nonfinite_dropped"] == 1.0, bad
    # model.fit raised hetsync's NonFiniteError with the clean message (TensorFlow's wrapping taken off)
    assert bad["error"].startswith("NonFiniteError: hetsync non-finite stop: ") and "at step 5" in bad["error"], \
        bad["error"][-800:]
    assert "assertion failed" not in bad["error"] and "[[" not in bad["error"], bad["error"][-800:]
    _assert_one_line_stop(proc.stderr, 1)
    assert ("rank 1 at step 5" in bad["error"]) or ("rank(s) [1] at step 5" in bad["error"])
    assert bad["finite"] is True  # the NaN step changed nothing on rank 1 either
    assert "rank 1 stopped" in output
    other = rec[0]
    # rank 0 never received a NaN: its weights were finite after every step it ran, and at its error
    assert other["finite"] is True and other["nonfinite_dropped"] == 0.0, other
    if every_rank_raises:
        assert other["step"] == -1 and "rank(s) [1] at step 5" in other["error"], other
        assert other["error"].startswith("NonFiniteError: hetsync non-finite stop: "), other
        _assert_one_line_stop(proc.stderr, 0)
    # else rank 0 was ended by rank 1's MPI_Abort (mpirun's note about it is not always printed)


@pytest.mark.parametrize("protocol,np_,args", [
    ("bsp", 2, []), ("selsync", 2, []), ("rna", 2, []),
    ("rnah", 3, ["servers=1"]),  # ranks 0, 1 workers, rank 2 the server; the final average carries the statistics
])
def test_batchnorm_statistics_end_equal_on_every_rank(protocol, np_, args, tmp_path):
    launch(np_, [SCRIPT, "batchnorm", protocol, str(tmp_path)] + args, timeout=240)
    w0, w1 = (np.load(tmp_path / f"rank{r}.npz") for r in (0, 1))
    names = w0.files
    assert len(names) == 8  # 2 Dense x (kernel, bias) + BN gamma, beta, moving mean, moving variance
    for k in names:
        np.testing.assert_allclose(w0[k], w1[k], rtol=0, atol=1e-6, err_msg=f"{protocol}: weight {k}")
    # the moving statistics were trained (not left at their initial 0 and 1)
    assert np.abs(w0[names[4]]).max() > 1e-3 and np.abs(w0[names[5]] - 1).max() > 1e-3


def test_diverging_rna_run_of_the_example_exits_non_zero_without_a_summary(tmp_path):
    """The user's report: RNA with a far too large learning rate and momentum 0.9 diverged to NaN and
    still ended with status 0 and a summary. Now the job stops at the first non-finite gradient."""
    proc = launch(2, ["examples/keras_digits.py", "--protocol", "rna", "--lr", "1e37", "--momentum", "0.9",
                      "--epochs", "3", "--quiet", "--out", str(tmp_path)], timeout=240, check=False, env=TAGGED)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert not (tmp_path / "summary.json").exists()
    assert "hetsync non-finite stop: non-finite gradient on rank" in output and "(protocol RNA)" in output
    stopped = [r for r in (0, 1) if any("hetsync non-finite stop" in line for line in _stderr_of(proc.stderr, r))]
    assert stopped, proc.stderr[-3000:]
    for r in stopped:  # the rank that stopped first; the other may have been ended by its MPI_Abort before
        _assert_one_line_stop(proc.stderr, r)
