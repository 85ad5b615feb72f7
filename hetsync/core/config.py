"""Protocol configurations: each protocol's parameters declared once, as a frozen dataclass.

Bagua turns a frozen configuration into a runtime object; hetsync does the same. A protocol's
``Config`` (a subclass of :class:`ProtocolConfig`) lists every parameter with its type
annotation, default and :func:`param` metadata (bounds, unit, documentation). From it come:

* validation (:meth:`ProtocolConfig.__post_init__`, shared checks of :mod:`hetsync.core.checks`,
  plus the protocol's cross-field :meth:`ProtocolConfig.validate`), so bad input fails before training;
* the wrapper's signature and the argument list of its docstring
  (:func:`hetsync.core.wrapper.protocol_wrapper`);
* ``Protocol.config()`` (:func:`dataclasses.asdict`, JSON-serialisable), which
  ``summary.json`` reports and a saved model stores (:func:`hetsync.load_model`);
* the CLI's ``--protocol-arg KEY=VALUE`` parsing (:meth:`ProtocolConfig.parse_arg`, typed by the
  annotations).
"""
import ast
import dataclasses
import textwrap
import typing

from hetsync.core import checks as _checks

__all__ = ["ProtocolConfig", "param", "argument_rows"]


def param(default, doc, *, label=None, ge=None, gt=None, le=None, lt=None, unit=None, none=None, allow_inf=False,
          check=None, parse=None):
    """Declare one configuration field (a :func:`dataclasses.field` with metadata).

    Args:
        default: the default value (immutable: None, a number, a str, a bool or a tuple).
        doc: str, the argument's documentation (types, units, paper reference) for the docstring.
        label: str used in error messages instead of the field's name (e.g. ``"fraction C"``).
        ge, gt, le, lt: bounds of a number or of every element of a sequence.
        unit: str, the unit named in error messages (e.g. ``"seconds"``).
        none: str, what None means when the annotation is Optional (error messages).
        allow_inf: bool, a float field may be infinite.
        check: callable ``(owner, label, value) -> normalised value`` raising ValueError, for a field whose
            type the shared checks do not cover (e.g. RNA-H's ``groups``: ``"auto"`` or lists of ranks).
        parse: callable ``(text) -> value`` converting the CLI text of such a field (ValueError if bad).

    Returns:
        a ``dataclasses.Field``.
    """
    meta = {"doc": doc, "label": label, "ge": ge, "gt": gt, "le": le, "lt": lt, "unit": unit, "none": none,
            "allow_inf": allow_inf, "check": check, "parse": parse}
    return dataclasses.field(default=default, metadata={k: v for k, v in meta.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class ProtocolConfig:
    """Base of every protocol's configuration (a frozen dataclass; subclasses add the fields).

    Construction checks every field against its annotation and :func:`param` bounds and
    normalises it (ints to ``int``, numbers to ``float``, sequences to tuples), then runs
    :meth:`validate`. The message of a bad value names the protocol (:attr:`owner`), the argument,
    what is allowed and the value.

    Raises:
        ValueError: a value outside what its field allows.
    """

    #: the protocol's display name used in error messages (e.g. ``"RNA"``).
    owner: typing.ClassVar[str] = "protocol"

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _checks.check_value(self.owner, f.name, getattr(self, f.name), hints[f.name], f.metadata)
            object.__setattr__(self, f.name, value)
        self.validate()

    def validate(self):
        """Cross-field checks of a subclass (called after every field passed its own check).

        Raises:
            ValueError: an inconsistent combination (the message names the values).
        """

    def as_dict(self):
        """Return the fields as a JSON-serialisable dict (:func:`dataclasses.asdict`)."""
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls):
        """Return the field names (list of str), in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def parse_arg(cls, key, text):
        """Convert the text of ``--protocol-arg KEY=VALUE`` to the field's type (not yet validated).

        ``None``/``none`` gives None for Optional fields; bool fields take True/False (also
        true/false, 1/0, yes/no); int and float fields their Python literal; str and choice fields
        the text; integer lists a Python list literal such as ``[3, 1, 1]``.

        Args:
            key: str, a field name. text: str.

        Returns:
            the converted value (checked later by the dataclass).

        Raises:
            ValueError: unknown key (the message lists the fields) or text that is not of the
                field's type.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if key not in fields:
            allowed = ", ".join(fields) if fields else "(none)"
            raise ValueError(f"protocol {cls.owner} takes no argument {key!r}; its arguments: {allowed}")
        hint = typing.get_type_hints(cls)[key]
        text = text.strip()
        if fields[key].metadata.get("parse") is not None:
            return fields[key].metadata["parse"](text)
        args = typing.get_args(hint)
        if typing.get_origin(hint) is typing.Union and type(None) in args:
            if text in ("None", "none", "null"):
                return None
            hint = next(a for a in args if a is not type(None))
        try:
            if hint is bool:
                low = text.lower()
                if low in ("true", "1", "yes"):
                    return True
                if low in ("false", "0", "no"):
                    return False
                raise ValueError
            if hint is int:
                return int(text)
            if hint is float:
                return float(text)
            if typing.get_origin(hint) is tuple:
                value = ast.literal_eval(text)
                if not isinstance(value, (list, tuple)):
                    raise ValueError
                return list(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # literal_eval("{[1]}"): TypeError
            kind = {bool: "True or False", int: "an integer", float: "a number"}.get(hint, "a list such as [1, 2]")
            raise ValueError(f"protocol {cls.owner} argument {key} must be {kind}, got {text!r}") from None
        return text

    @classmethod
    def describe_args(cls, indent=8, width=110):
        """Return the docstring lines documenting every field (str, each ``name: doc Default: value.``)."""
        lines = []
        for f in dataclasses.fields(cls):
            text = f"{f.name}: {f.metadata.get('doc', '').strip()} Default: {f.default!r}."
            lines.append(textwrap.fill(text, width=width, initial_indent=" " * indent,
                                       subsequent_indent=" " * (indent + 4)))
        return "\n".join(lines)


def _type_name(hint):
    """The user-facing name of a configuration annotation (str): ``int``, ``float``, ``"pool" | "shard"``..."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return " | ".join(_type_name(a) for a in inner) + " | None"
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if typing.get_origin(hint) is tuple:
        return "list of int"
    if hint is typing.Any:
        return "see description"
    return getattr(hint, "__name__", str(hint))


def argument_rows(config_cls):
    """The argument table of a protocol's configuration, one row per field in declaration order.

    Generated into the protocol's documentation page, so the page cannot drift from the code.

    Args:
        config_cls: a :class:`ProtocolConfig` subclass.

    Returns:
        list of dicts ``{"name": str, "type": str, "default": str (``repr`` of the default, ``None`` as
        None), "allowed": str (bounds such as ``>= 1``, ``> 0, <= 1``; empty when any value of the type is
        allowed), "unit": str or "", "none": str or "" (what None means), "doc": str}``.

    Raises:
        TypeError: ``config_cls`` is not a configuration dataclass.
    """
    if not (isinstance(config_cls, type) and issubclass(config_cls, ProtocolConfig)):
        raise TypeError(f"argument_rows takes a ProtocolConfig subclass, got {config_cls!r}")
    hints = typing.get_type_hints(config_cls)
    rows = []
    for f in dataclasses.fields(config_cls):
        meta = f.metadata
        bounds = [f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if k in meta]
        if meta.get("allow_inf"):
            bounds.append("inf allowed")
        rows.append({"name": f.name, "type": _type_name(hints[f.name]), "default": repr(f.default),
                     "allowed": ", ".join(bounds), "unit": meta.get("unit", ""), "none": meta.get("none", ""),
                     "doc": meta.get("doc", "")})
    return rows
