"""Split programs as :func:`commsched.optimize` candidates (issue 18): the zoo step retraced as two micro-batches
(:mod:`commsched.rewrites.split_batch`) and with its sequences in 2, then 4 chunks
(:mod:`commsched.rewrites.split_sequence`), costed by the same model, scheduled by the same ``overlap`` search (with
the search's knobs) in two program orders, the micro-batches / chunks interleaved node by node and as traced (the
list scheduler's priorities start from the program order), and judged by the simulator within the same memory
budget as every other variant; the fastest split is then also bucketed like the fastest bucketed variant.

Where they apply: a module the zoo traced and nobody changed since; the batch split where the batch is at least 2,
the sequence split for a prefill and for a training step with TP or EP. Elsewhere the report says why it was not
tried. A program whose lower bound (the simulator's, in its own costs) is no faster than the best variant found so
far is not scheduled (its verdict gives both). Its label gives the simulator's lower bound of the split program next
to the traced program's (the bound is what a split can move and reordering cannot).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from commsched.cost import CostEstimate
from commsched.ir import Graph
from commsched.sim import simulate_costs

LABEL = "split batch"
SEQUENCE_LABEL = "split sequence"
SEQUENCE_CHUNKS = (2, 4)
"""the chunk counts a step's sequences are tried in, in order, more only while fewer won (the simulator picks)"""


@dataclasses.dataclass
class SplitBatchPlan:
    """The split program of one zoo step (a plan kind of the search: ``apply_fx`` gives the module to keep), and
    the bucket plan applied after it, if any (``buckets``: (plan, the order it was planned on) on ``graph``, the
    split module's IR)."""

    gm: Any
    buckets: tuple | None = None
    graph: Graph | None = None

    def apply_fx(self, gm: Any, graph: Graph) -> Any:
        """The split module (built once; ``gm`` / ``graph``, the traced step, are what it was made from)."""
        if self.buckets is None:
            return self.gm
        from commsched.rewrites import apply_bucket_plan

        return apply_bucket_plan(self.gm, self.graph, *self.buckets, recompile=False).gm


def split_batch_variants(
    gm: Any, g: Graph, hw: Any, cost: Callable[[Graph], CostEstimate], knobs: dict, variants: list
) -> list:
    """The split programs of ``gm`` (IR ``g``): two micro-batches where the batch has >= 2 sequences, and the
    sequences as :data:`SEQUENCE_CHUNKS` chunks; each built, costed with ``cost`` and scheduled with ``knobs`` (a
    search ``_Variant`` whose ``plan`` is a :class:`SplitBatchPlan`), or a ``Tried`` saying why it was not tried or
    failed; then the fastest of them bucketed like the fastest bucketed variant (:func:`_bucketed_split`, on
    ``hw``). ``variants``: the search's so far (the first is the traced program, whose bound the label quotes)."""
    from commsched.optimize.search import Tried
    from commsched.rewrites.split_batch import micro_batch_sizes, split_zoo_step, traced_spec, why_not_split

    spec = traced_spec(gm)
    if spec is None:
        why = "not a zoo step as traced (a split retraces the step; other modules: not built)"
        return [Tried(LABEL, None, verdict=f"not applied: {why}")]
    why = why_not_split(spec)
    if why is not None:
        out = [Tried(LABEL, None, verdict=f"not applied: {why}")]
    else:
        label = f"{LABEL} ({' + '.join(map(str, micro_batch_sizes(spec.batch)))} sequences"
        build = lambda: split_zoo_step(spec, interleave=False).gm  # noqa: E731
        out = _split_variants(label, "one after the other", build, g, cost, knobs, variants)
    out += _sequence_splits(spec, g, cost, knobs, variants + out)
    return out + _bucketed_split(hw, cost, knobs, variants + out)


def _bucketed_split(hw: Any, cost: Callable, knobs: dict, variants: list) -> list:
    """The fastest split variant within the budget, bucketed by the plan of the fastest bucketed variant (its
    configuration, planned on the split program's own order) and scheduled: the chunks' collectives of one kind
    merge as the traced program's did (llama3-8b TP training: its all_reduces). Empty where either is missing,
    a ``Tried`` where the plan merges nothing or the bound shows it cannot win."""
    from commsched.optimize.reuse_gathers import _bucketing_of
    from commsched.optimize.search import Tried, _incumbent_ns, _scheduled, _Variant, bound_ns, bound_pruned
    from commsched.rewrites import plan_buckets
    from commsched.rewrites.bucket_graph import bucket_graph, noncontiguous_inputs

    limit = knobs["memory_budget"].bytes
    splits = [v for v in variants if isinstance(v, _Variant) and isinstance(v.plan, SplitBatchPlan)
              and v.sim.peak_memory_bytes <= limit]  # fmt: skip
    base = _bucketing_of(variants, knobs)
    if not splits or base is None:
        return []
    best = min(splits, key=lambda v: v.sim.makespan_ns)
    (config, cap_label), g2 = base, best.graph
    label = f"bucketed ({cap_label}, planned on traced order) + {best.label}"
    plan = plan_buckets(g2, best.costs, None, hardware=hw, config=config)
    if not plan.merged:
        return [Tried(label, None, verdict="no merge")]
    g3 = bucket_graph(g2, plan, None, noncontiguous_inputs(best.plan.gm, g2))
    c3 = cost(g3)
    why = bound_pruned(bound_ns(simulate_costs(g3, c3)), _incumbent_ns(variants, knobs))
    if why is not None:
        return [Tried(label, len(g3.collectives), verdict=why)]
    return [_scheduled(label, g3, c3, knobs, SplitBatchPlan(best.plan.gm, (plan, None), g2))]


