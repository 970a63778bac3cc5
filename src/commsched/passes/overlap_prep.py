"""Per-graph preparation for the ``overlap`` pass: the arrays every list-scheduling attempt reads (durations from
the stream model, constraints, memory facts of the input order), and per collective order the constraint graph
with each group's FIFO chain, bottom levels and which collective each node feeds.

Time inside is int64 nanoseconds (:mod:`commsched.sim.model`). The list scheduler plans without link sharing, which
the final simulation accounts for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind
from commsched.ir.graph import csr
from commsched.ir.order import collective_chains
from commsched.ir.transform import kahn_order
from commsched.memory import liveness, memory_profile
from commsched.sim.bounds import heads_and_tails
from commsched.sim.jit import ENABLED as JIT_ENABLED
from commsched.sim.model import StreamModel, durations_ns


@dataclass
class Prep:
    """Per-graph arrays (lists, for fast scalar access) shared by every attempt with the same collective order."""

    n: int
    dur_ns: list[int]
    is_coll: list[bool]
    is_wait: list[bool]
    is_sync: list[bool]
    group: list[int]
    wait_of: list[int]
    succ_ptr: list[int]
    succ_idx: list[int]
    indeg: list[int]
    bottom: list[int]
    feeds: list[int]
    pos: list[int]
    alloc: list[int]  # bytes allocated when the node runs (the non-persistent storages it owns)
    node_storages: list[list[int]]  # freeable storages each node uses (their last user frees them)
    storage_users: list[int]
    storage_bytes: list[int]
    persistent_bytes: int
    input_order: list[int]  # the pass's input order (the memory reference)
    input_after: list[int]  # memory after each position of the input order
    input_max: list[list[int]]  # sparse table of the input order's curve (range maximum in O(1))
    release_pos: list[int]  # per node: input position after which the storages it allocates are freed
    chains: dict[int, list[int]]  # per group: its collectives in issue (FIFO) order
    model: StreamModel
    data_preds: list[list[int]] = field(default_factory=list)  # preds without the FIFO chain edges
    shared: dict = field(default_factory=dict, repr=False)  # arrays for the compiled loops, one per GraphPrep
    cache: dict = field(default_factory=dict, repr=False)  # this Prep's own arrays for the compiled loops

    @property
    def feeder(self) -> list[bool]:
        """Per node: a short path leads from it to a busiest-group collective (:func:`feeders`; computed when
        first read, once per GraphPrep: only the "feeders" priority reads it)."""
        return _derived(self.shared, "feeder")

    @property
    def nearest(self) -> list[int]:
        """Per node: the least kernel time from its end to a collective's issue (:func:`nearest`; computed when
        first read, once per GraphPrep: only the "nearest" priority reads it)."""
        return _derived(self.shared, "nearest")

    @property
    def tail(self) -> list[int]:
        """Per node: the least time from its end to the end of the step (computed when first read, once per
        GraphPrep: only the collective reordering reads it)."""
        return _derived(self.shared, "tail")


def _derived(shared: dict, key: str):
    if key not in shared:
        shared[key] = shared.pop(f"{key} (to compute)")()
    return shared[key]


def base_arrays(g: Graph, costs: CostEstimate) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(duration ns, data+dep edge src, dst) of ``g``; zero-time kinds get duration 0."""
    ptr, idx = g.predecessors_csr()
    return durations_ns(g, costs), idx.astype(np.int64), np.repeat(np.arange(len(g)), np.diff(ptr))


def input_chains(g: Graph, order: np.ndarray) -> dict[int, list[int]]:
    """Per group: its collectives in the order ``order`` issues them (lists, for the chain constraints)."""
    return {grp: chain.tolist() for grp, chain in collective_chains(g, order).items()}


@dataclass
class GraphPrep:
    """The chain-independent part of a :class:`Prep`, computed once per pass invocation."""

    fields: dict
    dur_ns: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    pos: np.ndarray


def prepare_graph(
    g: Graph, order: np.ndarray, costs: CostEstimate, extra_src: np.ndarray, extra_dst: np.ndarray
) -> GraphPrep:
    """The :class:`GraphPrep` of (``g``, ``order``, ``costs``, extra edges), kept on ``g`` for the next call with the
    same inputs (``commsched.optimize`` schedules one bucketed graph twice: its probe, then its full search)."""
    key = (np.asarray(order).tobytes(), np.asarray(extra_src).tobytes(), np.asarray(extra_dst).tobytes())
    kept = g.__dict__.setdefault("_commsched_graph_prep", [])
    for c, k, gp in kept:
        if c is costs and k == key:  # the entry holds ``costs``: its identity cannot be reused meanwhile
            return gp
    gp = _prepare_graph(g, order, costs, extra_src, extra_dst)
    kept[:] = [(costs, key, gp)]  # the latest only: a pass run keeps one
    return gp


