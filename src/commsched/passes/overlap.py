"""``overlap``: commsched's memory-budgeted latency-hiding scheduler (the default pass).

A list scheduler (:mod:`commsched.passes.overlap_list`) that runs the stream model (:mod:`commsched.sim.model`: one
compute stream, one FIFO comm stream per process group, sync, interference while collectives are in flight) while it
schedules. At every step it
  1. runs every wait whose collective is already over (free), unlocking its users (a collective among them then
     competes for the budget with those issuable already, by input position);
  2. issues each collective that is next in its group's order and whose inputs are done (so communication starts
     as early as the data and the FIFO allow), if it fits the memory guard;
  3. runs the best ready kernel that fits the budget, by the variant's priority (what feeds the earliest collective
     and the longest path to the end, the input order, or what feeds the busiest group's next collective);
  4. otherwise waits for the collective released first.
Then it *tightens* the result without changing its timing (:mod:`commsched.passes.overlap_orders`): each collective is
issued at the last point from which it still starts in time (its buffer is allocated later), and each wait runs at
the first point at which it costs nothing (the collective's inputs are released sooner).

Every group keeps its input collective order (SPMD-safe) unless ``reorder_collectives`` is set, in which case the
order within each group is rebuilt by Jackson's rule (start the released collective whose result is needed first;
:mod:`commsched.passes.overlap_chains`) from a first attempt's timing, then from a "nearest" attempt's (what issues a
collective soonest runs first) — deterministic in (graph, costs), so every rank that has the same costs (aligned
estimates) makes the same choice, the condition torch's own scheduler relies on too.

The simulator judges: every candidate is checked with the full memory model and simulated with the full simulator
(link sharing, interference). The budget is hard: a variant over budget is retried with what it produced early
across its peak moved past it, and, while its step beats the best order that fits, with its memory guard's budget
lowered by the overshoot (the guard's memory account can miss the simulated peak by a little). The best order
that fits and simulates no worse than the input wins; otherwise the input order is returned, or a
ScheduleError raised if even that breaks a byte budget. Stats list every attempt.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from commsched.ir import Graph
from commsched.passes.budget import MemoryBudget
from commsched.passes.check import ScheduleError
from commsched.passes.overlap_chains import consistent_chains, earlier_placements, jackson_chains, promote_unwaited
from commsched.passes.overlap_list import Attempt, Priority, schedule_once
from commsched.passes.overlap_orders import delay_past_peak, late_waits, tighten
from commsched.passes.overlap_prep import GraphPrep, Prep, input_chains, prepare, prepare_graph
from commsched.passes.registry import PassConfig, PassContext, PassResult, PassStats, register_pass
from commsched.sim import SimResult, simulate_costs


@dataclass(frozen=True, kw_only=True)
class OverlapConfig(PassConfig):
    """Knobs of the ``overlap`` pass."""

    memory_budget: MemoryBudget = MemoryBudget(ratio=1.05)
    """hard peak-memory budget: a multiple of the input order's peak and / or bytes (the smaller applies)"""
    reorder_collectives: bool = False
    """let each group's collective order change (Jackson's rule; needs the same costs on every rank)"""
    variants: tuple[tuple[Priority, bool], ...] = (
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
    jackson_also_from: tuple[Priority, ...] = ("nearest",)
    """with reorder_collectives: priorities whose attempt in the input collective order Jackson's rule also learns
    from (one round, scheduled with that priority). The due dates are the attempt's: where one chunk's norm
    waits behind the other chunk's matmuls, its all_gather looks due late and the rule keeps the chunks in lock step
    (llama3-8b TP+SP prefill split in two chunks: 7.09 ms from the "feeds" attempt, 6.50 ms from "nearest")"""
    jackson_also_within: float = 0.05
    """learn from such an attempt only when its step is within this fraction of the best order's so far (a pruning
    rule: on the zoo steps every order this learner improved came from an attempt 1.00-1.035 x the best)"""
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
    budget_retries: int = 2
    """per variant with the memory guard that breaks the budget with a step faster than the best order that fits:
    times it is scheduled again with the guard's budget lowered by the overshoot (the guard plans with the list
    scheduler's memory account, which can miss the simulated peak by a little: llama3-70b FSDP+TP+SP at 256 ranks,
    batch 16, fused costs: "feeds" 15.03 s, 0.12 % over budget, fits at the same time when retried, where the best
    order that fit took 16.21 s)"""


def _budget(cfg: OverlapConfig, base_peak: int) -> int:
    return cfg.memory_budget.limit_bytes(base_peak)


@dataclass
class Candidate:
    """An order the search simulated, and what made it (to learn from, or to move its waits late)."""

    label: str
    order: list[int]
    makespan_ns: int
    peak_bytes: int
    reorders_collectives: bool = False
    prep: Prep | None = None
    attempt: Attempt | None = None
    sim: SimResult | None = None
    variant: tuple[str, bool] | None = None


class _Search:
    """One run of the pass: the budget, every order simulated (by content), the best that fits, the stats."""

    def __init__(self, g: Graph, order: np.ndarray, ctx: PassContext, cfg: OverlapConfig) -> None:
        self.g, self.costs, self.cfg = g, ctx.costs, cfg
        self.stats = PassStats("overlap")
        base = simulate_costs(g, ctx.costs, order)
        self.base_sim, self.base_peak = base, base.peak_memory_bytes
        self.budget = _budget(cfg, base.peak_memory_bytes)
        self.best = Candidate("input order", order.tolist(), base.makespan_ns, base.peak_memory_bytes)
        self.seen: dict[tuple[int, ...], tuple[int, int]] = {}  # order -> (makespan, peak)
        self.attempts = 0

    @functools.cached_property
    def good_enough_ns(self) -> float:
        """A schedule within ``stop_within_bound`` of the lower bound cannot improve much: stop searching. (Read
        only when there is a next step to stop: a one-attempt search never computes the bound.)"""
        return self.base_sim.lower_bound_s * 1e9 * (1.0 + self.cfg.stop_within_bound)

    @property
    def done(self) -> bool:
        return self.best.makespan_ns <= self.good_enough_ns

    def evaluate(self, cand: Candidate) -> tuple[bool, SimResult | None]:
        """Simulate ``cand`` (once per distinct order) and keep it if it is the best that fits. Returns (fits, its
        simulation; None when the order was seen before)."""
        self.attempts += 1
        key = tuple(cand.order)
        if key in self.seen:
            return self.seen[key][1] <= self.budget, None
        # judged by the full simulator (link sharing, interference) and the full memory model
        res = simulate_costs(self.g, self.costs, np.asarray(cand.order, np.int32))
        cand.makespan_ns, cand.peak_bytes, cand.sim = res.makespan_ns, res.peak_memory_bytes, res
        self.seen[key] = (res.makespan_ns, res.peak_memory_bytes)
        fits = res.peak_memory_bytes <= self.budget
        row = {"attempt": cand.label, "makespan_s": res.makespan_s, "peak_bytes": res.peak_memory_bytes, "fits": fits}
        self.stats.rows.append(row)
        if fits and (cand.makespan_ns, cand.peak_bytes) < (self.best.makespan_ns, self.best.peak_bytes):
            self.best = cand
        if not fits:
            self.stats.refuse("memory budget")
        return fits, res

    def attempt(self, label: str, p: Prep, variant: tuple[str, bool], reorders: bool, nb=None, plan_budget=None):
        """One list-scheduling attempt (planned within ``plan_budget``, default the budget), tightened and evaluated:
        (attempt, fits, simulation)."""
        a = schedule_once(p, self.budget if plan_budget is None else plan_budget, nb, *variant)
        fits, res = self.evaluate(Candidate(label, tighten(p, a), 0, 0, reorders, p, a, None, variant))
        return a, fits, res

    def run(self, label: str, p: Prep, reorders: bool = False, variants=None) -> Attempt | None:
        """The variants in order until one fits (each followed by peak repairs when it does not) or the best is
        good enough. Returns the attempt to learn from (Jackson's rule)."""
        first = learn = None
        variants = variants or self.cfg.variants
        for k, (priority, guard) in enumerate(variants):
            name = f"{label}, {priority} priority{', memory guard' if guard else ''}"
            a, fits, res = self.attempt(name, p, (priority, guard), reorders)
            first = first or a
            if not fits and learn is None:  # repairs only until one variant fits: they cost several attempts each
                fits, a = self.repair_peak(name, p, (priority, guard), reorders, a, res)
            if not fits and guard:  # unguarded, the planner checks only what is live now: a lower budget rarely
                # moves the peak (on the zoo steps it never did), so only the guard's budget is lowered
                fits, a = self.lower_guard_budget(name, p, (priority, guard), reorders, a, res)
            # every variant is still tried (which priority wins depends on the graph: the simulator decides); the
            # first that fits is the one Jackson's rule learns from, as before
            if fits and learn is None:
                learn = a
            if k + 1 < len(variants) and self.done:
                break
        return learn or first

    def repair_peak(self, name: str, p: Prep, variant, reorders: bool, a: Attempt, res) -> tuple[bool, Attempt]:
        """Move what was produced early across the peak past it, a few times: prefetched collectives first (just
        enough, the latest-used first), compute run ahead only when no collective is left to move. Returns whether
        an attempt fit, and the last attempt."""
        nb: dict[int, int] = {}
        for k in range(self.cfg.max_peak_repairs):
            if res is None or self.done:
                return False, a
            cand = tighten(p, a)
            excess = (res.peak_memory_bytes - self.budget) * 5 // 4
            peak_at = res.memory.peak_position
            moved = delay_past_peak(self.g, p, a, cand, peak_at, nb, include_compute=False, excess_bytes=excess)
            if moved is None:
                moved = delay_past_peak(self.g, p, a, cand, peak_at, nb, excess_bytes=excess)
            if moved is None:
                return False, a
            nb = moved
            a, fits, res = self.attempt(f"{name}, {k + 1} peak repair(s)", p, variant, reorders, nb)
            if fits:
                return True, a
        return False, a

    def lower_guard_budget(self, name: str, p: Prep, variant, reorders: bool, a: Attempt, res) -> tuple[bool, Attempt]:
        """Schedule the variant again within a budget lowered by its simulated overshoot (a quarter more), up to
        ``budget_retries`` times, while its step stays faster than the best order that fits (only then can it win)
        and its peak keeps falling. ``res``: the variant's first simulation. Returns whether an attempt fit, and the
        last attempt."""
        plan_budget = self.budget
        for k in range(self.cfg.budget_retries):
            if res is None or self.done or res.makespan_ns >= self.best.makespan_ns:
                break
            excess = res.peak_memory_bytes - self.budget
            plan_budget -= excess + excess // 4
            if plan_budget <= 0:
                break
            a, fits, res_k = self.attempt(f"{name}, {k + 1} lowered budget(s)", p, variant, reorders, None, plan_budget)
            if fits:
                return True, a
            if res_k is None or res_k.peak_memory_bytes >= res.peak_memory_bytes:
                break  # an order seen before, or the peak did not fall: the guard does not bind at the peak
            res = res_k
        return False, a

    def reorder_collectives(self, gp, learn: Attempt | None, p: Prep) -> None:
        """Rebuild each group's collective order: Jackson rounds (from the first attempt that fit, then from each
        ``jackson_also_from`` priority's attempt), unwaited collectives promoted, the most exposed collective moved
        earlier; each kept only if the simulated step got faster."""
        g, cfg = self.g, self.cfg
        self.jackson_rounds(gp, learn, p, "Jackson collective order")
        for priority in cfg.jackson_also_from:
            if self.done:
                break
            a, _, res = self.attempt(f"input collective order, {priority} priority", p, (priority, False), False)
            if res is None or res.makespan_ns > (1.0 + cfg.jackson_also_within) * self.best.makespan_ns:
                continue  # an order already made, or one far slower than the best: the round is skipped (pruning)
            label = f"Jackson collective order learned from {priority} priority"
            self.jackson_rounds(gp, a, p, label, [(priority, False)], rounds=1)
        if self.best.prep is not None and not self.done:
            promoted = promote_unwaited(g, self.best.prep, self.best.attempt)
            if promoted is not None:
                moved = _prepare_consistent(gp, promoted)
                self.run("Jackson collective order, unwaited collectives promoted", moved, True)
        for _ in range(cfg.exposed_moves):
            if self.best.prep is None or self.done:
                break
            before = self.best.makespan_ns
            variant = [self.best.variant]  # the variant that made the best order: the others rarely win here
            for label, chains in earlier_placements(g, self.best.prep, self.best.sim):
                try:
                    moved = prepare(gp, chains)
                except RuntimeError:  # it would have to start before a collective it depends on
                    continue
                self.run(f"Jackson collective order, {label}", moved, True, variant)
            if self.best.makespan_ns >= before:
                break

    def jackson_rounds(self, gp, learn: Attempt | None, p: Prep, label: str, variants=None, rounds=None) -> None:
        """``rounds`` (default ``jackson_rounds``) rounds of Jackson's rule, the first learning from ``learn``'s
        timing, each next one from the attempt the previous round's order gave."""
        for r in range(self.cfg.jackson_rounds if rounds is None else rounds):
            if learn is None or self.done:
                break
            p = _prepare_consistent(gp, jackson_chains(self.g, p, learn))
            learn = self.run(f"{label} (round {r + 1})", p, True, variants)

    def late_waits(self) -> None:
        """Waits just before their first use, kept when the model predicts no loss: the same time with more
        memory, but a collective slower than predicted then stalls compute only where its result is needed."""
        best = self.best
        late = late_waits(best.prep, best.order)
        if late == best.order:
            return
        cand = Candidate(f"{best.label}, late waits", late, 0, 0, best.reorders_collectives, best.prep)
        if self.evaluate(cand)[0]:
            late_ns, late_peak = self.seen[tuple(late)]
            if late_ns <= best.makespan_ns:
                cand.makespan_ns, cand.peak_bytes = late_ns, late_peak
                self.best = cand


def _prepare_consistent(gp: GraphPrep, chains: dict[int, list[int]]) -> Prep:
    """:func:`prepare` for rebuilt collective orders; orders that cross a dependency (each group's order is built on
    its own) are first made consistent with the graph (:func:`consistent_chains`)."""
    try:
        return prepare(gp, chains)
    except RuntimeError:
        return prepare(gp, consistent_chains(gp, chains))


@register_pass("overlap", OverlapConfig)
def overlap(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Memory-budgeted latency hiding: collectives issued as early as data, FIFO and a future-aware memory guard
    allow (and no earlier than their stream can start them), waits at the first moment they cost nothing, compute
    that feeds communication first; per-group collective order kept unless reordering is allowed; hard memory
    budget; never worse than the input. O((N+E) log N) per attempt, a handful of attempts."""
    cfg: OverlapConfig = ctx.config  # type: ignore[assignment]
    search = _Search(g, order, ctx, cfg)
    gp = prepare_graph(g, order, ctx.costs, ctx.extra_src, ctx.extra_dst)
    p = prepare(gp, input_chains(g, order))
    learn = search.run("input collective order", p)
    if cfg.reorder_collectives:
        search.reorder_collectives(gp, learn, p)
    if cfg.waits == "late" and search.best.prep is not None:
        search.late_waits()
    best = search.best
    if best.peak_bytes > search.budget:
        raise ScheduleError(
            f"overlap: no order found within the memory budget of {search.budget} bytes; the input order peaks at "
            f"{search.base_peak} bytes (raise the memory_budget knob)"
        )
    search.stats.notes.append(
        f"budget {search.budget} B (input peak {search.base_peak} B); chose {best.label}: "
        f"{best.makespan_ns / 1e9:.6f} s vs input {search.base_sim.makespan_s:.6f} s, peak {best.peak_bytes} B, "
        f"{search.attempts} attempt(s)"
    )
    return PassResult(np.asarray(best.order, np.int32), search.stats, reorders_collectives=best.reorders_collectives)
