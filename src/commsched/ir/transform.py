"""Whole-graph transforms that renumber nodes: subgraph selection, dead-node elimination, a new node order."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from commsched.ir.graph import CAUSAL_META, PERMUTE_META, Graph, GraphError, OpKind

NODE_TAGS_META = "node_tags"
"""``Graph.meta`` key: tag -> names of the nodes with it (``"recompute"``: an activation checkpoint's recompute,
``"float8"``: float8 training's kernels), from the FX nodes' ``meta[FX_TAGS_KEY]`` (``commsched.workloads.tags``)"""
FX_TAGS_KEY = "commsched_tags"
"""``torch.fx.Node.meta`` key: the node's tags (a frozenset of strings), which ``from_fx`` gathers into
:data:`NODE_TAGS_META`"""

DERIVED_META = (CAUSAL_META, PERMUTE_META, NODE_TAGS_META, "flop_errors")
"""graph meta keys a frontend derives from the graph itself: a program derived from another keeps its own"""


MODULE_META_KEY = "commsched_graph_meta"
"""``GraphModule.meta`` key under which a traced program carries its workload meta (the zoo sets it), so that
``from_fx`` of the module, or of any copy a rewrite makes, keeps the workload facts its reports need"""


def inheritable_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a program's meta that a program derived from it (rewritten, bucketed, reordered) inherits:
    the workload's facts that reports read (dtype, tokens per step, world size, ...), not :data:`DERIVED_META`."""
    return {k: v for k, v in meta.items() if k not in DERIVED_META}


def inherit_meta(g: Graph, meta: Mapping[str, Any]) -> Graph:
    """``g`` (its arrays shared) with :func:`inheritable_meta` of ``meta``, the program it was derived from, added
    to its own meta: a rewrite changes the program, not the workload it computes, so every graph written of it
    keeps what its reports need."""
    out = copy.copy(g)
    out.meta = {**g.meta, **inheritable_meta(meta)}
    return out


def _remap_csr(ptr: np.ndarray, idx: np.ndarray, keep: np.ndarray, new_id: np.ndarray, strict: str | None):
    n = len(ptr) - 1
    dst = np.repeat(np.arange(n), np.diff(ptr))
    edge_keep = keep[dst]
    if strict is not None:
        lost = edge_keep & ~keep[idx]
        if lost.any():
            e = int(np.flatnonzero(lost)[0])
            raise GraphError(f"node {int(dst[e])} keeps {strict} {int(idx[e])}, which is dropped")
    else:
        edge_keep &= keep[idx]
    new_dst, new_src = new_id[dst[edge_keep]], new_id[idx[edge_keep]]
    new_ptr = np.zeros(int(keep.sum()) + 1, np.int32)
    np.cumsum(np.bincount(new_dst, minlength=len(new_ptr) - 1), out=new_ptr[1:])
    return new_ptr, new_src.astype(np.int32)


def _renumbered(
    g: Graph, rows: np.ndarray, buf_idx: np.ndarray, buf_ptr: np.ndarray, edges: tuple, new_id: np.ndarray,
    storages: np.ndarray, new_storage: np.ndarray, buf_storage: np.ndarray | None = None, **columns,
) -> Graph:  # fmt: skip
    """``g``'s nodes ``rows`` (in that order) with their buffers ``buf_idx`` (``buf_ptr`` per node), ``edges``: the
    new (in, dep) CSRs, ``new_id``: old node id -> new, ``storages``: the kept storages in their new order
    (``new_storage``: old storage id -> new); ``columns``: the collective-group and wait columns, already
    renumbered."""
    (in_ptr, in_idx), (dep_ptr, dep_idx) = edges
    buf_storage = g.buf_storage if buf_storage is None else buf_storage
    return Graph(
        names=[g.names[i] for i in rows],
        targets=[g.targets[i] for i in rows],
        kinds=g.kinds[rows],
        in_ptr=in_ptr,
        in_idx=in_idx,
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        flops=g.flops[rows],
        buf_ptr=buf_ptr,
        buf_shape=[g.buf_shape[b] for b in buf_idx],
        buf_dtype=[g.buf_dtype[b] for b in buf_idx],
        buf_nbytes=g.buf_nbytes[buf_idx],
        buf_storage=new_storage[buf_storage[buf_idx]].astype(np.int32),
        storage_nbytes=g.storage_nbytes[storages],
        storage_owner=new_id[g.storage_owner[storages]].astype(np.int32),
        side_effect=g.side_effect[rows],
        coll_type=g.coll_type[rows],
        coll_in_bytes=g.coll_in_bytes[rows],
        coll_out_bytes=g.coll_out_bytes[rows],
        coll_sync=g.coll_sync[rows],
        meta=g.meta,
        **columns,
    )


def select_nodes(g: Graph, keep: np.ndarray, redirect: dict[int, int] | None = None) -> Graph:
    """The nodes ``keep`` (a mask) in their order. ``redirect``: a dropped node -> the kept node whose value its
    readers read instead (the same value, e.g. a repeated collective's earlier result)."""
    keep = np.asarray(keep, bool)
    if keep.shape != (len(g),):
        raise GraphError(f"keep mask has shape {keep.shape}; expected ({len(g)},)")
    new_id = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    in_idx = g.in_idx
    if redirect:
        to = np.arange(len(g), dtype=in_idx.dtype)
        to[list(redirect)] = list(redirect.values())
        in_idx = to[in_idx]
    in_ptr, in_idx = _remap_csr(g.in_ptr, in_idx, keep, new_id, strict="input")
    to_storage = np.arange(g.num_storages)  # what viewed a dropped node's storage views the kept one's
    for d, k in (redirect or {}).items():
        to_storage[g.buf_storage[g.buf_ptr[d] : g.buf_ptr[d + 1]]] = g.buf_storage[g.buf_ptr[k] : g.buf_ptr[k + 1]]
    buf_storage = to_storage[g.buf_storage]
    # deps to dropped nodes are dropped: a dropped node has no effect left to order against
    dep_ptr, dep_idx = _remap_csr(g.dep_ptr, g.dep_idx, keep, new_id, strict=None)
    buf_counts = np.diff(g.buf_ptr)
    buf_node = np.repeat(np.arange(len(g)), buf_counts)
    buf_keep = keep[buf_node]
    storage_used = np.zeros(g.num_storages, bool)
    storage_used[buf_storage[buf_keep]] = True
    owner_kept = keep[g.storage_owner]
    if np.any(storage_used & ~owner_kept):
        s = int(np.flatnonzero(storage_used & ~owner_kept)[0])
        raise GraphError(f"storage {s} is used by a kept node but its owner {g.names[g.storage_owner[s]]!r} is dropped")
    new_storage = np.cumsum(storage_used) - 1
    buf_ptr = np.zeros(len(kept) + 1, np.int32)
    np.cumsum(buf_counts[kept], out=buf_ptr[1:])
    buf_idx = np.flatnonzero(buf_keep)
    wait_of = g.wait_of[kept].copy()
    has_wait = wait_of >= 0
    if np.any(has_wait & ~keep[np.maximum(wait_of, 0)]):
        raise GraphError("a kept wait's collective is dropped")
    wait_of[has_wait] = new_id[wait_of[has_wait]]
    edges = ((in_ptr, in_idx), (dep_ptr, dep_idx))
    return _renumbered(
        g, kept, buf_idx, buf_ptr, edges, new_id, np.flatnonzero(storage_used), new_storage, buf_storage,
        coll_group=g.coll_group[kept],
        coll_reduce_op={int(new_id[i]): op for i, op in g.coll_reduce_op.items() if keep[i]},
        wait_of=wait_of.astype(np.int32),
        groups=g.groups,
    )  # fmt: skip


def live_mask(g: Graph) -> np.ndarray:
    """Nodes that must stay: inputs, outputs, collectives, waits, side effects, and everything they read."""
    live = (
        g.side_effect
        | (g.kinds == OpKind.INPUT)
        | (g.kinds == OpKind.OUTPUT)
        | (g.kinds == OpKind.COLLECTIVE)
        | (g.kinds == OpKind.WAIT)
    ).copy()
    # only data inputs keep a node alive; control deps to dead readers are dropped with them
    ptr_l, idx_l = g.in_ptr.tolist(), g.in_idx.tolist()
    live_l = live.tolist()
    for i in range(len(g) - 1, -1, -1):
        if live_l[i]:
            for p in idx_l[ptr_l[i] : ptr_l[i + 1]]:
                live_l[p] = True
    return np.asarray(live_l, bool)


def eliminate_dead_nodes(g: Graph) -> Graph:
    keep = live_mask(g)
    return g if keep.all() else select_nodes(g, keep)


def kahn_order(succ_ptr, succ_idx, indeg, key) -> list[int]:
    """Kahn's topological sort of a CSR successor graph, always taking the ready node with the smallest
    ``(key[node], node)``; ``indeg`` is not modified. Nodes on a cycle are left out. O((N + E) log N)."""
    import heapq

    sp = succ_ptr.tolist() if hasattr(succ_ptr, "tolist") else succ_ptr
    si = succ_idx.tolist() if hasattr(succ_idx, "tolist") else succ_idx
    key = key.tolist() if hasattr(key, "tolist") else key
    deg = list(indeg.tolist() if hasattr(indeg, "tolist") else indeg)
    heap = [(key[i], i) for i in range(len(deg)) if deg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, v = heapq.heappop(heap)
        out.append(v)
        for s in si[sp[v] : sp[v + 1]]:
            deg[s] -= 1
            if deg[s] == 0:
                heapq.heappush(heap, (key[s], s))
    return out


def topological_order(g: Graph, key=None) -> np.ndarray:
    """A topological order of ``g`` that takes, among ready nodes, the smallest ``key`` (default: the node id).
    ``key`` may hold numbers or tuples, one per node. int32."""
    ptr, idx = g.successors_csr()
    indeg = np.diff(g.predecessors_csr()[0])
    out = kahn_order(ptr, idx, indeg, range(len(g)) if key is None else key)
    return np.asarray(out, np.int32)


def _permute_csr(ptr: np.ndarray, idx: np.ndarray, order: np.ndarray, new_id: np.ndarray):
    """A CSR's rows taken in ``order``, their entries renumbered by ``new_id`` (each row keeps its entry order)."""
    counts = np.diff(ptr)[order]
    new_ptr = np.zeros(len(order) + 1, np.int32)
    np.cumsum(counts, out=new_ptr[1:])
    take = np.repeat(ptr[order] - new_ptr[:-1], counts) + np.arange(int(new_ptr[-1]))
    return new_ptr, new_id[idx[take]].astype(np.int32)


def permute_nodes(g: Graph, order: np.ndarray) -> Graph:
    """``g`` with its nodes renumbered in ``order`` (a topological order of every node): the graph a frontend
    builds from the same program written in that order (storages numbered by their owner's new position, process
    groups by first use), without importing it again."""
    order = np.asarray(order, np.int64)
    if sorted(order.tolist()) != list(range(len(g))):
        raise GraphError(f"order must list each of the graph's {len(g)} nodes once")
    new_id = np.empty(len(g), np.int64)
    new_id[order] = np.arange(len(g))
    in_ptr, in_idx = _permute_csr(g.in_ptr, g.in_idx, order, new_id)
    dep_ptr, dep_idx = _permute_csr(g.dep_ptr, g.dep_idx, order, new_id)
    for ptr, idx, what in ((in_ptr, in_idx, "an input"), (dep_ptr, dep_idx, "an ordering predecessor")):
        late = idx >= np.repeat(np.arange(len(g)), np.diff(ptr))
        if late.any():
            v = int(np.searchsorted(ptr, np.flatnonzero(late)[0], side="right")) - 1
            raise GraphError(f"order puts node {g.names[order[v]]!r} before {what} of it")
    buf_ptr, buf_idx = _permute_csr(g.buf_ptr, np.arange(len(g.buf_nbytes)), order, np.arange(len(g.buf_nbytes)))
    storage_order = np.lexsort((np.arange(g.num_storages), new_id[g.storage_owner]))  # by owner, then as made
    new_storage = np.empty(g.num_storages, np.int64)
    new_storage[storage_order] = np.arange(g.num_storages)
    coll = g.coll_type[order] >= 0
    first_use = dict.fromkeys(g.coll_group[order][coll].tolist())
    groups = list(first_use) + [k for k in range(len(g.groups)) if k not in first_use]
    new_group = np.full(len(g.groups) + 1, -1, np.int64)  # index -1 (no group) stays -1
    new_group[groups] = np.arange(len(groups))
    wait_of = g.wait_of[order].copy()
    wait_of[wait_of >= 0] = new_id[wait_of[wait_of >= 0]]
    edges = ((in_ptr, in_idx), (dep_ptr, dep_idx))
    return _renumbered(
        g, order, buf_idx, buf_ptr, edges, new_id, storage_order, new_storage,
        coll_group=new_group[g.coll_group[order]].astype(g.coll_group.dtype),
        coll_reduce_op={int(new_id[i]): op for i, op in g.coll_reduce_op.items()},
        wait_of=wait_of.astype(np.int32),
        groups=[g.groups[k] for k in groups],
    )  # fmt: skip
