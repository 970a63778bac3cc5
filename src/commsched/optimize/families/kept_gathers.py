"""Gathered parameters kept for the backward as :func:`commsched.optimize` candidates (FSDP's
``reshard_after_forward=False`` per layer; :mod:`commsched.rewrites.reuse_gathers`).

Each candidate drops the re-gathers of the first ``j`` runs in program order (the backward's: the last layer's
first, whose gathered parameters wait the least), for ``j`` = 1, 2, 4, ... and all of them. Each one keeps more
gathered memory and issues fewer all_gathers; the simulator decides whether the step gains within the budget.
Every candidate's IR is made directly (:func:`commsched.rewrites.reuse_gathers.reuse_graph`; the FX module is
rewritten for the kept one only), costed like every other variant, and judged by the same one-attempt probe twice:
unbucketed, and bucketed by the plan of the best bucketed variant so far (its configuration, planned on the
candidate's own program order). A form whose lower bound is above the best step so far is not probed; the count
stops growing once the probed forms of a candidate all exceed the budget (more kept parameters only hold more
memory). The core's finals follow (the ``finalists`` fastest probes fully scheduled unless their lower bound is above
a step already found), then the bucketing family's search on the fastest candidate's program.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from commsched.ir import Graph
from commsched.optimize import protocol
from commsched.optimize.protocol import BUCKETING, BucketedPlan, Candidate, Judge, Probed, State, Tried, Variant

name = "kept gathers"
transform = True
LABEL = "gathers kept for the backward"


@dataclasses.dataclass
class ReusePlan:
    """One candidate's plan (``apply_fx`` gives the module to keep): the re-gathers it drops, the IR of the program
    without them, and the bucketing applied after, if any. The FX module is rewritten for the kept candidate only."""

    dropped: tuple
    graph: Graph
    buckets: BucketedPlan | None = None

    def apply_fx(self, gm: Any, graph: Graph) -> Any:
        from commsched.rewrites.reuse_gathers import reuse_gathers

        out = reuse_gathers(gm, [r.backward for r in self.dropped], recompile=False).gm
        if self.buckets is None:
            return out
        from commsched.rewrites import apply_bucket_plan

        b = self.buckets
        return apply_bucket_plan(out, self.graph, b.plan, b.order, recompile=False, copy=False).gm


def counts(runs: int) -> list[int]:
    """1, 2, 4, ... below ``runs``, then ``runs``."""
    out, j = [], 1
    while j < runs:
        out.append(j)
        j *= 2
    return [*out, runs] if runs else []


def variants(state: State, judge: Judge) -> list:
    """The candidates of the traced module, judged as the module docstring says: variants (``plan``: a
    :class:`ReusePlan`) and verdicts. Empty when the module gathers nothing twice."""
    from commsched.rewrites.reuse_gathers import find_regathers
    from commsched.sim import simulate_costs

    runs = find_regathers(state.gm)
    if not runs:
        return []
    base = state.bucketing()
    incumbent = state.incumbent_ns()
    out: list = []
    probed: list[Probed] = []
    for j in counts(len(runs)):
        dropped = tuple(r for run in runs[:j] for r in run)
        label = f"{LABEL} ({j} of {len(runs)} runs, {len(dropped)} all_gathers fewer)"
        try:
            candidates = _candidates(state, dropped, label, base)
        except Exception as exc:  # a candidate that cannot be built is a verdict, not a failed search
            out.append(Tried(label, None, verdict=f"failed: {exc}"))
            break
        fits, probes = False, 0
        for lab, g2, c2, plan in candidates:
            why = protocol.bound_pruned(protocol.bound_ns(simulate_costs(g2, c2)), incumbent)
            if why is not None:  # no order of it can win
                out.append(Tried(lab, len(g2.collectives), verdict=why))
                continue
            probes += 1
            (probe,) = judge.probe([Candidate(lab, plan, lambda g2=g2, c2=c2: (g2, c2))])
            if isinstance(probe, Tried):
                out.append(probe)
                continue
            fits = fits or probe.peak_bytes <= state.limit_bytes
            probed.append(probe)
        if probes and not fits:  # more kept gathers only hold more memory (all pruned: fewer gathers may win)
            break
    out += judge.finals({"all": probed}, "the best such candidate's", incumbent)
    return out + _rebucketed(state, judge, [*state.variants, *out])


def _rebucketed(state: State, judge: Judge, variants: list) -> list:
    """The bucketing family's search (planned on the program's order and on its probe's schedule) on the program
    of the fastest candidate within the budget, its variants labelled and planned as candidates; empty when no
    candidate fits. Only the granularities whose plans got the full search on the traced program are tried (a few
    all_gathers fewer seldom change which caps pay; on the 5.5k-node FSDP step the other caps cost 1.5 s)."""
    from commsched.optimize.protocol import PROBE, schedule_variant

    mine = [v for v in variants[len(state.variants):] if isinstance(v, Variant)
            and v.sim.peak_memory_bytes <= state.limit_bytes]  # fmt: skip
    if not mine:
        return []
    best = min(mine, key=lambda v: v.sim.makespan_ns).plan
    g2 = best.graph
    c2 = state.cost(g2)
    probe = schedule_variant("", g2, c2, {**state.knobs, **PROBE})
    order = probe.schedule.order if isinstance(probe, Variant) else None
    label = next(v.label for v in mine if v.plan is best).split(" + ")[-1].split(", collectives")[0]
    searched = [v.label for v in variants if isinstance(v, Variant) and v.family == BUCKETING]
    finals = {lab.split("(", 1)[1].split(", planned on")[0] for lab in searched if lab.startswith("bucketed (")}
    granularities = state.granularities
    caps = tuple(gr for gr in granularities if gr[0] in finals) or granularities
    # the candidate bucketed like the best bucketed variant (_candidates) is one of these plans: judged already
    ours = f" + {label}"
    done = {v.label.partition(", collectives")[0].removesuffix(ours) for v in variants if v.label.endswith(ours)
            or v.label.partition(", collectives")[0].endswith(ours)}  # fmt: skip
    out = judge.bucketed(g2, c2, order, 1, caps, variants, done)
    for v in out:
        head, sep, rest = v.label.partition(", collectives")
        v.label = f"{head}{ours}{sep}{rest}"
        if isinstance(v, Variant):
            v.plan = ReusePlan(best.dropped, g2, v.plan)
        elif v.verdict.startswith("the same plan as: "):  # a plan of this program, not of the traced one
            v.verdict += ours
    return out


def _candidates(state: State, dropped: tuple, label: str, base: tuple | None) -> list[tuple]:
    """(label, IR, costs, plan) of the rewritten program (its IR made directly, :func:`reuse_graph`), and of it
    bucketed like ``base`` (a bucket config and its label), where that merges anything."""
    from commsched.rewrites import plan_buckets
    from commsched.rewrites.bucket_graph import bucket_graph, noncontiguous_inputs
    from commsched.rewrites.reuse_gathers import reuse_graph

    g2 = reuse_graph(state.graph, dropped)
    c2 = state.cost(g2)
    out = [(label, g2, c2, ReusePlan(dropped, g2))]
    if base is not None:
        config, cap_label = base
        plan = plan_buckets(g2, c2, None, hardware=state.hw, config=config)
        if plan.merged:
            g3 = bucket_graph(g2, plan, None, noncontiguous_inputs(state.gm, state.graph))
            lab = f"bucketed ({cap_label}, planned on traced order) + {label}"
            out.append((lab, g3, state.cost(g3), ReusePlan(dropped, g2, BucketedPlan(plan))))
    return out