def _prepare_graph(
    g: Graph, order: np.ndarray, costs: CostEstimate, extra_src: np.ndarray, extra_dst: np.ndarray
) -> GraphPrep:
    n = len(g)
    model = StreamModel.from_costs(costs)
    dur_ns, src, dst = base_arrays(g, costs)
    # no kernel-driven comm rate here: collectives planned at their slowed speed (the simulator judges the result)
    dur_ns = model.planning_comm_ns(dur_ns, g.coll_type >= 0)
    src = np.concatenate([src, extra_src.astype(np.int64)])
    dst = np.concatenate([dst, extra_dst.astype(np.int64)])
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    lv = liveness(g)
    nsp, nsi = lv.node_storage_ptr.tolist(), lv.node_storage_idx.tolist()
    prof = memory_profile(g, order)
    free_pos = np.where(prof.free_position < 0, n - 1, prof.free_position)
    release = np.zeros(n, np.int64)
    transient = ~lv.persistent
    np.maximum.at(release, lv.owner[transient], free_pos[transient])
    # sparse table of the input order's memory curve: row k holds maxima over windows of 2**k positions
    rows = [prof.curve_bytes]
    span = 1
    while span * 2 <= n:
        rows.append(np.maximum(rows[-1][: len(rows[-1]) - span], rows[-1][span:]))
        span *= 2
    pp, pi = csr(n, src, dst)
    pp_l, pi_l = pp.tolist(), pi.tolist()
    lazy = {
        "feeder (to compute)": functools.partial(feeders, g, dur_ns.copy(), np.array(order)),
        "nearest (to compute)": functools.partial(nearest, g, dur_ns.copy(), np.array(order)),
        "tail (to compute)": functools.partial(_tails, g, dur_ns.copy()),
    }
    fields = dict(
        n=n,
        dur_ns=dur_ns.tolist(),
        is_coll=(g.coll_type >= 0).tolist(),
        is_wait=(g.kinds == OpKind.WAIT).tolist(),
        is_sync=g.coll_sync.tolist(),
        group=g.coll_group.tolist(),
        wait_of=g.wait_of.tolist(),
        pos=pos.tolist(),
        alloc=lv.alloc_bytes.tolist(),
        node_storages=[nsi[nsp[i] : nsp[i + 1]] for i in range(n)],
        storage_users=np.diff(lv.users_ptr).tolist(),
        storage_bytes=lv.storage_bytes.tolist(),
        persistent_bytes=lv.persistent_bytes,
        input_order=order.tolist(),
        input_after=prof.after_bytes.tolist(),
        input_max=[r.tolist() for r in rows],
        release_pos=release.tolist(),
        model=model,
        data_preds=[pi_l[pp_l[i] : pp_l[i + 1]] for i in range(n)],
        shared=lazy,
    )
    return GraphPrep(fields, dur_ns, src, dst, pos)


def _tails(g: Graph, dur_ns: np.ndarray) -> list[int]:
    return heads_and_tails(g, dur_ns)[1]


def feeders(g: Graph, dur_ns: np.ndarray, order: np.ndarray, reach: float = 0.1) -> list[bool]:
    """Per node: whether a collective of the busiest process group can be issued within ``reach`` x that group's
    median collective time of the node's end (through its successors' durations). Running such nodes first keeps
    the bottleneck stream fed (e.g. a gradient's cast before its reduce_scatter, ahead of the next layer's work)."""
    is_coll = g.coll_type >= 0
    if not is_coll.any():
        return [False] * len(g)
    comm = np.bincount(g.coll_group[is_coll], weights=dur_ns[is_coll], minlength=len(g.groups)).astype(np.float64)
    comm[np.bincount(g.coll_group[is_coll], minlength=len(g.groups)) == 0] = -1.0  # groups with no collective
    busiest = int(np.argmax(comm))
    target = is_coll & (g.coll_group == busiest)
    limit = int(reach * float(np.median(dur_ns[target])))
    return [t <= limit for t in to_collective_ns(g, dur_ns, order, target)]


def nearest(g: Graph, dur_ns: np.ndarray, order: np.ndarray) -> list[int]:
    """Per node: the least kernel time from its end until a collective (of any group) can be issued
    (:func:`to_collective_ns`; at least 2**62 where none follows)."""
    return to_collective_ns(g, dur_ns, order, g.coll_type >= 0)


