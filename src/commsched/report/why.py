"""Why a collective stayed exposed, and what a schedule moved: facts read off the graph, the order and the simulated
step, never guessed.

For every collective of a simulated step, :func:`collective_facts` measures the three things that can keep it from
hiding behind compute, each a time the simulation shows:

* **queued**: it started after its issue because its group's previous collective still ran (one collective at a
  time per process group: ``StreamModel.comm_start_ns``);
* **group order**: its group's previous collective was issued after its inputs were ready, and each group keeps
  its collective order (SPMD), so it could not be issued sooner;
* **held back**: it was issued later than its inputs and its group's order allow (the order put other work
  first); its issue moved to right after its last input gives a peak memory that :func:`collective_facts` computes
  with the memory model, so a budget that stopped the earlier issue shows as that peak over the budget;
* **dependency**: from its issue to the moment a stream needed its output (its wait), compute ran for less than
  the collective took: the consumer (the first op after the wait) needs the result that soon.

:func:`what_moved` pairs two orders of one graph (the traced one and a schedule) collective by collective: hidden
now, still exposed (with the reason), newly exposed, and how far its issue moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir.graph import CollType, OpKind
from commsched.report.units import fmt_bytes, fmt_seconds
from commsched.sim.result import SimResult

_KERNELS = (OpKind.COMPUTE, OpKind.OTHER)
_TIMED = (OpKind.COMPUTE, OpKind.OTHER, OpKind.COLLECTIVE, OpKind.WAIT)
MAX_MEMORY_CHECKS = 40
"""collectives (the most exposed first) whose earlier issue is checked against the memory model"""


@dataclass(frozen=True)
class CollectiveFacts:
    """One collective in one simulated order; times in ns. ``reason`` is the largest cause of its exposure:
    ``"hidden"``, ``"queued"``, ``"group order"``, ``"held back"``, ``"held back (memory)"`` or ``"dependency"``;
    ``why`` says it with names and numbers."""

    node: int
    name: str
    type: str
    group: str
    nbytes: int
    position: int
    duration_ns: int
    exposed_ns: int
    queued_ns: int
    held_ns: int
    window_ns: int
    sync_ns: int
    consumer: str
    previous: str
    peak_if_early_bytes: int | None
    reason: str
    why: str


class _Step:
    """What the facts of every collective of one simulated step are read from (positions, readiness, waits)."""

    def __init__(self, res: SimResult) -> None:
        g = self.g = res.graph
        self.res = res
        self.pos = np.empty(len(g), np.int64)
        self.pos[res.order] = np.arange(len(res.order))
        self.pred_ptr, self.pred_idx = g.predecessors_csr()
        self.succ_ptr, self.succ_idx = g.successors_csr()
        self.ready = self._data_ready_ns()
        self.first_wait = self._first_waits()
        colls = g.collectives
        self.group_prev: dict[int, int] = {}  # collective -> its group's previous collective, in issue order
        for grp in np.unique(g.coll_group[colls]).tolist():
            members = colls[g.coll_group[colls] == grp]
            chain = members[np.argsort(res.issue_ns[members], kind="stable")].tolist()
            self.group_prev.update(zip(chain[1:], chain[:-1]))

    def _data_ready_ns(self) -> np.ndarray:
        """Per node, when its output exists: a timed node's end, a free node's (view, input) latest input's."""
        g, res = self.g, self.res
        timed = np.isin(g.kinds, _TIMED)
        ready = np.zeros(len(g), np.int64)
        ptr, idx = self.pred_ptr, self.pred_idx
        for i in range(len(g)):  # ids are a topological order
            if timed[i]:
                ready[i] = res.end_ns[i]
            elif ptr[i + 1] > ptr[i]:
                ready[i] = ready[idx[ptr[i] : ptr[i + 1]]].max()
        return ready

    def _first_waits(self) -> dict[int, int]:
        """Collective -> the wait that blocks first (the earliest need of its output)."""
        g = self.g
        first: dict[int, int] = {}
        for w in np.flatnonzero(g.wait_of >= 0).tolist():
            c = int(g.wait_of[w])
            if c not in first or self.need_ns(w) < self.need_ns(first[c]):
                first[c] = w
        return first

    def need_ns(self, wait: int) -> int:
        """When a stream reached ``wait`` (began blocking on it, or passed it at once)."""
        return int(self.res.start_ns[wait] - self.res.blocked_ns[wait])

    def inputs_ready(self, c: int) -> tuple[int, int]:
        """When ``c``'s inputs were all ready, and the position in the order right after the last of them."""
        preds = self.pred_idx[self.pred_ptr[c] : self.pred_ptr[c + 1]]
        if not len(preds):
            return 0, 0
        return int(self.ready[preds].max()), int(self.pos[preds].max()) + 1

    def consumer(self, wait: int) -> str:
        """The first kernel (or collective) in the order that uses the wait's output, through views."""
        g = self.g
        frontier, seen, users = [wait], {wait}, []
        while frontier:
            i = frontier.pop()
            for s in self.succ_idx[self.succ_ptr[i] : self.succ_ptr[i + 1]].tolist():
                if s not in seen:
                    seen.add(s)
                    (users if g.kinds[s] in (*_KERNELS, OpKind.COLLECTIVE) else frontier).append(s)
        return g.names[min(users, key=lambda s: self.pos[s])] if users else "the step's output"

    def peak_if_issued_at(self, c: int, position: int) -> int:
        """The step's peak memory (the memory model) with ``c`` moved to ``position`` of the order."""
        from commsched.memory import memory_profile

        order = self.res.order.tolist()
        order.remove(c)
        order.insert(position, c)
        return int(memory_profile(self.g, np.asarray(order, np.int64)).peak_bytes)


