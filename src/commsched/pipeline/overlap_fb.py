"""DualPipeV's OVERLAP_F_B timed by commsched's scheduler: a forward of one micro-batch and a backward of another,
issued together, as one program that the ``overlap`` pass orders.

torch runs an OVERLAP_F_B's two sub-actions in turn unless a custom function is registered for it (DeepSeek's
DualPipe registers one that interleaves them, so one micro-batch's all_to_all or TP collectives run under the other's
compute). :func:`pair_graph` builds that program from two traced stages: the forward nodes of one and the backward
nodes of the other (what the backward reads of its own, earlier forward, the activations autograd saved, becomes
an input). :func:`pair_seconds` simulates it in torch's order (the forward, then the backward) and in the order the
``overlap`` pass gives it with ``reorder_collectives`` (the two micro-batches' collectives share their process
groups' streams), and keeps the faster: the simulator judges, so the pair never costs more than F + B run in turn,
and never less than the longer of the two parts' compute.

:func:`with_overlap_f_b` fills :class:`StageCosts` ' ``overlap_f_b_s`` for the (forward stage, backward stage) pairs
a V-shaped schedule puts on one rank. A long stage's pair comes from its layer-scaled traces (as in
:mod:`commsched.pipeline.cache`): the saving over F + B is found at K and K + 1 layers and extrapolated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from commsched.ir import CAUSAL_META, PERMUTE_META, Graph, GraphBuilder, OpKind
from commsched.pipeline.stages import TracedStage

_NAME_LISTS = (CAUSAL_META, PERMUTE_META)


@dataclasses.dataclass(frozen=True)
class PairTimes:
    """One OVERLAP_F_B pair's simulated seconds: in turn (torch's default), as the ``overlap`` pass orders it, and
    the kept one (the faster); ``compute_s``: the forward's and the backward's compute, each summed (the pair's floor
    is the larger)."""

    in_turn_s: float
    overlapped_s: float
    compute_s: tuple[float, float]

    @property
    def pair_s(self) -> float:
        return min(self.in_turn_s, self.overlapped_s)


def pair_graph(fwd: TracedStage, bwd: TracedStage) -> tuple[Graph, np.ndarray]:
    """One program of ``fwd`` 's forward nodes then ``bwd`` 's backward nodes (names prefixed ``f.`` / ``b.``), and
    the mask of the forward's nodes. What a kept node reads from outside its part becomes an INPUT."""
    return part_graph([(fwd, fwd.forward & (fwd.graph.kinds != OpKind.OUTPUT), "f."), (bwd, ~bwd.forward, "b.")])


def part_graph(parts: list[tuple[TracedStage, np.ndarray, str]]) -> tuple[Graph, np.ndarray]:
    """One program of each (traced stage, node mask, name prefix) part in turn, and the mask of the first part's
    nodes. What a kept node reads from outside its part becomes an INPUT (a value computed earlier)."""
    b = GraphBuilder(dict(parts[-1][0].graph.meta))
    for key in _NAME_LISTS:
        b.meta.pop(key, None)
    sizes = [_append(b, traced.graph, mask, prefix) for traced, mask, prefix in parts]
    g = b.build()
    first = np.zeros(len(g), bool)
    first[: sizes[0]] = True
    return g, first