def to_collective_ns(g: Graph, dur_ns: np.ndarray, order: np.ndarray, target: np.ndarray) -> list[int]:
    """Per node: the shortest path, in its successors' durations, from its end to a ``target`` collective's issue
    (at least 2**62 where no target follows). ``order``: a topological order of ``g``. O(N + E)."""
    n = len(g)
    is_target = target.tolist()
    sp, si = (a.tolist() for a in g.successors_csr())
    dur = dur_ns.tolist()
    never = 1 << 62
    to_coll = [never] * n
    for v in reversed(order.tolist()):
        best = never
        for u in si[sp[v] : sp[v + 1]]:
            d = 0 if is_target[u] else dur[u] + to_coll[u]
            if d < best:
                best = d
        to_coll[v] = best
    return to_coll


def prepare(gp: GraphPrep, chains: dict[int, list[int]]) -> Prep:
    """A :class:`Prep` for one issue order per group: constraints, in-degrees, bottom levels and feeds."""
    n = gp.fields["n"]
    pos = gp.pos
    chain_src = [a for chain in chains.values() for a in chain[:-1]]
    chain_dst = [b for chain in chains.values() for b in chain[1:]]
    all_src = np.concatenate([gp.src, np.asarray(chain_src, np.int64)])
    all_dst = np.concatenate([gp.dst, np.asarray(chain_dst, np.int64)])
    succ_ptr, succ_idx = csr(n, all_dst, all_src)
    indeg = np.bincount(succ_idx, minlength=n) if len(succ_idx) else np.zeros(n, np.int64)
    # the collectives' global issue rank: by input position
    colls = sorted((c for chain in chains.values() for c in chain), key=lambda c: pos[c])
    # bottom level (longest remaining duration path; a collective's time counts towards its wait and the next
    # collective of its group) and feeds (the earliest-ranked collective a node leads to)
    if JIT_ENABLED:
        return _prepare_compiled(gp, chains, colls, succ_ptr, succ_idx, indeg)
    sp, si = succ_ptr.tolist(), succ_idx.tolist()
    d = gp.fields["dur_ns"]
    bottom = [0] * n
    feeds = [n + 1] * n
    for r, c in enumerate(colls):
        feeds[c] = r
    topo = kahn_order(sp, si, indeg, gp.fields["pos"])
    if len(topo) != n:
        raise RuntimeError("the ordering constraints have a cycle (collective order vs data dependencies)")
    for node in reversed(topo):
        best = 0
        first = feeds[node]
        for s in si[sp[node] : sp[node + 1]]:
            if bottom[s] > best:
                best = bottom[s]
            if feeds[s] < first:
                first = feeds[s]
        bottom[node] = d[node] + best
        feeds[node] = first
    return Prep(**gp.fields, succ_ptr=sp, succ_idx=si, indeg=indeg.tolist(), bottom=bottom, feeds=feeds, chains=chains)


def _prepare_compiled(gp: GraphPrep, chains, colls, succ_ptr, succ_idx, indeg) -> Prep:
    """The levels of :func:`prepare` by the compiled loops (:mod:`commsched.passes.overlap_jit`; identical)."""
    from commsched.passes.overlap_jit import kahn_jit, levels_jit

    n = gp.fields["n"]
    sp, si, deg = succ_ptr.astype(np.int64), succ_idx.astype(np.int64), indeg.astype(np.int64)
    topo = kahn_jit(sp, si, deg, gp.pos.astype(np.float64))
    if len(topo) != n:
        raise RuntimeError("the ordering constraints have a cycle (collective order vs data dependencies)")
    feeds = np.full(n, n + 1, np.int64)
    feeds[np.asarray(colls, np.int64)] = np.arange(len(colls))
    bottom = levels_jit(sp, si, topo, gp.dur_ns.astype(np.int64), feeds)
    p = Prep(**gp.fields, succ_ptr=sp.tolist(), succ_idx=si.tolist(), indeg=deg.tolist(), bottom=bottom.tolist(),
             feeds=feeds.tolist(), chains=chains)  # fmt: skip
    p.cache["csr"] = (sp, si, deg)
    return p


def range_max(table: list[list[int]], lo: int, hi: int) -> int:
    """Maximum of the base row over positions lo..hi (inclusive) of a sparse table. O(1)."""
    k = (hi - lo + 1).bit_length() - 1
    row = table[k]
    a, b = row[lo], row[hi - (1 << k) + 1]
    return a if a > b else b
