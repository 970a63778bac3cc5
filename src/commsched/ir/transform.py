"""Whole-graph transforms that renumber nodes: subgraph selection and dead-node elimination."""

from __future__ import annotations

import numpy as np

from commsched.ir.graph import Graph, GraphError, OpKind


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


def select_nodes(g: Graph, keep: np.ndarray) -> Graph:
    keep = np.asarray(keep, bool)
    if keep.shape != (len(g),):
        raise GraphError(f"keep mask has shape {keep.shape}; expected ({len(g)},)")
    new_id = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    in_ptr, in_idx = _remap_csr(g.in_ptr, g.in_idx, keep, new_id, strict="input")
    # deps to dropped nodes are dropped: a dropped node has no effect left to order against
    dep_ptr, dep_idx = _remap_csr(g.dep_ptr, g.dep_idx, keep, new_id, strict=None)
    buf_counts = np.diff(g.buf_ptr)
    buf_node = np.repeat(np.arange(len(g)), buf_counts)
    buf_keep = keep[buf_node]
    storage_used = np.zeros(g.num_storages, bool)
    storage_used[g.buf_storage[buf_keep]] = True
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
    return Graph(
        names=[g.names[i] for i in kept],
        targets=[g.targets[i] for i in kept],
        kinds=g.kinds[kept],
        in_ptr=in_ptr,
        in_idx=in_idx,
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        flops=g.flops[kept],
        buf_ptr=buf_ptr,
        buf_shape=[g.buf_shape[b] for b in buf_idx],
        buf_dtype=[g.buf_dtype[b] for b in buf_idx],
        buf_nbytes=g.buf_nbytes[buf_idx],
        buf_storage=new_storage[g.buf_storage[buf_idx]].astype(np.int32),
        storage_nbytes=g.storage_nbytes[storage_used],
        storage_owner=new_id[g.storage_owner[storage_used]].astype(np.int32),
        side_effect=g.side_effect[kept],
        coll_type=g.coll_type[kept],
        coll_group=g.coll_group[kept],
        coll_reduce_op={int(new_id[i]): op for i, op in g.coll_reduce_op.items() if keep[i]},
        coll_in_bytes=g.coll_in_bytes[kept],
        coll_out_bytes=g.coll_out_bytes[kept],
        coll_sync=g.coll_sync[kept],
        wait_of=wait_of.astype(np.int32),
        groups=g.groups,
        meta=g.meta,
    )


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
