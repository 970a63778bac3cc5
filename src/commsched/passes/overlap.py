"""``overlap``: commsched's memory-budgeted latency-hiding scheduler (the default pass).

A list scheduler that runs the stream model while it schedules (one compute stream, one FIFO comm stream per process
group, interference while collectives are in flight). At every step it
  1. issues each collective that is next in its group's order and whose inputs are done (so communication starts
     as early as the data and the FIFO allow), within a cap on bytes in flight;
  2. runs every wait whose collective has already finished (free), unlocking its users;
  3. runs the ready compute node that feeds the earliest collective, then the one with the longest path to the end
     of the step (each group's FIFO chain of collectives counts as a path), if its allocation fits the budget;
  4. otherwise waits for the in-flight collective that finishes first.
Then it *tightens* the result without changing its timing: each collective is issued at the last point before its
communication can start (the FIFO stream could not start it earlier, so its buffer is allocated later), and each wait
runs at the first point after its collective ends (no stall; the collective's inputs are released sooner).

Every group keeps its input collective order (SPMD-safe) unless ``reorder_collectives`` is set, in which case the
order within each group is rebuilt by Jackson's rule from a first attempt's timing (start the released collective
whose result is needed first) — deterministic in (graph, costs), so every rank that has the same costs (aligned
estimates) makes the same choice, the condition torch's own scheduler relies on too.

The budget is hard: every candidate is checked with the full memory model and simulated with the full simulator
(link sharing, interference); over budget, the bytes-in-flight cap shrinks and the scheduler retries. The best order
that fits and simulates no worse than the input wins; otherwise the input order is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph
from commsched.passes.check import ScheduleError
from commsched.passes.overlap_core import (
    delay_past_peak,
    input_chains,
    jackson_chains,
    just_in_time,
    need_times,
    prepare,
    schedule_once,
    tighten,
)
from commsched.passes.registry import PassConfig, PassContext, PassResult, PassStats, register_pass
from commsched.sim import simulate_costs


@dataclass(frozen=True, kw_only=True)
class OverlapConfig(PassConfig):
    """Knobs of the ``overlap`` pass."""

    memory_budget_ratio: float | None = 1.05
    """hard peak-memory budget as a multiple of the input order's peak (None: no ratio limit)"""
    memory_budget_bytes: int | None = None
    """hard peak-memory budget in bytes; with both set, the smaller one applies"""
    reorder_collectives: bool = False
    """let each group's collective order change (Jackson's rule; needs the same costs on every rank)"""
    jit_leads: tuple[float, ...] = ()
    """just-in-time variants: issue each collective no earlier than (1 + lead) x its duration before its first use"""
    max_peak_repairs: int = 6
    """per variant: times collectives prefetched across a peak that breaks the budget are moved past it"""
    max_cap_retries: int = 4
    """when no variant fits the budget: retries with a shrinking cap on bytes in flight"""


def _budget(cfg: OverlapConfig, base_peak: int) -> int:
    limits = []
    if cfg.memory_budget_ratio is not None:
        if cfg.memory_budget_ratio < 1.0:
            raise ValueError(f"memory_budget_ratio={cfg.memory_budget_ratio} must be >= 1 (the input order's peak)")
        limits.append(int(base_peak * cfg.memory_budget_ratio))
    if cfg.memory_budget_bytes is not None:
        limits.append(int(cfg.memory_budget_bytes))
    return min(limits) if limits else 1 << 62


