"""A small TOML writer for profiles: nested tables of strings, numbers, booleans and lists of them."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            raise ValueError(f"{where}: NaN cannot be written to a profile")
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    raise ValueError(f"{where}: cannot write a {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML text of ``data``: scalars first, then one ``[table]`` per nested mapping, depth first."""
    lines: list[str] = []

    def emit(table: Mapping[str, Any], path: list[str]) -> None:
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
        if path and (scalars or not tables):
            lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        for k, v in scalars:
            lines.append(f"{_key(k)} = {_value(v, '.'.join([*path, k]))}")
        for k, v in tables:
            emit(v, [*path, k])

    emit(data, [])
    return "\n".join(lines).lstrip("\n") + "\n"
