"""Split-batch overlap as an :func:`commsched.optimize` candidate (issue 18): the zoo step retraced as two
micro-batches (:mod:`commsched.rewrites.split_batch`), costed by the same model, scheduled by the same ``overlap``
search (with the search's knobs) in two program orders, the micro-batches interleaved node by node and one after
the other (the list scheduler's priorities start from the program order), and judged by the simulator within the
same memory budget as every other variant.

Where it applies: a module the zoo traced and nobody changed since, whose batch is at least 2. Elsewhere the
report says why it was not tried. A program whose lower bound (the simulator's, in its own costs) is no faster
than the best variant found so far is not scheduled (its verdict gives both). Its label gives the micro-batches
and the simulator's lower bound of the split program next to the traced program's (the bound is what a split can
move and reordering cannot).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from commsched.cost import CostEstimate
from commsched.ir import Graph
from commsched.sim import simulate_costs

LABEL = "split batch"


@dataclasses.dataclass
class SplitBatchPlan:
    """The split program of one zoo step (a plan kind of the search: ``apply_fx`` gives the module to keep)."""

    gm: Any
    sizes: tuple[int, ...]

    def apply_fx(self, gm: Any, graph: Graph) -> Any:
        """The split module (built once; ``gm`` / ``graph``, the traced step, are what it was made from)."""
        return self.gm


def split_batch_variants(gm: Any, g: Graph, cost: Callable[[Graph], CostEstimate], knobs: dict, variants: list) -> list:
    """The split program of ``gm`` (IR ``g``) built, costed with ``cost`` and scheduled with ``knobs`` (a search
    ``_Variant`` whose ``plan`` is a :class:`SplitBatchPlan`), or a ``Tried`` saying why it was not tried or
    failed. ``variants``: the search's so far (the first is the traced program, whose bound the label quotes)."""
    from commsched.frontends.fx import from_fx
    from commsched.optimize.search import Tried, _scheduled, _Variant
    from commsched.rewrites.split_batch import interleave_micro_batches, split_zoo_step, traced_spec, why_not_split

    spec = traced_spec(gm)
    if spec is None:
        why = "not a zoo step as traced (the split retraces the step at a smaller batch; other modules: not built)"
        return [Tried(LABEL, None, verdict=f"not applied: {why}")]
    why = why_not_split(spec)
    if why is not None:
        return [Tried(LABEL, None, verdict=f"not applied: {why}")]
    try:
        res = split_zoo_step(spec, interleave=False)
        sequential = from_fx(res.gm, group_sizes=g.group_sizes(), meta=g.meta)
        gm_i = interleave_micro_batches(res.gm, sequential)
        programs = {"interleaved": (gm_i, from_fx(gm_i, group_sizes=g.group_sizes(), meta=g.meta)),
                    "one after the other": (res.gm, sequential)}  # fmt: skip
    except Exception as exc:  # a transform that cannot be built is a verdict, not a failed search
        return [Tried(LABEL, None, verdict=f"failed: {exc}")]
    sizes = res.extra["split"].sizes
    suffix = ", collectives reordered" if knobs.get("reorder_collectives") else ""
    traced = next((v for v in variants if isinstance(v, _Variant)), None)
    best_s = _best_so_far(variants, knobs)
    out = []
    for how, (gm2, g2) in programs.items():
        label = f"{LABEL} ({' + '.join(map(str, sizes))} sequences, {how}{suffix})"
        c2 = cost(g2)
        bound_s = simulate_costs(g2, c2).lower_bound_s
        if best_s is not None and bound_s >= best_s:  # no schedule of it can win: not scheduled
            why = (f"pruned: its lower bound {bound_s * 1e3:.3f} ms is no faster than the best variant's "
                   f"{best_s * 1e3:.3f} ms")  # fmt: skip
            out.append(Tried(label, len(g2.collectives), verdict=why))
            continue
        v = _scheduled(label, g2, c2, knobs, SplitBatchPlan(gm2, sizes))
        if isinstance(v, _Variant) and traced is not None:
            v.label += (f"; lower bound {v.sim.lower_bound_s * 1e3:.3f} ms, traced program's "
                        f"{traced.sim.lower_bound_s * 1e3:.3f} ms")  # fmt: skip
        out.append(v)
    return out


def _best_so_far(variants: list, knobs: dict) -> float | None:
    """The fastest step (s) among the search's variants within the budget, or None."""
    from commsched.optimize.search import _Variant

    limit = knobs["memory_budget"].bytes if knobs.get("memory_budget") is not None else None
    fits = [v.sim.makespan_s for v in variants if isinstance(v, _Variant)
            and (limit is None or v.sim.peak_memory_bytes <= limit)]  # fmt: skip
    return min(fits, default=None)