@register_pass("overlap", OverlapConfig)
def overlap(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Memory-budgeted latency hiding: collectives issued as early as data and FIFO allow (or just in time for
    their use), waits at the first moment they cost nothing, compute that feeds communication first; per-group
    collective order kept; hard memory budget; never worse than the input. O((N+E) log N) per attempt."""
    cfg: OverlapConfig = ctx.config  # type: ignore[assignment]
    stats = PassStats("overlap")
    base_sim = simulate_costs(g, ctx.costs, order)
    base_peak = base_sim.peak_memory_bytes
    budget = _budget(cfg, base_peak)
    best: list = [base_sim.makespan_ns, base_peak, order.tolist(), "input order"]
    fastest: list = [1 << 62, None, None]  # (makespan, prep, attempt) of the fastest candidate, fitting or not
    seen: set[tuple[int, ...]] = set()
    attempts = 0

    def consider(label: str, p, a, not_before=None) -> bool:
        nonlocal attempts
        attempts += 1
        cand = tighten(p, a)
        key = tuple(cand)
        if key in seen:
            return False
        seen.add(key)
        # judge with the full simulator (link sharing, interference) and the full memory model
        res = simulate_costs(g, ctx.costs, np.asarray(cand, np.int32))
        fits = res.peak_memory_bytes <= budget
        # over budget because collectives were prefetched across the peak: move them past it and retry
        repairs = 0
        nb = dict(not_before or {})
        while not fits and repairs < cfg.max_peak_repairs and res.makespan_ns < best[0]:
            nb2 = delay_past_peak(g, p, a, cand, res.memory.peak_position, nb)
            if nb2 is None:
                break
            repairs += 1
            nb = nb2
            a = schedule_once(p, budget, _NO_CAP, nb)
            cand = tighten(p, a)
            res = simulate_costs(g, ctx.costs, np.asarray(cand, np.int32))
            fits = res.peak_memory_bytes <= budget
        if repairs:
            label = f"{label}, {repairs} peak repair(s)"
        stats.rows.append(
            {"attempt": label, "makespan_s": res.makespan_s, "peak_bytes": res.peak_memory_bytes, "fits": fits}
        )
        if res.makespan_ns < fastest[0]:
            fastest[:] = [res.makespan_ns, p, a]
        if fits and (res.makespan_ns, res.peak_memory_bytes) < (best[0], best[1]):
            best[:] = [res.makespan_ns, res.peak_memory_bytes, cand, label]
        elif not fits:
            stats.refuse("memory budget")
        return fits

    bases = [("input collective order", input_chains(g, order))]
    while bases:
        label, chains = bases.pop(0)
        p = prepare(g, order, ctx.costs, chains, ctx.extra_src, ctx.extra_dst)
        a0 = schedule_once(p, budget, _NO_CAP)
        consider(f"{label}, as early as possible", p, a0)
        need = need_times(g, p, a0)
        for lead in cfg.jit_leads:
            nb = just_in_time(p, a0, need, lead)
            a = schedule_once(p, budget, _NO_CAP, nb)
            consider(f"{label}, just in time (lead {lead:g})", p, a, nb)
        if cfg.reorder_collectives and label == "input collective order":
            bases.append(("Jackson collective order", jackson_chains(g, p, a0)))
    # over budget everywhere: shrink the bytes in flight of the fastest attempt until it fits
    tries = 0
    while best[3] == "input order" and fastest[1] is not None and tries < cfg.max_cap_retries:
        tries += 1
        _, p, a = fastest
        res = simulate_costs(g, ctx.costs, np.asarray(tighten(p, a), np.int32))
        in_flight_peak = max(1, _max_in_flight(p, a))
        cap = max(0, min(in_flight_peak // 2, in_flight_peak - (res.peak_memory_bytes - budget)))
        a = schedule_once(p, budget, cap)
        fastest[2] = a
        if consider(f"in-flight cap {cap} B", p, a):
            break
    makespan_ns, peak, chosen, label = best
    if peak > budget:
        raise ScheduleError(
            f"overlap: no order found within the memory budget of {budget} bytes; the input order peaks at "
            f"{base_peak} bytes (raise memory_budget_bytes / memory_budget_ratio)"
        )
    stats.notes.append(
        f"budget {budget} B (input peak {base_peak} B); chose {label}: {makespan_ns / 1e9:.6f} s vs input "
        f"{base_sim.makespan_s:.6f} s, peak {peak} B, {attempts} attempt(s)"
    )
    return PassResult(np.asarray(chosen, np.int32), stats, reorders_collectives=label.startswith("Jackson"))


_NO_CAP = 1 << 62


def _max_in_flight(p, a) -> int:
    """Largest sum of output bytes of collectives issued but not yet waited on, over the attempt."""
    events = [(a.at[c], p.alloc[c]) for c in a.comm_start]
    for w, c in enumerate(p.wait_of):
        if c >= 0:
            events.append((a.at[w], -p.alloc[c]))
    events.sort()
    cur = best = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best
