"""The search behind :func:`commsched.optimize`: program variants, each scheduled and simulated alike.

Variants (first landing step of issue 16): the traced program in its traced order; the traced program scheduled by
``overlap``; and, when a GraphModule is given, the traced program with its collectives bucketed by the bucket
planner at several granularities (the cap at a few fractions of the asymptotic bus bandwidth, with and without the
planner's overlap refusals), planned on the traced order and on the scheduled one, then scheduled by ``overlap``
(with collective reordering only for the fastest few, which costs several times the plain schedule). Every variant
is costed by the same model on the same hardware and simulated by the same simulator; the memory budget is absolute
(a multiple of the traced program's peak), so a bucketed program cannot win by spending memory. Identical bucket
plans are tried once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commsched.cost import CostEstimate, estimate_costs
from commsched.hardware import for_graph
from commsched.ir import Graph
from commsched.passes import MemoryBudget, Schedule, ScheduleError, schedule
from commsched.sim import SimResult, simulate_costs

SATURATIONS = (0.9, 0.99)
"""bucket caps tried ("cap 0.9" in a variant's label): where a collective reaches this fraction of its asymptotic
bus bandwidth (bigger: fewer, larger collectives)"""


@dataclass
class Tried:
    """One program variant the search simulated, and what became of it."""

    label: str
    collectives: int | None
    """collectives in the variant's program (None: not built, e.g. the same plan as another)"""
    makespan_s: float | None = None
    peak_memory_bytes: int | None = None
    verdict: str = ""
    """'kept', or why it lost: slower than the kept one, over the memory budget, the same plan as another, failed"""


@dataclass
class _Variant:
    label: str
    graph: Graph
    costs: CostEstimate
    schedule: Schedule
    sim: SimResult
    gm: Any = None  # the rewritten GraphModule of a bucketed variant


@dataclass
class Optimized:
    """The result of :func:`optimize`: the kept program (``graph``, and ``gm`` in its final node order when a
    GraphModule was given), its ``schedule`` and ``costs``, the traced program's simulation (``before``) and the
    kept one's (``after``), and every variant tried with its verdict."""

    label: str
    graph: Graph
    schedule: Schedule
    costs: CostEstimate
    before: SimResult
    after: SimResult
    budget_bytes: int
    tried: list[Tried] = field(default_factory=list)
    gm: Any = None
    wall_s: float = 0.0

    @property
    def speedup(self) -> float:
        return self.before.makespan_s / self.after.makespan_s if self.after.makespan_s > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the kept variant, before / after, the budget and every variant with its verdict."""
        from dataclasses import asdict

        return {
            "kept": self.label,
            "traced_step_s": self.before.makespan_s,
            "step_s": self.after.makespan_s,
            "speedup": self.speedup,
            "lower_bound_s": self.after.lower_bound_s,
            "peak_memory_bytes": self.after.peak_memory_bytes,
            "budget_bytes": self.budget_bytes,
            "collectives": {"traced": len(self.before.graph.collectives), "kept": len(self.graph.collectives)},
            "wall_s": self.wall_s,
            "tried": [asdict(t) for t in self.tried],
        }

    def summary(self) -> str:
        return (
            f"kept {self.label}: {self.after.makespan_s * 1e3:.3f} ms vs traced {self.before.makespan_s * 1e3:.3f} ms "
            f"({self.speedup:.3f}x), peak {self.after.peak_memory_bytes} B (budget {self.budget_bytes} B), "
            f"{len(self.tried)} variant(s) in {self.wall_s:.2f} s"
        )


def optimize(
    program: Any,
    hardware: Any,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    memory_budget: MemoryBudget | float | str | None = 1.05,
    reorder_collectives: bool = True,
    group_sizes: dict[str, int] | None = None,
    finalists: int = 3,
) -> Optimized:
    """Optimize one step: a ``torch.fx.GraphModule`` (traced with ``_c10d_functional`` collectives; import it inside
    its (fake) process group or give ``group_sizes``) or a commsched ``Graph`` (reordering only: rewrites need the
    FX module). ``hardware``: a profile name, TOML path or ``Hardware`` (nodes inferred from the world size unless
    given). ``memory_budget``: a cap relative to the traced program's peak (or absolute), for every variant.
    ``reorder_collectives``: let ``overlap`` reorder each group's collectives (needs the same costs on every rank,
    which the analytic model gives; it costs a few times more scheduling, so bucketed programs are first scheduled
    without it and only the ``finalists`` fastest are scheduled again with it). Never worse than the traced order;
    see the module docstring for the search."""
    t0 = time.perf_counter()
    gm, g = _import(program, group_sizes)
    hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    costs = estimate_costs(g, hw)
    before = simulate_costs(g, costs)
    limit = MemoryBudget.parse(memory_budget).limit_bytes(before.peak_memory_bytes)
    knobs = {"reorder_collectives": reorder_collectives, "memory_budget": MemoryBudget(bytes=limit)}
    traced = _Variant("traced order", g, costs, Schedule(g, np.arange(len(g), dtype=np.int32)), before)
    variants: list[_Variant | Tried] = [traced, _scheduled("traced program, scheduled", g, costs, knobs)]
    if gm is not None:
        scheduled = variants[1] if isinstance(variants[1], _Variant) else traced
        quick = {**knobs, "reorder_collectives": False}
        bucketed = _bucketed(gm, g, hw, costs, quick, scheduled.schedule.order)
        variants += bucketed
        if reorder_collectives:  # prune: only the fastest bucketed programs get the (costlier) reordering search
            built = sorted((v for v in bucketed if isinstance(v, _Variant)), key=lambda v: v.sim.makespan_ns)
            for v in built[:finalists]:
                variants.append(_scheduled(f"{v.label}, collectives reordered", v.graph, v.costs, knobs, v.gm))
    best, tried = _judge(variants, limit)
    out_gm = None
    if gm is not None:
        from commsched.rewrites.fxutil import copy_graph_module
        from commsched.runtime.apply import apply_schedule

        out_gm = apply_schedule(copy_graph_module(best.gm if best.gm is not None else gm), best.schedule)
    return Optimized(
        best.label, best.graph, best.schedule, best.costs, before, best.sim, limit, tried, out_gm,
        time.perf_counter() - t0,
    )  # fmt: skip


def _import(program: Any, group_sizes: dict[str, int] | None) -> tuple[Any, Graph]:
    if isinstance(program, Graph):
        return None, program
    from commsched.frontends.fx import from_fx

    return program, from_fx(program, group_sizes=group_sizes)


def _scheduled(label: str, g: Graph, costs: CostEstimate, knobs: dict, gm: Any = None) -> _Variant | Tried:
    """``g`` scheduled by ``overlap`` and simulated; a failure (e.g. no order within the budget) is a verdict."""
    try:
        s = schedule(g, costs, "default", **knobs)
    except ScheduleError:  # its own traced order is over the budget and no schedule brings it under
        return Tried(label, len(g.collectives), verdict="over the memory budget (no order fits)")
    except Exception as exc:  # one variant that cannot be scheduled must not sink the search
        return Tried(label, len(g.collectives), verdict=f"failed: {exc}")
    return _Variant(label, g, costs, s, simulate_costs(g, costs, s.order), gm)


def _bucketed(gm: Any, g: Graph, hw: Any, costs: CostEstimate, knobs: dict, scheduled_order: np.ndarray) -> list:
    """Every distinct bucket plan of ``gm`` (granularity x refusals x the order it is planned on), applied,
    re-imported, costed on ``hw`` and scheduled."""
    from commsched.frontends.fx import from_fx
    from commsched.rewrites import BucketConfig, apply_bucket_plan, plan_buckets

    sizes = g.group_sizes()
    out: list[_Variant | Tried] = []
    seen: dict[tuple, str] = {}
    for plan_on, order in (("traced order", None), ("scheduled order", scheduled_order)):
        for saturation in SATURATIONS:
            for refusals in (True, False):
                label = f"bucketed (cap {saturation:g}{', overlap-aware' if refusals else ''}, planned on {plan_on})"
                cfg = BucketConfig(saturation=saturation, overlap_aware=refusals)
                plan = plan_buckets(g, costs, order, hardware=hw, config=cfg)
                key = tuple(b.members for b in plan.buckets if b.merged)
                if not key or key in seen:
                    verdict = "no merge" if not key else f"the same plan as: {seen[key]}"
                    out.append(Tried(label, None, verdict=verdict))
                    continue
                seen[key] = label
                result = apply_bucket_plan(gm, g, plan, order)  # only distinct plans are applied (FX work)
                g2 = from_fx(result.gm, group_sizes=sizes, meta=g.meta)
                out.append(_scheduled(label, g2, estimate_costs(g2, hw), knobs, result.gm))
    return out


def _judge(variants: list, limit: int) -> tuple[_Variant, list[Tried]]:
    """The fastest variant within ``limit`` bytes (ties: less memory, then the earlier, simpler one) and a verdict
    for every variant."""
    fits = [v for v in variants if isinstance(v, _Variant) and v.sim.peak_memory_bytes <= limit]
    # nothing within the budget (an absolute one below the traced peak): the traced program, as it came
    best = min(fits or variants[:1], key=lambda v: (v.sim.makespan_ns, v.sim.peak_memory_bytes))
    tried = []
    for v in variants:
        if isinstance(v, Tried):
            tried.append(v)
            continue
        if v is best:
            verdict = "kept"
        elif v.sim.peak_memory_bytes > limit:
            verdict = f"over the memory budget ({v.sim.peak_memory_bytes} B > {limit} B)"
        else:
            verdict = f"slower than the kept one by {(v.sim.makespan_s / best.sim.makespan_s - 1) * 100:.2f} %"
        tried.append(Tried(v.label, len(v.graph.collectives), v.sim.makespan_s, v.sim.peak_memory_bytes, verdict))
    return best, tried
