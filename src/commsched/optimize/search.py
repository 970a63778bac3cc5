"""The core of :func:`commsched.optimize`: every variant family proposes, the core judges, the simulator decides.

The core simulates the traced program in its traced order and schedules it with ``overlap``; then each family of
the registry (:mod:`commsched.optimize.families`, in order; program transforms only with ``transforms=True``)
proposes its variants through the :class:`commsched.optimize.protocol.Judge` (:mod:`commsched.optimize.judge` here,
:mod:`commsched.optimize.parallel` on an executor's workers: the same verdicts in the same order), which probes,
prunes by lower bound and fully schedules them. The fastest variant within the memory budget is kept, judged once
more as the module returned (:func:`_kept_as_returned`), and every variant gets its verdict.

Every variant is costed by the same model on the same hardware and simulated by the same simulator; the memory budget
is absolute (a multiple of the traced program's peak, or of the seeds' where given), so a transformed program cannot
win by spending memory.

**Seeds** (``optimize(..., seeds={"FSDP2 order": order})``): orders of the traced program that the user runs today
(e.g. the framework's, :func:`commsched.passes.schedule` with ``"framework"``). Each is a variant judged like the
others, and the scheduler is started from the fastest one too (``"<label>, scheduled"``), so the result is never
slower than any seed; a relative budget is then relative to the largest seed peak (what the user runs today: every
seed fits it, the traced order, which nobody runs, need not). Without seeds nothing changes. Why: the scheduler
started from the traced order can end slower than the framework's order where the budget binds (a deep model:
llama3-70b at 80 layers, 8.64 s against FSDP2's 7.96 s; benchmarks/RESULTS.md, "plan: full-depth check").
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commsched.cost import CostEstimate, MeasuredTable, estimate_costs, load_measured
from commsched.hardware import for_graph
from commsched.ir import Graph
from commsched.optimize.families import FAMILIES
from commsched.optimize.families.bucketing import GRANULARITIES
from commsched.optimize.judge import SerialJudge
from commsched.optimize.protocol import State, Tried, Variant, schedule_variant
from commsched.passes import MemoryBudget, Schedule, check_schedule, schedule
from commsched.sim import SimResult, simulate_costs


@dataclass
class Optimized:
    """The result of :func:`optimize`: the kept program (``graph``, and ``gm`` in its final node order when a
    GraphModule was given: a lazy GraphModule, its code generated when first run or read), its ``schedule`` and
    ``costs``, the traced program's simulation (``before``) and the
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
        """One line in human units: what was kept, how much faster than the traced order, its peak against the
        budget, how many variants were tried and the wall time."""
        from commsched.report.units import fmt_bytes, fmt_seconds

        return (
            f"kept {self.label}: {fmt_seconds(self.after.makespan_s)} vs traced {fmt_seconds(self.before.makespan_s)} "
            f"({self.speedup:.3f}x), peak {fmt_bytes(self.after.peak_memory_bytes)} "
            f"(budget {fmt_bytes(self.budget_bytes)}), {len(self.tried)} variant(s) in {self.wall_s:.2f} s"
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
    finalists: int = 2,
    table: MeasuredTable | str | None = None,
    transforms: bool = True,
    executor: Any = None,
    granularities: tuple = GRANULARITIES,
    seeds: Mapping[str, Any] | None = None,
    fusion: bool = True,
) -> Optimized:
    """Optimize one step: a ``torch.fx.GraphModule`` (traced with ``_c10d_functional`` collectives; import it inside
    its (fake) process group or give ``group_sizes``) or a commsched ``Graph`` (reordering only: rewrites need the
    FX module). ``hardware``: a profile name, TOML path or ``Hardware`` (nodes inferred from the world size unless
    given). ``memory_budget``: a cap relative to the traced program's peak (or absolute), for every variant.
    ``reorder_collectives``: let ``overlap`` reorder each group's collectives (needs the same costs on every rank,
    which the analytic model gives). ``finalists``: bucket plans per order they were planned on (traced, scheduled)
    that get the full scheduling search after the one-attempt probe. ``table``: measured times (a
    ``MeasuredTable``, or a table / profiler trace path, e.g. from ``commsched calibrate --trace``) used for every
    variant before the model; bucketed collectives of other sizes are interpolated. ``transforms``: also try
    the families that transform the program (decomposed TP, split batch or sequence, gathers kept for the backward:
    :mod:`commsched.optimize.families`). Never worse than the traced order (with seeds: than any seed); see the
    module docstring for the search. ``executor`` (:mod:`commsched.execute`): judge the candidates that can travel
    (bucket plans) on its workers (:mod:`commsched.optimize.parallel`; the same result); ``granularities``: the
    bucket caps tried
    (default :data:`commsched.optimize.families.bucketing.GRANULARITIES`). ``seeds``: label -> an order of the
    traced program the user runs today (node ids or names, a single-stream ``Schedule``, or the name of a pass that
    orders it, e.g. ``"framework"``: FSDP2's and DDP's order): judged as variants, the scheduler started from the
    fastest, never worse than any, a relative budget taken from their largest peak (module docstring); ValueError
    naming the seed when one is not a valid order. ``fusion``: kernels costed as Inductor fuses them (a compiled
    step, the default); False: every op its own kernel (an eager step, as ``predict`` costs it)."""
    t0 = time.perf_counter()
    with _collector_paused():
        out = _optimize(program, hardware, num_nodes, gpus_per_node, memory_budget, reorder_collectives, group_sizes,
                        finalists, table, transforms, executor, granularities, seeds, fusion)  # fmt: skip
    out.wall_s = time.perf_counter() - t0
    return out


