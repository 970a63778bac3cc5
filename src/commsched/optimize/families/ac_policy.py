"""Activation checkpointing chosen per layer as a :func:`commsched.optimize` candidate (issue 38): the zoo step
retraced with each block under its own policy (``none``, ``selective-op`` or ``full``:
:mod:`commsched.workloads.ac`'s ``per-layer:`` spelling), costed by the same model and judged by the core within the
same memory budget as every other variant. Over the budget, it looks for the least recompute that fits; within it,
for less recompute than the step was traced with, if memory allows.

Pruning, never keeping. The plans considered put the heaviest policy on the earliest blocks (``full`` on blocks
``0 .. f-1``, ``selective-op`` on the next ``s``, ``none`` on the rest), as Megatron-LM's ``--recompute-method block``
recomputes the first layers of a stage: a checkpointed block's recompute runs after the later blocks' saved
activations are freed, so it adds least to the peak. Each plan gets an estimate from the step traced with every block
under one policy (per block: the compute the policy adds, the peak memory it saves, both from those traces' costs;
the peak never below the lowest uniform one), and only the plans on the estimate's Pareto frontier (no other plan
both faster and lower) are candidates, least recompute first. The simulator decides which fit: a candidate fits when
its probe (:data:`commsched.optimize.protocol.PROBE`) peaks within the budget. Assuming that a plan with more
recompute never peaks higher, the search finds the fastest-by-estimate plan that fits with a few probes: from the plan
the estimate says fits first, outward in steps 1, 2, 4, ..., then by bisection. The fitting candidates go to the
core's finals (fully scheduled unless their lower bound is above a step already found), with the fastest one also
bucketed like the best bucketed variant; the core keeps the fastest step within the budget (ties: less memory).

Less recompute is not always faster: the memory recompute frees lets the schedule prefetch more (llama3-8b FSDP over
8 ranks, 4 layers of 4096 tokens on h100-sxm, the budget at the no-AC step's peak: every block selective-op 77.6 ms,
no AC 82.8 ms). So the uniform plans with more recompute than that one (traced for the estimate: no new trace) are
probed too, unless their lower bound is above the best step so far.

Where it applies: a training step the zoo traced and nobody changed since. A step that recomputes nothing and fits
the budget is left alone where the best step so far leaves over 5 % of the budget unused (memory does not bind the
schedule), is within 2 % of the traced compute work (nothing left to hide), or is no slower than the traced program's
compute work, critical path or any group's communication (no plan has less: recompute keeps every collective and
adds compute).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from commsched.optimize.protocol import BucketedPlan, Candidate, Judge, Probed, State, Tried, Variant

name = "ac policy"
transform = True
LABEL = "ac per layer"
NONE, SELECTIVE, FULL = "none", "selective-op", "full"


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Per-block figures from the step traced under each uniform policy: ``added_s[p]`` the compute one block under
    policy ``p`` adds, ``saved_bytes[p]`` the peak memory it saves (both against ``none``); ``peak_none_bytes`` the
    step's peak with no recompute, ``floor_bytes`` the lowest uniform peak (no plan is estimated below it)."""

    added_s: dict[str, float]
    saved_bytes: dict[str, float]
    peak_none_bytes: int
    floor_bytes: int

    def of(self, full: int, selective: int) -> tuple[float, float]:
        """(compute added in s, peak in bytes) of the plan with ``full`` full and ``selective`` selective-op
        blocks."""
        added = full * self.added_s[FULL] + selective * self.added_s[SELECTIVE]
        saved = full * self.saved_bytes[FULL] + selective * self.saved_bytes[SELECTIVE]
        return added, max(self.peak_none_bytes - saved, self.floor_bytes)


@dataclasses.dataclass
class ACPlan:
    """A candidate's plan (``apply_fx`` gives the module to keep): the retraced step (``gm``, ``graph``) and the
    bucketing applied after it, if any. A copy is handed out: the traced module may be cached."""

    ac: str
    gm: Any
    graph: Any
    buckets: BucketedPlan | None = None

    def apply_fx(self, gm: Any, graph: Any) -> Any:
        from commsched.rewrites.fxutil import copy_graph_module

        if self.buckets is None:
            return copy_graph_module(self.gm, lazy=True)
        return self.buckets.module(self.gm, self.graph)


