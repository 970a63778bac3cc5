"""The core's judging on an executor (:mod:`commsched.execute`): :class:`ExecutorJudge`, the same rules as
:class:`commsched.optimize.judge.SerialJudge` with the probes and the full searches of every candidate that offers a
recipe (a bucket plan: :mod:`commsched.optimize.families.bucketing`) mapped over workers.

Each such candidate travels as a small spec (its label, plan and recipe: the task function that builds its IR, with
its payload, and the search's context by content: the Hardware, the measured table, the knobs), and comes back as a
row of figures. A candidate is a pure function of its spec, so every backend gives the same rows; ties are broken by
candidate index, as in the serial search. The finalists come back as :class:`Evaluated` stand-ins; the one the
search keeps is rebuilt here (:meth:`Evaluated.built`: the same deterministic passes), so only the winner's graph
and schedule are ever built twice. Candidates without a recipe are judged here, as by the serial judge.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from commsched.execute.base import error_text, resolve_fn
from commsched.optimize import protocol
from commsched.optimize.judge import SerialJudge, figures
from commsched.optimize.protocol import PROBE, Candidate, Probed, State, Tried, Variant

PROBE_FN = "commsched.optimize.parallel:judge_candidate"


@dataclasses.dataclass
class Evaluated(Variant):
    """A finalist judged on a worker: ``sim`` holds its figures only (``makespan_ns``, ``makespan_s``,
    ``peak_memory_bytes``), ``graph`` its collective count; :meth:`built` makes the real variant."""

    spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    real: Variant | Tried | None = dataclasses.field(default=None, repr=False)

    def built(self) -> Variant:
        """The real variant, built once (other families build on the best bucketed one, which may be the kept
        one); with this stand-in's label, plan and family as they are now."""
        if self.real is None:
            g2, c2 = _build(self.spec)
            self.real = protocol.schedule_variant(self.label, g2, c2, self.spec["ctx"]["knobs"], self.plan)
            self.real.probe_s = self.probe_s
        if isinstance(self.real, Variant):
            self.real.family = self.family
        return self.real


def _build(spec: dict[str, Any]) -> tuple[Any, Any]:
    from commsched.cost import estimate_costs

    fn, payload = spec["recipe"]
    g2 = resolve_fn(fn)(payload)
    ctx = spec["ctx"]
    return g2, estimate_costs(g2, ctx["hw"], table=ctx["table"], fusion=ctx["fusion"])


def judge_candidate(spec: dict[str, Any]) -> dict[str, Any]:
    """One candidate, on any worker: its IR built from its recipe, costed and scheduled with the probe's knobs
    (``spec["stage"] == "probe"``) or the full search's; a row of figures, or of the verdict why it has none."""
    knobs = spec["ctx"]["knobs"]
    if spec["stage"] == "probe":
        knobs = {**knobs, **PROBE}
    try:
        g2, c2 = _build(spec)
    except Exception as exc:  # a plan that cannot be applied: a verdict, as a failed schedule is
        return _failed(spec, error_text("build", exc))
    v = protocol.schedule_variant(spec["label"], g2, c2, knobs, spec["plan"])
    if isinstance(v, Tried):
        return {"label": v.label, "collectives": v.collectives, "verdict": v.verdict}
    sim = v.sim
    row = {"label": v.label, "collectives": len(g2.collectives), "makespan_ns": int(sim.makespan_ns),
           "makespan_s": float(sim.makespan_s), "peak_memory_bytes": int(sim.peak_memory_bytes)}  # fmt: skip
    if spec["stage"] == "probe":  # a finalist whose bound is above a step found before it is pruned
        row["lower_bound_ns"] = protocol.bound_ns(sim)
    return row


def _failed(spec: dict[str, Any], text: str) -> dict[str, Any]:
    return {"label": spec["label"], "collectives": None, "verdict": f"failed: {text}"}


class ExecutorJudge(SerialJudge):
    """:class:`SerialJudge` with the recipes' probes and full searches on ``executor``'s workers."""

    def __init__(self, state: State, executor: Any, table: Any = None, fusion: bool = True) -> None:
        super().__init__(state)
        self.executor = executor
        self.ctx = {"hw": state.hw, "table": table, "knobs": state.knobs, "fusion": fusion}
        self._rows: dict[int, dict] = {}  # a remote finalist's full-search row, by candidate index

    def probe(self, candidates: list[Candidate]) -> list[Probed | Tried]:
        indices = [self._next_index() for _ in candidates]
        remote = [(i, c) for i, c in zip(indices, candidates, strict=True) if c.recipe is not None]
        specs = [self._spec(c, "probe") for _, c in remote]
        rows = dict(zip((i for i, _ in remote), self.executor.map(PROBE_FN, specs, fail=_failed), strict=True))
        out: list[Probed | Tried] = []
        for i, c in zip(indices, candidates, strict=True):
            if c.recipe is None:
                out.append(self._probe_here(c, i))
                continue
            row = rows[i]
            if "makespan_ns" not in row:  # no order within the budget even for the probe, or it failed
                out.append(Tried(row["label"], row["collectives"], verdict=row["verdict"]))
                continue
            out.append(Probed(row["makespan_ns"], i, c, row["collectives"], row["lower_bound_ns"],
                              row["peak_memory_bytes"]))  # fmt: skip
        return out

    def _spec(self, c: Candidate, stage: str) -> dict[str, Any]:
        label = c.label + (self.state.suffix if stage == "full" else "")
        return {"label": label, "plan": c.plan, "recipe": c.recipe, "stage": stage, "ctx": self.ctx}

    def _prepare_finals(self, chosen: list[Probed], best_ns: int) -> None:
        """The full searches of the remote finalists run at once, but for those the step found before them already
        prunes (the bound rule is then applied in order, as the serial judge does, so each verdict is the same)."""
        runs = [q for q in chosen if q.graph is None and protocol.bound_pruned(q.bound_ns, best_ns) is None]
        specs = [self._spec(q.candidate, "full") for q in runs]
        self._rows.update(zip((q.index for q in runs), self.executor.map(PROBE_FN, specs, fail=_failed),
                              strict=True))  # fmt: skip

    def _run_final(self, q: Probed) -> tuple:
        if q.graph is not None:  # built here
            return super()._run_final(q)
        row = self._rows.pop(q.index)
        if "makespan_ns" not in row:
            return Tried(row["label"], row["collectives"], verdict=row["verdict"], probe_s=q.ns / 1e9), None
        sim = SimpleNamespace(makespan_ns=row["makespan_ns"], makespan_s=row["makespan_s"],
                              peak_memory_bytes=row["peak_memory_bytes"])  # fmt: skip
        graph = SimpleNamespace(collectives=range(row["collectives"]))
        spec = self._spec(q.candidate, "full")
        v = Evaluated(row["label"], graph, None, None, sim, q.candidate.plan, q.ns / 1e9, spec=spec)
        return v, figures(v)
