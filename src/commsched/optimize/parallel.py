"""``optimize``'s bucket-plan candidates judged on an executor (:mod:`commsched.execute`): the same search as
:func:`commsched.optimize.search._bucketed`, with the probes and the full searches mapped over workers.

The plans are made here (cheap) and deduplicated; each candidate travels as a small spec (its label, plan and the
order it was planned on) with the search's context by content (the traced Graph, the Hardware, the measured table,
the FX module's non-contiguous inputs, the knobs), and comes back as a row of figures. A candidate is a pure
function of its spec, so every backend gives the same rows; ties are broken by candidate index, as in the serial
search. The finalists come back as :class:`Evaluated` stand-ins; the one the search keeps is rebuilt here
(:meth:`Evaluated.rebuild`: the same deterministic passes), so only the winner's graph and schedule are ever built
twice.
"""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace
from typing import Any

from commsched.execute.base import error_text
from commsched.optimize import search

PROBE_FN = "commsched.optimize.parallel:judge_candidate"


@dataclasses.dataclass
class Evaluated(search._Variant):
    """A finalist judged on a worker: ``sim`` holds its figures only (``makespan_ns``, ``makespan_s``,
    ``peak_memory_bytes``), ``graph`` its collective count; :meth:`rebuild` makes the real variant."""

    spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    built: search._Variant | None = dataclasses.field(default=None, repr=False)

    def rebuild(self) -> search._Variant:
        """The real variant, built once (transforms build on the best bucketed one, which may be the kept one)."""
        if self.built is None:
            g2, c2 = _bucketed_graph(self.spec)
            self.built = search._scheduled(self.label, g2, c2, self.spec["ctx"]["knobs"], self.plan)
            self.built.probe_s = self.probe_s
        if isinstance(self.built, search._Variant) and self.built.module is None:
            self.built.module = self.module  # its FX rewrite, when transforms built it on this stand-in
        return self.built


def _cost(ctx: dict[str, Any]):
    from commsched.cost import estimate_costs

    return functools.partial(estimate_costs, hardware=ctx["hw"], table=ctx["table"])


def _bucketed_graph(spec: dict[str, Any]) -> tuple[Any, Any]:
    from commsched.rewrites.bucket_graph import bucket_graph

    ctx = spec["ctx"]
    plan, order = spec["plan"]
    g2 = bucket_graph(ctx["graph"], plan, order, ctx["noncontig"])
    return g2, _cost(ctx)(g2)


def judge_candidate(spec: dict[str, Any]) -> dict[str, Any]:
    """One candidate, on any worker: its bucketed graph costed and scheduled with the probe's knobs
    (``spec["stage"] == "probe"``) or the full search's; a row of figures, or of the verdict why it has none."""
    knobs = spec["ctx"]["knobs"]
    if spec["stage"] == "probe":
        knobs = {**knobs, **search.PROBE}
    try:
        g2, c2 = _bucketed_graph(spec)
    except Exception as exc:  # a plan that cannot be applied: a verdict, as a failed schedule is
        return {"label": spec["label"], "collectives": None, "verdict": f"failed: {error_text('bucket', exc)}"}
    v = search._scheduled(spec["label"], g2, c2, knobs, spec["plan"])
    if isinstance(v, search.Tried):
        return {"label": v.label, "collectives": v.collectives, "verdict": v.verdict}
    sim = v.sim
    row = {"label": v.label, "collectives": len(g2.collectives), "makespan_ns": int(sim.makespan_ns),
           "makespan_s": float(sim.makespan_s), "peak_memory_bytes": int(sim.peak_memory_bytes)}  # fmt: skip
    if spec["stage"] == "probe":  # a finalist whose bound is above a step found before it is pruned
        row["lower_bound_ns"] = search.bound_ns(sim)
    return row


def _failed(spec: dict[str, Any], text: str) -> dict[str, Any]:
    return {"label": spec["label"], "collectives": None, "verdict": f"failed: {text}"}


