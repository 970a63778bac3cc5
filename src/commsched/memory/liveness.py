"""Storage liveness and the memory-over-time curve of one order (the memory semantics live here, in one place).

Semantics (memory is counted per *storage*, so views and other aliases are counted once):

* **Persistent** storages are owned by an ``INPUT`` node (parameters, optimizer state, the batch): they exist
  before the step starts and are never freed. They form ``persistent_bytes``, the floor of the curve.
* Every other storage is **allocated** at the position of its owner, the node that first produces it. A
  collective's output storage is therefore allocated when the collective is *issued* (its position in the order),
  not when it completes.
* A storage's **users** are the nodes that produce a buffer on it (its owner and every alias: views, ``getitem``,
  ``wait_tensor``, in-place results) and the nodes that read a buffer on it.
* With ``hold_collective_inputs=True`` (the default) the storages an asynchronous collective reads also count the
  collective's wait node(s) as users: NCCL reads its input while it runs, so the caching allocator cannot reuse that
  memory before the wait. ``False`` drops the rule (torch's ``MemoryTracker`` has no such rule).
* The storages one node **copies out of an all_gather's output** (a node that reads the gathered buffer and writes
  several storages: FSDP2's ``split_with_sizes_copy`` of a unit's parameters) are freed **together**, after the last
  user of any of them: FSDP2 frees a unit's unsharded parameters at once when it reshards the unit, after the
  unit's forward and after its backward (``FSDPParamGroup.reshard`` in ``post_forward`` / ``post_backward``), not
  each after its own last reader.
* A storage is **freed** right after its last user in the order. A storage read by the ``OUTPUT`` node is never
  freed (it is returned from the step).
* ``curve_bytes[p]`` is the memory in use *while the node at position p runs*: after its allocations and before its
  frees. The peak is the maximum of that curve, which is the definition torch's
  ``torch._inductor.fx_passes.memory_estimator.MemoryTracker.peak_memory`` uses too (it updates the peak after a
  node's allocations, then frees).

A storage nobody reads is freed right after its owner (torch's tracker keeps it to the end of the graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir.graph import CollType, Graph, OpKind, csr
from commsched.ir.order import as_order


@dataclass(frozen=True, eq=False)
class Liveness:
    """Order-independent liveness facts of a graph (built once per graph and flag; see the module docstring).

    ``users_ptr/users_idx``: CSR storage -> the nodes whose position extends its life (owner included).
    ``node_storage_ptr/node_storage_idx``: the transpose, node -> the *freeable* storages it uses.
    ``alloc_bytes``: per node, the bytes of the non-persistent storages it owns.
    """

    storage_bytes: np.ndarray  # int64 [S]
    owner: np.ndarray  # int32 [S]
    persistent: np.ndarray  # bool [S]: owned by an INPUT node
    freeable: np.ndarray  # bool [S]: neither persistent nor read by the OUTPUT node
    users_ptr: np.ndarray  # int32 [S + 1]
    users_idx: np.ndarray  # int32
    node_storage_ptr: np.ndarray  # int32 [N + 1]
    node_storage_idx: np.ndarray  # int32
    alloc_bytes: np.ndarray  # int64 [N]
    persistent_bytes: int


_CACHE_ATTR = "_commsched_liveness"


def liveness(g: Graph, hold_collective_inputs: bool = True) -> Liveness:
    """The :class:`Liveness` of ``g`` (cached on the graph per flag value). O(N + E + buffers)."""
    cache = g.__dict__.setdefault(_CACHE_ATTR, {})
    if hold_collective_inputs in cache:
        return cache[hold_collective_inputs]
    n, num_storages = len(g), g.num_storages
    sptr, sidx = g.storage_users
    rows = [np.repeat(np.arange(num_storages), np.diff(sptr)), np.arange(num_storages)]
    cols = [sidx, g.storage_owner]
    if hold_collective_inputs:
        extra_s, extra_w = [], []
        buf_ptr, buf_storage = g.buf_ptr, g.buf_storage
        for c in g.collectives.tolist():
            waits = g.waits_of(c)
            if not len(waits) or g.coll_sync[c]:
                continue
            read = np.unique(
                np.concatenate([buf_storage[buf_ptr[i] : buf_ptr[i + 1]] for i in g.inputs(c)] or [np.zeros(0, int)])
            )
            extra_s.append(np.repeat(read, len(waits)))
            extra_w.append(np.tile(waits, len(read)))
        if extra_s:
            rows.append(np.concatenate(extra_s))
            cols.append(np.concatenate(extra_w))
    for group in _copy_out_groups(g):
        readers = np.unique(np.concatenate([sidx[sptr[st] : sptr[st + 1]] for st in group]))
        rows.append(np.repeat(group, len(readers)))
        cols.append(np.tile(readers, len(group)))
    users_ptr, users_idx = csr(num_storages, np.concatenate(cols), np.concatenate(rows))

    owner = g.storage_owner.astype(np.int32)
    storage_bytes = g.storage_nbytes.astype(np.int64)
    persistent = g.kinds[owner] == OpKind.INPUT if num_storages else np.zeros(0, bool)
    pinned = np.zeros(num_storages, bool)
    user_rows = np.repeat(np.arange(num_storages), np.diff(users_ptr))
    pinned[user_rows[g.kinds[users_idx] == OpKind.OUTPUT]] = True
    freeable = ~persistent & ~pinned

    keep = freeable[user_rows]
    node_storage_ptr, node_storage_idx = csr(n, user_rows[keep], users_idx[keep])
    alloc_bytes = np.bincount(owner[~persistent], weights=storage_bytes[~persistent], minlength=n)
    lv = Liveness(
        storage_bytes=storage_bytes,
        owner=owner,
        persistent=persistent,
        freeable=freeable,
        users_ptr=users_ptr,
        users_idx=users_idx,
        node_storage_ptr=node_storage_ptr,
        node_storage_idx=node_storage_idx,
        alloc_bytes=np.rint(alloc_bytes).astype(np.int64),
        persistent_bytes=int(storage_bytes[persistent].sum()),
    )
    cache[hold_collective_inputs] = lv
    return lv


def _copy_out_groups(g: Graph) -> list[np.ndarray]:
    """The storages of each node that reads an all_gather's output (its wait's, or a view of it) and writes two or
    more storages: each such node's storages are freed together (see the module docstring). O(N + buffers)."""
    gathers = g.collectives[g.coll_type[g.collectives] == CollType.ALL_GATHER] if len(g.collectives) else []
    gathered = {int(st) for c in gathers for st in g.buf_storage[g.buf_ptr[c] : g.buf_ptr[c + 1]]}
    if not gathered:
        return []
    # per node: whether one of its buffers is a gathered storage, then whether one of its inputs' is (numpy over
    # the CSR segments: a loop over the nodes was half of a plan layout's costing on a 16k-node CP step)
    is_gathered = np.zeros(g.num_storages, bool)
    is_gathered[list(gathered)] = True
    holds = _segment_any(is_gathered[g.buf_storage], g.buf_ptr)
    reads = _segment_any(holds[g.in_idx], g.in_ptr)
    several = np.diff(g.buf_ptr) >= 2
    candidates = several & reads & (g.kinds != OpKind.COLLECTIVE) & (g.kinds != OpKind.WAIT)
    groups = []
    for i in np.flatnonzero(candidates).tolist():
        written = np.unique(g.buf_storage[g.buf_ptr[i] : g.buf_ptr[i + 1]])
        if len(written) >= 2:
            groups.append(written)
    return groups


