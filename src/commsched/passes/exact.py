"""``exact``: optimal scheduling with OR-Tools CP-SAT, for small graphs or windows (a few hundred nodes).

The model is the stream model (:mod:`commsched.sim.model`) without interference, bandwidth sharing and stream sync,
in 10 ns ticks (CP-SAT domains stay small):
* one compute stream: every non-collective node is an interval of its duration on a NoOverlap resource (a
  synchronous collective too: it blocks the stream);
* each collective runs on its group's FIFO comm stream: it starts after its inputs are done and after the previous
  collective of its group (the order is fixed: SPMD), and lasts its duration;
* a wait starts no earlier than its collective's end; every node starts after its predecessors end;
* memory: each freeable storage lives from its owner's start to the latest end of its users, and a cumulative
  constraint keeps the live bytes (plus the persistent ones) within the budget.
The objective is the makespan. The solver returns the optimum, or the best order found and its proven lower bound.
The order is read off the start times (collectives at their issue time) with a stable topological sort.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind
from commsched.memory import liveness, memory_profile
from commsched.passes.budget import MemoryBudget
from commsched.passes.registry import PassConfig, PassContext, PassResult, PassStats, register_pass
from commsched.sim.model import TIMED_KINDS

_TICK_S = 1e-8  # time unit of the model (10 ns): keeps domains small without losing meaningful precision


@dataclass(frozen=True, kw_only=True)
class ExactConfig(PassConfig):
    """Knobs of the ``exact`` pass."""

    time_limit_s: float = 20.0
    """CP-SAT wall-time limit; the best order found so far is returned with its bound"""
    memory_budget: MemoryBudget = MemoryBudget(ratio=1.05)
    """peak-memory budget: a multiple of the input order's peak and / or bytes (unlimited: no memory constraint)"""
    max_nodes: int = 600
    """refuse larger graphs (CP-SAT grows quickly); schedule windows instead"""
    workers: int = 2


@dataclass
class ExactResult:
    order: np.ndarray
    makespan_s: float  # the solver's objective for the returned order
    lower_bound_s: float  # proven lower bound on the optimum
    optimal: bool
    status: str
    wall_s: float

    @property
    def gap(self) -> float:
        return 0.0 if self.makespan_s <= 0 else (self.makespan_s - self.lower_bound_s) / self.makespan_s


@dataclass
class _Model:
    """The CP-SAT model of one graph: per node its start and end, per asynchronous collective its start on the comm
    stream (a synchronous one's is its start), and the makespan."""

    m: object
    dur: np.ndarray
    start: list
    end: list
    comm_start: dict[int, object]
    makespan: object
    horizon: int


def _build_model(g: Graph, costs: CostEstimate, order: np.ndarray) -> _Model:
    """Streams, dependencies and FIFO order (see the module docstring), without memory."""
    from ortools.sat.python import cp_model

    n = len(g)
    dur = np.rint(costs.node_s / _TICK_S).astype(np.int64)
    dur[~np.isin(g.kinds, TIMED_KINDS)] = 0
    is_coll = g.coll_type >= 0
    horizon = int(dur.sum()) + 1
    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon, f"s{i}") for i in range(n)]
    end = [m.new_int_var(0, horizon, f"e{i}") for i in range(n)]
    # a collective: `start` is its issue time (on the compute stream), comm_* its run on the group's stream
    comm_start: dict[int, object] = {}
    compute_intervals = []
    for i in range(n):
        d = int(dur[i])
        if is_coll[i] and not g.coll_sync[i]:
            cs = m.new_int_var(0, horizon, f"cs{i}")
            comm_start[i] = cs
            m.add(cs >= start[i])
            m.add(end[i] == cs + d)
        else:
            iv = m.new_interval_var(start[i], d, end[i], f"iv{i}")
            if d > 0:
                compute_intervals.append(iv)
            if is_coll[i]:  # synchronous: runs on its group's stream while blocking the compute stream
                comm_start[i] = start[i]
    m.add_no_overlap(compute_intervals)
    ptr, idx = g.predecessors_csr()
    for i in range(n):
        for p in idx[ptr[i] : ptr[i + 1]].tolist():
            if is_coll[p] and not g.coll_sync[p] and g.kinds[i] != OpKind.WAIT:
                m.add(start[i] >= start[p])  # views of a collective's output need only its issue
            else:
                m.add(start[i] >= end[p])
    previous: dict[int, int] = {}  # FIFO per group, in the given order
    for c in order[is_coll[order]].tolist():
        prev = previous.get(int(g.coll_group[c]))
        if prev is not None:
            m.add(comm_start[c] >= end[prev])
            m.add(start[c] >= start[prev])  # issued in the same order as they run
        previous[int(g.coll_group[c])] = c
    makespan = m.new_int_var(0, horizon, "makespan")
    m.add_max_equality(makespan, end)
    return _Model(m, dur, start, end, comm_start, makespan, horizon)


