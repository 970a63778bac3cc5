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
from typing import Literal

import numpy as np

from commsched.ir import Graph
from commsched.passes.budget import MemoryBudget
from commsched.passes.check import ScheduleError
from commsched.passes.overlap_chains import earlier_placements, jackson_chains, promote_unwaited
from commsched.passes.overlap_core import (
    delay_past_peak,
    input_chains,
    late_waits,
    prepare,
    prepare_graph,
    schedule_once,
    tighten,
)
from commsched.passes.registry import PassConfig, PassContext, PassResult, PassStats, register_pass
from commsched.sim import simulate_costs


@dataclass(frozen=True, kw_only=True)
class OverlapConfig(PassConfig):
    """Knobs of the ``overlap`` pass."""

    memory_budget: MemoryBudget = MemoryBudget(ratio=1.05)
    """hard peak-memory budget: a multiple of the input order's peak and / or bytes (the smaller applies)"""
    reorder_collectives: bool = False
    """let each group's collective order change (Jackson's rule; needs the same costs on every rank)"""
    variants: tuple[tuple[Literal["feeds", "feeders", "input"], bool], ...] = (
        ("feeds", False),
        ("feeders", True),
        ("input", True),
        ("feeds", True),
    )
    """(compute priority, future-aware memory guard) tried in order until one fits the budget: priority "feeds" runs
    what feeds the earliest collective first, "input" keeps the input order, "feeders" keeps it except that what is
    about to release a collective of the busiest group goes first"""
    stop_within_bound: float = 0.002
    """stop trying further variants once the best order is this close (relative) to the simulator's lower bound"""
    jackson_rounds: int = 2
    """with reorder_collectives: rounds of Jackson's rule, each learning from the previous round's timing"""
    exposed_moves: int = 2
    """with reorder_collectives: rounds of moving the most exposed collective earlier in its group's order (each
    tries a few distances and keeps the best; e.g. the embedding gradient's big reduce_scatter ahead of the last
    layer's, so the last layer's weight gradients overlap it instead of queueing ahead of it)"""
    waits: Literal["early", "late"] = "early"
    """where waits go: "early" (as soon as their collective is predicted done: its inputs are freed sooner) or
    "late" (just before the first use, when that fits the budget: a collective slower than predicted then stalls
    compute only where its result is needed; same predicted time)"""
    max_peak_repairs: int = 3
    """per variant that breaks the budget: times what was produced early across the peak is moved past it"""


def _budget(cfg: OverlapConfig, base_peak: int) -> int:
    return cfg.memory_budget.limit_bytes(base_peak)


