"""Costs, orders and predictions for a real run: computed once (rank 0), from the calibration every rank measured.

Two cost sources predict each order's step time: ``profile`` (the hardware profile's roofline, eager: no fusion)
and ``measured`` (each op's own measured time). Both take the collectives from the calibration of the link the run
uses, and the compute slowdown while communication is in flight from the interference probe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch.fx

from commsched.cost import CostEstimate, estimate_costs
from commsched.cost.table import MeasuredTable
from commsched.hardware import Hardware
from commsched.ir import Graph, OpKind
from commsched.passes.budget import MemoryBudget
from commsched.report.run_report import CostTotals, Prediction

COST_SOURCES = ("profile", "measured")
BUILTIN_VARIANTS = {
    "original": "the traced order (each collective waited right where it was issued)",
    "overlap": "commsched's scheduler (the pass preset or list given by --passes)",
    "torch": "torch 2.13's OverlapScheduler (commsched.peers), fed the same costs",
    "optimize": "the program commsched.optimize keeps (collectives bucketed, scheduled), on the profile's costs",
}
OPTIMIZE = "optimize"
"""the variant that runs a rewritten program, not an order of the traced one (``runtime.optimize_run``)"""


def link_table(rows: Sequence[tuple[str, int, int, float]], source: str = "link calibration") -> MeasuredTable:
    """The measured collectives as a table for :func:`estimate_costs`."""
    table = MeasuredTable(source)
    for kind, size, nbytes, t in rows:
        table.add_collective(kind, size, nbytes, t)
    return table


def run_costs(
    graph: Graph,
    hardware: Hardware,
    table: MeasuredTable,
    compute_slowdown: float,
    op_times_s: Mapping[str, float] | None = None,
    comm_slowdown: float = 1.0,
) -> CostEstimate:
    """Costs of ``graph`` for an eager run: collectives from ``table``, compute from ``op_times_s`` (node name ->
    seconds) where given, else the profile's roofline without fusion (an FX GraphModule runs op by op)."""

    def measured(node: Any) -> float | None:
        if op_times_s is None or node.kind in (OpKind.INPUT, OpKind.OUTPUT, OpKind.WAIT, OpKind.COLLECTIVE):
            return None
        return op_times_s.get(node.name)

    costs = estimate_costs(graph, hardware, table=table, estimate=measured if op_times_s else None, fusion=False)
    return dataclasses.replace(
        costs, compute_slowdown=max(1.0, float(compute_slowdown)), comm_slowdown=max(1.0, float(comm_slowdown))
    )


def cost_sources(
    graph: Graph,
    hardware: Hardware,
    table: MeasuredTable,
    op_times_s: Mapping[str, float],
    compute_slowdown: float,
    comm_slowdown: float,
) -> dict[str, CostEstimate]:
    """The costs every order is predicted with: ``measured`` and ``profile`` (see the module docstring; the
    schedulers see one of them), and ``measured, comm unslowed`` (the measured costs without communication's
    slowdown under compute, to show what that term buys)."""
    return {
        "measured": run_costs(graph, hardware, table, compute_slowdown, op_times_s, comm_slowdown),
        "profile": run_costs(graph, hardware, table, compute_slowdown, comm_slowdown=comm_slowdown),
        "measured, comm unslowed": run_costs(graph, hardware, table, compute_slowdown, op_times_s),
    }


def torch_default_budget_bytes(peak_bytes: int) -> int:
    """torch's OverlapScheduler default memory limit: the input order's peak plus max(1 GiB, 5 %)."""
    return int(peak_bytes + max(1 << 30, 0.05 * peak_bytes))


def run_memory_budget(graph: Graph, memory_budget: MemoryBudget | None) -> MemoryBudget:
    """The memory rule every planner of a run gets: ``memory_budget``, or by default torch's (an absolute limit:
    the traced order's peak plus max(1 GiB, 5 %))."""
    from commsched.memory import memory_profile

    if memory_budget is not None:
        return memory_budget
    return MemoryBudget(bytes=torch_default_budget_bytes(memory_profile(graph).peak_bytes))


