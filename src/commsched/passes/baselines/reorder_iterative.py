"""``reorder_communication_preserving_peak_memory``: move each async collective earlier, one swap at a time,
until something stops it; the peak memory never grows past the budget.

The policy over the skeleton in ``iterative_common``: async collectives move, left to right, towards the start of
the order. A node the group depends on (directly or through the group) joins the group when groupable: not an async
collective (unless ``group_with_collectives``) and, without runtime estimations, not gemm-like. The move stops at,
in order: ``unexposed by runtime estimations``, ``collective ordering`` (another collective, unless
``unsafe_collectives_reorder``), ``data dependency`` (a predecessor that cannot be grouped), ``waits exposure`` /
``collective exposure`` (with runtime estimations: the swap would expose grouped waits or the other collective more
than it hides), and ``peak memory`` (the peak would exceed ``memory_budget``). With collective ordering kept every
node is passed by at most one collective: O(N + E) swaps, and runs of plain nodes are passed in one jump.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph
from commsched.memory import liveness
from commsched.passes.baselines.iterative_common import IterativeConfig, IterativeSwaps, StopReasons
from commsched.passes.registry import PassContext, PassResult, register_pass


@dataclass(frozen=True, kw_only=True)
class ReorderConfig(IterativeConfig):
    """Knobs (torch 2.13 ``config_comms`` names without the ``reorder_iterative_`` prefix; torch's defaults)."""

    group_with_collectives: bool = False
    """allow a dependent async collective to join the moving group"""
    jump_plain_runs: bool = True
    """pass runs of plain nodes in one jump (the same order and stats as one swap at a time, without the quadratic
    cost); False swaps one node at a time, as the seed does"""


@register_pass("reorder_communication_preserving_peak_memory", ReorderConfig)
def reorder_communication_preserving_peak_memory(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Move each async collective earlier by swaps with its predecessor (grouping what it depends on), stopping at
    ordering, data dependency, exposure or peak-memory limits. Peak never exceeds ``memory_budget`` (default 1.2 x
    the input peak)."""
    return _RaiseCollectives(g, order, ctx).run()


class _RaiseCollectives(IterativeSwaps):
    cfg: ReorderConfig
    name, step = "reorder_communication_preserving_peak_memory", -1
    reasons = StopReasons(
        "start of graph", blocked="collective ordering", facing="collective exposure", tracked="waits exposure"
    )

    def __init__(self, g: Graph, order: np.ndarray, ctx: PassContext) -> None:
        super().__init__(g, order, ctx)
        lv = liveness(g)
        ptr, idx = lv.node_storage_ptr.tolist(), lv.node_storage_idx.tolist()
        self.uses = [idx[ptr[i] : ptr[i + 1]] for i in range(len(g))]  # storages each node touches
        self.alloc = lv.alloc_bytes.tolist()
        self.group_storages: set[int] = set()
        self.jumps = self.cfg.jump_plain_runs

    def nodes_to_move(self) -> list[int]:
        return [c for c in self.order.tolist() if self.view.is_async_coll[c]]

    def row_names(self, node: int) -> dict[str, str]:
        return {"collective": self.g.names[node]}

    def start_group(self, node: int) -> None:
        self.joiners = set(self.view.preds[node])
        self.group_storages = set(self.uses[node])

    def blocking(self) -> list[bool]:
        return [False] * len(self.g) if self.cfg.unsafe_collectives_reorder else self.view.is_coll

    def groupable(self, candidate: int) -> bool:
        v, cfg = self.view, self.cfg
        return (cfg.group_with_collectives or not v.is_async_coll[candidate]) and (
            cfg.use_runtime_estimations or not v.is_gemm_like[candidate]
        )

    def refusal(self, candidate: int) -> str:
        return f"data dependency on {self.g.names[candidate]}"

    def joined(self, candidate: int) -> None:
        self.joiners.update(self.view.preds[candidate])
        self.group_storages.update(self.uses[candidate])

    def tracks(self, node: int) -> bool:
        return self.view.is_wait[node]

    def faces(self, candidate: int) -> bool:
        return self.view.is_async_coll[candidate]

    def jump(self, candidate: int) -> tuple[str | None, int | None]:
        """Pass the run of plain nodes right before the group in one move (the same order and stats as one swap at
        a time)."""
        if (
            self.view.is_coll[candidate]
            or candidate in self.joiners
            or self.group_storages.intersection(self.uses[candidate])
        ):
            return None, candidate  # no plain node to pass (the common case, kept cheap): the one-swap rules decide
        passed, refusal = self._plain_run()
        if passed:
            mo, group = self.moving, self.group
            new_pos = mo.pos[group[0]] - passed
            nodes = [*group, *mo.order[new_pos : mo.pos[group[0]]]]
            self.memory.apply_move(group, new_pos)
            mo.rotate(new_pos, new_pos + len(nodes), nodes)
            self.row["moves"] += passed
            self.row["comp_time_s"] = self.comp_time_s
            self.row["final_exposed_s"] = self.comm_time_s - self.comp_time_s
            candidate = self.neighbour()
        return refusal, candidate

    def _plain_run(self) -> tuple[int, str | None]:
        """How many nodes right before the group it can pass in one jump, and why it stopped (None: the next node
        needs the one-swap path); adds their compute to ``comp_time_s``. A plain node is no collective, not a
        predecessor of the group and shares no storage with it, so passing it changes only the memory around it by
        the group's net allocation; the peak outside the window is unchanged (and within the limit), so each
        step's check reduces to the window's maximum. O(run length)."""
        v, mo, mem, alloc, group, cfg = self.view, self.moving, self.memory, self.alloc, self.group, self.cfg
        joiners, storages, uses, limit = self.joiners, self.group_storages, self.uses, self.limit_bytes  # hot loop
        comm_time, comp_time = self.comm_time_s, self.comp_time_s
        pos0 = mo.pos[group[0]]
        before_group = mem.memory_at(pos0) - alloc[group[0]]
        after = pos0 + len(group)
        after_group = mem.memory_at(after) - alloc[mo.order[after]] if after < len(mo.order) else before_group
        net = after_group - before_group
        max_cumulative = max(mem.memory_at(mo.pos[x]) for x in group) - before_group
        passed, refusal = 0, None
        run_max = None
        p = pos0 - 1
        while p >= 0:
            x = mo.order[p]
            if v.is_boundary[x] or v.is_coll[x] or x in joiners or storages.intersection(uses[x]):
                break
            if cfg.use_runtime_estimations and comm_time - comp_time < -cfg.extra_comm_comp_overlap * comm_time:
                refusal = "unexposed by runtime estimations"
                break
            memory_x = mem.memory_at(p)
            run_max = memory_x if run_max is None or memory_x > run_max else run_max
            if max(memory_x - alloc[x] + max_cumulative, run_max + net) > limit:
                refusal = "peak memory"
                break
            passed += 1
            comp_time += v.runtime[x]
            p -= 1
        self.comp_time_s = comp_time
        return passed, refusal
