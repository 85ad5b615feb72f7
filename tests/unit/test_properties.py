"""Property-based tests (hypothesis): the scenario parser and every protocol's configuration take any
input and either build a valid object or raise ValueError naming the bad value; never another exception."""
import dataclasses
import json
import math
import string
import typing

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hetsync import protocols
from hetsync.emulation import scenario as sd
from hetsync.core import checks as _checks

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the scenario parser ---------------------------------------------------------------------------------------
NAMES = ["random", "deterministic", "uniform", "speeds", "netdelay", "device", "pause", "stall", "kill", "none",
         "slow", ""]
NUMBER_TEXT = st.one_of(
    st.integers(-5, 12).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "nan", "-nan", "inf", "-inf", "1e400", "-0", "0.0", "1_0", "abc", "0x10", "1,2",
                     "2-3", "１", "9" * 5000]))
ARGS = st.lists(NUMBER_TEXT, min_size=0, max_size=4).map(":".join)
RANKS_TEXT = st.one_of(
    st.lists(st.one_of(st.integers(-2, 9).map(str), st.tuples(st.integers(-2, 9), st.integers(-2, 9)).map(
        lambda t: f"{t[0]}-{t[1]}"), st.sampled_from(["", "a", "0-", "-", "1-1000000000000", "3-1"])),
        min_size=1, max_size=4).map(",".join))


@st.composite
def structured_part(draw):
    name = draw(st.sampled_from(NAMES))
    part = name if draw(st.integers(0, 9)) == 0 else f"{name}:{draw(ARGS)}"
    if name == "speeds" and draw(st.booleans()):
        part = "speeds:" + ",".join(draw(st.lists(NUMBER_TEXT, min_size=1, max_size=4)))
    if draw(st.integers(0, 3)) == 0:
        part += "@" + draw(RANKS_TEXT)
    return part


@st.composite
def valid_part(draw):
    """A well-formed part (it may still not fit a small world: ranks up to 5)."""
    rank = draw(st.integers(0, 5))
    sec = st.floats(0, 100, allow_nan=False).map(lambda x: f"{x:g}")
    pos = st.floats(0.001, 100, allow_nan=False).map(lambda x: f"{x:g}")
    return draw(st.sampled_from([
        f"random:{draw(st.floats(1, 50).map(lambda x: f'{x:g}'))}",
        f"deterministic:{rank}:{draw(st.integers(1, 10))}",
        "uniform:{}:{}".format(*sorted([draw(st.integers(0, 100)), draw(st.integers(0, 100))])),
        "speeds:" + ",".join(draw(st.lists(pos, min_size=1, max_size=5))),
        f"netdelay:{draw(sec)}", f"device:{draw(pos)}",
        f"pause:{rank}:{draw(sec)}:{draw(pos)}", f"stall:{rank}:{draw(sec)}:{draw(pos)}", f"kill:{rank}:{draw(sec)}",
        f"uniform:0:5@{rank}", f"random:3@0-{rank}",
    ]))


def _check_spec(text, world_size):
    """Parse ``text``; return the Scenario or None after a ValueError whose message names a part of ``text``."""
    try:
        scenario = sd.parse_spec(text)
    except ValueError as exc:
        msg = str(exc)
        parts = [p.strip() for p in text.split("+")]
        named = [p for p in parts if p and repr(p) in msg] + [t for t in (text, text.strip()) if repr(t) in msg]
        # every message quotes the bad part (or the whole spec); the empty-part message quotes the spec
        assert named, (text, msg)
        return None
    assert isinstance(scenario, sd.Scenario)
    for c in scenario.components:  # what was accepted is in range
        if isinstance(c, sd.Fault):
            assert c.kind in sd.FAULT_ARITY and c.rank >= 0 and math.isfinite(c.at_s) and c.at_s >= 0
            assert (c.for_s is None) == (c.kind == "kill")
            assert c.for_s is None or (math.isfinite(c.for_s) and c.for_s > 0)
        elif isinstance(c, sd.OnRanks):
            assert c.ranks == tuple(sorted(set(c.ranks))) and all(0 <= r < sd.MAX_RANKS for r in c.ranks)
            assert not isinstance(c.part, (sd.Fault, sd.Device, sd.NetDelay, sd.OnRanks))
    try:
        scenario.validate(world_size)
    except ValueError as exc:
        assert str(exc)
        return None
    rng = scenario.rng(0, 0)
    for rank in range(world_size):
        factor, extra = scenario.draw(rng, rank, world_size)
        assert factor >= 1 and extra >= 0 and math.isfinite(factor) and math.isfinite(extra)
    return scenario


