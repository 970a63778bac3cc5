"""The ordering edges ``from_fx`` derives from in-place writes (read-after-write, write-after-read on a storage), as
a rewritten program needs them beyond the old nodes' remapped ones (``rewrites/graph_emit.py``: ``e`` is its
emitted sequence: ``g``, ``m``, ``items``, ``new_pos``, ``old_pos``, ``old_v``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from commsched.ir import OpKind

NOT_WRITERS = (int(OpKind.VIEW), int(OpKind.WAIT), int(OpKind.INPUT), int(OpKind.OUTPUT))
"""kinds that never write a storage in place"""


def row_of(ptr: np.ndarray) -> np.ndarray:
    """The row of every entry of a CSR with row pointers ``ptr``."""
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))


def inplace_ordering_deps(e: Any, in_ptr, in_idx, buf_ptr, storage, creator) -> dict[int, list[int]]:
    """Ordering dependencies ``from_fx``'s rule gives the bucketed program beyond the old nodes' remapped ones: a new
    node (not a view or wait) that reads a storage written in place runs after the last kept node that wrote it
    before it (read-after-write); and on a storage a new node created (a bucket's output, which its members' outputs
    now share), a kept reader follows the last in-place writer before it, and a kept writer follows the readers
    since the previous write (write-after-read): edges a member's reader and another member's writer never had."""
    import bisect

    g = e.g
    row_item = row_of(buf_ptr)
    # in-place writes: a kept node (not a view, wait, input or output) whose output lives on a storage it reads
    writer_item = np.zeros(e.m, bool)
    writer_item[e.old_pos] = ~np.isin(g.kinds[e.old_v], NOT_WRITERS)
    # rows that created their storage cannot be on a storage their node reads
    candidates = np.flatnonzero(writer_item[row_item] & ~creator).tolist()
    storages = storage.tolist()
    ptr, idx, bptr = in_ptr.tolist(), in_idx.tolist(), buf_ptr.tolist()

    def read(p: int) -> set[int]:
        return {storages[b] for i in idx[ptr[p] : ptr[p + 1]] for b in range(bptr[i], bptr[i + 1])}

    events: dict[int, list[int]] = {}  # storage -> positions of its in-place writers, ascending
    reads: dict[int, set[int]] = {}
    for r in candidates:
        p = int(row_item[r])
        if p not in reads:
            reads[p] = read(p)
        if storages[r] in reads[p]:
            events.setdefault(storages[r], []).append(p)
    out: dict[int, set[int]] = {}
    if not events:
        return {p: [] for p in e.new_pos}

    def last_writer(p: int, s: int) -> int | None:
        at = events.get(s)
        k = bisect.bisect_left(at, p) if at else 0
        return at[k - 1] if k else None

    for p in e.new_pos:
        deps = set()
        if e.items[p].kind not in (OpKind.VIEW, OpKind.WAIT):
            deps = {w for s in read(p) if (w := last_writer(p, s)) is not None}
        out[p] = deps
    for p, deps in _shared_storage_deps(e, in_ptr, in_idx, row_item, storage, creator, events, read).items():
        out.setdefault(p, set()).update(deps)
    return {p: sorted(deps - {p} - set(idx[ptr[p] : ptr[p + 1]])) for p, deps in out.items()}


def _shared_storage_deps(e: Any, in_ptr, in_idx, row_item, storage, creator, events, read) -> dict[int, set[int]]:
    """Kept nodes' ordering dependencies on the storages new nodes created (see :func:`inplace_ordering_deps`)."""
    import bisect

    is_new = np.zeros(e.m, bool)
    is_new[e.new_pos] = True
    created = set(storage[creator & is_new[row_item]].tolist()) & set(events)
    if not created:
        return {}
    kind_at = np.full(e.m, -1, np.int64)
    kind_at[e.old_pos] = e.g.kinds[e.old_v]
    on_created = np.zeros(e.m, bool)
    on_created[row_item[np.isin(storage, list(created))]] = True
    readers = np.unique(row_of(in_ptr)[on_created[in_idx]])
    readers_of: dict[int, list[int]] = {}  # storage -> ascending positions of its kept readers (not views or waits)
    for p in readers[~is_new[readers]].tolist():
        if kind_at[p] not in (int(OpKind.VIEW), int(OpKind.WAIT)):
            for s in read(p) & created:
                readers_of.setdefault(s, []).append(p)
    out: dict[int, set[int]] = {}
    for s, at in events.items():
        if s not in created:
            continue
        for p in readers_of.get(s, ()):  # read-after-write
            k = bisect.bisect_left(at, p)
            if k:
                out.setdefault(p, set()).add(at[k - 1])
        for k, w in enumerate(at):  # write-after-read: the readers since the previous write
            prev = at[k - 1] if k else -1
            out.setdefault(w, set()).update(r for r in readers_of.get(s, ()) if prev < r < w)
    return out
