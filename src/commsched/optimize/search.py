"""The search behind :func:`commsched.optimize`: program variants, each scheduled and simulated alike.

Variants: the traced program in its traced order; the traced program scheduled by ``overlap``; and, when a
GraphModule is given, its collectives bucketed by the bucket planner at several granularities (:data:`GRANULARITIES`:
caps at fractions of the asymptotic bus bandwidth, fixed sizes, and "structural" plans without the planner's
early-use rule, as torch's FSDP pre-bucketing makes them), planned on the traced order and on the scheduled one.
Identical plans are tried once. Each plan is applied on the IR (:func:`commsched.rewrites.bucket_graph.bucket_graph`,
node for node the graph the FX rewrite gives, about 10x cheaper than rewriting and re-importing the module) and
judged by one guarded list-scheduling attempt (:data:`PROBE`); per order the plans were made on, the ``finalists``
fastest get the full ``overlap`` search (with collective reordering when asked), the rest are pruned with the probe's
time as their verdict. (The probe keeps the planned order's priorities, so it compares plans made on one order
well and plans made on different orders badly: under a tight budget on llama3-70b FSDP+TP at 1024 ranks the winner's
probe was 26 % behind the best probe, which was made on the other order.) Only the
kept plan is applied to the FX module, and the kept schedule orders it by node name.

Every variant is costed by the same model on the same hardware and simulated by the same simulator; the memory budget
is absolute (a multiple of the traced program's peak), so a bucketed program cannot win by spending memory.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commsched.cost import CostEstimate, MeasuredTable, estimate_costs, load_measured
from commsched.hardware import for_graph
from commsched.ir import Graph
from commsched.passes import MemoryBudget, Schedule, ScheduleError, schedule
from commsched.sim import SimResult, simulate_costs

GRANULARITIES = (
    ("cap 0.9", {"saturation": 0.9}),
    ("cap 0.99", {"saturation": 0.99}),
    ("cap 0.999", {"saturation": 0.999}),
    ("cap 256 MiB", {"cap_bytes": 256 << 20}),
    ("cap 1 GiB", {"cap_bytes": 1 << 30}),
    ("structural, cap 64 MiB", {"cap_bytes": 64 << 20, "early_use": False}),
    ("structural, cap 256 MiB", {"cap_bytes": 256 << 20, "early_use": False}),
    ("structural, cap 1 GiB", {"cap_bytes": 1 << 30, "early_use": False}),
)
"""bucket caps tried: where a collective reaches this fraction of its asymptotic bus bandwidth, or a fixed size
(nccl-tests bytes; a few buckets per step, as torch's FSDP pre-bucketing makes them). Bigger: fewer, larger
collectives, less overlap, more memory; the simulator decides."""
PROBE = {"variants": (("input", True),), "max_peak_repairs": 0, "budget_retries": 0, "reorder_collectives": False}
"""the first judgement of every bucket plan: one list-scheduling attempt that keeps the planned order's priorities
under the future-aware memory guard (it nearly always fits), about a fifth of the full search. Simulating the plan
in the order it was planned on instead misjudges plans that only pay off once rescheduled (e.g. llama3-70b FSDP+TP
at 512 ranks under torch's peak: it pruned the plan that wins by 2.5 %)"""


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
    probe_s: float | None = None
    """a bucket plan's step time after the one-attempt probe (:data:`PROBE`) that ranks plans for the full search"""

    def __str__(self) -> str:
        """One line in human units, naming only what was measured: ``label: verdict (34 collectives, step ...)``."""
        from commsched.report.units import fmt_bytes, fmt_seconds

        figures = (
            (self.collectives, lambda n: f"{n} collectives"),
            (self.probe_s, lambda t: f"probe {fmt_seconds(t)}"),
            (self.makespan_s, lambda t: f"step {fmt_seconds(t)}"),
            (self.peak_memory_bytes, lambda b: f"peak {fmt_bytes(b)}"),
        )
        shown = ", ".join(show(v) for v, show in figures if v is not None)
        return f"{self.label}: {self.verdict}" + (f" ({shown})" if shown else "")


@dataclass
class _Variant:
    label: str
    graph: Graph
    costs: CostEstimate
    schedule: Schedule
    sim: SimResult
    plan: Any = None  # (BucketPlan, the order it was planned on) of a bucketed variant
    probe_s: float | None = None
    module: Any = None  # a bucketed variant's FX rewrite once built (lazy, not yet ordered): see bucketed_module


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
    program transforms (decomposed TP collectives, :mod:`commsched.optimize.transforms`). Never worse than the traced
    order; see the module docstring for the search. ``executor`` (:mod:`commsched.execute`): judge the bucket
    plans on its workers (:mod:`commsched.optimize.parallel`; the same result); ``granularities``: the bucket caps
    tried (default :data:`GRANULARITIES`)."""
    t0 = time.perf_counter()
    with _collector_paused():
        out = _optimize(program, hardware, num_nodes, gpus_per_node, memory_budget, reorder_collectives, group_sizes,
                        finalists, table, transforms, executor, granularities)  # fmt: skip
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
              finalists, table, transforms, executor=None, granularities=GRANULARITIES) -> Optimized:  # fmt: skip
    gm, g = _import(program, group_sizes)
    hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    if isinstance(table, (str, os.PathLike)):
        table = load_measured(table)
    cost = functools.partial(estimate_costs, hardware=hw, table=table)  # every variant is costed alike
    costs = cost(g)
    before = simulate_costs(g, costs)
    limit = MemoryBudget.parse(memory_budget).limit_bytes(before.peak_memory_bytes)
    knobs = {"reorder_collectives": reorder_collectives, "memory_budget": MemoryBudget(bytes=limit)}
    traced = _Variant("traced order", g, costs, Schedule(g, np.arange(len(g), dtype=np.int32)), before)
    variants: list[_Variant | Tried] = [traced, _scheduled("traced program, scheduled", g, costs, knobs)]
    if gm is not None:
        scheduled = variants[1] if isinstance(variants[1], _Variant) else traced
        args = (gm, g, hw, (costs, cost), knobs, scheduled.schedule.order, finalists, granularities, list(variants))
        if executor is None:
            variants += _bucketed(*args)
        else:  # the same search, its candidates judged on the executor's workers
            from commsched.optimize import parallel

            variants += parallel.bucketed(*args, executor=executor, table=table)
        if transforms:  # program transforms (issue 18): candidates like any other, see optimize/transforms.py
            from commsched.optimize.transforms import transform_variants

            variants += transform_variants(gm, g, cost, knobs, finalists, variants)
            from commsched.optimize.split_batch import split_batch_variants  # two micro-batches (issue 18)

            variants += split_batch_variants(gm, g, hw, cost, knobs, variants)
            from commsched.optimize.reuse_gathers import reuse_variants  # FSDP gathers kept for the backward

            variants += reuse_variants(gm, g, hw, cost, knobs, variants, finalists, granularities)
    best, tried = _judge(variants, limit)
    best = best.rebuild() if hasattr(best, "rebuild") else best  # a finalist judged on a worker, built here
    out_gm = None
    if gm is not None:
        best, returned = _kept_as_returned(cost, variants, best, limit, tried)
        out_gm = _final_module(gm, g, best)
        best = returned
    return Optimized(best.label, best.graph, best.schedule, best.costs, before, best.sim, limit, tried, out_gm)


def _as_returned(cost: Callable[[Graph], CostEstimate], best: _Variant) -> _Variant:
    """The kept variant as the returned module is: its graph in its schedule's order (the graph ``from_fx`` gives of
    the returned module, without importing it again: ``tests/rewrites/test_as_returned.py``), costed and simulated
    in that order. The cost model's fusion depends on program order (Inductor fuses neighbours), so this can differ
    from the judged variant by a few microseconds; the reported step is the one of the module the user gets."""
    from commsched.ir.transform import permute_nodes
    from commsched.runtime.apply import module_order

    g2 = permute_nodes(best.graph, module_order(best.graph, best.schedule.order))
    c2 = cost(g2)
    order = np.arange(len(g2), dtype=np.int32)
    return _Variant(best.label, g2, c2, Schedule(g2, order), simulate_costs(g2, c2, order), best.plan, best.probe_s)


AS_RETURNED_TRIES = 3
"""at most this many variants are judged as returned (:func:`_kept_as_returned`)"""


def _kept_as_returned(
    cost: Callable[[Graph], CostEstimate], variants: list, best: _Variant, limit: int, tried: list[Tried]
) -> tuple[_Variant, _Variant]:
    """The variant to keep and its :func:`_as_returned` form. A variant whose order interleaves what the program
    order kept apart (a split program's chunks) can lose fusion as returned; when the kept one's returned step is
    slower than the next variant's judged step, that one is judged as returned too (up to
    :data:`AS_RETURNED_TRIES`, fastest judged first), and the fastest returned within ``limit`` is kept; the
    verdicts in ``tried`` say so."""
    fits = sorted((v for v in variants if isinstance(v, _Variant) and v.sim.peak_memory_bytes <= limit),
                  key=lambda v: (v.sim.makespan_ns, v.sim.peak_memory_bytes))  # fmt: skip
    chosen = (best, _as_returned(cost, best), best)  # (variant, as returned, as listed in variants)
    returned_s = {best.label: chosen[1].sim.makespan_s}
    for v in [v for v in fits if v.label != best.label][: AS_RETURNED_TRIES - 1]:
        if chosen[1].sim.makespan_ns <= v.sim.makespan_ns:
            break
        built = v.rebuild() if hasattr(v, "rebuild") else v
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


def _final_module(gm: Any, g: Graph, best: _Variant) -> Any:
    """The kept program as a GraphModule in its schedule's order: the FX rewrite of its bucket plan (node names
    as on the IR, see :mod:`commsched.rewrites.bucket_graph`), reordered by name. A lazy module (torch's
    ``_LazyGraphModule``): its Python code is generated when it is first run or read, not here (torch's own
    scheduling passes leave the code to their caller too; on a 5k-node step it is a quarter of a second)."""
    from commsched.rewrites.fxutil import copy_graph_module
    from commsched.runtime.apply import apply_schedule

    if best.plan is None:
        out = copy_graph_module(gm, lazy=True)
    elif hasattr(best.plan, "apply_fx"):  # a program transform (optimize/transforms.py)
        out = best.plan.apply_fx(gm, g)
    else:
        out = bucketed_module(gm, g, best)
    return apply_schedule(out, best.schedule)


def bucketed_module(gm: Any, g: Graph, variant: _Variant) -> Any:
    """The FX rewrite of a bucketed variant's plan (``gm``: the traced module, ``g`` its IR), built once per
    variant: program transforms build on it and the final module reorders it (a lazy module, see
    :func:`commsched.rewrites.fxutil.copy_graph_module`; rewrite a copy of it, or reorder it once, for the kept
    variant)."""
    from commsched.rewrites import apply_bucket_plan

    if variant.module is None:
        plan, order = variant.plan
        variant.module = apply_bucket_plan(gm, g, plan, order, recompile=False).gm
    return variant.module


def _import(program: Any, group_sizes: dict[str, int] | None) -> tuple[Any, Graph]:
    if isinstance(program, Graph):
        return None, program
    from commsched.frontends.fx import from_fx

    return program, from_fx(program, group_sizes=group_sizes)


def _scheduled(label: str, g: Graph, costs: CostEstimate, knobs: dict, plan: Any = None) -> _Variant | Tried:
    """``g`` scheduled by ``overlap`` and simulated; a failure (e.g. no order within the budget) is a verdict."""
    try:
        s = schedule(g, costs, "default", **knobs)
    except ScheduleError:  # its own traced order is over the budget and no schedule brings it under
        return Tried(label, len(g.collectives), verdict="over the memory budget (no order fits)")
    except Exception as exc:  # one variant that cannot be scheduled must not sink the search
        return Tried(label, len(g.collectives), verdict=f"failed: {exc}")
    return _Variant(label, g, costs, s, simulate_costs(g, costs, s.order), plan)


PLANNED_ON = ("traced order", "scheduled order")


def _plans(g: Graph, hw: Any, costs: CostEstimate, scheduled_order: np.ndarray, granularities: tuple = GRANULARITIES):
    """Every bucket plan the search considers: (label, plan, the order it was planned on, that order's name)."""
    from commsched.rewrites import BucketConfig, plan_buckets

    for plan_on, order in zip(PLANNED_ON, (None, scheduled_order), strict=True):
        for cap_label, cap in granularities:
            # the planner's own overlap estimate ("exposes" refusals) is left out: the simulator judges each plan,
            # and with it the plans differed by about one collective and 0.05 % on the benchmark steps
            label = f"bucketed ({cap_label}, planned on {plan_on})"
            cfg = BucketConfig(overlap_aware=False, **cap)
            yield label, plan_buckets(g, costs, order, hardware=hw, config=cfg), order, plan_on


def _bucketed(
    gm: Any, g: Graph, hw: Any, costing: tuple, knobs: dict, scheduled_order, finalists: int,
    granularities: tuple = GRANULARITIES, prior: list | tuple = (), done: Collection[str] = (),
) -> list:  # fmt: skip
    """Every distinct bucket plan applied on the IR (:func:`bucket_graph`, the graph the FX rewrite gives) and
    judged by one guarded list-scheduling attempt (:data:`PROBE`); per order the plans were made on, the
    ``finalists`` fastest get the full ``overlap`` search (with ``knobs``) unless their lower bound is above a step
    already found (``prior``: the variants judged before), the others keep the probe's verdict. ``costing``: (the
    costs of ``g``, the function that costs a bucketed graph alike). ``done``: labels of plans the caller has
    already judged on this same program (left out here, so that no variant is listed twice)."""
    from commsched.rewrites.bucket_graph import bucket_graph, noncontiguous_inputs

    noncontig = noncontiguous_inputs(gm, g)
    out: list[_Variant | Tried] = []
    seen: dict[tuple, str] = {}
    probed: dict[str, list[tuple]] = {name: [] for name in PLANNED_ON}
    costs, cost = costing
    for label, plan, order, plan_on in _plans(g, hw, costs, scheduled_order, granularities):
        key = tuple(b.members for b in plan.buckets if b.merged)
        if key and label in done:
            seen.setdefault(key, label)
            continue
        if not key or key in seen:
            out.append(Tried(label, None, verdict="no merge" if not key else f"the same plan as: {seen[key]}"))
            continue
        seen[key] = label
        g2 = bucket_graph(g, plan, order, noncontig)
        c2 = cost(g2)
        probe = _scheduled(label, g2, c2, {**knobs, **PROBE}, (plan, order))
        if isinstance(probe, Tried):  # no order within the budget even for the probe
            out.append(probe)
            continue
        probed[plan_on].append((probe.sim.makespan_ns, len(seen) - 1, label, g2, c2, (plan, order), probe.sim))
    return out + _finals(probed, knobs, finalists, _incumbent_ns(prior, knobs))


def _incumbent_ns(variants: list, knobs: dict) -> int:
    """The fastest step among ``variants`` within the memory budget (the search's best so far)."""
    limit = knobs["memory_budget"].bytes
    steps = [v.sim.makespan_ns for v in variants if isinstance(v, _Variant) and v.sim.peak_memory_bytes <= limit]
    return min(steps, default=2**62)


def bound_ns(sim: SimResult) -> int:
    """The simulator's lower bound of ``sim``'s program in ns (any order of it: :mod:`commsched.sim.bounds`)."""
    return round(sim.lower_bound_s * 1e9)


def bound_pruned(bound: int, best_ns: int) -> str | None:
    """The verdict of a finalist that cannot win: its program's lower bound is above the best step already found
    (strictly: a tie could still win on memory); None when it must be searched."""
    if bound <= best_ns:
        return None
    return (
        f"pruned: its lower bound {bound / 1e6:.3f} ms is above the best step found before it ({best_ns / 1e6:.3f} ms)"
    )


def final_order(probed: dict[str, list], finalists: int, bound_of: Callable[[tuple], int]) -> tuple[list, list]:
    """Each order's probed plans ranked by probe (ties: the earlier candidate), and the ``finalists`` best of each
    order in the order their full searches run: the lowest lower bound (``bound_of``) first, so that a finalist
    whose bound is above a step already found is pruned (:func:`bound_pruned`; the same verdicts on every
    backend)."""
    ranked = [sorted(family, key=lambda q: q[:2]) for family in probed.values()]
    chosen = [q for family in ranked for q in family[:finalists]]
    return ranked, sorted(chosen, key=lambda q: (bound_of(q), q[1]))


def judge_finals(chosen: list, best_ns: int, limit: int, bound_of: Callable, run: Callable, pruned: Callable) -> dict:
    """The verdict of each finalist of ``chosen`` (in that order), by candidate index: ``pruned(q, why)`` where its
    lower bound (``bound_of(q)``) is above the fastest step within ``limit`` bytes found so far (``best_ns``, then
    each full search's), else ``run(q)``: (its variant or verdict, (step ns, peak bytes) or None). One rule for the
    serial search and the executors'."""
    judged: dict[int, Any] = {}
    for q in chosen:
        why = bound_pruned(bound_of(q), best_ns)
        if why is not None:
            judged[q[1]] = pruned(q, why)
            continue
        judged[q[1]], figures = run(q)
        if figures is not None and figures[1] <= limit:
            best_ns = min(best_ns, figures[0])
    return judged


def _finals(probed: dict[str, list], knobs: dict, finalists: int, best_ns: int,
            rival: str = "the best plan's made on the same order") -> list:  # fmt: skip
    """The full ``overlap`` search (with ``knobs``) for each order's ``finalists`` best probes that can still win,
    and the probe's verdict for the others (slower than ``rival``); in candidate order per order planned on."""
    suffix = ", collectives reordered" if knobs["reorder_collectives"] else ""

    def run(q: tuple) -> tuple:
        ns, _, label, g2, c2, plan, _ = q
        full = _scheduled(label + suffix, g2, c2, knobs, plan)
        full.probe_s = ns / 1e9
        return full, (full.sim.makespan_ns, full.sim.peak_memory_bytes) if isinstance(full, _Variant) else None

    def pruned(q: tuple, why: str) -> Tried:
        return Tried(q[2], len(q[3].collectives), verdict=why, probe_s=q[0] / 1e9)

    def bound_of(q: tuple) -> int:
        return bound_ns(q[6])

    ranked, chosen = final_order(probed, finalists, bound_of)
    judged = judge_finals(chosen, best_ns, knobs["memory_budget"].bytes, bound_of, run, pruned)
    out: list[_Variant | Tried] = []
    for family in ranked:
        for k, (ns, index, label, g2, *_rest) in enumerate(family):
            if k < finalists:
                out.append(judged[index])
            else:
                why = f"pruned: probe {ns / family[0][0] - 1:.1%} slower than {rival}"
                out.append(Tried(label, len(g2.collectives), verdict=why, probe_s=ns / 1e9))
    return out


def _judge(variants: list, limit: int, best: _Variant | None = None) -> tuple[_Variant, list[Tried]]:
    """The fastest variant within ``limit`` bytes (ties: less memory, then the earlier, simpler one), or ``best``
    where given, and a verdict for every variant."""
    from commsched.report.units import fmt_bytes

    fits = [v for v in variants if isinstance(v, _Variant) and v.sim.peak_memory_bytes <= limit]
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
            verdict = f"slower than the kept one by {(v.sim.makespan_s / best.sim.makespan_s - 1) * 100:.2f} %"
        tried.append(
            Tried(v.label, len(v.graph.collectives), v.sim.makespan_s, v.sim.peak_memory_bytes, verdict, v.probe_s)
        )
    return best, tried
