"""The main job's Makefile target (``make run``) without running it: ``make -n`` shows each protocol launched at its
own learning rate and arguments, and the first-run page names the same defaults as the Makefile."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _launches(*assignments):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-C", ROOT, "run", *assignments], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    launches = {}
    for cmd in out.split(";"):
        m = re.search(r"keras_digits\.py --protocol (\S+) .*?--lr (\S+)(.*?) --epochs", cmd)
        if m:
            launches[m.group(1)] = (float(m.group(2)), m.group(3).strip())
    return launches


def _makefile_default(name):
    with open(os.path.join(ROOT, "Makefile")) as f:
        m = re.search(rf"^{name} \?= (\S+)$", f.read(), re.M)
    assert m, f"the Makefile sets no default for {name}"
    return m.group(1)


def test_each_protocol_runs_at_its_own_learning_rate_with_its_arguments(tmp_path):
    lr, lr_bsp = float(_makefile_default("LR")), float(_makefile_default("LR_bsp"))
    got = _launches("PROTOCOLS=bsp rna hop", f"RUN_OUT={tmp_path}", "LR_hop=0.3",
                    "ARGS_rna=--protocol-arg update_rule=samples")
    assert got["bsp"] == (lr_bsp, "")
    assert got["rna"][1] == "--protocol-arg update_rule=samples"
    assert got["hop"] == (0.3, "")
    assert _launches("PROTOCOLS=ssp", f"RUN_OUT={tmp_path}")["ssp"] == (lr, "")


def test_the_first_run_page_names_the_makefile_defaults():
    with open(os.path.join(ROOT, "docs", "guide", "first-run.md")) as f:
        page = f.read()
    for name in ("LR", "LR_bsp", "LR_rna"):
        assert re.search(rf"\| `{name}` \| {re.escape(_makefile_default(name))} \|", page), name


def _targets(*assignments):
    out = subprocess.run(["make", "-n", "-C", ROOT, "run", "PROTOCOLS=bsp", *assignments], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return re.findall(r"--(dataset \S+).*?--target-accuracy (\S+)", out)


def test_the_target_follows_the_data_unless_given(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # without the MNIST files the job runs the embedded digits to 0.94; a given TARGET wins
    assert _targets(f"MNIST_DIR={tmp_path}", f"RUN_OUT={tmp_path}") == [("dataset digits", "0.94")]
    assert _targets(f"MNIST_DIR={tmp_path}", f"RUN_OUT={tmp_path}", "TARGET=0.8") == [("dataset digits", "0.8")]
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"")
    assert _targets(f"MNIST_DIR={tmp_path}", f"RUN_OUT={tmp_path / 'out'}") == [("dataset mnist-idx", "0.9")]
    with open(os.path.join(ROOT, "docs", "guide", "first-run.md")) as f:
        assert "| `TARGET` | 0.9 (MNIST) or 0.94 (digits) |" in f.read()
