"""Program transforms as :func:`commsched.optimize` candidates (issue 18): programs that differ from the traced one
by more than bucketing, each judged by the simulator like every other variant.

Today one transform: decomposed TP collectives (:mod:`commsched.rewrites.decompose_tp`, async TP with functional
collectives). Its plans are a few global choices over the step's TP sites: ``k`` chunks in :data:`CHUNKS`, the
reduce side split along ``m`` (rows) or ``n`` (columns), every site or only one side (the all_gathers, or the
reduce_scatters / all_reduces). Each plan is applied to the FX module, re-imported, costed by the same cost model
(smaller GEMMs at their lower shape efficiency, one launch per kernel, each collective's latency, the copies that
reassemble chunks) and judged by the same one-attempt probe as bucket plans; the ``finalists`` fastest get the full
``overlap`` search. A plan the simulator finds slower loses with its numbers in ``Optimized.tried``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from commsched.cost import CostEstimate
from commsched.ir import Graph
from commsched.rewrites.decompose_tp import TPSite, TPSplit, decompose_tp, find_tp_sites

CHUNKS = (2, 4)
"""chunk counts tried: more chunks hide more of each transfer but pay a launch, a collective's latency and a less
efficient GEMM per chunk (the cost model charges each)"""
_SIDES = {"every site": ("ag_mm", "mm_rs", "mm_ar"), "all_gathers": ("ag_mm",), "reductions": ("mm_rs", "mm_ar")}
_NAMES = {"ag_mm": "all_gather->mm", "mm_rs": "mm->reduce_scatter", "mm_ar": "mm->all_reduce"}


@dataclasses.dataclass
class TransformPlan:
    """One candidate program transform: a label, the splits it makes and (once built) the rewritten module."""

    label: str
    splits: tuple[TPSplit, ...]
    sites: tuple[TPSite, ...]
    _gm: Any = None

    def where(self) -> str:
        """The sites it splits, by pattern: e.g. ``4 all_gather->mm, 4 mm->reduce_scatter``."""
        counts: dict[str, int] = {}
        for s in self.sites:
            counts[s.pattern] = counts.get(s.pattern, 0) + 1
        return ", ".join(f"{n} {_NAMES[p]}" for p, n in counts.items())

    def apply_fx(self, gm: Any, graph: Graph) -> Any:
        """The transformed copy of ``gm`` (``graph``: its IR), built once."""
        if self._gm is None:
            self._gm = decompose_tp(gm, self.splits, graph=graph).gm
        return self._gm


def tp_plans(gm: Any, sites: list[TPSite] | None = None) -> list[TransformPlan]:
    """The decomposed-TP plans of ``gm`` (module docstring), distinct split sets only, in a fixed order."""
    sites = find_tp_sites(gm) if sites is None else sites
    plans: list[TransformPlan] = []
    seen: set[tuple[TPSplit, ...]] = set()
    for k in CHUNKS:
        for dim in ("n", "m"):
            for side, patterns in _SIDES.items():
                if side != "every site" and k != CHUNKS[0]:  # one side alone: the fewest chunks only
                    continue
                chosen = []
                for s in sites:
                    d = "m" if s.pattern == "ag_mm" else dim
                    if s.pattern in patterns and s.can_split(d, k):
                        chosen.append((s, TPSplit(s.collective, d, k)))
                key = tuple(sp for _, sp in chosen)
                if not key or key in seen:
                    continue
                seen.add(key)
                label = f"decomposed TP (k={k}, reductions split along {dim}, {side})"
                plans.append(TransformPlan(label, key, tuple(s for s, _ in chosen)))
    return plans


def transform_variants(
    gm: Any, g: Graph, cost: Callable[[Graph], CostEstimate], knobs: dict, finalists: int = 2
) -> list:
    """Every transform plan of ``gm`` (IR ``g``) built, re-imported, costed with ``cost`` and probed; the
    ``finalists`` fastest scheduled with ``knobs`` (the search's ``_Variant``, ``plan``: the
    :class:`TransformPlan`), the rest a ``Tried`` with the probe's verdict. Empty when ``gm`` has no TP site."""
    from commsched.frontends.fx import from_fx
    from commsched.optimize.search import PROBE, Tried, _scheduled, _Variant

    probed: list[tuple[int, TransformPlan, Graph, CostEstimate]] = []
    out: list = []
    for plan in tp_plans(gm):
        label = f"{plan.label}: {plan.where()}"
        try:
            g2 = from_fx(plan.apply_fx(gm, g), group_sizes=g.group_sizes(), meta=g.meta)
        except Exception as exc:  # a plan that cannot be built is a verdict, not a failed search
            out.append(Tried(label, None, verdict=f"failed: {exc}"))
            continue
        c2 = cost(g2)
        probe = _scheduled(label, g2, c2, {**knobs, **PROBE}, plan)
        if isinstance(probe, Tried):
            out.append(probe)
            continue
        probed.append((probe.sim.makespan_ns, plan, g2, c2))
    probed.sort(key=lambda q: q[0])
    suffix = ", collectives reordered" if knobs.get("reorder_collectives") else ""
    for k, (ns, plan, g2, c2) in enumerate(probed):
        label = f"{plan.label}: {plan.where()}"
        if k < finalists:
            full = _scheduled(label + suffix, g2, c2, knobs, plan)
            if isinstance(full, _Variant):
                full.probe_s = ns / 1e9
            out.append(full)
        else:
            why = f"pruned: probe {ns / probed[0][0] - 1:.1%} slower than the best transform plan's"
            out.append(Tried(label, len(g2.collectives), verdict=why, probe_s=ns / 1e9))
    return out