@SETTINGS
@given(st.text(), st.integers(1, 8))
def test_any_text_parses_or_raises_value_error_naming_it(text, world_size):
    _check_spec(text, world_size)


@SETTINGS
@given(st.text(alphabet=string.ascii_lowercase[:8] + "rdumspk0123456789.:,@+- enia", max_size=40), st.integers(1, 8))
def test_spec_like_text_parses_or_raises_value_error(text, world_size):
    _check_spec(text, world_size)


@SETTINGS
@given(st.lists(st.one_of(structured_part(), valid_part()), min_size=1, max_size=4), st.sampled_from(["+", " + "]),
       st.integers(1, 8))
def test_structured_specs_parse_or_raise_value_error_naming_the_bad_part(parts, joiner, world_size):
    _check_spec(joiner.join(parts), world_size)


@SETTINGS
@given(st.lists(valid_part(), min_size=1, max_size=4), st.integers(6, 8))
def test_well_formed_specs_parse_and_fit_a_large_enough_world(parts, world_size):
    text = "+".join(parts)
    assume(sum(p.startswith("device:") for p in parts) <= 1)
    assume(not any(p.startswith("speeds:") for p in parts))  # a speeds list must have world_size entries
    scenario = sd.parse_spec(text)
    assert len(scenario.components) == len(parts)
    scenario.validate(world_size)
    # faults take no part in the draws: the same draws as the spec without them
    plain = [p for p in parts if p.split(":")[0] not in sd.FAULT_ARITY]
    if plain:
        other = sd.parse_spec("+".join(plain))
        a, b = scenario.rng(3, 1), other.rng(3, 1)
        assert [scenario.draw(a, 1, world_size) for _ in range(5)] == [other.draw(b, 1, world_size) for _ in range(5)]


@SETTINGS
@given(st.sampled_from(["pause", "stall", "kill"]), st.one_of(st.integers(-3, 10), st.floats(allow_nan=True)),
       st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True),
       st.integers(1, 8))
def test_fault_fields_are_checked(kind, rank, at_s, for_s, world_size):
    def fmt(x):  # '+' joins parts, so exponents are written without it (1e16, not 1e+16)
        return repr(x).replace("e+", "e")

    text = f"{kind}:{fmt(rank)}:{fmt(at_s)}" + ("" if kind == "kill" else f":{fmt(for_s)}")
    ok = (isinstance(rank, int) and 0 <= rank and math.isfinite(at_s) and at_s >= 0
          and (kind == "kill" or (math.isfinite(for_s) and for_s > 0)))
    if not ok:
        with pytest.raises(ValueError, match="RANK|AT_S|FOR_S"):
            sd.parse_spec(text)
        return
    fault, = sd.parse_spec(text).components
    assert fault == sd.Fault(kind, rank, at_s, None if kind == "kill" else for_s)
    if rank < world_size:
        sd.parse_spec(text).validate(world_size)
    else:
        with pytest.raises(ValueError, match=f"RANK {rank} is not a rank of this launch; allowed: 0..{world_size - 1}"):
            sd.parse_spec(text).validate(world_size)


# -- protocol configurations -------------------------------------------------------------------------------------
class _Odd:
    def __repr__(self):
        return "<odd object>"


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-10 ** 400, 10 ** 400), st.floats(),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 10 ** 400, -(10 ** 400), 1e308, 5e-324]),
    st.text(max_size=8), st.sampled_from(["auto", "ring", "layer", "memory", "static", "adaptive", "none", "fp16",
                                         "gradient", "parameter", "seldp", "defdp", "1", "nan"]),
    st.lists(st.one_of(st.integers(-3, 6), st.booleans(), st.floats(), st.none(), st.text(max_size=2)), max_size=4),
    st.lists(st.lists(st.integers(-1, 6), max_size=3), max_size=3),
    st.tuples(st.integers(0, 6), st.integers(0, 6)), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from([np.float32("nan"), np.float64(0.5), np.int64(3), np.int32(-1), np.bool_(True),
                     np.array([1, 2]), 1 + 2j, b"ab", _Odd(), object]),
)


