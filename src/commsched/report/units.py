"""Human-readable numbers for tables."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def fmt_flops(n: float) -> str:
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or unit == "E":
            return f"{n:.3g} {unit}FLOP"
        n /= 1000
    return f"{n:.3g} EFLOP"


def fmt_seconds(s: float) -> str:
    if s == 0:
        return "0"
    if abs(s) >= 1:
        return f"{s:.3f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_seconds_short(s: float) -> str:
    """Seconds in 3 significant digits and a unit (at most 7 characters)."""
    for scale, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "us")):
        if abs(s) * scale >= 1 or unit == "us":
            return f"{s * scale:.3g} {unit}"
    return ""


def fmt_percent(ratio: float) -> str:
    """A ratio (0.558) as a percentage ("55.8 %"): how every table shows overlap and other shares."""
    return f"{100 * ratio:.1f} %"


def fmt_signed_percent(ratio: float) -> str:
    """A relative difference (0.062, -0.211) as a signed percentage ("+6.2 %", "-21.1 %")."""
    return f"{100 * ratio:+.1f} %"


def fmt_value(key: str, value: Any) -> str:
    """One value of a record as a table shows it: seconds (``*_s``) and bytes (``*_bytes``, ``bytes``) in human
    units, a mapping as ``k=v, k=v``, a list comma-separated, a float in 4 significant digits."""
    if isinstance(value, Mapping):
        return fmt_mapping(value)
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "-"}[value]
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(key, v) for v in value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        if key.endswith("_s"):
            return fmt_seconds(value)
        if key.endswith("bytes"):
            return fmt_bytes(value)
        if isinstance(value, float):
            return f"{value:.4g}"
    return str(value)


def fmt_mapping(mapping: Mapping[str, Any]) -> str:
    """A mapping as ``k=v, k=v`` (each value by :func:`fmt_value`), never a Python dict's repr."""
    return ", ".join(f"{k}={fmt_value(str(k), v)}" for k, v in mapping.items()) or "-"


def column_label(key: str) -> str:
    """A record's key as a column heading: units dropped (the cells carry them), underscores as spaces."""
    for suffix in ("_bytes", "_s"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


_RAW_BYTES = re.compile(r"\b(\d{4,}) B\b")
_RAW_SECONDS = re.compile(r"(?<![\w.])(\d+\.\d+) s\b")


def humanize(text: str) -> str:
    """A message written with raw units (``4366331293 B``, ``0.028201 s``, as the passes' notes are) with those
    numbers in human units (``4.07 GiB``, ``28.201 ms``)."""
    text = _RAW_BYTES.sub(lambda m: fmt_bytes(int(m.group(1))), text)
    return _RAW_SECONDS.sub(lambda m: fmt_seconds(float(m.group(1))), text)