def _append(b: GraphBuilder, g: Graph, keep: np.ndarray, prefix: str) -> int:
    """Copy ``g`` 's nodes in ``keep`` into ``b`` (topological order kept); the nodes they read that are not kept
    become INPUTs (values already computed). Returns how many nodes were added."""
    waits = np.flatnonzero(keep & (g.wait_of >= 0))
    keep = keep.copy()
    keep[waits[~keep[g.wait_of[waits]]]] = False  # a wait of a collective outside the part: its value is an input
    ptr, idx = g.in_ptr, g.in_idx
    needed = np.zeros(len(g), bool)
    rows = np.flatnonzero(keep)
    needed[np.concatenate([idx[ptr[i] : ptr[i + 1]] for i in rows]) if len(rows) else []] = True
    as_input = needed & ~keep
    new_id: dict[int, int] = {}
    storage: dict[int, int] = {}
    start = len(b)
    for i in np.flatnonzero(keep | as_input).tolist():
        nid = len(b)
        bufs = []
        for buf in g.buffers(i):
            if buf.storage not in storage:
                storage[buf.storage] = b.new_storage(int(g.storage_nbytes[buf.storage]), nid)
            bufs.append((buf.shape, buf.dtype, buf.nbytes, storage[buf.storage]))
        if as_input[i]:
            b.add_node(prefix + g.names[i], g.targets[i], OpKind.INPUT, buffers=bufs)
        else:
            b.add_node(prefix + g.names[i], g.targets[i], OpKind(int(g.kinds[i])),
                       [new_id[int(j)] for j in g.inputs(i)], buffers=bufs, flops=float(g.flops[i]),
                       side_effect=bool(g.side_effect[i]),
                       deps=[new_id[int(d)] for d in g.deps(i) if int(d) in new_id])  # fmt: skip
            _collective(b, g, i, nid, new_id)
        new_id[i] = nid
    names = {g.names[i] for i in new_id}
    for key in _NAME_LISTS:
        mine = [prefix + name for name in g.meta.get(key, ()) if name in names]
        if mine:
            b.meta[key] = [*b.meta.get(key, ()), *mine]
    return len(b) - start


def _collective(b: GraphBuilder, g: Graph, i: int, nid: int, new_id: dict[int, int]) -> None:
    """Carry node i's collective (its group registered by name) or its wait."""
    if g.coll_type[i] >= 0:
        grp = g.groups[int(g.coll_group[i])]
        b.set_collective(nid, int(g.coll_type[i]), b.group(grp.name, grp.size, grp.stride), g.coll_reduce_op.get(i),
                         int(g.coll_in_bytes[i]), int(g.coll_out_bytes[i]), bool(g.coll_sync[i]))  # fmt: skip
    if g.wait_of[i] >= 0:
        b.set_wait(nid, new_id[int(g.wait_of[i])])


def pair_seconds(fwd: TracedStage, bwd: TracedStage, hardware: Any, *, fusion: bool = True) -> PairTimes:
    """``fwd`` 's forward and ``bwd`` 's backward as one OVERLAP_F_B program, simulated on ``hardware`` in turn and
    as the ``overlap`` pass (with ``reorder_collectives``) orders it (module docstring); ``fusion``: the kernels
    fused as a compiled block's, else eager."""
    g, fwd_mask = pair_graph(fwd, bwd)
    in_turn, overlapped = ordered_twice(g, hardware, fusion=fusion)
    on_compute = (g.kinds == OpKind.COMPUTE) | (g.kinds == OpKind.OTHER)
    alone = in_turn.standalone_ns
    compute = (int(alone[on_compute & fwd_mask].sum()) * 1e-9, int(alone[on_compute & ~fwd_mask].sum()) * 1e-9)
    return PairTimes(int(in_turn.makespan_ns) * 1e-9, int(overlapped.makespan_ns) * 1e-9, compute)


def ordered_twice(g: Graph, hardware: Any, *, fusion: bool = True) -> tuple[Any, Any]:
    """``g`` simulated in its own order and in the order the ``overlap`` pass gives it with ``reorder_collectives``
    (the collectives of two parts share their groups' streams): the two SimResults. ``fusion``: costed as
    :func:`commsched.pipeline.stages.stage_seconds` costs a stage (compiled, else eager)."""
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph
    from commsched.passes import schedule
    from commsched.sim import simulate_costs

    costs = estimate_costs(g, for_graph(hardware, g), fusion=fusion)
    sched = schedule(g, costs, overlap={"reorder_collectives": True})
    return simulate_costs(g, costs), simulate_costs(g, costs, sched.order)


def with_overlap_f_b(job: Any, costs: Any, hardware: Any) -> Any:
    """``costs`` (a :class:`StageCosts` of ``job``, a ResolvedJob) with ``overlap_f_b_s`` filled for the (forward
    stage, backward stage) pairs the program's OVERLAP_F_B actions run: F + B less the pair's saving
    (:func:`pair_seconds`, from layer-scaled traces for long stages), never below the longer of F and B; the other
    entries F + B (never run as a pair)."""
    from commsched.pipeline.actions import ActionKind

    forward_s = np.broadcast_to(np.asarray(costs.forward_s, float), (len(job.stages),))
    backward_s = np.broadcast_to(np.asarray(costs.backward_s, float), (len(job.stages),))
    table = np.add.outer(forward_s, backward_s)
    pairs = {(int(row[1]), int(row[4])) for acts in job.program.actions for row in acts
             if row[0] == ActionKind.OVERLAP_F_B}  # fmt: skip
    for f, b in sorted(pairs):
        fwd, bwd = job.stages[f], job.stages[b]
        saving = _saving(job.compute, (fwd.shape, job.policies(fwd)), (bwd.shape, job.policies(bwd)), hardware,
                         job.job.compile)  # fmt: skip
        table[f, b] -= min(saving, table[f, b] - max(forward_s[f], backward_s[b]))
    return dataclasses.replace(costs, overlap_f_b_s=table)


