"""Shared argument checks of the protocol configurations (one wording for every protocol).

Each check takes the owner (e.g. ``"RNA"``) and the argument's label for the message, and raises
``ValueError("<owner>: <label> must be <what is allowed>, got <value>")`` before training.
"""
import math
import numbers
import typing

#: the upper bound of every int configuration field that declares none (counts of steps, ranks,
#: micro-batches, samples per round, windows): 2**20. No real cluster comes near it, and a larger value
#: is a mistake that would otherwise show up as a run that never finishes its first round.
MAX_COUNT = 1 << 20

__all__ = ["MAX_COUNT", "describe_range", "check_int", "check_number", "check_bool", "check_choice", "check_int_sequence",
           "check_value"]


def _fmt(x):
    return f"{x:g}" if isinstance(x, float) else str(x)


def describe_range(ge=None, gt=None, le=None, lt=None):
    """Return the range phrase of the bounds, e.g. ``">= 1"``, ``"in (0, 1]"``, or ``""`` without bounds."""
    low = (f"[{_fmt(ge)}" if ge is not None else f"({_fmt(gt)}") if (ge is not None or gt is not None) else None
    high = (f"{_fmt(le)}]" if le is not None else f"{_fmt(lt)})") if (le is not None or lt is not None) else None
    if low and high:
        return f"in {low}, {high}"
    if ge is not None:
        return f">= {_fmt(ge)}"
    if gt is not None:
        return f"> {_fmt(gt)}"
    if le is not None:
        return f"<= {_fmt(le)}"
    if lt is not None:
        return f"< {_fmt(lt)}"
    return ""


def _in_range(x, ge=None, gt=None, le=None, lt=None):
    return ((ge is None or x >= ge) and (gt is None or x > gt) and (le is None or x <= le)
            and (lt is None or x < lt))


def _what(kind, meta):
    rng = describe_range(meta.get("ge"), meta.get("gt"), meta.get("le"), meta.get("lt"))
    unit = meta.get("unit")
    return f"{kind}{' ' + rng if rng else ''}{f' ({unit})' if unit else ''}"


def _fail(owner, label, what, value, none=None):
    allowed = f"None ({none}) or {what}" if none is not None else what
    raise ValueError(f"{owner}: {label} must be {allowed}, got {value!r}")