@register_pass("overlap", OverlapConfig)
def overlap(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Memory-budgeted latency hiding: collectives issued as early as data, FIFO and a future-aware memory guard
    allow (and no earlier than their stream can start them), waits at the first moment they cost nothing, compute
    that feeds communication first; per-group collective order kept unless reordering is allowed; hard memory
    budget; never worse than the input. O((N+E) log N) per attempt, a handful of attempts."""
    cfg: OverlapConfig = ctx.config  # type: ignore[assignment]
    if cfg.waits not in ("early", "late"):
        raise ValueError(f"waits={cfg.waits!r}: expected 'early' or 'late'")
    stats = PassStats("overlap")
    base_sim = simulate_costs(g, ctx.costs, order)
    base_peak = base_sim.peak_memory_bytes
    budget = _budget(cfg, base_peak)
    best: list = [base_sim.makespan_ns, base_peak, order.tolist(), "input order"]
    seen: dict[tuple[int, ...], tuple[int, int]] = {}
    best_attempt: list = [None, None, None, None]  # (prep, attempt, simulation, variant) behind the best order
    attempts = 0

    def evaluate(label: str, p, a, variant=None, late=None) -> tuple[bool, object]:
        """Tighten, simulate and record one attempt (or the order ``late``); returns (fits, its simulation)."""
        nonlocal attempts
        attempts += 1
        cand = tighten(p, a) if late is None else late
        key = tuple(cand)
        if key in seen:
            _, peak = seen[key]
            return peak <= budget, None
        # judge with the full simulator (link sharing, interference) and the full memory model
        res = simulate_costs(g, ctx.costs, np.asarray(cand, np.int32))
        seen[key] = (res.makespan_ns, res.peak_memory_bytes)
        fits = res.peak_memory_bytes <= budget
        stats.rows.append(
            {"attempt": label, "makespan_s": res.makespan_s, "peak_bytes": res.peak_memory_bytes, "fits": fits}
        )
        if fits and (res.makespan_ns, res.peak_memory_bytes) < (best[0], best[1]):
            best[:] = [res.makespan_ns, res.peak_memory_bytes, cand, label]
            best_attempt[:] = [p, a, res, variant]
        if not fits:
            stats.refuse("memory budget")
        return fits, res

    def run(label: str, p, variants=None):
        """The variants in order until one fits, each followed by a few peak repairs (what was produced early across
        the peak moves past it) when it does not. Returns the attempt to learn from (Jackson's rule)."""
        first = None
        for priority, guard in variants or cfg.variants:
            name = f"{label}, {priority} priority{', memory guard' if guard else ''}"
            a = schedule_once(p, budget, _NO_CAP, priority=priority, guard=guard)
            fits, res = evaluate(name, p, a, (priority, guard))
            first = first or a
            nb: dict[int, int] = {}
            for k in range(cfg.max_peak_repairs):
                if fits or res is None or best[0] <= bound_ns:
                    break
                # move prefetched collectives past the peak first (just enough, the latest-used first); compute run
                # ahead only when no collective is left to move
                cand = tighten(p, a)
                excess = (res.peak_memory_bytes - budget) * 5 // 4
                peak_at = res.memory.peak_position
                nb2 = delay_past_peak(g, p, a, cand, peak_at, nb, include_compute=False, excess_bytes=excess)
                if nb2 is None:
                    nb2 = delay_past_peak(g, p, a, cand, peak_at, nb, excess_bytes=excess)
                if nb2 is None:
                    break
                nb = nb2
                a = schedule_once(p, budget, _NO_CAP, nb, priority, guard)
                fits, res = evaluate(f"{name}, {k + 1} peak repair(s)", p, a, (priority, guard))
            if fits or best[0] <= bound_ns:
                return a
        return first

    # a schedule within `stop_within_bound` of the lower bound cannot improve much: stop searching
    bound_ns = base_sim.lower_bound_s * 1e9 * (1.0 + cfg.stop_within_bound)
    gp = prepare_graph(g, order, ctx.costs, ctx.extra_src, ctx.extra_dst)
    p = prepare(gp, input_chains(g, order))
    learn = run("input collective order", p)
    if cfg.reorder_collectives:
        for r in range(cfg.jackson_rounds):
            if learn is None or best[0] <= bound_ns:
                break
            p = prepare(gp, jackson_chains(g, p, learn))
            learn = run(f"Jackson collective order (round {r + 1})", p)
        if best_attempt[0] is not None and best[0] > bound_ns:
            promoted = promote_unwaited(g, *best_attempt[:2])
            if promoted is not None:
                run("Jackson collective order, unwaited collectives promoted", prepare(gp, promoted))
        for _ in range(cfg.exposed_moves):
            if best_attempt[0] is None or best[0] <= bound_ns:
                break
            before = best[0]
            variant = [best_attempt[3]]  # the variant that made the best order: the others rarely win here
            for label, chains in earlier_placements(g, best_attempt[0], best_attempt[2]):
                try:
                    moved = prepare(gp, chains)
                except RuntimeError:  # it would have to start before a collective it depends on
                    continue
                run(f"Jackson collective order, {label}", moved, variant)
            if best[0] >= before:
                break
    if cfg.waits == "late" and best_attempt[0] is not None:
        late = late_waits(best_attempt[0], best[2])
        label = f"{best[3]}, late waits"
        if late != best[2] and evaluate(label, best_attempt[0], None, late=late)[0]:
            late_ns, late_peak = seen[tuple(late)]
            if late_ns <= best[0]:  # the same time in the model, more memory: worth it for robustness
                best[:] = [late_ns, late_peak, late, label]
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