def _good_values(f, hint):
    """A strategy of values of the field's own type (in or out of its bounds)."""
    meta = f.metadata
    if meta.get("check") is not None:  # RNA-H's groups
        return st.one_of(st.just("auto"), st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=3), min_size=1,
                                                    max_size=3))
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-5, 300)
    if hint is float:
        return st.one_of(st.floats(-10, 1000), st.integers(-5, 300), st.just(math.e))
    if typing.get_origin(hint) is typing.Literal:
        return st.sampled_from(args)
    if typing.get_origin(hint) is tuple:
        return st.lists(st.integers(-1, 6), max_size=5)
    if hint is str:
        return st.one_of(st.sampled_from(["ring", "ring-based", "double-ring", "complete", "gateway:2,2", "chain:4",
                                          "edges:0-1,1>2", "ring ", "star"]), st.text(max_size=8))
    raise AssertionError(f"no strategy for {hint!r}")


def _message_names(msg, cfg_cls, kwargs):
    """Whether ``msg`` names one of the given fields (its name or label) and shows its value."""
    fields = {f.name: f for f in dataclasses.fields(cfg_cls)}
    for name, value in kwargs.items():
        label = fields[name].metadata.get("label", name)
        shown = {repr(value), str(value)}
        if isinstance(value, (list, tuple)):  # a message may show the bad element instead of the whole list
            shown |= {repr(list(value)), str(list(value))} | {repr(v) for v in value}
            inner = [v for v in value if isinstance(v, (list, tuple))]
            shown |= {repr(list(v)) for v in inner} | {repr(x) for v in inner for x in v}
        if (name in msg or label in msg) and any(s in msg for s in shown):
            return True
    return False


def _accepted_is_valid(cfg, hints):
    """Every accepted field value is of its declared type and inside its declared bounds."""
    json.dumps(cfg.as_dict(), allow_nan=True)
    for f in dataclasses.fields(cfg):
        v, meta, hint = getattr(cfg, f.name), f.metadata, hints[f.name]
        if meta.get("check") is not None:
            continue
        if typing.get_origin(hint) is typing.Union:
            if v is None:
                continue
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        bounds = [(meta.get("ge"), lambda x, b: x >= b), (meta.get("gt"), lambda x, b: x > b),
                  (meta.get("le"), lambda x, b: x <= b), (meta.get("lt"), lambda x, b: x < b)]
        if hint is bool:
            assert type(v) is bool
        elif hint is int:
            assert type(v) is int and all(b is None or ok(v, b) for b, ok in bounds), (f.name, v)
        elif hint is float:
            assert type(v) is float and not math.isnan(v) and (meta.get("allow_inf") or math.isfinite(v)), (f.name, v)
            assert all(b is None or ok(v, b) for b, ok in bounds), (f.name, v)
        elif typing.get_origin(hint) is typing.Literal:
            assert v in typing.get_args(hint)
        elif typing.get_origin(hint) is tuple:
            assert type(v) is tuple and v and all(type(x) is int for x in v)
            assert all(b is None or ok(x, b) for x in v for b, ok in bounds), (f.name, v)
        elif hint is str:
            assert type(v) is str


@st.composite
def config_kwargs(draw, cfg_cls):
    hints = typing.get_type_hints(cfg_cls)
    fields = dataclasses.fields(cfg_cls)
    chosen = draw(st.lists(st.sampled_from(fields), unique_by=lambda f: f.name, max_size=len(fields)))
    return {f.name: draw(st.one_of(_good_values(f, hints[f.name]), JUNK) if draw(st.integers(0, 3)) else JUNK)
            for f in chosen}


CONFIGS = sorted({name: protocols.get_config_class(name) for name in protocols.WRAPPERS}.items())


