"""``reorder_communication_preserving_peak_memory``: move each async collective earlier, one swap at a time,
until something stops it; the peak memory never grows past the budget.

For each async collective, left to right, the pass swaps it with the node just before it. A node it depends on
(directly or through the group) joins a *group* that moves with it, when groupable. The move stops at, in order:
``unexposed by runtime estimations`` (with ``use_runtime_estimations``: compute already covers the collective plus
``extra_comm_comp_overlap`` of it), ``collective ordering`` (another collective, unless
``unsafe_collectives_reorder``), ``data dependency`` (a predecessor that cannot be grouped), ``waits exposure`` /
``collective exposure`` (with runtime estimations: the swap would expose grouped waits or the other collective more
than it hides), and ``peak memory`` (the peak would exceed the input peak by more than ``peak_memory_budget``).
Peak memory is tracked incrementally (``commsched.memory.IncrementalMemory``), exposure incrementally; each swap
costs O(group size), and with collective ordering kept every node is passed by at most one collective: O(N + E) swaps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph
from commsched.memory import IncrementalMemory, liveness
from commsched.passes.baselines.iterative_common import (
    MovingOrder,
    RuntimeMultipliers,
    coll_exposure,
    make_view,
    wait_exposure,
)
from commsched.passes.registry import PassContext, PassResult, PassStats, register_pass


@dataclass(frozen=True, kw_only=True)
class ReorderConfig(RuntimeMultipliers):
    """Knobs (torch 2.13 ``config_comms`` names without the ``reorder_iterative_`` prefix; torch's defaults)."""

    peak_memory_budget: float = 0.2
    """allowed peak-memory increase as a fraction of the input order's peak"""
    extra_comm_comp_overlap: float = 0.5
    """with runtime estimations: keep moving until compute covers (1 + this) x the collective's time"""
    use_runtime_estimations: bool = False
    """stop once the collective is hidden, and weigh the exposure of grouped waits; allows grouping gemm-like ops"""
    unsafe_collectives_reorder: bool = False
    """let a collective pass another one (torch defaults to True with rank-aligned estimates; we keep SPMD order)"""
    group_with_collectives: bool = False
    """allow a dependent async collective to join the moving group"""
    jump_plain_runs: bool = True
    """pass runs of plain nodes in one jump (the same order and stats as one swap at a time, without the quadratic
    cost); False swaps one node at a time, as the seed does"""


@register_pass("reorder_communication_preserving_peak_memory", ReorderConfig)
def reorder_communication_preserving_peak_memory(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Move each async collective earlier by swaps with its predecessor (grouping what it depends on), stopping at
    ordering, data dependency, exposure or peak-memory limits. Peak never exceeds (1 + budget) x input peak."""
    cfg: ReorderConfig = ctx.config  # type: ignore[assignment]
    v = make_view(g, ctx, cfg.comm_runtime_mult, cfg.non_comm_runtime_mult)
    mo = MovingOrder(order)
    mem = IncrementalMemory(g, order)
    base_peak = mem.peak_bytes
    limit = base_peak + int(base_peak * cfg.peak_memory_budget)
    stats = PassStats("reorder_communication_preserving_peak_memory")
    lv = liveness(g)
    sp, si = lv.node_storage_ptr.tolist(), lv.node_storage_idx.tolist()
    uses = [si[sp[i] : sp[i + 1]] for i in range(len(g))]
    alloc = lv.alloc_bytes.tolist()
    collectives = [c for c in order.tolist() if v.is_async_coll[c]]
    for curr in collectives:
        comm_time, comp_time = coll_exposure(v, mo, curr)
        row = {
            "collective": g.names[curr],
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
        group = [curr]  # contiguous in the order, group[0] first
        in_group = {curr}
        group_preds: set[int] = set(v.preds[curr])
        group_waits: dict[int, tuple[float, float]] = {}
        group_runtime = 0.0
        group_storages: set[int] = set(uses[curr])
        candidate = mo.prev(curr)
        while candidate is not None and not v.is_boundary[candidate]:
            if not group_waits and cfg.jump_plain_runs:
                # fast path: jump over a run of plain nodes at once (same result as swapping one at a time)
                passed, stop, comp_time = _plain_run(
                    v, mo, mem, uses, alloc, group, group_preds, group_storages, limit, cfg, comm_time, comp_time
                )
                if passed:
                    new_pos = mo.pos[group[0]] - passed
                    nodes = [*group, *mo.order[new_pos : mo.pos[group[0]]]]
                    mem.apply_move(group, new_pos)
                    mo.rotate(new_pos, new_pos + len(nodes), nodes)
                    row["moves"] += passed
                    row["comp_time_s"] = comp_time
                    row["final_exposed_s"] = comm_time - comp_time
                if stop:
                    row["limiting_factor"] = stop
                    break
                candidate = mo.prev(group[0])
                if candidate is None or v.is_boundary[candidate]:
                    break
            exposed = comm_time - comp_time
            if cfg.use_runtime_estimations and exposed < -cfg.extra_comm_comp_overlap * comm_time:
                row["limiting_factor"] = "unexposed by runtime estimations"
                break
            if not cfg.unsafe_collectives_reorder and v.is_coll[candidate]:
                row["limiting_factor"] = "collective ordering"
                break
            if candidate in group_preds:
                groupable = (cfg.group_with_collectives or not v.is_async_coll[candidate]) and (
                    cfg.use_runtime_estimations or not v.is_gemm_like[candidate]
                )
                if not groupable:
                    row["limiting_factor"] = f"data dependency on {g.names[candidate]}"
                    break
                group.insert(0, candidate)
                in_group.add(candidate)
                group_preds.update(v.preds[candidate])
                group_storages.update(uses[candidate])
                if cfg.use_runtime_estimations and v.is_wait[candidate]:
                    group_waits[candidate] = wait_exposure(v, mo, candidate)
                if not v.is_async_coll[candidate]:
                    group_runtime += v.runtime[candidate]
                row["grouped"] += 1
                row["grouped_info"] += f"+{g.names[candidate]}"
                candidate = mo.prev(candidate)
                continue
            c_runtime = v.runtime[candidate]
            if cfg.use_runtime_estimations:
                if not v.is_async_coll[candidate]:
                    if c_runtime > 0 and group_waits:
                        delta = max(0.0, exposed - c_runtime) - max(0.0, exposed)
                        for w_comm, w_comp in group_waits.values():
                            delta += max(0.0, w_comm - w_comp + c_runtime) - max(0.0, w_comm - w_comp)
                        if delta > 0:
                            row["limiting_factor"] = "waits exposure"
                            break
                        group_waits = {w: (wc, wp - c_runtime) for w, (wc, wp) in group_waits.items()}
                elif group_runtime > 0:
                    c_comm, c_comp = coll_exposure(v, mo, candidate)
                    if max(0.0, c_comm - c_comp + group_runtime) > max(0.0, c_comm - c_comp):
                        row["limiting_factor"] = "collective exposure"
                        break
            new_pos = mo.pos[candidate]
            if mem.potential_peak_after_move(group, new_pos) > limit:
                row["limiting_factor"] = "peak memory"
                break
            mem.apply_move(group, new_pos)
            mo.rotate(new_pos, new_pos + len(group) + 1, [*group, candidate])
            row["moves"] += 1
            if not v.is_coll[candidate]:
                comp_time += c_runtime
            row["comp_time_s"] = comp_time
            row["final_exposed_s"] = comm_time - comp_time
            candidate = mo.prev(group[0])
        if row["limiting_factor"] == "none":
            row["limiting_factor"] = "start of graph"
        stats.refuse(row["limiting_factor"].split(" on ")[0])
    stats.notes.append(f"peak memory {base_peak} -> {mem.peak_bytes} bytes (limit {limit})")
    return PassResult(np.asarray(mo.order, np.int32), stats, reorders_collectives=cfg.unsafe_collectives_reorder)


def _plain_run(v, mo, mem, uses, alloc, group, group_preds, group_storages, limit, cfg, comm_time, comp_time):
    """How many nodes right before ``group`` it can pass in one jump, and why it stopped (None: the next node needs
    the one-swap path). A plain node is no collective, not a predecessor of the group and shares no storage with it,
    so passing it changes only the memory around it by the group's net allocation; the peak outside the window is
    unchanged (and within the limit), so each step's check reduces to the window's maximum. O(run length)."""
    pos0 = mo.pos[group[0]]
    before_g = mem.memory_at(pos0) - alloc[group[0]]
    nxt = pos0 + len(group)
    after_g = mem.memory_at(nxt) - alloc[mo.order[nxt]] if nxt < len(mo.order) else before_g
    net = after_g - before_g
    max_cum = max(mem.memory_at(mo.pos[x]) for x in group) - before_g
    passed = 0
    run_max = None
    p = pos0 - 1
    while p >= 0:
        x = mo.order[p]
        if v.is_boundary[x] or v.is_coll[x] or x in group_preds or group_storages.intersection(uses[x]):
            return passed, None, comp_time
        if cfg.use_runtime_estimations and comm_time - comp_time < -cfg.extra_comm_comp_overlap * comm_time:
            return passed, "unexposed by runtime estimations", comp_time
        cx = mem.memory_at(p)
        run_max = cx if run_max is None or cx > run_max else run_max
        if max(cx - alloc[x] + max_cum, run_max + net) > limit:
            return passed, "peak memory", comp_time
        passed += 1
        comp_time += v.runtime[x]
        p -= 1
    return passed, None, comp_time
