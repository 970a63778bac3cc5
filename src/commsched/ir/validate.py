"""Invariant checks for :class:`Graph` (see its module docstring for the contract)."""

from __future__ import annotations

import numpy as np

from commsched.ir.graph import CollType, Graph, GraphError, OpKind


def _label(g: Graph, i: int) -> str:
    return f"node {i} {g.names[i]!r} ({g.targets[i]})"


def _find_cycle(n: int, preds: list[list[int]]) -> list[int] | None:
    """A cycle in the predecessor relation, as node ids, or None. Iterative DFS, O(N + E)."""
    color = [0] * n  # 0 new, 1 on stack, 2 done
    for root in range(n):
        if color[root]:
            continue
        stack = [(root, iter(preds[root]))]
        path = [root]
        color[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                color[node] = 2
            elif color[nxt] == 1:
                return [*path[path.index(nxt) :], nxt]
            elif color[nxt] == 0:
                color[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(preds[nxt])))
    return None


def check_topological(g: Graph, src: np.ndarray, dst: np.ndarray, what: str) -> None:
    """Every edge src -> dst must have src < dst; otherwise name the cycle or the out-of-order edge."""
    n = len(g)
    bad_range = np.flatnonzero((src < 0) | (src >= n))
    if len(bad_range):
        e = int(bad_range[0])
        raise GraphError(f"{_label(g, int(dst[e]))}: {what} id {int(src[e])} does not exist (expected 0..{n - 1})")
    bad = np.flatnonzero(src >= dst)
    if not len(bad):
        return
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src.tolist(), dst.tolist(), strict=False):
        preds[d].append(s)
    cycle = _find_cycle(n, preds)
    if cycle is not None:
        path = " -> ".join(repr(g.names[i]) for i in reversed(cycle))
        raise GraphError(f"the graph has a cycle: {path}; expected a DAG")
    e = int(bad[0])
    s, d = int(src[e]), int(dst[e])
    raise GraphError(
        f"{_label(g, d)}: {what} {g.names[s]!r} (id {s}) comes after it; expected nodes in topological order"
    )


