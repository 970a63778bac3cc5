"""Lower bounds on the makespan of any schedule of a graph on a stream assignment.

``lower_bound = max(busiest compute stream's work, each group's comm work, critical path, interference term)``,
all at standalone speed (interference and link sharing only slow things down, and sync overheads only add time, so
each term bounds every schedule the simulator can produce).

The interference term: while any collective is in flight, a compute stream either idles or runs ``slowdown`` times
slower, so each wall-clock unit of communication costs it at least ``1 - 1/slowdown`` units of its work's progress.
Communication of the busiest group lasts at least that group's standalone comm time ``C``, hence every schedule takes
at least ``W + (1 - 1/slowdown) * C`` for the work ``W`` of any compute stream. The critical path follows the simulator's rules: an asynchronous
collective is available to its successors when issued, its wait only after its standalone duration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir.graph import Graph, OpKind


@dataclass(frozen=True)
class LowerBound:
    compute_s: float  # work of the busiest compute stream
    comm_s: dict[str, float]  # per process group: its collectives back to back
    critical_path_s: float
    interference_s: float = 0.0  # compute work plus the least progress lost while communication is in flight

    @property
    def value_s(self) -> float:
        return max(self.compute_s, max(self.comm_s.values(), default=0.0), self.critical_path_s, self.interference_s)

    @property
    def binding(self) -> str:
        """Which term sets the bound: 'compute', 'comm:<group>' or 'critical path'."""
        terms = {"compute": self.compute_s, "critical path": self.critical_path_s,
                 "compute + interference": self.interference_s}
        terms.update({f"comm:{k}": v for k, v in self.comm_s.items()})
        return max(terms, key=terms.__getitem__)


def critical_path_ns(g: Graph, dur_ns: np.ndarray) -> int:
    """Longest path in ns under the simulator's availability rules (see the module docstring). O(N + E)."""
    ptr, idx = g.predecessors_csr()
    ptr_l, idx_l = ptr.tolist(), idx.tolist()
    dur = dur_ns.tolist()
    kinds = g.kinds.tolist()
    wait_of = g.wait_of.tolist()
    # successors may use an async collective from its issue on; everything else from its end
    issue_only = ((g.kinds == OpKind.COLLECTIVE) & ~g.coll_sync).tolist()
    wait = int(OpKind.WAIT)
    est = [0] * len(g)
    avail = [0] * len(g)
    best = 0
    for i in range(len(g)):
        m = 0
        for e in range(ptr_l[i], ptr_l[i + 1]):
            a = avail[idx_l[e]]
            if a > m:
                m = a
        if kinds[i] == wait:
            c = wait_of[i]
            m = max(m, est[c] + dur[c])
        est[i] = m
        fin = m + dur[i]
        avail[i] = m if issue_only[i] else fin
        if fin > best:
            best = fin
    return best


def lower_bound(g: Graph, dur_ns: np.ndarray, compute_stream: np.ndarray, slowdown: float = 1.0) -> LowerBound:
    """The bound for per-node standalone durations ``dur_ns``, the compute stream of each non-collective node and
    the compute slowdown while communication is in flight."""
    is_coll = g.coll_type >= 0
    work = np.bincount(compute_stream[~is_coll], weights=dur_ns[~is_coll]) if (~is_coll).any() else np.zeros(1)
    comm = np.bincount(g.coll_group[is_coll], weights=dur_ns[is_coll], minlength=len(g.groups))
    busiest_work = float(work.max(initial=0.0))
    busiest_comm = float(comm.max(initial=0.0))
    return LowerBound(
        compute_s=busiest_work * 1e-9,
        comm_s={grp.name: float(comm[k]) * 1e-9 for k, grp in enumerate(g.groups)},
        critical_path_s=critical_path_ns(g, dur_ns) * 1e-9,
        interference_s=(busiest_work + (1.0 - 1.0 / max(1.0, slowdown)) * busiest_comm) * 1e-9,
    )
