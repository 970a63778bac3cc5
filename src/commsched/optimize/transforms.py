"""Program transforms as :func:`commsched.optimize` candidates (issue 18): programs that differ from the traced one
by more than bucketing, each judged by the simulator like every other variant.

Today one transform: decomposed TP collectives (:mod:`commsched.rewrites.decompose_tp`, async TP with functional
collectives). Its plans are a few global choices over the step's TP sites: ``k`` chunks in :data:`CHUNKS`, the
reduce side split along ``m`` (rows) or ``n`` (columns), every site or only one side (the all_gathers, or the
reduce_scatters / all_reduces). Each plan is applied on the IR (:mod:`commsched.rewrites.decompose_graph`: the graph
the FX rewrite re-imports as, node for node, about 10x cheaper than rewriting and importing the module), costed by
the same cost model (smaller GEMMs at their lower shape efficiency, one launch per kernel, each collective's latency,
the copies that reassemble chunks) and judged by the same one-attempt probe as bucket plans; the ``finalists``
fastest get the full ``overlap`` search. A plan the simulator finds slower loses with its numbers in
``Optimized.tried``. Only the kept plan is rewritten in FX (:meth:`TransformPlan.apply_fx`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from commsched.cost import CostEstimate
from commsched.ir import Graph
from commsched.rewrites.decompose_graph import FxFacts, Unsupported, decompose_graph, fx_facts
from commsched.rewrites.decompose_tp import TPSite, TPSplit, decompose_tp, find_tp_sites

CHUNKS = (2, 4)
"""chunk counts tried: more chunks hide more of each transfer but pay a launch, a collective's latency and a less
efficient GEMM per chunk (the cost model charges each)"""
_SIDES = {"every site": ("ag_mm", "mm_rs", "mm_ar"), "all_gathers": ("ag_mm",), "reductions": ("mm_rs", "mm_ar")}
_NAMES = {"ag_mm": "all_gather->mm", "mm_rs": "mm->reduce_scatter", "mm_ar": "mm->all_reduce"}


@dataclasses.dataclass
class TransformPlan:
    """One candidate program transform: a label, the splits it makes and (once built) the rewritten module.

    ``base``: the search's bucketed variant it is made on when that is not the traced step (the label names its
    bucket plan), ``base_graph`` that program's IR; ``shape``: (chunks, dim of the reductions, side) it was made
    from."""

    label: str
    splits: tuple[TPSplit, ...]
    sites: tuple[TPSite, ...]
    shape: tuple[int, str, str] = (0, "", "")
    base: Any = None
    base_graph: Graph | None = None
    _gm: Any = None

    def where(self) -> str:
        """The sites it splits, by pattern: e.g. ``4 all_gather->mm, 4 mm->reduce_scatter``."""
        counts: dict[str, int] = {}
        for s in self.sites:
            counts[s.pattern] = counts.get(s.pattern, 0) + 1
        return ", ".join(f"{n} {_NAMES[p]}" for p, n in counts.items())

    def apply_fx(self, gm: Any, graph: Graph) -> Any:
        """The transformed program as a module, built once, its code not compiled (``runtime.apply_schedule``
        recompiles the kept one): a copy of ``gm`` (``graph``: its IR) split, or, made on a bucketed variant, that
        variant's FX rewrite split in place (it is built for this; the variant's module is dropped)."""
        if self._gm is None:
            if self.base is None:
                self._gm = decompose_tp(gm, self.splits, graph=graph, recompile=False).gm
            else:
                from commsched.optimize.search import bucketed_module

                src = bucketed_module(gm, graph, self.base)
                self.base.module = None  # split in place below: no longer the bucketed program
                self._gm = decompose_tp(src, self.splits, graph=self.base_graph, recompile=False, copy=False).gm
        return self._gm


def _plan(sites: list[TPSite], k: int, dim: str, side: str) -> TransformPlan | None:
    chosen = []
    for s in sites:
        d = "m" if s.pattern == "ag_mm" else dim
        if s.pattern in _SIDES[side] and s.can_split(d, k):
            chosen.append((s, TPSplit(s.collective, d, k)))
    if not chosen:
        return None
    label = f"decomposed TP (k={k}, reductions split along {dim}, {side})"
    return TransformPlan(label, tuple(sp for _, sp in chosen), tuple(s for s, _ in chosen), (k, dim, side))


def tp_plans(gm: Any, sites: list[TPSite] | None = None) -> list[TransformPlan]:
    """The decomposed-TP plans of ``gm`` (module docstring), distinct split sets only, in a fixed order."""
    sites = find_tp_sites(gm) if sites is None else sites
    plans: list[TransformPlan] = []
    seen: set[tuple[TPSplit, ...]] = set()
    for k in CHUNKS:
        for dim in ("n", "m"):
            for side in _SIDES:
                if side != "every site" and k != CHUNKS[0]:  # one side alone: the fewest chunks only
                    continue
                plan = _plan(sites, k, dim, side)
                if plan is not None and plan.splits not in seen:
                    seen.add(plan.splits)
                    plans.append(plan)
    return plans


def transform_variants(
    gm: Any, g: Graph, cost: Callable[[Graph], CostEstimate], knobs: dict, finalists: int = 2, variants: list = ()
) -> list:
    """Every transform plan of ``gm`` (IR ``g``) built, re-imported, costed with ``cost`` and probed; the
    ``finalists`` fastest scheduled with ``knobs`` (the search's ``_Variant``, ``plan``: the
    :class:`TransformPlan`), the rest a ``Tried`` with the probe's verdict. When ``variants`` (the search's so far)
    hold a bucketed program within the budget, the best probe's plan is also made on the fastest one's FX rewrite
    and scheduled: bucketing and splitting compose. Empty when ``gm`` has no TP site."""
    from commsched.optimize.search import PROBE, Tried, _scheduled, _Variant

    sites = find_tp_sites(gm)
    if not sites:
        return []
    facts = fx_facts(gm, sites)
    suffix = ", collectives reordered" if knobs.get("reorder_collectives") else ""
    pruned = _bound_prune(g, cost(g), sites, variants, knobs)
    if pruned is not None:  # no plan on the traced program can win; on the best bucketed one it still may
        out = [Tried("decomposed TP on the traced program", None, verdict=pruned)]
        base = _best_bucketed(variants, knobs)
        if base is not None:
            if hasattr(base, "rebuild"):  # judged on an executor (optimize/parallel.py): its graph is built here
                base = base.rebuild()
            why = _bound_prune(base.graph, base.costs, sites, variants, knobs)
            if why is None:
                return out + _on_bucketed(gm, g, base, tp_plans(gm, sites)[:1], (cost, sites, facts), knobs, suffix)
            out.append(Tried(f"{base.label.split(', collectives')[0]} + decomposed TP", None, verdict=why))
        return out
    probed: list[tuple[int, TransformPlan, Graph, CostEstimate]] = []
    out: list = []
    for plan in tp_plans(gm, sites):
        built = _build(plan, gm, g, cost, facts)
        if isinstance(built, Tried):
            out.append(built)
            continue
        probe = _scheduled(_label(plan), *built, {**knobs, **PROBE}, plan)
        if isinstance(probe, Tried):
            out.append(probe)
            continue
        probed.append((probe.sim.makespan_ns, plan, *built))
    probed.sort(key=lambda q: q[0])
    for k, (ns, plan, g2, c2) in enumerate(probed):
        if k < finalists:
            full = _scheduled(_label(plan) + suffix, g2, c2, knobs, plan)
            if isinstance(full, _Variant):
                full.probe_s = ns / 1e9
            out.append(full)
        else:
            why = f"pruned: probe {ns / probed[0][0] - 1:.1%} slower than the best transform plan's"
            out.append(Tried(_label(plan), len(g2.collectives), verdict=why, probe_s=ns / 1e9))
    base = _best_bucketed(variants, knobs)
    if base is not None and probed:
        out += _on_bucketed(gm, g, base, [probed[0][1]], (cost, sites, facts), knobs, suffix)
    return out


def _bound_prune(g: Graph, costs: CostEstimate, sites: list[TPSite], variants, knobs) -> str | None:
    """Why no plan made on program ``g`` can win, or None. A split never makes a node cheaper (smaller GEMMs run
    less efficiently, chunks re-read their weights, each chunk's collective pays its latency), so a transformed
    program's lower bound is at least the bound of ``g`` with every collective it splits free (the sites' names that
    ``g`` still holds); when that is no faster than the best variant so far within the budget, no plan can win and
    none is built (on a 5.7k-node FSDP+TP step the plans cost more than the rest of the search)."""
    import dataclasses

    import numpy as np

    from commsched.optimize.search import _Variant
    from commsched.sim import simulate_costs

    limit = knobs["memory_budget"].bytes if knobs.get("memory_budget") is not None else None
    best = min((v.sim.makespan_s for v in variants if isinstance(v, _Variant)
                and (limit is None or v.sim.peak_memory_bytes <= limit)), default=None)  # fmt: skip
    if best is None:
        return None
    index = {name: i for i, name in enumerate(g.names)}
    free = np.asarray([index[s.collective] for s in sites if s.collective in index], dtype=np.int64)
    node_s, latency_s = costs.node_s.copy(), costs.coll_latency_s.copy()
    node_s[free], latency_s[free] = 0.0, 0.0
    bound_s = simulate_costs(g, dataclasses.replace(costs, node_s=node_s, coll_latency_s=latency_s)).lower_bound_s
    if bound_s < best:
        return None
    return (f"pruned: with its {len(free)} split collectives free the step's lower bound is {bound_s * 1e3:.2f} ms, "
            f"no faster than the best variant's {best * 1e3:.2f} ms")  # fmt: skip


def _label(plan: TransformPlan) -> str:
    return f"{plan.label}: {plan.where()}"


def _build(plan: TransformPlan, gm: Any, g: Graph, cost: Callable[[Graph], CostEstimate], facts: FxFacts):
    """(IR, costs) of the plan's program (made on ``g``, or on ``plan.base_graph``), or a ``Tried`` saying why it
    could not be built. The IR is built directly (:func:`decompose_graph`, the graph the FX rewrite imports as);
    where that cannot promise the same graph, the FX module is rewritten and imported."""
    from commsched.frontends.fx import from_fx
    from commsched.optimize.search import Tried, bucketed_module

    src_graph = g if plan.base is None else plan.base_graph
    try:
        g2 = decompose_graph(src_graph, plan.splits, plan.sites, facts)
    except Unsupported:
        try:
            src = gm if plan.base is None else bucketed_module(gm, g, plan.base)
            plan._gm = decompose_tp(src, plan.splits, graph=src_graph, recompile=False).gm
            g2 = from_fx(plan._gm, group_sizes=g.group_sizes(), meta=g.meta)
        except Exception as exc:  # a plan that cannot be built is a verdict, not a failed search
            return Tried(_label(plan), None, verdict=f"failed: {exc}")
    except Exception as exc:
        return Tried(_label(plan), None, verdict=f"failed: {exc}")
    return g2, cost(g2)


def _best_bucketed(variants: list, knobs: dict) -> Any:
    from commsched.optimize.search import _Variant

    limit = knobs["memory_budget"].bytes if knobs.get("memory_budget") is not None else None
    fits = [v for v in variants if isinstance(v, _Variant) and isinstance(v.plan, tuple)
            and (limit is None or v.sim.peak_memory_bytes <= limit)]  # fmt: skip
    return min(fits, key=lambda v: v.sim.makespan_ns, default=None)


def _on_bucketed(gm: Any, g: Graph, base: Any, plans: list[TransformPlan], costing: tuple, knobs: dict,
                 suffix: str) -> list:  # fmt: skip
    """``plans``' shapes made on the bucketed program of variant ``base`` and fully scheduled. ``costing``: (the
    cost function, the traced step's sites, their :func:`fx_facts`). The bucketed program's sites are the traced
    ones whose collective it kept (bucketing leaves the others' matmuls and readers as they are); its FX rewrite is
    built only for the kept variant (:meth:`TransformPlan.apply_fx`)."""
    from commsched.optimize.search import _scheduled
    from commsched.rewrites.bucket_graph import bucket_graph, noncontiguous_inputs

    cost, sites, facts = costing
    # its IR: the variant's own graph, unless judged on a worker (then the same bucket_graph, built here)
    g_b = base.graph if isinstance(base.graph, Graph) else bucket_graph(g, *base.plan, noncontiguous_inputs(gm, g))
    kept = [s for s in sites if s.collective in g_b.index]
    out = []
    for p in plans:
        plan = _plan(kept, *p.shape)
        if plan is None:
            continue
        plan.label = f"{base.label.split(', collectives')[0]} + {plan.label}"
        plan.base, plan.base_graph = base, g_b
        built = _build(plan, gm, g, cost, facts)
        out.append(built if not isinstance(built, tuple) else _scheduled(_label(plan) + suffix, *built, knobs, plan))
    return out