def validate_graph(g: Graph) -> None:
    n = len(g)
    for field in ("targets", "kinds", "flops", "side_effect", "coll_type", "coll_group", "wait_of", "coll_sync"):
        if len(getattr(g, field)) != n:
            raise GraphError(f"field {field!r} has {len(getattr(g, field))} entries; expected one per node ({n})")
    if len(g.index) != n:
        seen: set[str] = set()
        dup = next(name for name in g.names if name in seen or seen.add(name))
        raise GraphError(f"duplicate node name {dup!r}: node names must be unique")
    if n and (g.kinds.min() < 0 or g.kinds.max() > max(OpKind)):
        i = int(np.flatnonzero((g.kinds < 0) | (g.kinds > max(OpKind)))[0])
        raise GraphError(f"{_label(g, i)}: kind {int(g.kinds[i])} is not an OpKind")

    for ptr, idx, what in ((g.in_ptr, g.in_idx, "input"), (g.dep_ptr, g.dep_idx, "dep")):
        if len(ptr) != n + 1 or ptr[0] != 0 or ptr[-1] != len(idx) or np.any(np.diff(ptr) < 0):
            raise GraphError(f"{what} CSR pointers are malformed; expected {n + 1} non-decreasing offsets")
        dst = np.repeat(np.arange(n), np.diff(ptr))
        check_topological(g, idx, dst, what)

    bad = np.flatnonzero(g.flops < 0)
    if len(bad):
        raise GraphError(f"{_label(g, int(bad[0]))}: flops {g.flops[bad[0]]} must be >= 0")

    # buffers and storages
    nb, ns = len(g.buf_nbytes), len(g.storage_nbytes)
    if len(g.buf_ptr) != n + 1 or g.buf_ptr[-1] != nb or np.any(np.diff(g.buf_ptr) < 0):
        raise GraphError(f"buffer pointers are malformed; expected {n + 1} non-decreasing offsets ending at {nb}")
    if not (len(g.buf_shape) == len(g.buf_dtype) == len(g.buf_storage) == nb):
        raise GraphError("buffer fields shape/dtype/nbytes/storage must have one entry per buffer")
    buf_node = np.repeat(np.arange(n), np.diff(g.buf_ptr))
    bad = np.flatnonzero((g.buf_storage < 0) | (g.buf_storage >= ns))
    if len(bad):
        b = int(bad[0])
        raise GraphError(f"{_label(g, int(buf_node[b]))}: buffer storage {int(g.buf_storage[b])} does not exist")
    bad = np.flatnonzero(g.buf_nbytes < 0)
    if len(bad):
        raise GraphError(f"{_label(g, int(buf_node[bad[0]]))}: buffer nbytes must be >= 0")
    if len(g.storage_owner) != ns or np.any(g.storage_nbytes < 0):
        raise GraphError("each storage needs an owner node and nbytes >= 0")
    bad = np.flatnonzero((g.storage_owner < 0) | (g.storage_owner >= n))
    if len(bad):
        raise GraphError(f"storage {int(bad[0])}: owner node {int(g.storage_owner[bad[0]])} does not exist")
    first_user = np.full(ns, n, np.int64)
    np.minimum.at(first_user, g.buf_storage, buf_node)
    bad = np.flatnonzero(first_user < g.storage_owner)
    if len(bad):
        s = int(bad[0])
        raise GraphError(
            f"{_label(g, int(first_user[s]))}: uses storage {s} before its owner {g.names[g.storage_owner[s]]!r}"
        )

    # collectives and waits
    is_coll = g.coll_type >= 0
    bad = np.flatnonzero(is_coll != (g.kinds == OpKind.COLLECTIVE))
    if len(bad):
        i = int(bad[0])
        expected = "collective info (kind 'collective')" if is_coll[i] else "no collective info"
        raise GraphError(f"{_label(g, i)}: kind {OpKind(int(g.kinds[i])).name.lower()} expects {expected}")
    if np.any(g.coll_type > max(CollType)):
        i = int(np.flatnonzero(g.coll_type > max(CollType))[0])
        raise GraphError(f"{_label(g, i)}: collective type {int(g.coll_type[i])} is not a CollType")
    bad = np.flatnonzero(is_coll & ((g.coll_group < 0) | (g.coll_group >= len(g.groups))))
    if len(bad):
        i = int(bad[0])
        raise GraphError(f"{_label(g, i)}: process group index {int(g.coll_group[i])} does not exist")
    bad = np.flatnonzero(is_coll & ((g.coll_in_bytes < 0) | (g.coll_out_bytes < 0)))
    if len(bad):
        raise GraphError(f"{_label(g, int(bad[0]))}: collective bytes must be >= 0")
    is_wait = g.kinds == OpKind.WAIT
    bad = np.flatnonzero(is_wait != (g.wait_of >= 0))
    if len(bad):
        i = int(bad[0])
        if is_wait[i]:
            raise GraphError(f"{_label(g, i)}: wait does not belong to a collective; expected wait_of = a collective")
        raise GraphError(f"{_label(g, i)}: only wait nodes may complete a collective")
    waits = np.flatnonzero(is_wait)
    colls = g.wait_of[waits]
    bad = np.flatnonzero((colls >= n) | (colls >= waits))
    if len(bad):
        w = int(waits[bad[0]])
        raise GraphError(f"{_label(g, w)}: its collective id {int(g.wait_of[w])} must exist and come before it")
    bad = np.flatnonzero(~is_coll[colls])
    if len(bad):
        w = int(waits[bad[0]])
        c = int(g.wait_of[w])
        raise GraphError(f"{_label(g, w)}: waits on {_label(g, c)}, which is not a collective")
    for w in waits.tolist():
        c = int(g.wait_of[w])
        if c not in g.inputs(w) and c not in g.deps(w):
            raise GraphError(f"{_label(g, w)}: its collective {g.names[c]!r} must be one of its inputs or deps")
    wait_count = np.bincount(colls, minlength=n) if len(colls) else np.zeros(n, np.int64)
    bad = np.flatnonzero(is_coll & ~g.coll_sync & (wait_count == 0))
    if len(bad):
        raise GraphError(f"{_label(g, int(bad[0]))}: asynchronous collective has no wait; expected a wait_tensor")
    bad = np.flatnonzero(is_coll & g.coll_sync & (wait_count > 0))
    if len(bad):
        raise GraphError(f"{_label(g, int(bad[0]))}: synchronous collective must not have a wait")
    for grp in g.groups:
        if grp.size < 1 or grp.stride < 1:
            raise GraphError(f"process group {grp.name!r}: size and stride must be >= 1")