def collective_facts(res: SimResult, *, memory_budget_bytes: float | None = None) -> list[CollectiveFacts]:
    """Every collective of ``res`` in issue order, with what kept it exposed (see the module docstring).
    ``memory_budget_bytes``: the cap the scheduler worked under, named when an earlier issue would pass it."""
    st = _Step(res)
    exposed = res.exposed_ns_per_collective
    colls = sorted(res.graph.collectives.tolist(), key=lambda c: st.pos[c])
    checked = set(sorted(colls, key=lambda c: -exposed[c])[:MAX_MEMORY_CHECKS])
    return [_explain(st, c, memory_budget_bytes, check_memory=c in checked) for c in colls]


def _explain(st: _Step, c: int, budget: float | None, *, check_memory: bool) -> CollectiveFacts:
    """The facts of collective ``c`` and its largest cause of exposure (see the module docstring)."""
    g, res = st.g, st.res
    issue, duration = int(res.issue_ns[c]), int(res.end_ns[c] - res.start_ns[c])
    exposed = int(res.exposed_ns_per_collective[c])
    inputs_ns, early_pos = st.inputs_ready(c)
    held = max(0, issue - inputs_ns)
    prev = st.group_prev.get(c)
    queued = max(0, min(int(res.end_ns[prev]), int(res.start_ns[c])) - issue) if prev is not None else 0
    by_group_order = min(held, max(0, int(res.issue_ns[prev]) - inputs_ns)) if prev is not None else 0
    wait = st.first_wait.get(c)
    need = st.need_ns(wait) if wait is not None else int(res.end_ns[c])
    # stream syncs: issue -> start beyond any queue, and end -> the wait's release
    sync = max(0, int(res.start_ns[c]) - issue - queued) + (
        max(0, int(res.start_ns[wait] - res.end_ns[c])) if wait is not None else 0
    )
    peak = None
    if exposed > 0 and held > by_group_order and check_memory and early_pos < st.pos[c]:
        peak = st.peak_if_issued_at(c, early_pos)
    over_budget = peak is not None and budget is not None and peak > budget
    causes = {  # on a tie the first wins: "dependency" when nothing else explains it
        "dependency": max(0, duration + sync - (need - inputs_ns)),
        "queued": min(queued, exposed),
        "group order": min(by_group_order, exposed),
        "held back (memory)" if over_budget else "held back": min(held - by_group_order, exposed),
    }
    reason = "hidden" if exposed <= 0 else max(causes, key=lambda k: causes[k])
    parts = []
    if exposed > 0:
        prev_name = g.names[prev] if prev is not None else ""
        if queued > 0:
            parts.append(f"queued {_t(queued)} behind {prev_name} on its group's stream (one at a time)")
        if by_group_order > 0:
            parts.append(f"its group's previous collective {prev_name} was issued {_t(by_group_order)} after its "
                         "inputs were ready (each group keeps its collective order)")  # fmt: skip
        if held > by_group_order:
            text = f"issued {_t(held - by_group_order)} later than its inputs and group order allow"
            if peak is not None:
                text += f"; issued then, the step peaks at {fmt_bytes(peak)} (now {fmt_bytes(res.peak_memory_bytes)})"
                text += f", over the {fmt_bytes(budget)} memory budget" if over_budget else ""
            parts.append(text)
        if wait is not None:
            when = f"{_t(need - inputs_ns)} after" if need > inputs_ns else "as soon as"
            syncs = f" plus {_t(sync)} of stream syncs" if sync > 0 else ""
            parts.append(f"needed by {st.consumer(wait)} {when} its inputs are ready; it runs {_t(duration)}{syncs}")
    return CollectiveFacts(
        node=c, name=g.names[c], type=CollType(int(g.coll_type[c])).name.lower(),
        group=g.groups[int(g.coll_group[c])].name, nbytes=int(g.comm_bytes[c]), position=int(st.pos[c]),
        duration_ns=duration, exposed_ns=exposed, queued_ns=queued, held_ns=held, window_ns=need - issue,
        sync_ns=sync,
        consumer=st.consumer(wait) if wait is not None else "", previous=g.names[prev] if prev is not None else "",
        peak_if_early_bytes=peak, reason=reason, why="; ".join(parts) if parts else "hidden behind compute",
    )  # fmt: skip