@pytest.mark.parametrize("name, cfg_cls", CONFIGS, ids=[n for n, _ in CONFIGS])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_config_values_build_a_valid_config_or_raise_value_error_naming_them(name, cfg_cls, data):
    kwargs = data.draw(config_kwargs(cfg_cls))
    try:
        cfg = cfg_cls(**kwargs)
    except ValueError as exc:
        assert _message_names(str(exc), cfg_cls, kwargs), (name, kwargs, str(exc))
        return
    _accepted_is_valid(cfg, typing.get_type_hints(cfg_cls))
    assert cfg_cls(**cfg.as_dict()) == cfg  # normalised values are accepted unchanged


CLI_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(
    ["None", "none", "null", "true", "False", "yes", "0", "1", "-1", "nan", "inf", "-inf", "1e400", "9" * 5000,
     "[1, 2]", "[[0, 1], [2]]", "[", "[" * 200 + "]" * 200, "{[1]}", "{1: [2]}", "(1,)", "1+2j", "'a'", "auto",
     "\x00", "b'x'", "[1, 'a']", "{}", "[[]]", "()", "ring", "layer", "adaptive", " 3 "]))


@pytest.mark.parametrize("name, cfg_cls", CONFIGS, ids=[n for n, _ in CONFIGS])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_cli_protocol_args_parse_or_raise_value_error(name, cfg_cls, data):
    keys = st.one_of(st.sampled_from(cfg_cls.field_names() or ["x"]), st.text(max_size=6))
    pairs = data.draw(st.lists(st.one_of(st.tuples(keys, CLI_TEXT).map(lambda kv: f"{kv[0]}={kv[1]}"),
                                         st.text(max_size=10)), max_size=3))
    try:
        kwargs = protocols.parse_protocol_args(name, pairs)
    except ValueError as exc:
        msg = str(exc)
        keys = [p.partition("=")[0].strip() for p in pairs]
        assert any(k in msg or repr(k) in msg or repr(p) in msg for k, p in zip(keys, pairs)), (pairs, msg)
        return
    try:
        cfg = cfg_cls(**kwargs)
    except ValueError as exc:
        assert _message_names(str(exc), cfg_cls, kwargs), (name, kwargs, str(exc))
        return
    _accepted_is_valid(cfg, typing.get_type_hints(cfg_cls))


@SETTINGS
@given(JUNK, st.sampled_from([{}, {"ge": 1}, {"gt": 0, "le": 1}, {"ge": 0, "lt": 1}]))
def test_shared_number_checks_raise_only_value_error(value, bounds):
    for check in (_checks.check_int, _checks.check_number, _checks.check_bool, _checks.check_int_sequence):
        try:
            out = check("P", "arg", value, **bounds)
        except ValueError as exc:
            assert "P: arg must be" in str(exc)
            continue
        if check is _checks.check_number:
            assert type(out) is float and math.isfinite(out)


@pytest.mark.parametrize("name, cfg_cls", CONFIGS, ids=[n for n, _ in CONFIGS])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_wrapper_arguments_wrap_or_raise_value_error_naming_them(name, cfg_cls, data):
    import keras

    import hetsync

    hetsync.init()  # a single process: the wrapper's world-size checks run against 1 rank
    kwargs = data.draw(config_kwargs(cfg_cls))
    try:
        opt = protocols.get_wrapper(name)(keras.optimizers.SGD(0.1), **kwargs)
    except ValueError as exc:
        assert _message_names(str(exc), cfg_cls, kwargs), (name, kwargs, str(exc))
        return
    _accepted_is_valid(opt.hetsync_protocol.cfg, typing.get_type_hints(cfg_cls))


def test_a_huge_task_allocation_total_is_refused_at_once():
    """Regression: hypothesis once drew total=10**12 for TaskAllocation; the configuration accepted it and the
    allocation's rounding added one unit per loop iteration, so wrapping never returned. Now every count is
    bounded (hetsync.core.checks.MAX_COUNT) and the rounding is O(n log n) whatever the total."""
    import time

    from hetsync.core.checks import MAX_COUNT
    from hetsync.protocols.taskalloc.allocation import round_allocation

    cfg_cls = protocols.get_config_class("taskalloc")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"total must be at most 1048576 .*got 1000000000000$"):
        cfg_cls(total=10**12)
    assert cfg_cls(total=MAX_COUNT).total == MAX_COUNT
    a = round_allocation([1.0, 2.0, 0.5], 10**15)
    assert a.sum() == 10**15 and a.max() - a.min() <= 1
    assert time.monotonic() - t0 < 5.0