def plan_policies(layers: int, full: int, selective: int) -> tuple[str, ...]:
    """The blocks' policies of a plan: ``full`` on the first blocks, then ``selective`` selective-op, then none."""
    return (FULL,) * full + (SELECTIVE,) * selective + (NONE,) * (layers - full - selective)


def frontier(layers: int, est: Estimate) -> list[tuple[int, int]]:
    """The plans ``(full, selective)`` on the estimate's Pareto frontier, least compute added first: each has a lower
    estimated peak than every plan that adds less (ties: the fewer full blocks)."""
    plans = [(f, s) for f in range(layers + 1) for s in range(layers + 1 - f)]
    plans.sort(key=lambda fs: (*est.of(*fs), fs[0]))
    out, lowest = [], float("inf")
    for fs in plans:
        peak = est.of(*fs)[1]
        if peak < lowest:
            out.append(fs)
            lowest = peak
    return out


def first_fitting(count: int, start: int, fits: Any) -> int | None:
    """The smallest index ``k < count`` with ``fits(k)``, for ``fits`` monotone (False then True), asking it from
    ``start`` outward (1, 2, 4, ... steps) then by bisection; None when even the last does not fit."""
    start = min(max(start, 0), count - 1)
    if fits(start):
        hi, lo, step = start, -1, 1
        while hi - step >= 0:
            if not fits(hi - step):
                lo = hi - step
                break
            hi, step = hi - step, step * 2
    else:
        lo, hi, step = start, None, 1
        while hi is None:
            if lo == count - 1:
                return None
            k = min(lo + step, count - 1)
            if fits(k):
                hi = k
            else:
                lo, step = k, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def variants(state: State, judge: Judge) -> list:
    """The per-layer plans the module docstring's search probes, the uniform plans with more recompute where their
    lower bound can beat the best step, then the core's finals on those that fit; a ``Tried`` saying why where it
    does not apply."""
    from commsched.rewrites.split_batch import traced_spec
    from commsched.workloads.ac import layer_policies

    spec = traced_spec(state.gm)
    why = _why_not(spec, state)
    if why is not None:
        return [Tried(name, None, verdict=why)]
    layers = spec.model.n_layers
    traced_policies = layer_policies(spec.ac, layers)
    try:
        est = _estimate(state, spec)
    except Exception as exc:  # a step that cannot be retraced is a verdict, not a failed search
        return [Tried(name, None, verdict=f"failed: {exc}")]
    plans = [plan_policies(layers, *fs) for fs in frontier(layers, est)]
    figures = [est.of(*fs) for fs in frontier(layers, est)]
    limit, traced_fits = state.limit_bytes, _traced_fits(state)
    probes: dict[tuple, Probed | Tried] = {}

    def fits(policies: tuple, figure: tuple) -> bool:
        if policies == traced_policies:  # the traced program: judged already
            return traced_fits
        if policies not in probes:
            probes[policies] = _probe(state, judge, spec, policies, figure)
        p = probes[policies]
        return isinstance(p, Probed) and p.peak_bytes <= limit

    start = next((k for k, (_, peak) in enumerate(figures) if peak <= limit), len(plans) - 1)
    best = first_fitting(len(plans), start, lambda k: fits(plans[k], figures[k]))
    searched = len(probes)
    for policy in (SELECTIVE, FULL):  # traced for the estimate: more recompute can free memory for overlap
        uniform = (policy,) * layers
        if uniform not in probes and uniform != traced_policies and _may_win(state, spec, policy):
            fits(uniform, est.of(*((layers, 0) if policy == FULL else (0, layers))))
    out: list = [_summary(est, len(plans), searched, best, limit)]
    fitting = [p for p in probes.values() if isinstance(p, Probed) and p.peak_bytes <= limit]
    out += [p if isinstance(p, Tried) else _over_budget(p, limit) for p in probes.values()
            if not any(p is q for q in fitting)]  # fmt: skip
    if fitting:
        fastest = min(fitting, key=lambda p: (p.ns, p.index))
        fitting += _bucketed(state, judge, fastest)
    out += judge.finals({"all": fitting}, "the best fitting plan's", state.incumbent_ns())
    return out


