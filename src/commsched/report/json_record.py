"""Frozen dataclasses to and from JSON, strictly: the one place where report records are (de)serialised.

A record is a ``@dataclass(frozen=True, kw_only=True)`` subclass of :class:`JsonRecord`. ``to_dict()`` writes each
field under its own name (nested records, dicts, tuples and named tuples become JSON objects and lists); a field
declared with ``metadata=OMIT_IF_NONE`` is left out while it is None. ``from_dict()`` checks every field against
its annotation (``float``, ``int``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]``, ``list[X]``, ``dict[str,
X]``, named tuples, records, ``Any``) and raises a one-line ValueError naming the first missing, unknown or mistyped
field by its path, e.g. ``run report: variants.overlap.measured.median_s: missing``. Fields with a default may be
absent.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

OMIT_IF_NONE = types.MappingProxyType({"omit_if_none": True})
"""field metadata: leave the key out of ``to_dict()`` while the value is None (the key is optional in the JSON)"""


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data: records through their ``to_dict``, named tuples and tuples as lists."""
    if isinstance(value, JsonRecord):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    return value


RecordT = TypeVar("RecordT", bound="JsonRecord")


class JsonRecord:
    """Mixin of a frozen dataclass that round-trips through JSON (see the module docstring)."""

    record_name: ClassVar[str] = "record"
    """how errors name a top-level record of this type"""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_if_none"):
                continue
            out[f.name] = to_json(value)
        return out

    @classmethod
    def from_dict(cls: type[RecordT], data: Any) -> RecordT:
        """The record in ``data`` (a dict from JSON), checked field by field; ValueError naming the bad field."""
        return _read_record(cls, data, "", cls)


def _read_record(cls: type, data: Any, path: str, owner: type) -> Any:
    if not isinstance(data, Mapping):
        raise _error(owner, path, f"expected an object, got {type(data).__name__}")
    fields = dataclasses.fields(cls)
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise _error(owner, path, f"unknown field(s) {unknown}")
    hints = _hints(cls)
    values = {}
    for f in fields:
        where = f"{path}.{f.name}" if path else f.name
        if f.name in data:
            values[f.name] = _read_value(hints[f.name], data[f.name], where, owner)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _error(owner, where, "missing")
    return cls(**values)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _error(owner: type, path: str, what: str) -> ValueError:
    """One line: the top-level record's name, the field's path, what is wrong."""
    return ValueError(f"{getattr(owner, 'record_name', 'record')}: {path + ': ' if path else ''}{what}")


def _read_value(tp: Any, value: Any, where: str, owner: type) -> Any:
    """``value`` checked against the annotation ``tp`` (and converted: lists to tuples, ints to floats)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _read_value(inner, value, where, owner)
    if isinstance(tp, type) and issubclass(tp, JsonRecord):
        return _read_record(tp, value, where, owner)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _error(owner, where, f"expected an object, got {type(value).__name__}")
        return {k: _read_value(args[1], v, f"{where}.{k}", owner) for k, v in value.items()}
    if origin is tuple or (isinstance(tp, type) and issubclass(tp, tuple)):
        return _read_tuple(tp, value, where, owner)
    if origin is list:
        if not isinstance(value, list):
            raise _error(owner, where, f"expected a list, got {type(value).__name__}")
        return [_read_value(args[0], v, f"{where}[{i}]", owner) for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _error(owner, where, f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _error(owner, where, f"expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise _error(owner, where, f"expected {tp.__name__}, got {value!r}")
        return value
    raise TypeError(f"{where}: json_record cannot read a field annotated {tp!r}")


def _read_tuple(tp: Any, value: Any, where: str, owner: type) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise _error(owner, where, f"expected a list, got {type(value).__name__}")
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):  # a NamedTuple: fixed positions
        hints = typing.get_type_hints(tp)
        if len(value) != len(tp._fields):
            raise _error(owner, where, f"expected {len(tp._fields)} items ({', '.join(tp._fields)}), got {len(value)}")
        return tp(
            *(_read_value(hints[n], v, f"{where}[{i}]", owner) for i, (n, v) in enumerate(zip(tp._fields, value)))
        )
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_read_value(args[0], v, f"{where}[{i}]", owner) for i, v in enumerate(value))
    if len(args) != len(value):
        raise _error(owner, where, f"expected {len(args)} items, got {len(value)}")
    return tuple(_read_value(a, v, f"{where}[{i}]", owner) for i, (a, v) in enumerate(zip(args, value)))
