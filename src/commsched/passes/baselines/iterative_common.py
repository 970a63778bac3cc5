"""The skeleton of the seed's iterative passes (``reorder_communication_preserving_peak_memory`` and
``sink_waits_iterative``): take each node to move in turn and swap it with its neighbour, one neighbour at a time,
carrying a *group* of the nodes that must move with it, until a stop rule fires. The skeleton owns the swap loop,
the exposed-time accounting, the memory check and the stats; a policy (a subclass) says which nodes move, in which
direction, which neighbours stop the move and which join the group.

Per neighbour (``candidate``) the rules are tried in this order; the first that fires ends the node's move and is
its row's ``limiting_factor``:

1. ``unexposed by runtime estimations`` (with ``use_runtime_estimations``): compute already covers the moving
   node's collective plus ``extra_comm_comp_overlap`` of it;
2. a node the policy's :meth:`IterativeSwaps.blocking` marks (another collective in the way);
3. a candidate in the policy's ``joiners`` (a dependency of the group, either way) joins the group if
   :meth:`IterativeSwaps.groupable`, else the move stops with :meth:`IterativeSwaps.refusal`;
4. with runtime estimations, exposure: the swap may not expose the candidate (a collective or wait the policy
   *faces*) by the group's runtime, nor trade the moving node's gain for a larger loss of the grouped nodes the
   policy *tracks* (see :meth:`IterativeSwaps.exposure_refusal`);
5. ``peak memory``: the peak after the swap would exceed ``memory_budget`` of the input order's peak.

A policy may also pass a run of neighbours in one move first (:meth:`IterativeSwaps.jump`). Peak memory is tracked
incrementally (``commsched.memory.IncrementalMemory``); each swap costs O(group size).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph, OpKind
from commsched.memory import IncrementalMemory
from commsched.passes.budget import MemoryBudget
from commsched.passes.registry import PassConfig, PassContext, PassResult, PassStats

TORCH_MEMORY_BUDGET = MemoryBudget(ratio=1.2)  # torch's peak_memory_budget = 0.2: 20 % above the input order's peak


@dataclass(frozen=True, kw_only=True)
class IterativeConfig(PassConfig):
    """Knobs both iterative passes share: torch 2.13 ``config_comms`` names without their pass prefix
    (``reorder_iterative_`` / ``sink_iterative_``), torch's defaults."""

    comm_runtime_mult: float = 2.0
    """multiplier on collective runtimes (reorder_sink_runtime_estimations_comm_mult)"""
    non_comm_runtime_mult: float = 1.0
    """multiplier on other runtimes (reorder_sink_runtime_estimations_non_comm_mult)"""
    memory_budget: MemoryBudget = TORCH_MEMORY_BUDGET
    """the peak the order may reach; any spelling ``MemoryBudget.parse`` reads"""
    extra_comm_comp_overlap: float = 0.5
    """with runtime estimations: stop once compute covers (1 + this) x the collective's time"""
    use_runtime_estimations: bool = False
    """stop once the collective is hidden and weigh the exposure of grouped collectives / waits; allows grouping
    gemm-like ops"""
    unsafe_collectives_reorder: bool = False
    """let a collective pass another one (torch defaults to True with rank-aligned estimates; we keep SPMD order)"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_budget", MemoryBudget.parse(self.memory_budget, "memory_budget"))


@dataclass
class IterativeView:
    """Per-graph facts the iterative passes read (lists for fast scalar access)."""

    runtime: list[float]  # seconds, with the comm / non-comm multipliers applied
    is_coll: list[bool]
    is_async_coll: list[bool]
    is_wait: list[bool]
    is_view: list[bool]
    is_gemm_like: list[bool]  # nodes with a flop formula: matmuls, attention, convolutions
    is_boundary: list[bool]  # graph inputs and the output: they stay at the ends of the order
    wait_of: list[int]
    preds: list[list[int]]  # data inputs, control deps and constraints fixed by earlier passes
    succs: list[list[int]]


def make_view(g: Graph, ctx: PassContext, comm_mult: float, non_comm_mult: float) -> IterativeView:
    n = len(g)
    is_coll = g.coll_type >= 0
    runtime = np.where(is_coll, ctx.costs.node_s * comm_mult, ctx.costs.node_s * non_comm_mult)
    ptr, idx = g.predecessors_csr()
    preds = [idx[ptr[i] : ptr[i + 1]].tolist() for i in range(n)]
    for s, d in zip(ctx.extra_src.tolist(), ctx.extra_dst.tolist()):
        preds[d].append(s)
    succs: list[list[int]] = [[] for _ in range(n)]
    for d, ps in enumerate(preds):
        for s in ps:
            succs[s].append(d)
    return IterativeView(
        runtime=runtime.tolist(),
        is_coll=is_coll.tolist(),
        is_async_coll=(is_coll & ~g.coll_sync).tolist(),
        is_wait=(g.kinds == OpKind.WAIT).tolist(),
        is_view=(g.kinds == OpKind.VIEW).tolist(),
        is_gemm_like=(g.kinds == OpKind.COMPUTE).tolist(),
        is_boundary=((g.kinds == OpKind.INPUT) | (g.kinds == OpKind.OUTPUT)).tolist(),
        wait_of=g.wait_of.tolist(),
        preds=preds,
        succs=succs,
    )


class MovingOrder:
    """An order as a list plus positions, with the two moves the iterative passes make. O(k) per move."""

    def __init__(self, order: np.ndarray) -> None:
        self.order: list[int] = order.tolist()
        self.pos: list[int] = [0] * len(self.order)
        for p, v in enumerate(self.order):
            self.pos[v] = p

    def prev(self, node: int) -> int | None:
        p = self.pos[node]
        return self.order[p - 1] if p > 0 else None

    def next(self, node: int) -> int | None:
        p = self.pos[node] + 1
        return self.order[p] if p < len(self.order) else None

    def rotate(self, lo: int, hi: int, nodes: list[int]) -> None:
        """Positions lo..hi-1 now hold ``nodes``."""
        self.order[lo:hi] = nodes
        for k, v in enumerate(nodes):
            self.pos[v] = lo + k


def coll_exposure(v: IterativeView, mo: MovingOrder, coll: int) -> tuple[float, float]:
    """(comm_time, comp_time) of a collective: compute that runs between it and its first wait or consumer.

    Async collectives on the way are skipped (they do not compute); a synchronous one ends the window.
    """
    comm = v.runtime[coll]
    comp = 0.0
    users = set(v.succs[coll])
    p = mo.pos[coll] + 1
    order = mo.order
    while p < len(order):
        node = order[p]
        if node in users and not v.is_view[node]:
            break
        if v.is_view[node] and node in users:
            users.update(v.succs[node])  # getitem / views of the output: their users consume it too
        elif v.is_coll[node]:
            if not v.is_async_coll[node]:
                break
        else:
            comp += v.runtime[node]
        p += 1
    return comm, comp


def wait_exposure(v: IterativeView, mo: MovingOrder, wait: int) -> tuple[float, float]:
    """(comm_time, comp_time) of a wait: compute between its collective and the first barrier after it.

    Walking back from the wait, a synchronous collective, or an async collective whose wait was passed, resets the
    compute seen so far (that compute cannot hide the collective being waited on).
    """
    coll = v.wait_of[wait]
    comp = 0.0
    waits_seen: set[int] = set()
    p = mo.pos[wait] - 1
    order = mo.order
    while p >= 0:
        node = order[p]
        if node == coll:
            return v.runtime[coll], comp
        if v.is_wait[node]:
            waits_seen.add(v.wait_of[node])
        elif v.is_coll[node]:
            if not v.is_async_coll[node] or node in waits_seen:
                comp = 0.0
        else:
            comp += v.runtime[node]
        p -= 1
    return 0.0, comp


@dataclass(frozen=True)
class StopReasons:
    """The limiting factors a policy reports, by rule (the other rules' names are the skeleton's)."""

    end_of_order: str  # the move reached the graph's inputs / output
    blocked: str  # a node ``blocking`` marks
    facing: str  # the swap would expose the candidate itself
    tracked: str  # the swap would expose the tracked grouped nodes more than it hides


class IterativeSwaps:
    """One run of an iterative pass: the skeleton (:meth:`run`, :meth:`move`) and the hooks a policy overrides.

    ``step`` is -1 when nodes move earlier (the group stays in front of the moving node), +1 when they move later
    (the group trails it). ``group`` is contiguous in the order, ``group[0]`` first.
    """

    name: str  # the registered pass name, for the stats
    step: int  # -1: nodes move earlier; +1: later
    reasons: StopReasons  # the limiting factors the policy reports
    jumps = False  # whether ``jump`` runs first, while no grouped node is tracked

    def __init__(self, g: Graph, order: np.ndarray, ctx: PassContext) -> None:
        self.g = g
        self.order = order
        self.cfg: IterativeConfig = ctx.config  # type: ignore[assignment]
        self.view = make_view(g, ctx, self.cfg.comm_runtime_mult, self.cfg.non_comm_runtime_mult)
        self.moving = MovingOrder(order)
        self.memory = IncrementalMemory(g, order)
        self.input_peak_bytes = self.memory.peak_bytes
        self.limit_bytes = self.cfg.memory_budget.limit_bytes(self.input_peak_bytes)
        self.stats = PassStats(self.name)
        # the group's leading end (index into the group) and the step past it, in the moving direction
        self._lead, self._beyond = (0, self.moving.prev) if self.step < 0 else (-1, self.moving.next)
        self.blocks = self.blocking()
        # the node being moved and its group
        self.group: list[int] = []
        self.group_runtime_s = 0.0  # runtime of the grouped nodes that are not async collectives
        self.tracked: dict[int, tuple[float, float]] = {}  # grouped nodes whose exposure a swap changes
        self.joiners: set[int] = set()  # nodes the group cannot pass (dependencies): they join it or stop the move
        self.comm_time_s = self.comp_time_s = 0.0
        self.row: dict = {}

    # --- the policy: which nodes move, which neighbours stop them, which join the group ---
    def nodes_to_move(self) -> list[int]:
        raise NotImplementedError

    def row_names(self, node: int) -> dict[str, str]:
        """The leading fields of the node's stats row."""
        raise NotImplementedError

    def start_group(self, node: int) -> None:
        """Set ``joiners`` (and the policy's own bookkeeping) for a new moving ``node``."""

    def blocking(self) -> list[bool]:
        """Per node: whether it stops every move before any grouping (``reasons.blocked``: a collective in the way)."""
        raise NotImplementedError

    def groupable(self, candidate: int) -> bool:
        raise NotImplementedError

    def refusal(self, candidate: int) -> str:
        """Why the move stops at a ``candidate`` that must join the group but cannot."""
        raise NotImplementedError

    def joined(self, candidate: int) -> None:
        """Update ``joiners`` (and the policy's own bookkeeping) after ``candidate`` joined the group."""

    def jump(self, candidate: int) -> tuple[str | None, int | None]:
        """With ``jumps``: pass several neighbours in one move before the one-swap rules; returns a refusal (or None)
        and the next candidate (None at the end of the order)."""
        raise NotImplementedError

    def tracks(self, node: int) -> bool:
        """Whether a grouped ``node``'s exposure is weighed against the moving node's gain."""
        raise NotImplementedError

    def faces(self, candidate: int) -> bool:
        """Whether passing ``candidate`` exposes it by the group's runtime (a collective or wait the group passes)."""
        raise NotImplementedError

    # --- the skeleton ---
    def run(self) -> PassResult:
        for node in self.nodes_to_move():
            self.move(node)
        self.stats.notes.append(
            f"peak memory {self.input_peak_bytes} -> {self.memory.peak_bytes} bytes (limit {self.limit_bytes})"
        )
        order = np.asarray(self.moving.order, np.int32)
        return PassResult(order, self.stats, reorders_collectives=self.cfg.unsafe_collectives_reorder)

    def exposure(self, node: int) -> tuple[float, float]:
        """(comm_time, comp_time) of a wait or a collective at its current place."""
        if self.view.is_wait[node]:
            return wait_exposure(self.view, self.moving, node)
        return coll_exposure(self.view, self.moving, node)

    def neighbour(self) -> int | None:
        """The next node past the group's leading end, or None at an end of the order or a graph input / output."""
        candidate = self._beyond(self.group[self._lead])
        return None if candidate is None or self.view.is_boundary[candidate] else candidate

    def move(self, node: int) -> None:
        """Move ``node`` as far as the rules allow and record its stats row."""
        self.comm_time_s, self.comp_time_s = self.exposure(node)
        exposed = self.comm_time_s - self.comp_time_s
        self.row = row = {
            **self.row_names(node),
            "comm_time_s": self.comm_time_s,
            "comp_time_s": self.comp_time_s,
            "initial_exposed_s": exposed,
            "final_exposed_s": exposed,
            "limiting_factor": "none",
            "moves": 0,
            "grouped": 0,
            "grouped_info": "",
        }
        self.stats.rows.append(row)
        self.group, self.group_runtime_s, self.tracked = [node], 0.0, {}
        self.start_group(node)
        # the hot loop: names bound once
        lead, beyond, boundary, try_candidate = self._lead, self._beyond, self.view.is_boundary, self.try_candidate
        while (candidate := beyond(self.group[lead])) is not None and not boundary[candidate]:
            refusal = try_candidate(candidate)
            if refusal is not None:
                row["limiting_factor"] = refusal
                break
        if row["limiting_factor"] == "none":
            row["limiting_factor"] = self.reasons.end_of_order
        self.stats.refuse(row["limiting_factor"].split(" on ")[0])

    def try_candidate(self, candidate: int) -> str | None:
        """Group ``candidate`` or swap the group past it; a refusal ends the move."""
        if self.jumps and not self.tracked:
            refusal, candidate = self.jump(candidate)
            if refusal is not None or candidate is None:
                return refusal
        cfg, v = self.cfg, self.view
        exposed = self.comm_time_s - self.comp_time_s
        if cfg.use_runtime_estimations and exposed < -cfg.extra_comm_comp_overlap * self.comm_time_s:
            return "unexposed by runtime estimations"
        if self.blocks[candidate]:
            return self.reasons.blocked
        if candidate in self.joiners:
            if not self.groupable(candidate):
                return self.refusal(candidate)
            self.join(candidate)
            return None
        if cfg.use_runtime_estimations:
            refusal = self.exposure_refusal(candidate, exposed)
            if refusal is not None:
                return refusal
        mo, mem, group = self.moving, self.memory, self.group
        if self.step < 0:  # the group moves in front of the candidate
            moved, new_pos = group, mo.pos[candidate]
        else:  # the candidate moves in front of the group
            moved, new_pos = candidate, mo.pos[group[0]]
        if mem.potential_peak_after_move(moved, new_pos) > self.limit_bytes:
            return "peak memory"
        mem.apply_move(moved, new_pos)
        mo.rotate(new_pos, new_pos + len(group) + 1, [*group, candidate] if self.step < 0 else [candidate, *group])
        row = self.row
        row["moves"] += 1
        if not v.is_coll[candidate]:
            self.comp_time_s += v.runtime[candidate]
        row["comp_time_s"] = self.comp_time_s
        row["final_exposed_s"] = self.comm_time_s - self.comp_time_s
        return None

    def join(self, candidate: int) -> None:
        if self.step < 0:
            self.group.insert(0, candidate)
        else:
            self.group.append(candidate)
        if self.cfg.use_runtime_estimations and self.tracks(candidate):
            self.tracked[candidate] = self.exposure(candidate)
        if not self.view.is_async_coll[candidate]:
            self.group_runtime_s += self.view.runtime[candidate]
        self.row["grouped"] += 1
        self.row["grouped_info"] += f"+{self.g.names[candidate]}"
        self.joined(candidate)

    def exposure_refusal(self, candidate: int, exposed: float) -> str | None:
        """With runtime estimations: refuse a swap that exposes ``candidate`` by the group's runtime, or one that
        weighs the moving node's gain against the tracked grouped nodes' loss (their compute shrinks by the
        candidate's runtime). Moving earlier stops when the loss exceeds the gain; moving later stops when the gain
        exceeds the loss, the sign torch's ``sink_waits_iterative`` uses (kept to reproduce it)."""
        v = self.view
        if self.faces(candidate) and self.group_runtime_s > 0:
            comm, comp = self.exposure(candidate)
            if max(0.0, comm - comp + self.group_runtime_s) > max(0.0, comm - comp):
                return self.reasons.facing
        runtime = v.runtime[candidate]
        if not v.is_async_coll[candidate] and runtime > 0 and self.tracked:
            delta = max(0.0, exposed - runtime) - max(0.0, exposed)  # loss minus gain
            for comm, comp in self.tracked.values():
                delta += max(0.0, comm - comp + runtime) - max(0.0, comm - comp)
            if delta > 0 if self.step < 0 else delta < 0:
                return self.reasons.tracked
            self.tracked = {node: (comm, comp - runtime) for node, (comm, comp) in self.tracked.items()}
        return None
