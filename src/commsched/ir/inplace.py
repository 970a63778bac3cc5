"""In-place writes as ordering edges: the one rule for them, which ``from_fx`` applies node by node while it imports
(:class:`WriteOrder`) and a rewrite that emits the IR directly applies over its whole node sequence
(:func:`inplace_deps`), so that both give a program the same edges.

The rule, per storage, in program order: a node that reads a storage (not a view or a wait: they read nothing
themselves) runs after the storage's last in-place writer (read after write); a node that writes it in place runs
after every reader since that write (write after read); an asynchronous collective's in-place write is complete at
its wait, which then counts as the storage's last writer.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from commsched.ir.graph import OpKind

_READS_NOTHING = (OpKind.VIEW, OpKind.WAIT)
NEVER_WRITES = (int(OpKind.VIEW), int(OpKind.WAIT), int(OpKind.INPUT), int(OpKind.OUTPUT))
"""the kinds of node that never write a storage in place"""


class WriteOrder:
    """The rule's state over the nodes visited so far: each storage's last in-place writer and its readers since."""

    __slots__ = ("last_writer", "readers")

    def __init__(self) -> None:
        self.last_writer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = {}

    def visit(self, nid: int, kind: OpKind | int, reads: Iterable[int], writes: Iterable[int]) -> list[int]:
        """The ordering dependencies of node ``nid`` (of ``kind``), which reads the storages ``reads`` and writes
        ``writes`` in place, the nodes visited in program order: the last writer of each storage it reads, then the
        readers since the last write of each storage it writes. They may name ``nid`` itself or one of its inputs,
        which the caller drops (as ``GraphBuilder.add_dep`` does)."""
        deps: list[int] = []
        if kind not in _READS_NOTHING:
            for s in reads:
                w = self.last_writer.get(s)
                if w is not None:
                    deps.append(w)
                self.readers.setdefault(s, []).append(nid)
        for s in writes:
            deps.extend(self.readers.get(s, ()))
            self.readers[s] = []
            self.last_writer[s] = nid
        return deps

    def complete(self, wait: int, storages: Iterable[int]) -> None:
        """Wait ``wait`` completes its collective's in-place writes into ``storages``: later readers follow it."""
        for s in storages:
            self.last_writer[s] = wait


def _row_of(ptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))


def _input_storages(in_ptr, in_idx, buf_ptr, buf_storage, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(node, storage) for every buffer of every input of the nodes ``dst`` (a bool mask over nodes)."""
    rows = np.flatnonzero(dst[_row_of(in_ptr)])
    node, src = _row_of(in_ptr)[rows], in_idx[rows].astype(np.int64)
    count = (buf_ptr[src + 1] - buf_ptr[src]).astype(np.int64)
    off = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(node, count), buf_storage[np.repeat(buf_ptr[src].astype(np.int64), count) + off].astype(np.int64)


def inplace_writes(kinds, in_ptr, in_idx, buf_ptr, buf_storage, storage_owner) -> dict[int, set[int]]:
    """node -> the storages it writes in place, as the IR shows them (CSR columns as in :class:`Graph`): a node that
    may write (not a view, wait, input or output) with a buffer on a storage it did not create and one of its inputs
    is on. An op that writes without returning what it wrote (``_foreach_add_``, ``split_with_sizes_copy(out=)``)
    does not show: its edges are in the importing graph's ``deps`` only."""
    node = _row_of(buf_ptr)
    storage = np.asarray(buf_storage, np.int64)
    cand = ~np.isin(np.asarray(kinds)[node], NEVER_WRITES) & (np.asarray(storage_owner)[storage] != node)
    if not cand.any():
        return {}
    mask = np.zeros(len(kinds), bool)
    mask[node[cand]] = True
    reader, read = _input_storages(in_ptr, in_idx, buf_ptr, storage, mask)
    reads = set(zip(reader.tolist(), read.tolist(), strict=True))
    out: dict[int, set[int]] = {}
    for v, s in zip(node[cand].tolist(), storage[cand].tolist(), strict=True):
        if (v, s) in reads:
            out.setdefault(v, set()).add(s)
    return out


def inplace_deps(kinds, in_ptr, in_idx, buf_ptr, buf_storage, storage_owner, wait_of, coll_sync) -> dict[int, list]:
    """:class:`WriteOrder` over a whole graph's node sequence (ids in program order; columns as in :class:`Graph`),
    with the writes :func:`inplace_writes` shows: node -> its ordering dependencies (sorted, without itself or its
    inputs), for the nodes that have any. The rule keeps storages apart, so only the nodes that touch a storage
    written in place are visited: O(E) numpy plus a loop over those."""
    writes = inplace_writes(kinds, in_ptr, in_idx, buf_ptr, buf_storage, storage_owner)
    if not writes:
        return {}
    written = np.asarray(sorted(set().union(*writes.values())), np.int64)
    kinds = np.asarray(kinds)
    reading = ~np.isin(kinds, [int(k) for k in _READS_NOTHING])
    reader, read = _input_storages(in_ptr, in_idx, buf_ptr, buf_storage, reading)
    on = np.isin(read, written)
    reads: dict[int, set[int]] = {}
    for v, s in zip(reader[on].tolist(), read[on].tolist(), strict=True):
        reads.setdefault(v, set()).add(s)
    wait_of = np.asarray(wait_of)
    completes = {}  # wait -> the in-place writes of its (asynchronous) collective
    for w in np.flatnonzero(wait_of >= 0).tolist():
        c = int(wait_of[w])
        if c in writes and not coll_sync[c]:
            completes[w] = writes[c]
    rule, out = WriteOrder(), {}
    for v in sorted({*reads, *writes, *completes}):
        if v in completes:
            rule.complete(v, completes[v])
            continue
        deps = set(rule.visit(v, int(kinds[v]), reads.get(v, ()), writes.get(v, ())))
        deps.discard(v)
        deps.difference_update(in_idx[in_ptr[v] : in_ptr[v + 1]].tolist())
        if deps:
            out[v] = sorted(deps)
    return out