def plan_orders(
    gm: torch.fx.GraphModule,
    graph: Graph,
    costs: CostEstimate,
    variants: Sequence[str],
    *,
    passes: str | Sequence[str] = "default",
    knobs: Mapping[str, Any] | None = None,
    memory_budget: MemoryBudget | None = None,
    given: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The order of every variant (node ids of ``graph``) and, for variants that could not be planned, why.

    ``original``: the graph's order; ``overlap``: ``commsched.passes.schedule(graph, costs, passes, **knobs)``;
    ``torch``: torch's OverlapScheduler on ``gm`` with the same costs (skipped, with the reason, when its order is
    invalid for our graph); any other name must be in ``given`` (node names, checked).

    Both schedulers get the same memory rule: ``memory_budget`` (a ratio applies to each one's input peak in its own
    accounting; torch's is measured by a first run), or by default torch's own default limit (peak + max(1 GiB,
    5 %)). Our ``reorder_collectives`` defaults to True: the orders are decided once and given to every rank, so a
    group's collectives may be reordered safely, as torch's scheduler does; and ``waits`` defaults to "late" (each
    wait just before its first use, within the budget): a real collective that runs longer than predicted then
    stalls compute only where its result is needed. ``knobs`` override these defaults, which apply only to our passes
    (not the seed baselines) that have those knobs."""
    from commsched.ir.order import as_order
    from commsched.passes import PASSES, KnobNamespace, check_schedule, resolve_passes, schedule

    ours = dict(knobs or {})
    budget = run_memory_budget(graph, memory_budget)
    defaults: dict[str, Any] = {"reorder_collectives": True, "waits": "late", "memory_budget": budget}
    namespace = KnobNamespace.of(resolve_passes(passes))
    for name in namespace.passes:  # ours only (the seed baselines keep torch's defaults), where the user set nothing
        if PASSES[name].baseline:
            continue
        own = {k: v for k, v in defaults.items() if k in namespace.fields(name) and k not in ours}
        if own:
            ours[name] = {**own, **ours.get(name, {})}
    orders: dict[str, np.ndarray] = {}
    skipped: dict[str, str] = {}
    for name in variants:
        if given and name in given:
            order = as_order(graph, list(given[name]))
            check_schedule(graph, order, allow_collective_reorder=True)
            orders[name] = order
        elif name == "original":
            orders[name] = np.arange(len(graph), dtype=np.int32)
        elif name == "overlap":
            orders[name] = schedule(graph, costs, passes, **ours).order
        elif name == "torch":
            from commsched.peers import run_torch_overlap_scheduler

            result = run_torch_overlap_scheduler(gm, graph, costs)
            if memory_budget is not None:
                limit = memory_budget.limit_bytes(result.torch_baseline_peak_memory_bytes)
                result = run_torch_overlap_scheduler(gm, graph, costs, memory_budget=limit)
            if result.valid:
                orders[name] = result.order
            else:
                skipped[name] = f"torch's order is not valid for this graph: {result.invalid_reason}"
        else:
            raise ValueError(
                f"variant {name!r} has no order: expected one of {sorted(BUILTIN_VARIANTS)} or a given order"
            )
    return orders, skipped


def predict(
    graph: Graph, costs: Mapping[str, CostEstimate], orders: Mapping[str, np.ndarray]
) -> dict[str, dict[str, Prediction]]:
    """Simulated step of every order under every cost source: {variant: {source: Prediction}}."""
    from commsched.sim import simulate_costs

    out: dict[str, dict[str, Prediction]] = {}
    for name, order in orders.items():
        out[name] = {}
        for source, c in costs.items():
            r = simulate_costs(graph, c, order)
            out[name][source] = Prediction(
                makespan_s=float(r.makespan_s),
                exposed_comm_s=float(r.exposed_comm_s),
                peak_memory_bytes=int(r.peak_memory_bytes),
                lower_bound_s=float(r.lower_bound_s),
            )
    return out


def cost_summary(graph: Graph, costs: CostEstimate) -> CostTotals:
    """Total compute and collective seconds of a cost estimate (what the prediction is made of)."""
    is_coll = graph.coll_type >= 0
    return CostTotals(
        compute_s=float(costs.node_s[~is_coll].sum()),
        collectives_s=float(costs.node_s[is_coll].sum()),
        compute_slowdown=float(costs.compute_slowdown),
        comm_slowdown=float(costs.comm_slowdown),
    )
