"""Bad input is rejected with a clear error before training starts."""
import pytest
from conftest import launch


@pytest.mark.parametrize("args, message", [
    (["--slowdown", "bogus:1"], "unknown slowdown scenario 'bogus'"),
    (["--slowdown", "speeds:1,1,0.5"], "gives 3 speeds, but the world size is 1"),
    (["--protocol-arg", "delta=0.3"], "takes no argument 'delta'"),
    (["--protocol", "nope"], "invalid choice: 'nope'"),
    (["--epochs", "0"], "--epochs must be a positive integer"),
    (["--dataset", "mnist-idx", "--data-dir", "/nonexistent"], "data folder not found: /nonexistent"),
])
def test_example_rejects_bad_input_before_training(args, message, tmp_path):
    proc = launch(1, ["examples/keras_digits.py", "--out", str(tmp_path)] + args, launcher="single", check=False,
                  timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert "Epoch 1" not in proc.stdout
