"""hetsync.bench.job: the training job every benchmark launches (``python -m hetsync.bench.job``), its command
line, examples/keras_digits.py as a thin caller of it, and the data location as a setting."""
import importlib.util
import os

import pytest
from conftest import ROOT

import hetsync
from hetsync.bench import job, launch, matrix, pause, soak

#: every flag of the job's command line, with a valid value (None: a switch)
FLAGS = {"--out": "o", "--protocol": "rna", "--protocol-arg": "probes=2", "--dataset": "digits", "--data-dir": "d",
         "--model": "cnn", "--epochs": "2", "--batch-size": "16", "--lr": "0.2", "--momentum": "0.5",
         "--target-accuracy": "0.8", "--eval-every": "5", "--slowdown": "random:6", "--seed": "3",
         "--partition": "label-skew:2", "--backup-dir": "b", "--backup-every-steps": "10", "--backup-every-s": "1.5",
         "--quiet": None, "--as-rank": "1", "--as-world-size": "2"}


def test_the_job_takes_every_flag_and_the_benchmarks_launch_it_as_a_module():
    argv = [a for k, v in FLAGS.items() for a in ([k] if v is None else [k, v])]
    args, _ = job.parse_args(argv)
    assert (args.out, args.protocol, args.protocol_arg, args.dataset, args.data_dir, args.model) == \
        ("o", "rna", ["probes=2"], "digits", "d", "cnn")
    assert (args.epochs, args.batch_size, args.lr, args.momentum, args.target_accuracy, args.eval_every) == \
        (2, 16, 0.2, 0.5, 0.8, 5)
    assert (args.slowdown, args.seed, args.partition, args.backup_dir, args.backup_every_steps,
            args.backup_every_s, args.quiet, args.as_rank, args.as_world_size) == \
        ("random:6", 3, "label-skew:2", "b", 10, 1.5, True, 1, 2)
    # every benchmark runs the job as a module, never a script by its path in a checkout
    assert launch.JOB == ("-m", "hetsync.bench.job") and matrix.JOB == soak.JOB == launch.JOB
    assert launch.job_argv("bsp", "/o")[:2] == list(launch.JOB)
    cmd = soak.command({"np": 2, "protocol": "bsp", "scenario": "none", "seed": 0, "epochs": 1}, "/o")
    assert cmd[cmd.index("-m"):cmd.index("-m") + 2] == list(launch.JOB)
    p_args = pause.parse_args(["--protocols", "bsp", "--faults", "none"])
    cmd = pause.command(p_args, "bsp", "none", 0, "/o")
    assert cmd[cmd.index("-m"):cmd.index("-m") + 2] == list(launch.JOB)
    preset = matrix.PRESETS["quick"]
    digits = next(c for c in preset.cells if c.dataset == "digits")
    assert preset.job_argv(digits)[:2] == list(launch.JOB)
    bench = os.path.join(os.path.dirname(hetsync.__file__), "bench")
    for f in sorted(os.listdir(bench)):
        if f.endswith(".py"):
            with open(os.path.join(bench, f)) as fh:
                text = fh.read()
            assert '"examples"' not in text and "'examples'" not in text and '"examples/' not in text, f


@pytest.mark.parametrize("bad, msg", [(["--epochs", "0"], "--epochs must be a positive integer"),
                                      (["--momentum", "1"], "--momentum must be in [0, 1)"),
                                      (["--as-rank", "1"], "--as-rank and --as-world-size go together")])
def test_the_job_refuses_bad_values(bad, msg, capsys):
    with pytest.raises(SystemExit) as exc:
        job.parse_args(bad)
    assert exc.value.code == 2 and msg in capsys.readouterr().err


