"""The fastest split program bucketed: the split families' best variant (:mod:`.split_batch`, :mod:`.split_sequence`)
with its collectives merged by the configuration of the fastest bucketed variant (planned on the split program's
own order), so that the chunks' collectives of one kind merge as the traced program's did (llama3-8b TP training:
its all_reduces)."""

from __future__ import annotations

from commsched.optimize.protocol import BucketedPlan, Judge, ModulePlan, State, Tried, bound_ns, bound_pruned
from commsched.sim import simulate_costs

name = "bucketed split"
transform = True
SPLITS = ("split batch", "split sequence")
"""the families whose variants it buckets"""


def variants(state: State, judge: Judge) -> list:
    """The bucketed form of the fastest split within the budget; empty where no split or no bucketed variant fits,
    a ``Tried`` where the plan merges nothing or its lower bound shows it cannot win."""
    from commsched.rewrites import plan_buckets
    from commsched.rewrites.bucket_graph import bucket_graph, noncontiguous_inputs

    splits = [state.fastest(family=f) for f in SPLITS]
    base = state.bucketing()
    splits = [v for v in splits if v is not None]
    if not splits or base is None:
        return []
    best = min(splits, key=lambda v: v.sim.makespan_ns)
    (config, cap_label), g2 = base, best.graph
    label = f"bucketed ({cap_label}, planned on traced order) + {best.label}"
    plan = plan_buckets(g2, best.costs, None, hardware=state.hw, config=config)
    if not plan.merged:
        return [Tried(label, None, verdict="no merge")]
    g3 = bucket_graph(g2, plan, None, noncontiguous_inputs(best.plan.gm, g2))
    c3 = state.cost(g3)
    why = bound_pruned(bound_ns(simulate_costs(g3, c3)), state.incumbent_ns())
    if why is not None:
        return [Tried(label, len(g3.collectives), verdict=why)]
    return [judge.scheduled(label, g3, c3, ModulePlan(best.plan.gm, BucketedPlan(plan), g2))]
