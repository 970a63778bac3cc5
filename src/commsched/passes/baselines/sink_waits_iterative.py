"""``sink_waits_iterative``: move each wait later, one swap at a time, without growing the peak past the budget.

Waits are processed right to left. A wait swaps with the node just after it; a node that depends on the moving group
(or a collective meeting a group that holds one) joins the group when groupable: not a wait, not an async collective,
and, without runtime estimations, neither a collective nor gemm-like. The move stops at, in order:
``unexposed by runtime estimations``, ``async collective`` (the next node issues a collective: the space before the
next collective is what bucketing should create), ``collective ordering``, ``data dependency``, ``wait exposure`` /
``collectives exposure`` (with runtime estimations), and ``peak memory``. O(k) per swap with incremental memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph
from commsched.memory import IncrementalMemory
from commsched.passes.baselines.iterative_common import (
    MovingOrder,
    RuntimeMultipliers,
    coll_exposure,
    make_view,
    wait_exposure,
)
from commsched.passes.registry import PassContext, PassResult, PassStats, register_pass


@dataclass(frozen=True, kw_only=True)
class SinkWaitsConfig(RuntimeMultipliers):
    """Knobs (torch 2.13 ``config_comms`` ``sink_*`` names; torch's defaults except the SPMD-safe ordering)."""

    sink_peak_memory_budget: float = 0.2
    """allowed peak-memory increase as a fraction of the input order's peak (sink_iterative_peak_memory_budget)"""
    sink_extra_comm_comp_overlap: float = 0.5
    """with runtime estimations: stop once compute covers (1 + this) x the collective's time"""
    sink_use_runtime_estimations: bool = False
    """stop once hidden; weigh the exposure of the waited collective and of grouped collectives"""
    sink_unsafe_collectives_reorder: bool = False
    """let a group holding a collective pass another collective (torch defaults to True; we keep SPMD order)"""
    sink_swap_with_collectives: bool = False
    """let a wait move past an async collective (sink_waits_iterative_swap_with_collectives)"""


@register_pass("sink_waits_iterative", SinkWaitsConfig)
def sink_waits_iterative(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Move each wait later by swaps with its successor (grouping what depends on it), stopping at collectives,
    data dependencies, exposure or peak-memory limits. Peak never exceeds (1 + budget) x input peak."""
    cfg: SinkWaitsConfig = ctx.config  # type: ignore[assignment]
    v = make_view(g, ctx, cfg.comm_runtime_mult, cfg.non_comm_runtime_mult)
    mo = MovingOrder(order)
    mem = IncrementalMemory(g, order)
    base_peak = mem.peak_bytes
    limit = base_peak + int(base_peak * cfg.sink_peak_memory_budget)
    stats = PassStats("sink_waits_iterative")
    waits = [w for w in order.tolist()[::-1] if v.is_wait[w]]
    for curr in waits:
        comm_time, comp_time = wait_exposure(v, mo, curr)
        row = {
            "wait": g.names[curr],
            "collective": g.names[v.wait_of[curr]],
            "comm_time_s": comm_time,
            "comp_time_s": comp_time,
            "initial_exposed_s": comm_time - comp_time,
            "final_exposed_s": comm_time - comp_time,
            "limiting_factor": "none",
            "moves": 0,
            "grouped": 0,
            "grouped_info": "",
        }
        stats.rows.append(row)
        group = [curr]
        group_set = {curr}
        group_has_coll = v.is_coll[curr]
        group_colls: dict[int, tuple[float, float]] = {}
        group_runtime = 0.0
        candidate = mo.next(curr)
        while candidate is not None and not v.is_boundary[candidate]:
            exposed = comm_time - comp_time
            if cfg.sink_use_runtime_estimations and exposed < -cfg.sink_extra_comm_comp_overlap * comm_time:
                row["limiting_factor"] = "unexposed by runtime estimations"
                break
            data_dep = any(p in group_set for p in v.preds[candidate])
            if not cfg.sink_swap_with_collectives and v.is_async_coll[candidate]:
                row["limiting_factor"] = "async collective"
                break
            both_comms = group_has_coll and v.is_coll[candidate]
            if data_dep or both_comms:
                groupable = not v.is_wait[candidate] and not v.is_async_coll[candidate]
                if not cfg.sink_use_runtime_estimations:
                    groupable = groupable and not v.is_coll[candidate] and not v.is_gemm_like[candidate]
                if groupable:
                    group.append(candidate)
                    group_set.add(candidate)
                    group_has_coll = group_has_coll or v.is_coll[candidate]
                    if cfg.sink_use_runtime_estimations and v.is_coll[candidate]:
                        group_colls[candidate] = coll_exposure(v, mo, candidate)
                    if not v.is_async_coll[candidate]:
                        group_runtime += v.runtime[candidate]
                    row["grouped"] += 1
                    row["grouped_info"] += f"+{g.names[candidate]}"
                    candidate = mo.next(candidate)
                    continue
                if not data_dep and not cfg.sink_unsafe_collectives_reorder:
                    row["limiting_factor"] = "collective ordering"
                else:
                    row["limiting_factor"] = f"data dependency on {g.names[candidate]}"
                break
            c_runtime = v.runtime[candidate]
            if cfg.sink_use_runtime_estimations:
                if v.is_wait[candidate]:
                    w_comm, w_comp = wait_exposure(v, mo, candidate)
                    if max(0.0, w_comm - w_comp + group_runtime) > max(0.0, w_comm - w_comp):
                        row["limiting_factor"] = "wait exposure"
                        break
                if not v.is_async_coll[candidate] and c_runtime > 0 and group_colls:
                    delta = max(0.0, exposed) - max(0.0, exposed - c_runtime)
                    for c_comm, c_comp in group_colls.values():
                        delta += max(0.0, c_comm - c_comp) - max(0.0, c_comm - c_comp + c_runtime)
                    if delta > 0:
                        row["limiting_factor"] = "collectives exposure"
                        break
                    group_colls = {c: (cc, cp - c_runtime) for c, (cc, cp) in group_colls.items()}
            new_pos = mo.pos[group[0]]
            if mem.potential_peak_after_move(candidate, new_pos) > limit:
                row["limiting_factor"] = "peak memory"
                break
            mem.apply_move(candidate, new_pos)
            mo.rotate(new_pos, new_pos + len(group) + 1, [candidate, *group])
            row["moves"] += 1
            if not v.is_coll[candidate]:
                comp_time += c_runtime
            row["comp_time_s"] = comp_time
            row["final_exposed_s"] = comm_time - comp_time
            candidate = mo.next(group[-1])
        if row["limiting_factor"] == "none":
            row["limiting_factor"] = "end of graph"
        stats.refuse(row["limiting_factor"].split(" on ")[0])
    stats.notes.append(f"peak memory {base_peak} -> {mem.peak_bytes} bytes (limit {limit})")
    return PassResult(np.asarray(mo.order, np.int32), stats, reorders_collectives=cfg.sink_unsafe_collectives_reorder)
