"""``MemoryBudget``: the one way every pass is told how much peak memory it may use."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}  # fmt: skip
_UNLIMITED = 1 << 62
MAX_BYTES = 1 << 62
"""the largest cap in bytes (the graph's own byte totals stay below it, ``commsched.ir.graph.MAX_TOTAL_BYTES``)"""
MAX_RATIO = 1e6
"""the largest ratio; beyond it a cap means nothing (and ratio x peak could overflow an integer)"""


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
        ratio, nbytes = self.ratio, self.bytes
        if ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not math.isfinite(ratio):
                raise ValueError(f"memory budget ratio={ratio!r}: expected a finite number >= 1")
            if ratio > MAX_RATIO:
                raise ValueError(f"memory budget ratio={ratio:g}: expected at most {MAX_RATIO:g} (or None: no cap)")
            if ratio < 1.0:
                raise ValueError(f"memory budget ratio={ratio} must be >= 1 (the input order's peak)")
            object.__setattr__(self, "ratio", float(ratio))  # numpy scalars and ints compare and print as floats
        if nbytes is not None:
            if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
                raise ValueError(f"memory budget bytes={nbytes!r}: expected an integer >= 0")
            if not 0 <= nbytes <= MAX_BYTES:
                raise ValueError(f"memory budget bytes={nbytes}: expected an integer in [0, 2**62] (or None: no cap)")
            object.__setattr__(self, "bytes", int(nbytes))

    @property
    def unlimited(self) -> bool:
        return self.ratio is None and self.bytes is None

    def limit_bytes(self, input_peak_bytes: int) -> int:
        """The cap in bytes for an input order that peaks at ``input_peak_bytes`` (huge when unlimited)."""
        limits = []
        if self.ratio is not None:
            limits.append(min(int(input_peak_bytes * self.ratio), _UNLIMITED))
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
        try:
            if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "unlimited")):
                return cls()
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                return cls(ratio=float(value))
            if isinstance(value, str):
                text = value.strip().lower().replace(" ", "")
                m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)(x|[kmgt]?i?b)?", text)
                if m:
                    number, unit = float(m.group(1)), m.group(2) or "x"
                    if unit == "x":
                        return cls(ratio=number)
                    if unit in _UNITS and number * _UNITS[unit] <= MAX_BYTES:
                        return cls(bytes=int(number * _UNITS[unit]))
                    if unit in _UNITS:
                        raise ValueError(f"{number:g} {unit}: expected at most 2**62 bytes (or None: no cap)")
        except ValueError as exc:  # out of range: say which knob
            raise ValueError(f"knob {knob}={value!r}: {exc}") from None
        raise ValueError(
            f"knob {knob}={value!r}: expected a memory budget: a ratio of the input peak (1.05 or '1.05x'), "
            "bytes ('40GiB', '123456B') or None"
        )
