"""The core's judging of what the families propose (:class:`commsched.optimize.protocol.Judge`), here in this process.

Every candidate is built and probed (:data:`commsched.optimize.protocol.PROBE`); per group, the ``finalists`` fastest
probes (ties: the earlier candidate) get the full ``overlap`` search, the lowest lower bound first, so that a
finalist whose bound is above a step within the budget already found is pruned without it; the others keep the
probe's verdict. :mod:`commsched.optimize.parallel` runs the same rules on an executor's workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from commsched.cost import CostEstimate
from commsched.ir import Graph
from commsched.optimize import protocol
from commsched.optimize.protocol import NO_INCUMBENT_NS, PROBE, Candidate, ModulePlan, Probed, State, Tried, Variant
from commsched.sim import simulate_costs


def final_order(probed: dict[str, list[Probed]], finalists: int) -> tuple[list, list]:
    """Each group's probes ranked by probe (ties: the earlier candidate), and the ``finalists`` best of each group
    in the order their full searches run: the lowest lower bound first, so that a finalist whose bound is above a
    step already found is pruned (:func:`bound_pruned`; the same verdicts on every executor)."""
    ranked = [sorted(group, key=lambda q: (q.ns, q.index)) for group in probed.values()]
    chosen = [q for group in ranked for q in group[:finalists]]
    return ranked, sorted(chosen, key=lambda q: (q.bound_ns, q.index))


def judge_finals(chosen: list[Probed], best_ns: int, limit: int, run: Callable, pruned: Callable) -> dict:
    """The verdict of each finalist of ``chosen`` (in that order), by candidate index: ``pruned(q, why)`` where its
    lower bound is above the fastest step within ``limit`` bytes found so far (``best_ns``, then each full
    search's), else ``run(q)``: (its variant or verdict, (step ns, peak bytes) or None). One rule for every
    executor."""
    judged: dict[int, Any] = {}
    for q in chosen:
        why = protocol.bound_pruned(q.bound_ns, best_ns)
        if why is not None:
            judged[q.index] = pruned(q, why)
            continue
        judged[q.index], figures = run(q)
        if figures is not None and figures[1] <= limit:
            best_ns = min(best_ns, figures[0])
    return judged


def figures(v: Variant | Tried) -> tuple[int, int] | None:
    """(step ns, peak bytes) of a variant, None for a verdict."""
    return (v.sim.makespan_ns, v.sim.peak_memory_bytes) if isinstance(v, Variant) else None


class SerialJudge:
    """:class:`commsched.optimize.protocol.Judge` in this process, for the search of ``state``."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._probed = 0  # candidates probed so far: their index breaks ties (the earlier wins)

    def scheduled(self, label: str, g: Graph, costs: CostEstimate, plan: Any = None) -> Variant | Tried:
        return protocol.schedule_variant(label, g, costs, self.state.knobs, plan)

    def probe(self, candidates: list[Candidate]) -> list[Probed | Tried]:
        return [self._probe_here(c, self._next_index()) for c in candidates]

    def _next_index(self) -> int:
        self._probed += 1
        return self._probed - 1

    def _probe_here(self, c: Candidate, index: int) -> Probed | Tried:
        try:
            g2, c2 = c.build()
        except Exception as exc:  # a candidate that cannot be built is a verdict, not a failed search
            return Tried(c.label, None, verdict=f"failed: {exc}")
        v = protocol.schedule_variant(c.label, g2, c2, {**self.state.knobs, **PROBE}, c.plan)
        if isinstance(v, Tried):  # no order within the budget even for the probe
            return v
        bound = protocol.bound_ns(v.sim)
        return Probed(v.sim.makespan_ns, index, c, len(g2.collectives), bound, v.sim.peak_memory_bytes, g2, c2)

    def finals(self, probed: dict[str, list[Probed]], rival: str, best_ns: int = NO_INCUMBENT_NS,
               finalists: int | None = None) -> list:  # fmt: skip
        finalists = self.state.finalists if finalists is None else finalists
        ranked, chosen = final_order(probed, finalists)
        self._prepare_finals(chosen, best_ns)
        judged = judge_finals(chosen, best_ns, self.state.limit_bytes, self._run_final, self._pruned)
        out: list[Variant | Tried] = []
        for group in ranked:
            for k, q in enumerate(group):
                if k < finalists:
                    out.append(judged[q.index])
                else:
                    why = f"pruned: probe {q.ns / group[0].ns - 1:.1%} slower than {rival}"
                    out.append(Tried(q.candidate.label, q.collectives, verdict=why, probe_s=q.ns / 1e9))
        return out

    def _prepare_finals(self, chosen: list[Probed], best_ns: int) -> None:
        """Before the finals are judged in order: nothing here (an executor starts their full searches at once)."""

    def _run_final(self, q: Probed) -> tuple:
        full = self.scheduled(q.candidate.label + self.state.suffix, q.graph, q.costs, q.candidate.plan)
        full.probe_s = q.ns / 1e9
        return full, figures(full)

    @staticmethod
    def _pruned(q: Probed, why: str) -> Tried:
        return Tried(q.candidate.label, q.collectives, verdict=why, probe_s=q.ns / 1e9)

    def bucketed(self, graph: Graph, costs: CostEstimate, order: Any, finalists: int, caps: tuple,
                 prior: list, done: Any = ()) -> list:  # fmt: skip
        from commsched.optimize.families import bucketing

        return bucketing.bucketed_variants(self.state, self, graph, costs, order, finalists, caps, prior, done)

    def retraced(self, label: str, traced_how: str, build: Callable[[], Any], prior: list) -> list:
        """A program retraced as its own module (``build()``: the module in its traced order, ``traced_how``) in two
        program orders, its parts interleaved node by node and as traced (the list scheduler's priorities start from
        the program order); each pruned where its lower bound is no faster than the best variant so far, else fully
        scheduled (``plan``: a :class:`ModulePlan`), its label giving its lower bound next to the traced program's.
        ``prior``: the variants judged before it (the traced program first)."""
        from commsched.frontends.fx import from_fx
        from commsched.rewrites.split_batch import interleave_micro_batches

        g = self.state.graph
        try:
            gm_t = build()
            g_t = from_fx(gm_t, group_sizes=g.group_sizes(), meta=g.meta)
            gm_i = interleave_micro_batches(gm_t, g_t)
            programs = {"interleaved": (gm_i, from_fx(gm_i, group_sizes=g.group_sizes(), meta=g.meta)),
                        traced_how: (gm_t, g_t)}  # fmt: skip
        except Exception as exc:  # a transform that cannot be built is a verdict, not a failed search
            return [Tried(label.split(" (")[0], None, verdict=f"failed: {exc}")]
        traced = next((v for v in prior if isinstance(v, Variant)), None)
        best = self.state.fastest(prior)
        out = []
        for how, (gm2, g2) in programs.items():
            name = f"{label}, {how}{self.state.suffix})"
            c2 = self.state.cost(g2)
            bound_s = simulate_costs(g2, c2).lower_bound_s
            if best is not None and bound_s >= best.sim.makespan_s:  # no schedule of it can win: not scheduled
                why = (f"pruned: its lower bound {bound_s * 1e3:.3f} ms is no faster than the best variant's "
                       f"{best.sim.makespan_s * 1e3:.3f} ms")  # fmt: skip
                out.append(Tried(name, len(g2.collectives), verdict=why))
                continue
            v = self.scheduled(name, g2, c2, ModulePlan(gm2))
            if isinstance(v, Variant) and traced is not None:
                v.label += (f"; lower bound {v.sim.lower_bound_s * 1e3:.3f} ms, traced program's "
                            f"{traced.sim.lower_bound_s * 1e3:.3f} ms")  # fmt: skip
            out.append(v)
        return out