def _sequence_splits(spec: Any, g: Graph, cost: Callable, knobs: dict, variants: list) -> list:
    """The step's sequences as 2, then 4, ... chunks (:data:`SEQUENCE_CHUNKS`), more only while fewer won; none
    where :func:`unmoved_bound_s` shows that no split can beat the best variant so far."""
    from commsched.optimize.search import Tried
    from commsched.rewrites.split_sequence import split_zoo_sequence, why_not_split_sequence

    why = why_not_split_sequence(spec)
    best_s = _best_so_far(variants, knobs)
    traced = next((v for v in variants if not isinstance(v, Tried)), None)
    if why is None and best_s is not None and traced is not None:
        floor_s = unmoved_bound_s(traced.sim.bound, moved_groups(spec))
        if floor_s >= best_s:
            why = (f"pruned: it moves only the TP / EP groups' collectives, and the traced program's other bound "
                   f"terms (compute, other groups) are {floor_s * 1e3:.3f} ms, no faster than the best variant's "
                   f"{best_s * 1e3:.3f} ms")  # fmt: skip
    if why is not None or not SEQUENCE_CHUNKS:
        verdict = why if (why or "").startswith("pruned") else f"not applied: {why or 'no chunk count to try'}"
        return [Tried(SEQUENCE_LABEL, None, verdict=verdict)]
    out: list = []
    for j, k in enumerate(SEQUENCE_CHUNKS):
        label = f"{SEQUENCE_LABEL} ({k} chunks of {spec.seq_len // k} positions"
        why = why_not_split_sequence(spec, k)
        if why is not None:
            out.append(Tried(label + ")", None, verdict=f"not applied: {why}"))
            continue
        before_s = _best_so_far(variants + out, knobs)
        out += _split_variants(label, "layer by layer", lambda k=k: split_zoo_sequence(spec, k).gm, g, cost, knobs,
                               variants + out)  # fmt: skip
        after_s = _best_so_far(variants + out, knobs)
        if before_s is not None and (after_s is None or after_s >= before_s):  # more chunks: more launches, latency
            out += [Tried(f"{SEQUENCE_LABEL} ({m} chunks)", None, verdict=f"not tried: {k} chunks did not win")
                    for m in SEQUENCE_CHUNKS[j + 1 :]]  # fmt: skip
            break
    return out


def moved_groups(spec: Any) -> set[str]:
    """The names of the zoo step ``spec``'s TP and EP process groups, as its trace names them."""
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.trace import TRACED_RANK

    with fake_process_group(spec.plan.world_size, rank=TRACED_RANK):
        groups = create_groups(spec.plan, TRACED_RANK)
        return {groups[dim].group_name for dim in ("tp", "ep") if dim in groups}


def unmoved_bound_s(bound: Any, moved: set[str]) -> float:
    """What a split of a step's sequences leaves in place, from the traced program's ``bound`` (a
    :class:`commsched.sim.bounds.LowerBound`): its compute stream's work and the terms of every group but
    ``moved`` (the TP and EP groups, whose collectives the split repeats per chunk). A heuristic that prunes, never
    one that keeps: a split's compute can be a little less in the cost model (a chunk's causal attention fills
    fewer waves: llama3-8b TP+SP prefill, 1.337 -> 1.322 ms), and on llama3-70b FSDP+TP at 512 ranks the split
    dropped one FSDP re-gather (its own bound 142.0 ms, this one 148.3 ms; both above the best variant's step)."""
    terms = [bound.compute_s]
    for per_group in (bound.comm_s, bound.comm_heads_tails_s or {}, bound.exposed_comm_s or {}):
        terms += [v for name, v in per_group.items() if name not in moved]
    return max(terms)


def _split_variants(
    label: str, traced_how: str, build: Callable[[], Any], g: Graph, cost: Callable, knobs: dict, variants: list
) -> list:
    """One split program (``build()``: its module in the traced order, ``traced_how``) in two orders, the
    micro-batches (chunks) interleaved node by node and as traced, each pruned by its lower bound or scheduled."""
    from commsched.frontends.fx import from_fx
    from commsched.optimize.search import Tried, _scheduled, _Variant
    from commsched.rewrites.split_batch import interleave_micro_batches

    try:
        gm_t = build()
        g_t = from_fx(gm_t, group_sizes=g.group_sizes(), meta=g.meta)
        gm_i = interleave_micro_batches(gm_t, g_t)
        programs = {"interleaved": (gm_i, from_fx(gm_i, group_sizes=g.group_sizes(), meta=g.meta)),
                    traced_how: (gm_t, g_t)}  # fmt: skip
    except Exception as exc:  # a transform that cannot be built is a verdict, not a failed search
        return [Tried(label.split(" (")[0], None, verdict=f"failed: {exc}")]
    suffix = ", collectives reordered" if knobs.get("reorder_collectives") else ""
    traced = next((v for v in variants if isinstance(v, _Variant)), None)
    best_s = _best_so_far(variants, knobs)
    out = []
    for how, (gm2, g2) in programs.items():
        name = f"{label}, {how}{suffix})"
        c2 = cost(g2)
        bound_s = simulate_costs(g2, c2).lower_bound_s
        if best_s is not None and bound_s >= best_s:  # no schedule of it can win: not scheduled
            why = (f"pruned: its lower bound {bound_s * 1e3:.3f} ms is no faster than the best variant's "
                   f"{best_s * 1e3:.3f} ms")  # fmt: skip
            out.append(Tried(name, len(g2.collectives), verdict=why))
            continue
        v = _scheduled(name, g2, c2, knobs, SplitBatchPlan(gm2))
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
