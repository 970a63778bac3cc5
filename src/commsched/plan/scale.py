"""Judging a deep model from shallow traces: a step of L blocks is, to first order, its embedding and head plus L
times a block, so a quantity measured at K and 2K blocks is extrapolated linearly to the model's depth
(``benchmarks/bench_published.py`` and ``tests/plan`` check it against full traces). A pipeline is not scaled so: see
:func:`layer_counts`."""

from __future__ import annotations

from typing import Any

from commsched.plan.layout import Layout, PlanRequest


def extrapolate(y_k: float, y_2k: float, k: int, layers: int) -> float:
    """``y`` at ``layers`` from ``y`` at ``k`` and ``2k`` layers, linear in the layer count, never below 0 (every
    quantity plan scales is a time or a size; a falling one, e.g. exposed communication, would cross 0)."""
    return max(0.0, y_k + (layers - k) / k * (y_2k - y_k))


def layer_counts(req: PlanRequest, layout: Layout) -> tuple[int | None, ...]:
    """The depths a layout is judged at: ``(K, 2K)`` with K = ``req.layers_scale`` (a multiple of a
    selective-layer:N policy's N), or ``(None,)`` (every layer) when 2K reaches the model's depth, scaling is off,
    or the layout has PP. A pipeline is judged at the model's depth: its stages' costs are scaled per stage already
    (:mod:`commsched.pipeline.cache`: a long stage from traces of 2 and 3 layers), and its step is not linear in the
    depth (the slowest stage sets it, and the layers need not split evenly: llama3-70b on 512 GPUs, PP 16 x V 2,
    80 layers over 32 stages of 2 or 3, was 3-8 % under its full-depth step and its peak 16 % under or 13 % over
    when scaled from 32 and 64 layers, benchmarks/RESULTS.md)."""
    depth = req.model().n_layers
    k = req.layers_scale
    if k <= 0 or layout.pp > 1:
        return (None,)
    if layout.ac.startswith("selective-layer:"):
        n = int(layout.ac.partition(":")[2])
        k = -(-k // n) * n
    return (None,) if 2 * k >= depth else (k, 2 * k)


def extrapolate_peak(parts_k: dict[str, Any], parts_2k: dict[str, Any], k: int, layers: int) -> float:
    """The peak memory at ``layers`` from the step's parts at ``k`` and ``2k`` layers (each part ``(level_bytes,
    peak_bytes)``, :func:`commsched.sim.phases.phase_peaks`): each part's peak at 2K moved along its level's line,
    the maximum over the parts. Exact where each part's transient is the same at 2K and at ``layers`` and its level is
    linear in the depth (a maximum of lines, each extrapolated alone; one line through the step's peak is not)."""
    if parts_k.keys() != parts_2k.keys():
        raise ValueError(f"peak by phase: parts {sorted(parts_k)} at {k} layers, {sorted(parts_2k)} at {2 * k}")
    moved = [peak + (layers - 2 * k) / k * (level - parts_k[part][0]) for part, (level, peak) in parts_2k.items()]
    return max(0.0, *moved)
