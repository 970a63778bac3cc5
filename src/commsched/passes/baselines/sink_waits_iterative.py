"""``sink_waits_iterative``: move each wait later, one swap at a time, without growing the peak past the budget.

The policy over the skeleton in ``iterative_common``: waits move, right to left, towards the end of the order. A
node that depends on the moving group (or a collective meeting a group that holds one) joins the group when
groupable: not a wait, not an async collective, and, without runtime estimations, neither a collective nor
gemm-like. The move stops at, in order: ``unexposed by runtime estimations``, ``async collective`` (the next node
issues a collective: the space before the next collective is what bucketing should create), ``collective
ordering``, ``data dependency``, ``wait exposure`` / ``collectives exposure`` (with runtime estimations), and
``peak memory``. O(k) per swap with incremental memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph
from commsched.passes.baselines.iterative_common import IterativeConfig, IterativeSwaps, StopReasons
from commsched.passes.registry import PassContext, PassResult, register_pass


@dataclass(frozen=True, kw_only=True)
class SinkWaitsConfig(IterativeConfig):
    """Knobs (torch 2.13 ``config_comms`` ``sink_*`` names without the prefix; torch's defaults except the SPMD-safe
    ordering)."""

    swap_with_collectives: bool = False
    """let a wait move past an async collective (sink_waits_iterative_swap_with_collectives)"""


@register_pass("sink_waits_iterative", SinkWaitsConfig)
def sink_waits_iterative(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Move each wait later by swaps with its successor (grouping what depends on it), stopping at collectives,
    data dependencies, exposure or peak-memory limits. Peak never exceeds ``memory_budget`` (default 1.2 x the
    input peak)."""
    return _SinkWaits(g, order, ctx).run()


class _SinkWaits(IterativeSwaps):
    cfg: SinkWaitsConfig
    name, step = "sink_waits_iterative", 1
    reasons = StopReasons(
        "end of graph", blocked="async collective", facing="wait exposure", tracked="collectives exposure"
    )

    def __init__(self, g: Graph, order: np.ndarray, ctx: PassContext) -> None:
        super().__init__(g, order, ctx)
        self.dependents: set[int] = set()  # nodes that read a grouped node's output
        self.collectives = [c for c, coll in enumerate(self.view.is_coll) if coll]

    def nodes_to_move(self) -> list[int]:
        return [w for w in self.order.tolist()[::-1] if self.view.is_wait[w]]

    def row_names(self, node: int) -> dict[str, str]:
        return {"wait": self.g.names[node], "collective": self.g.names[self.view.wait_of[node]]}

    def start_group(self, node: int) -> None:
        self.dependents = set(self.view.succs[node])
        self.joiners = self.dependents
        if self.view.is_coll[node]:
            self._add_collectives()

    def blocking(self) -> list[bool]:
        return [False] * len(self.g) if self.cfg.swap_with_collectives else self.view.is_async_coll

    def groupable(self, candidate: int) -> bool:
        v = self.view
        if v.is_wait[candidate] or v.is_async_coll[candidate]:
            return False
        return self.cfg.use_runtime_estimations or (not v.is_coll[candidate] and not v.is_gemm_like[candidate])

    def refusal(self, candidate: int) -> str:
        if candidate not in self.dependents and not self.cfg.unsafe_collectives_reorder:
            return "collective ordering"
        return f"data dependency on {self.g.names[candidate]}"

    def joined(self, candidate: int) -> None:
        self.dependents.update(self.view.succs[candidate])
        if self.joiners is not self.dependents:
            self.joiners.update(self.view.succs[candidate])
        elif self.view.is_coll[candidate]:
            self._add_collectives()

    def _add_collectives(self) -> None:
        """Two collectives may not swap: once the group holds one, every collective it meets joins it (or stops the
        move)."""
        self.joiners = self.dependents | set(self.collectives)

    def tracks(self, node: int) -> bool:
        return self.view.is_coll[node]

    def faces(self, candidate: int) -> bool:
        return self.view.is_wait[candidate]