@contextlib.contextmanager
def _collector_paused():
    """The cyclic garbage collector off while the search runs (back on, as it was, after): the search allocates
    millions of small lists and tuples, and every full collection rescans the caller's whole heap (a traced
    module's FX graph and fake tensors: about 450k objects on a 5k-node step), which cost about 15 % of the
    search's CPU time. What the search leaves in reference cycles is collected once the collector is back on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _optimize(program, hardware, num_nodes, gpus_per_node, memory_budget, reorder_collectives, group_sizes,
              finalists, table, transforms, executor=None, granularities=GRANULARITIES,
              seeds=None, fusion=True) -> Optimized:  # fmt: skip
    gm, g = _import(program, group_sizes)
    hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    if isinstance(table, (str, os.PathLike)):
        table = load_measured(table)
    cost = functools.partial(estimate_costs, hardware=hw, table=table, fusion=fusion)  # every variant alike
    costs = cost(g)
    before = simulate_costs(g, costs)
    seeded = _seed_variants(g, costs, seeds or {})
    reference = max((v.sim.peak_memory_bytes for v in seeded), default=before.peak_memory_bytes)
    limit = MemoryBudget.parse(memory_budget).limit_bytes(reference)
    knobs = {"reorder_collectives": reorder_collectives, "memory_budget": MemoryBudget(bytes=limit)}
    traced = Variant("traced order", g, costs, Schedule(g, np.arange(len(g), dtype=np.int32)), before)
    scheduled = schedule_variant("traced program, scheduled", g, costs, knobs)
    # the families read the traced program and its scheduled order first (variants[0], variants[1])
    state = State(gm, g, costs, cost, hw, knobs, finalists, granularities,
                  [traced, scheduled, *seeded, *_seed_scheduled(seeded, knobs, limit)])  # fmt: skip
    if gm is not None:  # rewrites need the FX module
        judge = SerialJudge(state) if executor is None else _executor_judge(state, executor, table, fusion)
        for family in FAMILIES.values():
            if transforms or not family.transform:
                state.variants += _stamped(family.name, family.variants(state, judge))
    variants = state.variants
    best, tried = _judge(variants, limit)
    best = best.built()  # a finalist judged on a worker, built here
    out_gm = None
    if gm is not None:
        best, returned = _kept_as_returned(cost, variants, best, limit, tried)
        out_gm = _final_module(gm, g, best)
        best = returned
    return Optimized(best.label, best.graph, best.schedule, best.costs, before, best.sim, limit, tried, out_gm)


SEED_LABELS_TAKEN = ("traced order", "traced program, scheduled")
"""labels the search gives its own variants: a seed may not take one"""


def _seed_variants(g: Graph, costs: CostEstimate, seeds: Mapping[str, Any]) -> list[Variant]:
    """Each seed (label -> order, or the name of a registered pass run on the program order, e.g. ``"framework"``)
    checked (a topological order of ``g``; its own collective order, as every rank runs it) and simulated as given.
    ValueError naming the seed otherwise."""
    out = []
    for label, seed in seeds.items():
        if not isinstance(label, str) or not label or label in SEED_LABELS_TAKEN:
            raise ValueError(f"seeds: label {label!r} must be a non-empty string other than {SEED_LABELS_TAKEN}")
        if isinstance(seed, Schedule) and seed.streams is not None:
            raise ValueError(f"seeds[{label!r}]: a multi-stream schedule; expected one order (a single stream)")
        try:
            if isinstance(seed, str):  # a pass's order: costed as every variant is
                seed = schedule(g, costs, seed)
            order = check_schedule(g, seed.order if isinstance(seed, Schedule) else seed, allow_collective_reorder=True)
        except ValueError as exc:  # not an order (a ScheduleError), or an unknown pass
            raise ValueError(f"seeds[{label!r}]: {exc}") from None
        out.append(Variant(label, g, costs, Schedule(g, order), simulate_costs(g, costs, order)))
    return out


def _seed_scheduled(seeded: list[Variant], knobs: dict, limit: int) -> list:
    """The scheduler started from the fastest seed within ``limit`` (none fits: from none), as one more variant."""
    fits = [v for v in seeded if v.sim.peak_memory_bytes <= limit]
    if not fits:
        return []
    start = min(fits, key=lambda v: (v.sim.makespan_ns, v.sim.peak_memory_bytes))
    return [schedule_variant(f"{start.label}, scheduled", start.graph, start.costs, knobs, order=start.schedule.order)]


def _executor_judge(state: State, executor: Any, table: Any, fusion: bool = True) -> SerialJudge:
    from commsched.optimize.parallel import ExecutorJudge

    return ExecutorJudge(state, executor, table, fusion)


def _stamped(family: str, variants: list) -> list:
    """``variants`` with their lineage: the family that built them."""
    for v in variants:
        if isinstance(v, Variant):
            v.family = family
    return variants


def _as_returned(cost: Callable[[Graph], CostEstimate], best: Variant) -> Variant:
    """The kept variant as the returned module is: its graph in its schedule's order (the graph ``from_fx`` gives of
    the returned module, without importing it again: ``tests/rewrites/test_as_returned.py``), costed and simulated
    in that order. The cost model's fusion depends on program order (Inductor fuses neighbours), so this can differ
    from the judged variant by a few microseconds; the reported step is the one of the module the user gets."""
    from commsched.ir.transform import permute_nodes
    from commsched.runtime.apply import module_order

    g2 = permute_nodes(best.graph, module_order(best.graph, best.schedule.order))
    c2 = cost(g2)
    order = np.arange(len(g2), dtype=np.int32)
    return Variant(
        best.label, g2, c2, Schedule(g2, order), simulate_costs(g2, c2, order), best.plan, best.probe_s, best.family
    )


AS_RETURNED_TRIES = 3
"""at most this many variants are judged as returned (:func:`_kept_as_returned`)"""


def _kept_as_returned(
    cost: Callable[[Graph], CostEstimate], variants: list, best: Variant, limit: int, tried: list[Tried]
) -> tuple[Variant, Variant]:
    """The variant to keep and its :func:`_as_returned` form. A variant whose order interleaves what the program
    order kept apart (a split program's chunks) can lose fusion as returned; when the kept one's returned step is
    slower than the next variant's judged step, that one is judged as returned too (up to
    :data:`AS_RETURNED_TRIES`, fastest judged first), and the fastest returned within ``limit`` is kept; the
    verdicts in ``tried`` say so."""
    fits = sorted((v for v in variants if isinstance(v, Variant) and v.sim.peak_memory_bytes <= limit),
                  key=lambda v: (v.sim.makespan_ns, v.sim.peak_memory_bytes))  # fmt: skip
    chosen = (best, _as_returned(cost, best), best)  # (variant, as returned, as listed in variants)
    returned_s = {best.label: chosen[1].sim.makespan_s}
    for v in [v for v in fits if v.label != best.label][: AS_RETURNED_TRIES - 1]:
        if chosen[1].sim.makespan_ns <= v.sim.makespan_ns:
            break
        built = v.built()
        r = _as_returned(cost, built)
        returned_s[v.label] = r.sim.makespan_s
        if r.sim.peak_memory_bytes <= limit and r.sim.makespan_ns < chosen[1].sim.makespan_ns:
            chosen = (built, r, v)
    if chosen[0] is not best:
        tried[:] = _judge(variants, limit, chosen[2])[1]
        kept_s = chosen[1].sim.makespan_s
        for t in tried:
            if t.label in returned_s and t.label != chosen[2].label:
                t.verdict = (f"slower as returned ({returned_s[t.label] * 1e3:.3f} ms against the kept one's "
                             f"{kept_s * 1e3:.3f} ms: its program order changes fusion)")  # fmt: skip
            elif t.label == chosen[2].label:
                t.verdict = "kept (judged as returned)"
            elif t.verdict.startswith("slower than the kept one by -"):  # beyond the tries: never judged so
                t.verdict = f"faster as judged, not judged as returned (only the {AS_RETURNED_TRIES} fastest are)"
    return chosen[0], chosen[1]


def _final_module(gm: Any, g: Graph, best: Variant) -> Any:
    """The kept program as a GraphModule in its schedule's order: the FX rewrite of its plan (node names as on the
    IR, e.g. :mod:`commsched.rewrites.bucket_graph`), reordered by name. A lazy module (torch's
    ``_LazyGraphModule``): its Python code is generated when it is first run or read, not here (torch's own
    scheduling passes leave the code to their caller too; on a 5k-node step it is a quarter of a second)."""
    from commsched.rewrites.fxutil import copy_graph_module
    from commsched.runtime.apply import apply_schedule

    out = copy_graph_module(gm, lazy=True) if best.plan is None else best.plan.apply_fx(gm, g)
    return apply_schedule(out, best.schedule)


def _import(program: Any, group_sizes: dict[str, int] | None) -> tuple[Any, Graph]:
    if isinstance(program, Graph):
        return None, program
    from commsched.frontends.fx import from_fx

    return program, from_fx(program, group_sizes=group_sizes)


def _judge(variants: list, limit: int, best: Variant | None = None) -> tuple[Variant, list[Tried]]:
    """The fastest variant within ``limit`` bytes (ties: less memory, then the earlier, simpler one), or ``best``
    where given, and a verdict for every variant."""
    from commsched.report.units import fmt_bytes

    fits = [v for v in variants if isinstance(v, Variant) and v.sim.peak_memory_bytes <= limit]
    # nothing within the budget (an absolute one below the traced peak): the traced program, as it came
    if best is None:
        best = min(fits or variants[:1], key=lambda v: (v.sim.makespan_ns, v.sim.peak_memory_bytes))
    tried = []
    for v in variants:
        if isinstance(v, Tried):
            tried.append(v)
            continue
        if v is best:
            verdict = "kept"
        elif v.sim.peak_memory_bytes > limit:
            verdict = f"over the memory budget ({fmt_bytes(v.sim.peak_memory_bytes)} > {fmt_bytes(limit)})"
        else:
            # an empty step (0 s) is as fast as any other empty one
            slower = v.sim.makespan_ns / best.sim.makespan_ns - 1 if best.sim.makespan_ns else 0.0
            verdict = f"slower than the kept one by {slower * 100:.2f} %"
        tried.append(
            Tried(v.label, len(v.graph.collectives), v.sim.makespan_s, v.sim.peak_memory_bytes, verdict, v.probe_s)
        )
    return best, tried