def test_examples_keras_digits_is_a_thin_caller_of_the_job():
    path = os.path.join(ROOT, "examples", "keras_digits.py")
    spec = importlib.util.spec_from_file_location("keras_digits_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main is job.main and example.parse_args is job.parse_args and example.build_model is job.build_model
    with open(path) as f:
        text = f.read()
    assert "model.fit" not in text and "add_argument" not in text  # the job's body lives in hetsync.bench.job


def test_the_data_location_is_a_setting_never_a_path_in_the_checkout(monkeypatch, tmp_path, capsys):
    """MNIST's folder comes from --data-dir / HETSYNC_DATA_DIR (hetsync.data.data_dir); no module of hetsync names
    a path beside the checkout, and a benchmark that needs MNIST without the setting is refused before any
    launch, with a message naming the setting."""
    root = os.path.dirname(hetsync.__file__)
    for dirpath, _, files in os.walk(root):
        for f in (f for f in files if f.endswith(".py")):
            with open(os.path.join(dirpath, f)) as fh:
                text = fh.read()
            for needle in ("../shared", "shared/data", '"shared", "data"', "'shared', 'data'"):
                assert needle not in text, (os.path.join(dirpath, f), needle)

    # data_dir() follows the environment
    assert hetsync.data.DATA_DIR_ENV == "HETSYNC_DATA_DIR"
    monkeypatch.delenv("HETSYNC_DATA_DIR", raising=False)
    assert hetsync.data.data_dir() is None and launch.mnist_dir() is None
    monkeypatch.setenv("HETSYNC_DATA_DIR", "")
    assert hetsync.data.data_dir() is None
    monkeypatch.setenv("HETSYNC_DATA_DIR", str(tmp_path / "missing"))
    assert hetsync.data.data_dir() == str(tmp_path / "missing") and launch.mnist_dir() is None
    monkeypatch.delenv("HETSYNC_DATA_DIR")

    # without the setting: the job refuses mnist-idx, the benchmarks refuse mnist cells before launching
    assert job.parse_args([])[0].data_dir is None
    with pytest.raises(SystemExit) as exc:
        job.parse_args(["--dataset", "mnist-idx"])
    assert exc.value.code == 2 and "--data-dir DIR or the environment variable HETSYNC_DATA_DIR" in capsys.readouterr().err
    assert launch.dataset_args() == ["--dataset", "digits"]
    preset = matrix.PRESETS["full"]
    assert any(c.dataset == "mnist" for c in preset.cells)
    with pytest.raises(ValueError, match="mnist cells need MNIST's IDX files: pass --data-dir DIR or set "
                                         "HETSYNC_DATA_DIR .*HETSYNC_DATA_DIR is not set"):
        matrix.dataset_argv("mnist")
    assert "HETSYNC_DATA_DIR" in str(matrix.missing_data(preset))
    assert matrix.missing_data(matrix.PRESETS["quick"]) is None  # digits only: runs anywhere
    from hetsync.bench import __main__ as cli

    with pytest.raises(SystemExit) as exc:  # refused before any launch: nothing written
        cli.parse_args(["--preset", "full", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and not (tmp_path / "o").exists()
    assert "pass --data-dir DIR or set HETSYNC_DATA_DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        pause.parse_args(["--dataset", "mnist-idx"])
    assert exc.value.code == 2 and "HETSYNC_DATA_DIR" in capsys.readouterr().err

    # with the setting: the job's default, the launches' data flags
    monkeypatch.setenv("HETSYNC_DATA_DIR", str(tmp_path))
    assert job.parse_args(["--dataset", "mnist-idx"])[0].data_dir == str(tmp_path)
    assert launch.mnist_dir() == str(tmp_path)
    assert matrix.dataset_argv("mnist") == ["--dataset", "mnist-idx", "--data-dir", str(tmp_path)]
    assert launch.dataset_args() == ["--dataset", "mnist-idx", "--data-dir", str(tmp_path)]
    assert launch.dataset_args(digits=True) == ["--dataset", "digits"]
    assert matrix.missing_data(preset) is None
    assert pause.parse_args(["--dataset", "mnist-idx"]).data_dir == str(tmp_path)

    # hetsync-bench --data-dir DIR sets the setting (absolute) for its launches
    monkeypatch.delenv("HETSYNC_DATA_DIR")
    (tmp_path / "mnist").mkdir()
    monkeypatch.chdir(tmp_path)
    cli.parse_args(["--preset", "full", "--data-dir", "mnist", "--dry-run"])
    assert os.environ["HETSYNC_DATA_DIR"] == str(tmp_path / "mnist") == launch.mnist_dir()