def _why_not(spec: Any, state: State) -> str | None:
    """Why the family does not apply (a verdict), or None. A step that recomputes nothing and fits the budget can
    gain only where freed memory lets the schedule overlap more: not where the best step so far leaves more than
    :data:`UNUSED_SHARE` of the budget unused, or is within :data:`EXPOSED_SHARE` of the traced compute work."""
    from commsched.workloads.ac import layer_policies

    if spec is None:
        return "not applied: not a zoo step as traced (a policy retraces the step; other modules: not built)"
    if not spec.train:
        return f"not applied: a {spec.mode} step recomputes nothing (activation checkpointing is for training)"
    best = state.fastest()
    if set(layer_policies(spec.ac, spec.model.n_layers)) == {NONE} and _traced_fits(state) and best is not None:
        if best.sim.peak_memory_bytes < (1 - UNUSED_SHARE) * state.limit_bytes:
            return (f"not applied: the traced step recomputes nothing and the best step leaves "
                    f"{1 - best.sim.peak_memory_bytes / state.limit_bytes:.0%} of the budget unused (memory does "
                    "not bind: recompute would only add work)")  # fmt: skip
        bound = state.variants[0].sim.bound  # recompute keeps every collective and adds compute
        floor_s = max(bound.compute_s, bound.critical_path_s, *bound.comm_s.values())
        if floor_s >= best.sim.makespan_s:
            return (f"pruned: recompute keeps every collective and adds compute, so no plan's work, critical path or "
                    f"communication is below the traced program's {floor_s * 1e3:.3f} ms, no faster than the best "
                    f"step {best.sim.makespan_s * 1e3:.3f} ms")  # fmt: skip
        work_s = state.variants[0].sim.bound.compute_s  # the traced program's compute: more recompute adds to it
        if best.sim.makespan_s <= work_s * (1 + EXPOSED_SHARE):
            return (f"not applied: the traced step recomputes nothing and the best step, "
                    f"{best.sim.makespan_s * 1e3:.3f} ms, is within {EXPOSED_SHARE:.0%} of the traced compute work "
                    f"({work_s * 1e3:.3f} ms): recompute adds work, almost nothing is left to hide")  # fmt: skip
    return None


UNUSED_SHARE = 0.05
"""a step that recomputes nothing is not given recompute where the best step leaves this share of the budget unused"""
EXPOSED_SHARE = 0.02
"""... nor where the best step is within this share of the traced compute work (a pruning heuristic: recompute
can only win by hiding communication the best step still exposes)"""


def _may_win(state: State, spec: Any, policy: str) -> bool:
    """Whether the step with every block under ``policy`` (traced for the estimate) can beat the best step so far:
    its lower bound is not above it (:func:`commsched.optimize.protocol.bound_pruned`)."""
    from commsched.optimize.protocol import bound_ns, bound_pruned
    from commsched.sim import simulate_costs

    g = traced(dataclasses.replace(spec, ac=policy)).graph
    return bound_pruned(bound_ns(simulate_costs(g, state.cost(g))), state.incumbent_ns()) is None


def _traced_fits(state: State) -> bool:
    """Whether the traced program, scheduled (or as traced), fits the budget."""
    return any(isinstance(v, Variant) and v.sim.peak_memory_bytes <= state.limit_bytes for v in state.variants[:2])


def _estimate(state: State, spec: Any) -> Estimate:
    """The per-block figures of :class:`Estimate`, from the step traced under each uniform policy (costed by the
    search's cost function; compute: every node but the collectives; peak: the program order's simulation)."""
    from commsched.sim import simulate_costs

    layers = spec.model.n_layers
    compute_s, peak = {}, {}
    for policy in (NONE, SELECTIVE, FULL):
        if spec.ac == policy:  # the traced program itself
            g, costs = state.graph, state.costs
        else:
            g = traced(dataclasses.replace(spec, ac=policy)).graph
            costs = state.cost(g)
        collectives = set(g.collectives.tolist())
        compute_s[policy] = sum(float(t) for i, t in enumerate(costs.node_s) if i not in collectives)
        peak[policy] = simulate_costs(g, costs).peak_memory_bytes
    added = {p: (compute_s[p] - compute_s[NONE]) / layers for p in peak}
    saved = {p: (peak[NONE] - peak[p]) / layers for p in peak}
    return Estimate(added, saved, peak[NONE], min(peak.values()))