def _segment_any(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Per segment ``values[ptr[k] : ptr[k + 1]]``: whether any is True (False when empty)."""
    running = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return running[ptr[1:]] > running[ptr[:-1]]


@dataclass(frozen=True, eq=False)
class MemoryProfile:
    """Memory over one order (all byte arrays int64, one entry per position).

    ``curve_bytes[p]``: bytes in use while the node at position p runs (after its allocations, before its frees).
    ``after_bytes[p]``: bytes in use once that node has freed the storages it used last.
    ``alloc_position`` / ``free_position``: per storage, the position that allocates it (-1: persistent) and the
    position after which it is freed (-1: never).
    """

    order: np.ndarray
    curve_bytes: np.ndarray
    after_bytes: np.ndarray
    peak_bytes: int
    peak_position: int
    persistent_bytes: int
    alloc_position: np.ndarray
    free_position: np.ndarray


def memory_profile(g: Graph, order: np.ndarray | None = None, *, hold_collective_inputs: bool = True) -> MemoryProfile:
    """Memory over ``order`` (node ids; default the graph's own order) under the module's semantics. O(N + E)."""
    n = len(g)
    order = as_order(g, order, dtype=np.int64)
    lv = liveness(g, hold_collective_inputs)
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    last = pos[lv.owner]
    nonempty = np.diff(lv.users_ptr) > 0
    if nonempty.any():
        reduced = np.maximum.reduceat(pos[lv.users_idx], lv.users_ptr[:-1][nonempty])
        last[nonempty] = np.maximum(last[nonempty], reduced)
    alloc_pos = np.where(lv.persistent, -1, pos[lv.owner])
    free_pos = np.where(lv.freeable, last, -1)

    transient, freeable = ~lv.persistent, lv.freeable
    alloc_at = np.bincount(alloc_pos[transient], weights=lv.storage_bytes[transient], minlength=n)
    freed_at = np.bincount(free_pos[freeable], weights=lv.storage_bytes[freeable], minlength=n)
    # float64 sums of int64 sizes are exact below 2**53 bytes
    alloc_at, freed_at = np.rint(alloc_at).astype(np.int64), np.rint(freed_at).astype(np.int64)
    after = lv.persistent_bytes + np.cumsum(alloc_at - freed_at)
    curve = after + freed_at
    peak_position = int(np.argmax(curve)) if n else -1
    return MemoryProfile(
        order=order,
        curve_bytes=curve,
        after_bytes=after,
        peak_bytes=int(curve[peak_position]) if n else lv.persistent_bytes,
        peak_position=peak_position,
        persistent_bytes=lv.persistent_bytes,
        alloc_position=alloc_pos,
        free_position=free_pos,
    )