_SAVINGS: dict[tuple, tuple[float, ...]] = {}

Policies = tuple[str, ...] | None


def _saving(spec: Any, fwd: tuple[tuple, Policies], bwd: tuple[tuple, Policies], hardware: Any, fusion: bool) -> float:
    """Seconds the pair saves over F + B in turn, from the two stages' traces (each a (shape, AC policies) pair, its
    kernels fused with ``fusion``); for long stages at K and K + 1 layers each, extrapolated to the shorter stage's
    layers. Memoised per process."""
    (sf, pf), (sb, pb) = fwd, bwd

    def at(c: int | None) -> tuple[float]:
        ft, bt = (_trace(spec, s, p, c) for s, p in ((sf, pf), (sb, pb)))
        t = pair_seconds(ft, bt, hardware, fusion=fusion)
        return (t.in_turn_s - t.pair_s,)

    key = ("pair", spec, sf, sb, pf, pb, fusion)
    return _memo(key, hardware, at, min(sf[1], sb[1]), _scalable(pf, pb))[0]


def stage_savings(spec: Any, shape: tuple[bool, int, bool], hardware: Any, *, policies: Policies = None,
                  fusion: bool = True) -> tuple[float, float]:  # fmt: skip
    """(forward, backward) seconds the ``overlap`` pass saves on the stage's own forward and backward programs
    (each ordered alone, its TP collectives reordered; 0 where the simulator says the order is not faster), from
    the stage's layer-scaled traces, its blocks under ``policies`` (AC) and its kernels fused with ``fusion``, as
    the job costs the stage. Memoised per process."""

    def at(c: int | None) -> tuple[float, float]:
        t = _trace(spec, shape, policies, c)
        out = []
        for mask in (t.forward & (t.graph.kinds != OpKind.OUTPUT), ~t.forward):
            own, ordered = ordered_twice(part_graph([(t, mask, "")])[0], hardware, fusion=fusion)
            out.append(max(int(own.makespan_ns) - int(ordered.makespan_ns), 0) * 1e-9)
        return tuple(out)

    return _memo(("stage", spec, shape, policies, fusion), hardware, at, shape[1], _scalable(policies))


def _trace(spec: Any, shape: tuple[bool, int, bool], policies: Policies, count: int | None) -> TracedStage:
    """The stage's trace at its own length (``count`` None) or at ``count`` layers, its blocks' policies with it."""
    from commsched.pipeline.cache import cached_trace, policies_at

    first, layers, last = shape
    count = layers if count is None else count
    return cached_trace(spec, first, count, last, policies=policies_at(policies, count, layers))


def _scalable(*policies: Policies) -> bool:
    from commsched.pipeline.cache import scalable

    return all(scalable(p) for p in policies)


def _memo(key: tuple, hardware: Any, at: Any, layers: int, scale: bool) -> tuple[float, ...]:
    """``at(None)`` (the stage as it is), or, where ``scale`` and for more than K + 1 layers, ``at(K)`` and
    ``at(K + 1)`` extrapolated to ``layers`` (never below 0); memoised under ``key`` and the hardware."""
    from commsched.pipeline.cache import SCALE_LAYERS as k

    key = (*key, hardware if isinstance(hardware, str) else repr(hardware))
    if key not in _SAVINGS:
        if layers <= k + 1 or not scale:
            _SAVINGS[key] = at(None)
        else:
            lo, hi = at(k), at(k + 1)
            _SAVINGS[key] = tuple(max(x + (layers - k) * (y - x), 0.0) for x, y in zip(lo, hi, strict=True))
    return _SAVINGS[key]
