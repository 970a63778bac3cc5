"""How much of a step a measured table covers: the ops and collectives whose time came from the table, not the
model (``estimate --table``, ``compare --table``). A table taken on another shape or dtype matches nothing, and the
model quietly fills in; this says so."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from commsched.cost import CostEstimate, MeasuredTable
    from commsched.ir import Graph


@dataclass(frozen=True)
class TableMatch:
    """Ops (timed, non-collective nodes) and collectives of a graph, and how many of each the table timed."""

    source: str
    ops_matched: int
    ops: int
    collectives_matched: int
    collectives: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """``table SOURCE: matched K of N ops (collectives C of D)``."""
        return (
            f"table {self.source}: matched {self.ops_matched} of {self.ops} ops "
            f"(collectives {self.collectives_matched} of {self.collectives})"
        )

    @property
    def matched_nothing(self) -> bool:
        return self.ops_matched == 0 and self.collectives_matched == 0


def table_match(g: Graph, costs: CostEstimate, table: MeasuredTable) -> TableMatch:
    """Count what ``table`` timed in ``costs`` of ``g``: an op matches when the table has its (target, input
    shapes, dtype) key, as ``estimate_costs`` looks it up; a collective when ``estimate_costs`` marked its
    algorithm ``measured`` (its kind and group size were measured; sizes are interpolated)."""
    from commsched.cost.estimate import graph_features
    from commsched.cost.opclass import OpClass

    cls = graph_features(g).cls
    ops = np.flatnonzero((cls != OpClass.FREE) & (cls != OpClass.COLLECTIVE)).tolist()
    matched = sum(table.op_time(g, i) is not None for i in ops) if table.ops else 0
    algorithms = costs.meta.get("collective_algorithms", {})
    colls = g.collectives.tolist()
    measured = sum(algorithms.get(i) == "measured" for i in colls)
    return TableMatch(str(table.source), int(matched), len(ops), int(measured), len(colls))