def _spelling(layers: int, policies: tuple[str, ...]) -> str:
    """The ``ac`` value of ``policies``: the uniform mode where every block has the same one."""
    from commsched.workloads.ac import per_layer_ac

    return policies[0] if len(set(policies)) == 1 else per_layer_ac(policies)


@functools.lru_cache(maxsize=8)
def traced(spec: Any) -> Any:
    """The zoo step ``spec`` traced (:func:`commsched.workloads.trace_spec`), the last few kept: the estimate's
    uniform programs are often candidates, and a search is often repeated on the same step (budgets, profiles)."""
    from commsched.workloads import trace_spec

    return trace_spec(spec)


def _label(policies: tuple[str, ...]) -> str:
    from commsched.workloads.ac import per_layer_ac

    return f"{LABEL} ({per_layer_ac(policies).partition(':')[2]})"


def _probe(state: State, judge: Judge, spec: Any, policies: tuple[str, ...], est: tuple) -> Probed | Tried:
    """The step retraced under ``policies``, probed by the core; its label gives the estimate it was chosen by."""
    added_s, peak_bytes = est
    ac = _spelling(len(policies), policies)
    label = f"{_label(policies)}, est. +{added_s * 1e3:.3f} ms compute, peak {peak_bytes / 2**20:.0f} MiB"
    try:
        w = traced(dataclasses.replace(spec, ac=ac))
    except Exception as exc:  # a plan that cannot be traced is a verdict
        return Tried(label, None, verdict=f"failed: {exc}")
    plan = ACPlan(ac, w.graph_module, w.graph)
    (probe,) = judge.probe([Candidate(label, plan, lambda: (w.graph, state.cost(w.graph)))])
    return probe


def _over_budget(p: Probed, limit: int) -> Tried:
    from commsched.report.units import fmt_bytes

    why = f"over the memory budget in the probe ({fmt_bytes(p.peak_bytes)} > {fmt_bytes(limit)})"
    return Tried(p.candidate.label, p.collectives, peak_memory_bytes=p.peak_bytes, verdict=why, probe_s=p.ns / 1e9)


def _bucketed(state: State, judge: Judge, p: Probed) -> list[Probed]:
    """The probe of ``p``'s program bucketed like the best bucketed variant so far (its configuration, planned on
    the program's own order); empty where there is none, it merges nothing, or its probe does not fit."""
    from commsched.rewrites import plan_buckets
    from commsched.rewrites.bucket_graph import bucket_graph, noncontiguous_inputs

    base = state.bucketing()
    if base is None:
        return []
    (config, cap_label), plan = base, p.candidate.plan
    buckets = plan_buckets(plan.graph, p.costs, None, hardware=state.hw, config=config)
    if not buckets.merged:
        return []
    g3 = bucket_graph(plan.graph, buckets, None, noncontiguous_inputs(plan.gm, plan.graph))
    label = f"bucketed ({cap_label}, planned on traced order) + {p.candidate.label}"
    bplan = dataclasses.replace(plan, buckets=BucketedPlan(buckets))
    (probe,) = judge.probe([Candidate(label, bplan, lambda: (g3, state.cost(g3)))])
    return [probe] if isinstance(probe, Probed) and probe.peak_bytes <= state.limit_bytes else []


def _summary(est: Estimate, plans: int, probed: int, best: int | None, limit: int) -> Tried:
    """One line on the search: the per-block estimate, the frontier, how many plans the simulator probed."""
    per_block = ", ".join(f"{p} +{est.added_s[p] * 1e3:.3f} ms / -{est.saved_bytes[p] / 2**20:.1f} MiB"
                          for p in (SELECTIVE, FULL))  # fmt: skip
    found = "none fits" if best is None else f"the least recompute that fits is plan {best + 1}"
    verdict = (f"searched: {plans} plans on the estimate's frontier (per block: {per_block}), {probed} probed, "
               f"{found} (budget {limit / 2**20:.0f} MiB); the others not probed (more recompute: no higher "
               "peak); uniform plans probed where their lower bound can win")  # fmt: skip
    return Tried(f"{name} (search)", None, verdict=verdict)