def bucketed(gm: Any, g: Any, hw: Any, costing: tuple, knobs: dict, scheduled_order: Any, finalists: int,
             granularities: tuple = search.GRANULARITIES, prior: list | tuple = (), *, executor: Any,
             table: Any = None) -> list:  # fmt: skip
    """:func:`commsched.optimize.search._bucketed` with the candidates judged on ``executor``: the same list of
    variants and verdicts, in the same order, the finalists as :class:`Evaluated`."""
    from commsched.rewrites.bucket_graph import noncontiguous_inputs

    ctx = {"graph": g, "hw": hw, "table": table, "noncontig": noncontiguous_inputs(gm, g), "knobs": knobs}
    out: list[Any] = []
    seen: dict[tuple, str] = {}
    specs: list[dict[str, Any]] = []
    for label, plan, order, plan_on in search._plans(g, hw, costing[0], scheduled_order, granularities):
        key = tuple(b.members for b in plan.buckets if b.merged)
        if not key or key in seen:
            out.append(search.Tried(label, None, verdict="no merge" if not key else f"the same plan as: {seen[key]}"))
            continue
        seen[key] = label
        out.append(len(specs))  # this candidate's place: a failed probe's verdict goes here, as in the serial search
        specs.append({"index": len(specs), "label": label, "plan": (plan, order), "plan_on": plan_on,
                      "stage": "probe", "ctx": ctx})  # fmt: skip
    probes = executor.map(PROBE_FN, specs, fail=_failed)
    probed: dict[str, list[tuple[int, int, dict]]] = {name: [] for name in search.PLANNED_ON}
    for spec, row in zip(specs, probes, strict=True):
        if "makespan_ns" in row:
            probed[spec["plan_on"]].append((row["makespan_ns"], spec["index"], spec))
    out = [_probe_failed(probes[item]) if isinstance(item, int) else item for item in out]
    # no order within the budget even for the probe, or it failed: its verdict; a probed one: to the finals
    finals = _finals(probed, probes, knobs, finalists, executor, search._incumbent_ns(prior, knobs))
    return [item for item in out if item is not None] + finals


def _probe_failed(row: dict[str, Any]) -> Any:
    """The verdict of a candidate whose probe found no order (or failed), None when it was probed."""
    if "makespan_ns" in row:
        return None
    return search.Tried(row["label"], row["collectives"], verdict=row["verdict"])


def _finals(probed: dict, probes: list, knobs: dict, finalists: int, executor: Any, best_ns: int) -> list:
    """:func:`commsched.optimize.search._finals` on ``executor``: the finalists' full searches run at once (but
    those the step found before them already prunes), then every verdict is given in the serial search's order,
    with the same bound rule, so each finalist's row is the serial one."""
    suffix = ", collectives reordered" if knobs["reorder_collectives"] else ""

    def bound_of(q: tuple) -> int:
        return probes[q[1]]["lower_bound_ns"]

    ranked, chosen = search.final_order(probed, finalists, bound_of)
    runs = [q for q in chosen if search.bound_pruned(bound_of(q), best_ns) is None]
    final_specs = [{**spec, "label": spec["label"] + suffix, "stage": "full"} for _, _, spec in runs]
    rows = dict(zip((q[1] for q in runs), executor.map(PROBE_FN, final_specs, fail=_failed), strict=True))

    def run(q: tuple) -> tuple:
        ns, index, spec = q
        row = rows[index]
        figures = (row["makespan_ns"], row["peak_memory_bytes"]) if "makespan_ns" in row else None
        return _finalist(row, {**spec, "label": spec["label"] + suffix}, ns), figures

    def pruned(q: tuple, why: str) -> Any:
        return search.Tried(q[2]["label"], probes[q[1]]["collectives"], verdict=why, probe_s=q[0] / 1e9)

    judged = search.judge_finals(chosen, best_ns, knobs["memory_budget"].bytes, bound_of, run, pruned)
    out: list[Any] = []
    for family in ranked:
        for k, (ns, index, spec) in enumerate(family):
            if k < finalists:
                out.append(judged[index])
            else:
                why = f"pruned: probe {ns / family[0][0] - 1:.1%} slower than the best plan's made on the same order"
                out.append(search.Tried(spec["label"], probes[index]["collectives"], verdict=why, probe_s=ns / 1e9))
    return out


def _finalist(row: dict[str, Any], spec: dict[str, Any], probe_ns: int) -> Any:
    if "makespan_ns" not in row:
        return search.Tried(row["label"], row["collectives"], verdict=row["verdict"], probe_s=probe_ns / 1e9)
    sim = SimpleNamespace(makespan_ns=row["makespan_ns"], makespan_s=row["makespan_s"],
                          peak_memory_bytes=row["peak_memory_bytes"])  # fmt: skip
    graph = SimpleNamespace(collectives=range(row["collectives"]))
    return Evaluated(row["label"], graph, None, None, sim, spec["plan"], probe_ns / 1e9, spec=spec)