def _add_memory(g: Graph, model: _Model, memory_budget_bytes: int) -> None:
    """Each freeable storage lives from its owner's start to the latest end of its users; a cumulative constraint
    keeps the live bytes (plus the persistent ones) within the budget."""
    m, start, end, horizon = model.m, model.start, model.end, model.horizon
    lv = liveness(g)
    cap = int(memory_budget_bytes) - lv.persistent_bytes
    demands, intervals = [], []
    users_ptr, users_idx = lv.users_ptr, lv.users_idx
    for s in np.flatnonzero(~lv.persistent & (lv.storage_bytes > 0)).tolist():
        owner = int(lv.owner[s])
        until = m.new_int_var(0, horizon + 1, f"free{s}")
        for u in users_idx[users_ptr[s] : users_ptr[s + 1]].tolist():
            m.add(until >= end[u] + (1 if model.dur[u] == 0 else 0))
        if not lv.freeable[s]:
            m.add(until >= model.makespan + 1)
        m.add(until >= start[owner] + 1)
        size = m.new_int_var(1, horizon + 1, f"len{s}")
        intervals.append(m.new_interval_var(start[owner], size, until, f"mem{s}"))
        demands.append(int(lv.storage_bytes[s]))
    if intervals:
        scale = max(1, max(demands) // 1_000_000)  # keep coefficients modest
        m.add_cumulative(intervals, [-(-d // scale) for d in demands], max(0, cap) // scale)


def solve_exact(
    g: Graph,
    costs: CostEstimate,
    order: np.ndarray | None = None,
    *,
    memory_budget_bytes: int | None = None,
    time_limit_s: float = 20.0,
    workers: int = 2,
    hint: np.ndarray | None = None,
) -> ExactResult:
    """Solve the scheduling model of ``g`` exactly (see the module docstring). ``order`` fixes each group's
    collective order (default: the graph's order); ``hint`` is an order whose timing seeds the search."""
    from ortools.sat.python import cp_model

    order = np.arange(len(g), dtype=np.int32) if order is None else np.asarray(order, np.int32)
    model = _build_model(g, costs, order)
    if memory_budget_bytes is not None:
        _add_memory(g, model, memory_budget_bytes)
    model.m.minimize(model.makespan)
    if hint is not None:
        _add_hint(model.m, g, np.asarray(hint, np.int32), model.dur, model.start, model.end, model.comm_start)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = int(workers)
    t0 = time.perf_counter()
    status = solver.solve(model.m)
    wall = time.perf_counter() - t0
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT found no schedule ({name}) within {time_limit_s} s")
    return ExactResult(
        order=_extract_order(g, model, solver, order),
        makespan_s=solver.objective_value * _TICK_S,
        lower_bound_s=solver.best_objective_bound * _TICK_S,
        optimal=status == cp_model.OPTIMAL,
        status=name,
        wall_s=wall,
    )


def _extract_order(g: Graph, model: _Model, solver, order: np.ndarray) -> np.ndarray:
    """The solver's timing as a program order: each async collective issued before the compute node that is
    running when its communication starts, so the program order reproduces the timing."""
    n, dur, is_coll = len(g), model.dur, g.coll_type >= 0
    starts = [solver.value(model.start[i]) for i in range(n)]
    ends = [solver.value(model.end[i]) for i in range(n)]
    running = sorted((starts[i], ends[i]) for i in range(n) if dur[i] > 0 and not (is_coll[i] and not g.coll_sync[i]))
    run_starts = [a for a, _ in running]
    keys: list[tuple[int, int]] = [(0, 0)] * n
    ready_at = [0] * n  # when a node's result is usable by its users in the extracted program
    ptr, idx = g.predecessors_csr()
    for i in range(n):  # ids are topological
        preds_ready = max([ready_at[p] for p in idx[ptr[i] : ptr[i + 1]].tolist()] + [0])
        if is_coll[i] and not g.coll_sync[i]:
            cs = solver.value(model.comm_start[i])
            k = bisect.bisect_right(run_starts, cs) - 1
            t = running[k][0] if k >= 0 and running[k][1] > cs else cs
            keys[i] = (max(t, preds_ready), 0)
            ready_at[i] = keys[i][0]
        elif dur[i] == 0:
            # zero-time nodes (views, waits, inputs) as soon as they can run: the solver leaves them anywhere
            t = max(preds_ready, solver.value(model.end[g.wait_of[i]]) if g.wait_of[i] >= 0 else 0)
            keys[i] = (t, 0)  # before a kernel that starts at the same time
            ready_at[i] = t
        else:
            keys[i] = (starts[i], 1)
            ready_at[i] = ends[i]
    return _stable_topological(g, keys, order)


def _add_hint(m, g: Graph, order: np.ndarray, dur: np.ndarray, start, end, comm_start) -> None:
    """Seed the search with the timing of a known order (same model, computed sequentially)."""
    t = 0
    free: dict[int, int] = {}
    finish: dict[int, int] = {}
    coll_end: dict[int, int] = {}
    ptr, idx = g.predecessors_csr()
    for i in order.tolist():
        ready = max([finish.get(p, 0) for p in idx[ptr[i] : ptr[i + 1]].tolist()] + [0])
        if g.coll_type[i] >= 0 and not g.coll_sync[i]:
            s = max(t, 0)
            grp = int(g.coll_group[i])
            cs = max(s, free.get(grp, 0), ready)
            free[grp] = cs + int(dur[i])
            coll_end[i] = cs + int(dur[i])
            finish[i] = s  # views and waits see the issue; waits wait on the end below
            m.add_hint(start[i], s)
            m.add_hint(comm_start[i], cs)
            m.add_hint(end[i], cs + int(dur[i]))
            continue
        if g.kinds[i] == OpKind.WAIT:
            ready = max(ready, coll_end.get(int(g.wait_of[i]), 0))
        s = max(t, ready)
        m.add_hint(start[i], s)
        m.add_hint(end[i], s + int(dur[i]))
        t = s + int(dur[i])
        finish[i] = t


def _stable_topological(g: Graph, keys: list[tuple], order: np.ndarray) -> np.ndarray:
    """A topological order that follows ``keys`` (then the given order) as closely as possible, keeping each
    group's collectives in ``order``'s sequence."""
    from commsched.ir.graph import csr
    from commsched.ir.transform import kahn_order

    n = len(g)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    pptr, pidx = g.predecessors_csr()
    src = [pidx.astype(np.int64)]
    dst = [np.repeat(np.arange(n), np.diff(pptr))]
    colls = order[g.coll_type[order] >= 0]
    last: dict[int, int] = {}
    chain_src, chain_dst = [], []
    for c in colls.tolist():
        grp = int(g.coll_group[c])
        if grp in last:
            chain_src.append(last[grp])
            chain_dst.append(c)
        last[grp] = c
    src.append(np.asarray(chain_src, np.int64))
    dst.append(np.asarray(chain_dst, np.int64))
    ptr, idx = csr(n, np.concatenate(dst), np.concatenate(src))
    indeg = np.bincount(idx, minlength=n)
    out = kahn_order(ptr, idx, indeg, [(keys[i], int(rank[i])) for i in range(n)])
    return np.asarray(out, np.int32)


@register_pass("exact", ExactConfig)
def exact(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Optimal order by CP-SAT (compute stream, FIFO comm per group, memory budget); small graphs only."""
    cfg: ExactConfig = ctx.config  # type: ignore[assignment]
    if len(g) > cfg.max_nodes:
        raise ValueError(f"exact: the graph has {len(g)} nodes, over max_nodes={cfg.max_nodes}; schedule windows")
    budget = None
    if not cfg.memory_budget.unlimited:
        peak = memory_profile(g, order).peak_bytes if cfg.memory_budget.ratio is not None else 0
        budget = cfg.memory_budget.limit_bytes(peak)
    res = solve_exact(
        g, ctx.costs, order, memory_budget_bytes=budget, time_limit_s=cfg.time_limit_s, workers=cfg.workers, hint=order
    )
    stats = PassStats("exact")
    stats.rows.append(
        {
            "status": res.status,
            "makespan_s": res.makespan_s,
            "lower_bound_s": res.lower_bound_s,
            "gap": res.gap,
            "wall_s": res.wall_s,
        }
    )
    return PassResult(res.order, stats)