def _t(ns: int) -> str:
    return fmt_seconds(ns * 1e-9)


@dataclass(frozen=True)
class MovedRow:
    """One collective in two orders of the same graph: ``status`` is ``"hidden now"``, ``"still exposed"``,
    ``"newly exposed"`` or ``"hidden in both"``; ``issue_shift_ns`` < 0 when the schedule issues it earlier."""

    name: str
    type: str
    group: str
    nbytes: int
    exposed_before_ns: int
    exposed_after_ns: int
    issue_shift_ns: int
    status: str
    reason: str
    why: str


def what_moved(before: SimResult, after: SimResult, *, memory_budget_bytes: float | None = None) -> list[MovedRow]:
    """Each collective of ``before`` and ``after`` (two orders of one graph), most exposed after first; the reason
    is ``after``'s (:func:`collective_facts`)."""
    if before.graph is not after.graph and before.graph.names != after.graph.names:
        raise ValueError("what_moved: the two results simulate different graphs")
    then = {f.node: f for f in collective_facts(before)}
    rows = []
    for f in collective_facts(after, memory_budget_bytes=memory_budget_bytes):
        b = then[f.node]
        status = {(True, False): "hidden now", (True, True): "still exposed", (False, True): "newly exposed"}.get(
            (b.exposed_ns > 0, f.exposed_ns > 0), "hidden in both"
        )
        shift = int(after.issue_ns[f.node] - before.issue_ns[f.node])
        rows.append(MovedRow(f.name, f.type, f.group, f.nbytes, b.exposed_ns, f.exposed_ns, shift, status,
                             f.reason, f.why))  # fmt: skip
    return sorted(rows, key=lambda r: (-r.exposed_after_ns, -r.exposed_before_ns))
