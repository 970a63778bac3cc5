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
from commsched.passes.overlap_core import input_chains, jackson_chains, prepare, schedule_once, tighten
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
    max_attempts: int = 6
    """list-scheduling attempts at most (the first is unconstrained; later ones shrink the in-flight cap)"""


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
    """Memory-budgeted latency hiding: collectives issued as early as data and FIFO allow (and no earlier than their
    stream can start them), waits at the first moment they cost nothing, compute that feeds communication first;
    per-group collective order kept; hard memory budget; never worse than the input. O((N+E) log N) per attempt."""
    cfg: OverlapConfig = ctx.config  # type: ignore[assignment]
    stats = PassStats("overlap")
    base_sim = simulate_costs(g, ctx.costs, order)
    base_peak = base_sim.peak_memory_bytes
    budget = _budget(cfg, base_peak)
    best = (base_sim.makespan_ns, base_peak, order.tolist(), "input order")
    chain_sets = [("input collective order", input_chains(g, order))]
    attempts = 0
    seen: set[tuple[int, ...]] = set()
    while chain_sets and attempts < cfg.max_attempts:
        label, chains = chain_sets.pop(0)
        p = prepare(g, order, ctx.costs, chains, ctx.extra_src, ctx.extra_dst)
        cap = 1 << 62
        while attempts < cfg.max_attempts:
            attempts += 1
            a = schedule_once(p, budget, cap)
            cand = tighten(p, a)
            key = tuple(cand)
            if key in seen:
                break
            seen.add(key)
            res = simulate_costs(g, ctx.costs, np.asarray(cand, np.int32))
            fits = res.peak_memory_bytes <= budget
            cap_label = "no cap" if cap >= 1 << 62 else f"in-flight cap {cap} B"
            stats.rows.append(
                {"attempt": f"{label}, {cap_label}", "makespan_s": res.makespan_s, "peak_bytes": res.peak_memory_bytes,
                 "fits": fits}
            )
            if fits and (res.makespan_ns, res.peak_memory_bytes) < best[:2]:
                best = (res.makespan_ns, res.peak_memory_bytes, cand, f"{label}, {cap_label}")
            if cfg.reorder_collectives and label == "input collective order" and cap >= 1 << 62:
                chain_sets.append(("Jackson collective order", jackson_chains(g, p, a)))
            if fits:
                break
            stats.refuse("memory budget")
            # shrink the bytes in flight by the excess at the peak (at least halving), then retry
            excess = res.peak_memory_bytes - budget
            in_flight_peak = max(1, min(cap, _max_in_flight(p, a)))
            cap = max(0, min(in_flight_peak // 2, in_flight_peak - excess))
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
    reordered = label.startswith("Jackson")
    return PassResult(np.asarray(chosen, np.int32), stats, reorders_collectives=reordered)


def _max_in_flight(p, a) -> int:
    """Largest sum of output bytes of collectives issued but not yet waited on, over the attempt."""
    events = []
    for c, s in a.comm_start.items():
        events.append((a.at[c], p.alloc[c]))
    for w, c in enumerate(p.wait_of):
        if c >= 0:
            events.append((a.at[w], -p.alloc[c]))
    events.sort()
    cur = best = 0
    seen_wait: set[int] = set()
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    del seen_wait
    return best
