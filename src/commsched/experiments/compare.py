"""Side-by-side comparison of schedulers on one graph: the input order, each seed pass, our ``overlap`` scheduler,
the CP-SAT optimum where feasible and torch's own OverlapScheduler (when the FX GraphModule is available), every
order simulated by the same simulator with the same costs, so the table compares schedulers, not cost models."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph

SEED_PASSES = (
    "sink_waits",
    "raise_comms",
    "reorder_compute_for_overlap",
    "reorder_communication_preserving_peak_memory",
    "sink_waits_iterative",
)


@dataclass
class CompareRow:
    scheduler: str
    makespan_s: float | None = None
    exposed_comm_s: float | None = None
    overlap_ratio: float | None = None
    peak_memory_bytes: int | None = None
    wall_s: float | None = None
    gap_to_bound: float | None = None  # makespan / lower bound - 1
    note: str = ""


@dataclass
class CompareResult:
    rows: list[CompareRow]
    lower_bound_s: float
    bound_binding: str
    input_peak_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lower_bound_s": self.lower_bound_s,
            "bound_binding": self.bound_binding,
            "input_peak_bytes": self.input_peak_bytes,
            "meta": self.meta,
            "rows": [asdict(r) for r in self.rows],
        }

    def row(self, name: str) -> CompareRow:
        return next(r for r in self.rows if r.scheduler == name)


def compare_schedulers(
    graph: Graph,
    costs: CostEstimate,
    *,
    gm: Any = None,
    seed_passes: tuple[str, ...] = SEED_PASSES,
    exact_max_nodes: int = 300,
    exact_time_limit_s: float = 20.0,
    torch_knobs: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> CompareResult:
    """Run every scheduler on ``graph`` and simulate each order; see the module docstring."""
    from commsched.passes import MemoryBudget, schedule
    from commsched.sim import simulate_costs

    say = progress or (lambda _msg: None)
    base = simulate_costs(graph, costs)
    lb = base.lower_bound_s
    rows: list[CompareRow] = []

    def add(name: str, order: np.ndarray | None, wall: float | None, note: str = "", streams=None) -> None:
        if order is None:
            rows.append(CompareRow(name, wall_s=wall, note=note))
            return
        res = simulate_costs(graph, costs, order, streams)
        rows.append(
            CompareRow(
                scheduler=name,
                makespan_s=res.makespan_s,
                exposed_comm_s=res.exposed_comm_s,
                overlap_ratio=res.overlap_ratio,
                peak_memory_bytes=res.peak_memory_bytes,
                wall_s=wall,
                gap_to_bound=res.makespan_s / lb - 1.0 if lb > 0 else None,
                note=note,
            )
        )

    add("input order", np.arange(len(graph), dtype=np.int32), None)
    runs: list[tuple[str, list[str], dict[str, Any]]] = [(p, [p], {}) for p in seed_passes]
    runs.append(("torch passes (seed preset)", ["torch"], {}))
    runs.append(("overlap (ours)", ["overlap"], {}))
    runs.append(("overlap (ours, reorder_collectives)", ["overlap"], {"reorder_collectives": True}))
    for name, passes, knobs in runs:
        say(name)
        t0 = time.perf_counter()
        try:
            s = schedule(graph, costs, passes, **knobs)
        except Exception as exc:  # a pass that cannot handle this graph is a row, not a crash
            add(name, None, time.perf_counter() - t0, note=f"failed: {exc}")
            continue
        add(name, s.order, time.perf_counter() - t0, streams=s.streams)
    if len(graph) <= exact_max_nodes:
        say("exact (CP-SAT)")
        from commsched.memory import memory_profile
        from commsched.passes.exact import solve_exact

        ours = schedule(graph, costs, "default").order
        t0 = time.perf_counter()
        try:
            res = solve_exact(
                graph,
                costs,
                memory_budget_bytes=int(memory_profile(graph).peak_bytes * 1.05),
                time_limit_s=exact_time_limit_s,
                hint=ours,
            )
            add(
                "exact (CP-SAT)",
                res.order,
                time.perf_counter() - t0,
                note=f"{res.status}; proven bound {res.lower_bound_s * 1e3:.3f} ms (no interference/link sharing)",
            )
        except RuntimeError as exc:
            add("exact (CP-SAT)", None, time.perf_counter() - t0, note=str(exc))
    if gm is not None:
        say("torch OverlapScheduler")
        from commsched.peers import run_torch_overlap_scheduler

        try:
            tp = run_torch_overlap_scheduler(gm, graph, costs, **(torch_knobs or {}))
            note = "" if tp.valid else f"invalid: {tp.invalid_reason}"
            add("torch OverlapScheduler", tp.order, tp.wall_s, note=note)
            torch_peak = rows[-1].peak_memory_bytes
            if torch_peak is not None and tp.valid:
                # the same memory: ours with torch's peak as its hard budget, so neither wins by spending memory
                say("overlap at torch's peak")
                t0 = time.perf_counter()
                try:
                    s = schedule(
                        graph,
                        costs,
                        "overlap",
                        reorder_collectives=True,
                        memory_budget=MemoryBudget(bytes=torch_peak),
                    )
                    add("overlap (ours, reorder, torch's peak as budget)", s.order, time.perf_counter() - t0)
                except Exception as exc:
                    add("overlap (ours, reorder, torch's peak as budget)", None, None, note=f"failed: {exc}")
        except Exception as exc:
            add("torch OverlapScheduler", None, None, note=f"failed: {type(exc).__name__}: {exc}")
    return CompareResult(rows, lb, base.bound.binding, base.peak_memory_bytes)