def check_int(owner, label, value, none=None, **meta):
    """Return ``value`` as an int if it is an integer (not a bool) within the bounds of ``meta``.

    Args:
        owner: str, e.g. ``"RNA"``. label: str, the argument's name in the message.
        value: the argument. none: None, or the meaning of None when None is allowed (message only).
        meta: optional bounds ``ge``, ``gt``, ``le``, ``lt`` and ``unit`` (str, e.g. ``"steps"``).

    Raises:
        ValueError: not an integer, or out of bounds (the message names the label, the allowed
            values and the value).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not _in_range(value, **_bounds(meta)):
        _fail(owner, label, _what("an integer", meta), value, none)
    return int(value)


def check_number(owner, label, value, none=None, allow_inf=False, **meta):
    """Return ``value`` as a float if it is a real number (not a bool, not NaN; infinite only with
    ``allow_inf``) within the bounds of ``meta`` (see :func:`check_int`).

    Raises:
        ValueError: as :func:`check_int`.
    """
    try:  # float() of an int beyond the float range overflows (found by the property tests)
        x = None if isinstance(value, bool) or not isinstance(value, numbers.Real) else float(value)
    except (OverflowError, ValueError, TypeError):
        x = None
    if x is None or math.isnan(x) or (math.isinf(x) and not allow_inf) or not _in_range(x, **_bounds(meta)):
        _fail(owner, label, _what("a number", meta), value, none)
    return x


def check_bool(owner, label, value, none=None, **meta):
    """Return ``value`` if it is True or False.

    Raises:
        ValueError: anything else (1, "yes", ...).
    """
    if not isinstance(value, bool):
        _fail(owner, label, "True or False", value, none)
    return value


def check_choice(owner, label, value, choices, none=None, **meta):
    """Return ``value`` if it is one of ``choices`` (a tuple of str).

    Raises:
        ValueError: anything else (the message lists the choices).
    """
    if not isinstance(value, str) or value not in choices:
        _fail(owner, label, "one of " + ", ".join(repr(c) for c in choices), value, none)
    return value


def check_int_sequence(owner, label, value, none=None, **meta):
    """Return ``value`` as a tuple of ints if it is a non-empty list or tuple of integers within the
    bounds of ``meta`` (checked element by element; the message names the first bad element).

    Raises:
        ValueError: not a non-empty list/tuple, or an element that is not an integer in range.
    """
    what = f"a non-empty list of integers{' ' + describe_range(**_bounds(meta)) if _bounds(meta) else ''}"
    what += f" ({meta['unit']})" if meta.get("unit") else ""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        _fail(owner, label, what, value, none)
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not _in_range(v, **_bounds(meta)):
            rng = describe_range(**_bounds(meta))
            raise ValueError(f"{owner}: {label} must be {what}; {label.split()[0]}[{i}] = {v!r} is not an "
                             f"integer{' ' + rng if rng else ''}")
    return tuple(int(v) for v in value)


def _bounds(meta):
    return {k: meta[k] for k in ("ge", "gt", "le", "lt") if meta.get(k) is not None}


def _at_most_max_count(owner, label, checked, bounded):
    """``checked`` (an int or a tuple of ints) unless a field without its own upper bound exceeds
    :data:`MAX_COUNT` (then ValueError naming the value and the bound)."""
    if not bounded:
        for v in (checked if isinstance(checked, tuple) else (checked,)):
            if v > MAX_COUNT:
                raise ValueError(f"{owner}: {label} must be at most {MAX_COUNT} (hetsync's bound on every count), "
                                 f"got {v!r}")
    return checked


def check_value(owner, name, value, hint, meta):
    """Check one configuration field against its type annotation and metadata; return the normalised value.

    Supported annotations: ``bool``, ``int``, ``float``, ``str``, ``typing.Literal[...]`` of str,
    ``typing.Tuple[int, ...]`` and ``typing.Optional[...]`` of these. Metadata keys: ``label``
    (the name in messages, default ``name``), ``ge``/``gt``/``le``/``lt`` bounds, ``unit``,
    ``none`` (the meaning of None), ``allow_inf`` (floats), ``check`` (a callable ``(owner, label, value)``
    that checks and normalises the value itself, whatever the annotation).

    Raises:
        ValueError: the value does not fit (see the ``check_*`` functions).
        TypeError: an annotation this function does not support (a programming error).
    """
    label = meta.get("label", name)
    if meta.get("check") is not None:  # a field-specific check (param(check=...)) replaces the annotation's
        return meta["check"](owner, label, value)
    none = None
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{owner}: unsupported annotation {hint!r} of {name}")
        if value is None:
            return None
        hint, none = inner[0], meta.get("none", "default")
        args = typing.get_args(hint)
    opts = {k: meta[k] for k in ("ge", "gt", "le", "lt", "unit") if meta.get(k) is not None}
    bounded = "le" in opts or "lt" in opts
    if hint is bool:
        return check_bool(owner, label, value, none)
    if hint is int:
        return _at_most_max_count(owner, label, check_int(owner, label, value, none, **opts), bounded)
    if hint is float:
        return check_number(owner, label, value, none, allow_inf=meta.get("allow_inf", False), **opts)
    if typing.get_origin(hint) is typing.Literal:
        return check_choice(owner, label, value, args, none)
    if hint is str:
        if not isinstance(value, str):
            _fail(owner, label, "a str", value, none)
        return value
    if typing.get_origin(hint) is tuple and args == (int, Ellipsis):
        return _at_most_max_count(owner, label, check_int_sequence(owner, label, value, none, **opts), bounded)
    raise TypeError(f"{owner}: unsupported annotation {hint!r} of {name}")
