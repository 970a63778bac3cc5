"""Does the step fit? Peak memory against the device's HBM, FSDP padding that inflates the all_gathers, and a
network with no fitted data under a step across nodes.

Every command that knows the hardware prints these as warnings (stderr, one line each; ``--json`` carries them under
``warnings``), and the HTML report draws the capacity on its memory plot. They warn and never refuse: a step that
does not fit can still be compared with another that does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from commsched.hardware import Hardware, network_warning
from commsched.report.units import fmt_bytes

# a parameter whose FSDP shard is padded by more than this share of its rows is reported
PADDING_WARN_RATIO = 0.05


def capacity_warning(peak_bytes: float, hw: Hardware, *, what: str = "peak memory") -> str | None:
    """One line when ``peak_bytes`` (per rank) exceeds ``hw``'s HBM capacity; None when it fits."""
    capacity = hw.compute.hbm_capacity_bytes
    if capacity <= 0 or peak_bytes <= capacity:
        return None
    return (
        f"{what} {fmt_bytes(peak_bytes)} per rank exceeds the {capacity / 1e9:g} GB ({fmt_bytes(capacity)}) of "
        f"HBM of {hw.name} ({peak_bytes / capacity:.2f}x): this step does not fit on the device"
    )


def padding_warning(meta: Mapping[str, Any], *, ratio: float = PADDING_WARN_RATIO) -> str | None:
    """One line when a zoo workload's FSDP shards are padded by more than ``ratio`` of a parameter's rows (its
    ``meta["padding"]``, as ``workloads.build`` records it), naming the worst parameter; None otherwise."""
    padding = meta.get("padding")
    if not isinstance(padding, Mapping):
        return None
    rows = [p for p in padding.get("params", ()) if isinstance(p, Mapping) and p.get("local_rows")]
    bad = [p for p in rows if p.get("fsdp_pad_rows", 0) > ratio * p["local_rows"]]
    if not bad:
        return None
    worst = max(bad, key=lambda p: p["fsdp_pad_rows"] / p["local_rows"])
    rows_now, padded = worst["local_rows"], worst["local_rows"] + worst["fsdp_pad_rows"]
    fsdp = meta.get("fsdp", "?")
    pad_bytes = padding.get("fsdp_all_gather_pad_bytes", 0)
    return (
        f"FSDP padding: {len(bad)} parameter(s) padded by more than {100 * ratio:.0f} % of their rows to split over "
        f"{fsdp} FSDP ranks, worst {worst['param']} ({rows_now} rows padded to {padded}, "
        f"{padded / rows_now:.0f}x); one all_gather of every parameter moves {fmt_bytes(pad_bytes)} of zeros "
        "(fewer FSDP ranks, or ep)"
    )


def step_warnings(meta: Mapping[str, Any], hw: Hardware | None, peak_bytes: float | None) -> list[str]:
    """The warnings of one step: its padding (from the graph's ``meta``), its peak against ``hw``'s HBM, and a
    network with no fitted data under a step across nodes (:func:`commsched.hardware.network_warning`)."""
    lines = [padding_warning(meta)]
    if hw is not None and peak_bytes is not None:
        lines.append(capacity_warning(peak_bytes, hw))
    if hw is not None:
        lines.append(network_warning(hw))
    return [line for line in lines if line]
