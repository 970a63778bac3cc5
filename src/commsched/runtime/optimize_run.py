"""The ``optimize`` variant of a real run: the program :func:`commsched.optimize` keeps, built on every rank.

SPMD: every rank must run the same program. The other variants are orders, planned once on rank 0 and broadcast by
node name; a rewritten program cannot travel that way (its nodes hold each rank's own constants and process
groups), so every rank runs the same deterministic search on its own traced step (the analytic costs of the run's
hardware profile, the run's memory rule, no measured time), and the ranks then check that they kept the same
program, node for node, before anything runs. Its new collectives and ops are calibrated like the traced step's,
so that its prediction uses the same cost sources as the other variants'.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.fx

from commsched.ir import Graph
from commsched.passes.budget import MemoryBudget
from commsched.report.run_report import OutputCheck, ProgramChange
from commsched.runtime.apply import check_same_graph
from commsched.runtime.numerics import OutputDiff, merged_reductions, reduction_dtypes, reduction_ranks, reduction_rtol

Rows = list[tuple[str, int, int, float]]


@dataclasses.dataclass
class OptimizedRun:
    """This rank's optimized program and what was measured of it (rank 0 predicts from it)."""

    optimized: Any
    """the :class:`commsched.optimize.Optimized` (``gm``: the module that runs, in its final order)"""
    rows: Rows
    """link calibration of its collectives that the traced step does not have"""
    op_times_s: dict[str, float]
    """median over ranks of the op times of its nodes that the traced step does not have"""
    search_s: float
    rtol: float
    """0 (bit-identical expected) unless reductions were merged: :func:`reduction_rtol`"""
    merged_reductions: int

    def executed_names(self) -> list[str]:
        """Node names of the program in the order it runs."""
        o = self.optimized
        return [o.graph.names[i] for i in np.asarray(o.schedule.order).tolist()]

    def moved_nodes(self, traced: Graph) -> int:
        """Positions whose node is not the traced step's node there (a rewritten program counts its new nodes)."""
        names = self.executed_names()
        return sum(1 for i, n in enumerate(names) if i >= len(traced) or traced.names[i] != n)

    def change(self) -> ProgramChange:
        o = self.optimized
        return ProgramChange(
            kept=o.label,
            nodes=len(o.graph),
            collectives=len(o.graph.collectives),
            tried=len(o.tried),
            search_s=self.search_s,
        )

    def output_check(self, diff: OutputDiff) -> OutputCheck:
        return OutputCheck(
            expected="within tolerance" if self.rtol > 0 else "bit-identical",
            rtol=self.rtol,
            within=diff.within,
            max_abs_diff=diff.max_abs_diff,
            max_rel_diff=diff.max_rel_diff,
            merged_reductions=self.merged_reductions,
        )


def optimize_on_every_rank(
    gm: torch.fx.GraphModule, graph: Graph, hardware: str, memory_budget: MemoryBudget | None
) -> tuple[Any, float]:
    """(``commsched.optimize``'s result, its wall seconds) on this rank: called by every rank with the same
    arguments; raises on every rank when any rank's search failed or kept another program than rank 0's."""
    from commsched import hardware as hw_mod
    from commsched.optimize import optimize
    from commsched.runtime.plan import run_memory_budget

    t0 = time.perf_counter()
    failure: Exception | None = None
    optimized = None
    try:
        hw = hw_mod.for_graph(hardware, graph)
        budget = run_memory_budget(graph, memory_budget)
        # reorder_collectives: safe, as the ranks check below that they all kept the same program and order
        optimized = optimize(gm, hw, memory_budget=budget, group_sizes=graph.group_sizes(), reorder_collectives=True)
    except Exception as exc:  # every rank must reach the collective below, then all raise
        failure = exc
    failed = torch.tensor([0 if failure is None else 1])
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failure is not None:
        raise failure
    if failed.item():
        raise RuntimeError("commsched.optimize failed on another rank (its traceback says why)")
    search_s = time.perf_counter() - t0
    check_same_graph(optimized.gm, what=f"optimized program ({optimized.label})")
    return optimized, search_s


def build_optimized(
    gm: torch.fx.GraphModule,
    graph: Graph,
    cfg: Any,
    inputs: Sequence[torch.Tensor],
    rows: Rows,
    op_times_s: Mapping[str, float],
    device: torch.device,
) -> OptimizedRun:
    """Every rank: the optimized program of ``cfg`` (a RunConfig), checked the same on every rank, with its new
    collectives timed on the link (``rows``: the traced step's) and its new ops timed (``op_times_s``: the traced
    step's medians), the tolerance its outputs are compared with, and how many reductions it merged."""
    from commsched.rewrites.decompose_tp import TRANSFORM_META
    from commsched.runtime.measure import measure_graph_collectives, measure_op_times

    optimized, search_s = optimize_on_every_rank(gm, graph, cfg.hardware, cfg.memory_budget)
    og = optimized.graph
    known = {(k, s, b) for k, s, b, _ in rows}
    new_rows = measure_graph_collectives(optimized.gm, og, reps=cfg.calibrate_reps, device=device, skip=known)
    new_names = set(og.names) - set(op_times_s)
    mine: dict[str, float] = {}
    if new_names:  # ops the rewrite added (bucket copies, views): timed op by op like the traced step's
        measured = measure_op_times(optimized.gm, og, list(inputs), reps=cfg.op_reps, device=device)
        mine = {k: v for k, v in measured.items() if k in new_names}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    op_median = {k: statistics.median(d.get(k, v) for d in every) for k, v in mine.items()}
    merged = merged_reductions(graph, og)
    # a program transform splits matmuls: a GEMM over a row or column block may round otherwise than the whole one
    split = any(TRANSFORM_META in n.meta for n in optimized.gm.graph.nodes)
    rtol = reduction_rtol(reduction_dtypes(optimized.gm), reduction_ranks(og)) if merged or split else 0.0
    return OptimizedRun(optimized, new_rows, op_median, search_s, rtol, merged)
