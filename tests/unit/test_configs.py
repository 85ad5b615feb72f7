"""Each protocol's parameters exist once: the config dataclass gives the wrapper's signature, its
docstring's argument list, config() and the CLI parsing."""
import dataclasses
import inspect

import keras
import pytest

import hetsync
from hetsync import protocols
from hetsync.core.config import ProtocolConfig


@pytest.fixture(scope="module", autouse=True)
def _init():
    hetsync.init()


@pytest.mark.parametrize("name", sorted(protocols.WRAPPERS))
def test_wrapper_signature_is_the_config_dataclass(name):
    wrapper = protocols.get_wrapper(name)
    cfg = protocols.get_config_class(name)
    assert dataclasses.is_dataclass(cfg) and issubclass(cfg, ProtocolConfig)
    assert cfg.__dataclass_params__.frozen
    params = list(inspect.signature(wrapper).parameters.values())
    assert params[0].name == "optimizer" and params[0].default is inspect.Parameter.empty
    fields = dataclasses.fields(cfg)
    assert [(p.name, p.default) for p in params[1:]] == [(f.name, f.default) for f in fields]
    # the docstring documents every argument, in order, with its default
    doc = wrapper.__doc__
    positions = [doc.index(f"\n        {f.name}: ") for f in fields]
    assert positions == sorted(positions) and doc.index("\n        optimizer: ") < positions[0]
    flat = " ".join(doc.split())
    for f in fields:
        assert f.metadata.get("doc"), f"{name}.{f.name} has no documentation"
        assert f"{f.name}: {' '.join(f.metadata['doc'].split())} Default: {f.default!r}." in flat
    assert "{args}" not in doc
    # config() of a default wrap is exactly the dataclass defaults
    opt = wrapper(keras.optimizers.SGD(0.1)) if name != "rna" else wrapper(keras.optimizers.SGD(0.1), probes=1)
    expected = {f.name: f.default for f in fields}
    if name == "rna":
        expected["probes"] = 1
    assert opt.hetsync_protocol.config() == expected
    assert type(opt.hetsync_protocol.cfg) is cfg


def test_arguments_bind_like_a_function_and_configs_are_frozen():
    opt = hetsync.LocalSGD(keras.optimizers.SGD(0.1), 4, False)  # positional, as the signature says
    assert opt.hetsync_protocol.config() == {"period": 4, "average_at_end": False, "data_plan": "pool",
                                             "outer_lr": 1.0, "outer_momentum": 0.0, "outer_nesterov": True}
    with pytest.raises(TypeError, match="unexpected keyword argument 'perod'"):
        hetsync.LocalSGD(keras.optimizers.SGD(0.1), perod=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.hetsync_protocol.cfg.period = 2
    # normalisation: numbers to float, lists to tuples
    cfg = protocols.TaskAllocationConfig(weights=[2, 1], threshold=0)
    assert cfg.weights == (2, 1) and isinstance(cfg.threshold, float)
    assert protocols.RNAConfig(timeout_s=30).timeout_s == 30.0


def test_cli_values_are_converted_by_field_type():
    assert protocols.parse_protocol_args("rna", ["probes=1", "scale_lr=true", "drift_every=None", "timeout_s=30"]) == {
        "probes": 1, "scale_lr": True, "drift_every": None, "timeout_s": 30.0}
    kw = protocols.parse_protocol_args("taskalloc", ["mode=adaptive", "weights=[3, 1]", "micro_batch=None"])
    assert kw == {"mode": "adaptive", "weights": [3, 1], "micro_batch": None}
    assert protocols.parse_protocol_args("selsync", ["delta=inf"]) == {"delta": float("inf")}
    for pairs, message in ((["probes=two"], "protocol 'rna' argument probes must be an integer, got 'two'"),
                           (["scale_lr=maybe"], "protocol 'rna' argument scale_lr must be True or False, got 'maybe'"),
                           (["probe=1"], "protocol 'rna' takes no argument 'probe'; its arguments: probes, "),
                           (["probes=1", "probes=2"], "--protocol-arg probes given twice")):
        with pytest.raises(ValueError, match=message):
            protocols.parse_protocol_args("rna", pairs)
    with pytest.raises(ValueError, match="argument weights must be a list such as"):
        protocols.parse_protocol_args("taskalloc", ["weights=3"])
    # the range is checked by the dataclass when the wrapper builds it
    with pytest.raises(ValueError, match=r"RNA: probes must be an integer >= 1"):
        protocols.from_cli("rna", keras.optimizers.SGD(0.1), ["probes=0"])
