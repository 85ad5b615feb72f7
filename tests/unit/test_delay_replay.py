"""The one-process delay replay (examples/benchmarks/delay_replay.py): its configurations and its algebra."""
import argparse
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("delay_replay",
                                                  os.path.join(ROOT, "examples", "benchmarks", "delay_replay.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def digits():
    from hetsync.data import datasets
    ds = datasets.load("digits")
    return ds.x_train, ds.y_train, ds.x_test, ds.y_test


def test_configurations_are_parsed_and_bad_ones_refused(replay):
    assert replay.parse_configs("bsp:0.4,delay:0.4:1,seq:0.1:3") == [("bsp", 0.4, 0), ("delay", 0.4, 1),
                                                                      ("seq", 0.1, 3)]
    for bad in ("sgd:0.1", "delay:0.4:-1", "bsp:0", "seq:0.1:2:3"):
        with pytest.raises(ValueError, match="--configs"):
            replay.parse_configs(bad)


def test_one_rank_without_delay_is_the_same_sgd_in_every_form(replay, digits):
    args = argparse.Namespace(ranks=1, batch=32, model="mlp", target=0.8, eval_every=2, max_samples=6000)
    runs = [replay.samples_to_target(kind, 0.1, 0, 3, digits, args) for kind in ("bsp", "delay", "seq")]
    assert runs[0] is not None and runs == [runs[0]] * 3


def test_a_delay_costs_samples_on_four_ranks(replay, digits):
    args = argparse.Namespace(ranks=4, batch=32, model="mlp", target=0.85, eval_every=1, max_samples=20000)
    bsp = replay.samples_to_target("bsp", 0.4, 0, 3, digits, args)
    late = replay.samples_to_target("delay", 0.4, 2, 3, digits, args)
    assert bsp is not None and (late is None or late > bsp)
