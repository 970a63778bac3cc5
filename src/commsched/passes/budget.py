"""``MemoryBudget``: the one way every pass is told how much peak memory it may use."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}  # fmt: skip
_UNLIMITED = 1 << 62


@dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """A hard cap on a schedule's peak memory: ``ratio`` times the input order's peak, ``bytes`` absolute, or both
    (the smaller applies); neither means no cap. ``MemoryBudget.parse`` reads the knob spellings ``1.05`` or
    ``"1.05x"`` (a ratio), ``"40GiB"`` / ``"123456B"`` (bytes) and ``None`` / ``"none"`` (no cap)."""

    ratio: float | None = None
    """peak <= ratio x the input order's peak (>= 1: a pass never needs less than the order it was given)"""
    bytes: int | None = None
    """peak <= this many bytes"""

    def __post_init__(self) -> None:
        if self.ratio is not None and not (isinstance(self.ratio, int | float) and math.isfinite(self.ratio)):
            raise ValueError(f"memory budget ratio={self.ratio!r}: expected a finite number >= 1")
        if self.ratio is not None and self.ratio < 1.0:
            raise ValueError(f"memory budget ratio={self.ratio} must be >= 1 (the input order's peak)")
        if self.bytes is not None and (isinstance(self.bytes, bool) or not isinstance(self.bytes, int)):
            raise ValueError(f"memory budget bytes={self.bytes!r}: expected an integer >= 0")
        if self.bytes is not None and self.bytes < 0:
            raise ValueError(f"memory budget bytes={self.bytes} must be >= 0")

    @property
    def unlimited(self) -> bool:
        return self.ratio is None and self.bytes is None

    def limit_bytes(self, input_peak_bytes: int) -> int:
        """The cap in bytes for an input order that peaks at ``input_peak_bytes`` (huge when unlimited)."""
        limits = []
        if self.ratio is not None:
            limits.append(int(input_peak_bytes * self.ratio))
        if self.bytes is not None:
            limits.append(int(self.bytes))
        return min(limits) if limits else _UNLIMITED

    def __str__(self) -> str:
        parts = ([f"{self.ratio:g}x input peak"] if self.ratio is not None else []) + (
            [f"{self.bytes} B"] if self.bytes is not None else []
        )
        return " and ".join(parts) or "unlimited"

    @classmethod
    def parse(cls, value: object, knob: str = "memory_budget") -> MemoryBudget:
        """A budget from a knob value (see the class docstring); a one-line ValueError naming ``knob`` otherwise."""
        if isinstance(value, MemoryBudget):
            return value
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "unlimited")):
            return cls()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls(ratio=float(value))
        if isinstance(value, str):
            text = value.strip().lower().replace(" ", "")
            m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)(x|[kmgt]?i?b)?", text)
            if m:
                number, unit = float(m.group(1)), m.group(2) or "x"
                if unit == "x":
                    return cls(ratio=number)
                if unit in _UNITS:
                    return cls(bytes=int(number * _UNITS[unit]))
        raise ValueError(
            f"knob {knob}={value!r}: expected a memory budget: a ratio of the input peak (1.05 or '1.05x'), "
            "bytes ('40GiB', '123456B') or None"
        )
