"""Human-readable numbers for tables."""

from __future__ import annotations


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
