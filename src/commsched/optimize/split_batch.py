"""Split-batch overlap as an :func:`commsched.optimize` candidate (issue 18): the zoo step retraced as two
micro-batches (:mod:`commsched.rewrites.split_batch`), costed by the same model, scheduled by the same ``overlap``
search (with the search's knobs) in two program orders, the micro-batches interleaved node by node and one after
the other (the list scheduler's priorities start from the program order), and judged by the simulator within the
same memory budget as every other variant.

Where it applies: a module the zoo traced and nobody changed since, whose batch is at least 2. Elsewhere the
report says why it was not tried. Its label gives the micro-batches and the simulator's lower bound of the split
program next to the traced program's (the bound is what a split can move and reordering cannot).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from commsched.cost import CostEstimate
from commsched.ir import Graph

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
    out = []
    for how, (gm2, g2) in programs.items():
        label = f"{LABEL} ({' + '.join(map(str, sizes))} sequences, {how}{suffix})"
        v = _scheduled(label, g2, cost(g2), knobs, SplitBatchPlan(gm2, sizes))
        if isinstance(v, _Variant) and traced is not None:
            v.label += (f"; lower bound {v.sim.lower_bound_s * 1e3:.3f} ms, traced program's "
                        f"{traced.sim.lower_bound_s * 1e3:.3f} ms")  # fmt: skip
        out.append(v)
    return out
