"""How fast a simulated step computes: model FLOPs utilisation (the step's FLOPs per rank over the step time and the
device's peak for the step's dtype) and tokens per second (a zoo workload knows its tokens per step: batch x
sequence x data-parallel replicas). A graph without the number says "-" rather than guessing: a graph that names no
dtype (or one the device has no peak for) has no MFU, never one at another dtype's peak."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from commsched.hardware import Hardware
    from commsched.sim.result import SimResult


@dataclass(frozen=True)
class StepRates:
    """One step's rates. ``mfu``: ``flops_per_rank / (makespan_s * peak_flops)``, None without a device peak for the
    graph's ``dtype`` (None when the graph does not name it); ``tokens_per_s``: ``tokens_per_step / makespan_s`` over
    the whole job, None when the graph does not say."""

    flops_per_rank: float
    makespan_s: float
    dtype: str | None
    peak_flops: float | None
    tokens_per_step: int | None

    @property
    def mfu(self) -> float | None:
        if not self.peak_flops or self.makespan_s <= 0:
            return None
        return self.flops_per_rank / (self.makespan_s * self.peak_flops)

    @property
    def tokens_per_s(self) -> float | None:
        if not self.tokens_per_step or self.makespan_s <= 0:
            return None
        return self.tokens_per_step / self.makespan_s

    @property
    def mfu_label(self) -> str:
        """The MFU's name in a report: ``MFU (bfloat16)``, or ``MFU (dtype unknown)``."""
        return f"MFU ({self.dtype or 'dtype unknown'})"

    def to_dict(self) -> dict[str, float | None]:
        """``mfu`` and ``tokens_per_s`` (None where unknown): what ``simulate --json`` and ``schedule --json`` add."""
        return {"mfu": self.mfu, "tokens_per_s": self.tokens_per_s}


def step_rates(res: SimResult, hw: Hardware | None = None, makespan_s: float | None = None) -> StepRates:
    """``res``'s rates on ``hw``: its peak for the graph's ``meta["dtype"]``; no peak (no MFU) when the graph names no
    dtype or ``hw`` lists no peak for it (the profile's float32 peak is no stand-in for another dtype's).
    ``makespan_s``: the step time (default: ``res``'s makespan; a schedule's adds its contention charge)."""
    meta = res.graph.meta
    dtype = meta.get("dtype") if isinstance(meta.get("dtype"), str) and meta.get("dtype") else None
    tokens = meta.get("tokens_per_step")
    peaks = dict(hw.compute.peak_flops) if hw is not None else {}
    return StepRates(
        flops_per_rank=float(res.graph.flops.sum()),
        makespan_s=res.makespan_s if makespan_s is None else makespan_s,
        dtype=dtype,
        peak_flops=peaks.get(dtype) if dtype is not None else None,
        tokens_per_step=int(tokens) if isinstance(tokens, (int, float)) and tokens > 0 else None,
    )


def fmt_rate(value: float | None, unit: str = "") -> str:
    """A rate in 3 significant digits with k / M / G, or "-" when unknown."""
    if value is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def fmt_mfu(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"
