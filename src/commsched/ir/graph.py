"""The commsched graph: one training/inference step as a columnar, integer-indexed DAG.

Contract
--------
* Nodes have ids ``0..n-1`` and the ids are a valid topological order: every predecessor of a node has a
  smaller id. Passes never renumber nodes; they return a new *order* (a permutation of the ids).
* Per node: ``name`` (the FX node name when it came from FX; unique), ``target`` (a string such as
  ``"aten.mm.default"``), ``kind`` (:class:`OpKind`), data ``inputs`` (the nodes whose outputs it reads),
  control ``deps`` (ordering-only predecessors, e.g. the earlier readers of a buffer an in-place op
  overwrites), output buffers and ``flops``.
* A buffer is one output tensor: shape, dtype, bytes and a *storage* id. Views and aliases (``view``,
  ``t``, ``getitem``, ``wait_tensor``, in-place results) share their base's storage; memory is accounted
  per storage. A storage's ``storage_nbytes`` is its allocation size and ``storage_owner`` is the node
  that allocates it (an ``INPUT`` node for graph inputs, which persist for the whole step).
* Collectives: ``coll_type`` (:class:`CollType`), the process group (index into ``groups``), reduce op,
  input/output bytes and the wait node(s) that complete it. A collective with no wait is synchronous
  (e.g. ``_dtensor.shard_dim_alltoall``); every ``_c10d_functional`` collective is asynchronous and must
  have at least one wait. ``wait_of[w]`` is the collective a wait completes, -1 for other nodes.
* Adjacency is built once, on first use, as CSR int32 arrays: the predecessors of ``i`` are
  ``pred_idx[pred_ptr[i]:pred_ptr[i + 1]]`` (data inputs and control deps, unique, sorted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from enum import IntEnum
from functools import cached_property
from typing import Any

import numpy as np


class GraphError(ValueError):
    """An invalid graph; the message names the node or field and what was expected."""


class OpKind(IntEnum):
    """What a node does. Values are stable; the JSON format stores the lower-case names."""

    INPUT = 0  # a graph input (placeholder / get_attr): no inputs or deps; its storage exists before the step, persists
    COMPUTE = 1  # a kernel with a flop formula (matmul, attention, conv); runs on a compute stream
    COLLECTIVE = 2  # issues a collective on its process group's FIFO comm stream; its WAIT node(s) end it
    WAIT = 3  # blocks its stream until its collective has finished; costs nothing itself
    VIEW = 4  # aliases an input's storage (view, t, getitem, ...); costs nothing
    OTHER = 5  # any other op (pointwise, reduction, copy, ...): charged for the bytes it moves
    OUTPUT = 6  # the graph's output: keeps the storages it returns alive to the end of the step


class CollType(IntEnum):
    """Collective algorithms, named as nccl-tests names them."""

    ALL_REDUCE = 0
    ALL_GATHER = 1
    REDUCE_SCATTER = 2
    ALL_TO_ALL = 3
    BROADCAST = 4


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessGroup:
    """A process group as the graph sees it.

    ``stride`` is the distance between consecutive global ranks of the group (1 for contiguous ranks, the
    inner mesh size for the outer dimension of a 2-D mesh); the cost model derives placement from it.
    """

    name: str
    size: int
    stride: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Buffer:
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    storage: int


@dataclasses.dataclass(frozen=True, slots=True)
class Collective:
    type: CollType
    group: int  # index into Graph.groups
    reduce_op: str | None
    in_bytes: int
    out_bytes: int
    waits: tuple[int, ...]  # the wait nodes completing it; empty for a synchronous collective
    sync: bool = False  # completes before the next op on its issuing stream (no wait node)

    @property
    def comm_bytes(self) -> int:
        """Size in the nccl-tests convention: the whole gathered output for all_gather, the whole input for
        reduce_scatter, the buffer for all_reduce / all_to_all / broadcast."""
        if self.type == CollType.ALL_GATHER:
            return self.out_bytes
        return self.in_bytes


def csr(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of edges grouped by ``dst`` (ids 0..n-1): int32 (ptr, idx) with the ``src`` of each ``dst``, unique,
    sorted. O(E log E)."""
    if len(src):
        m = int(src.max()) + 1
        key = dst.astype(np.int64) * m + src.astype(np.int64)
        key.sort()  # sort and drop repeats: np.unique's result, at a quarter of its cost on these sizes
        first = np.empty(len(key), bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        key = key[first]
        dst, src = key // m, key % m
    counts = np.bincount(dst, minlength=n) if len(dst) else np.zeros(n, np.int64)
    ptr = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=ptr[1:])
    return ptr, src.astype(np.int32)


CAUSAL_META = "causal_attention"
"""``Graph.meta`` key: names of the attention nodes called with ``is_causal=True`` (frontends set it; the cost model
charges a causal pass by its blocks, since torch's flop counter ignores the mask)"""
PERMUTE_META = "permute_collectives"
"""``Graph.meta`` key: all_to_all nodes to / from one peer each (``permute_tensor``), charged as a sendrecv"""


class Graph:
    """An immutable, columnar DAG of one step; see the module docstring for the contract.

    Build one with :class:`commsched.ir.GraphBuilder` or a frontend (``from_fx``, ``load_graph``).
    ``g.validate()`` checks the invariants and raises :class:`GraphError` naming the offending node.
    """

    def __init__(
        self, *, names: list[str], targets: list[str], kinds: np.ndarray, in_ptr: np.ndarray, in_idx: np.ndarray,
        dep_ptr: np.ndarray, dep_idx: np.ndarray, flops: np.ndarray, buf_ptr: np.ndarray,
        buf_shape: list[tuple[int, ...]], buf_dtype: list[str], buf_nbytes: np.ndarray, buf_storage: np.ndarray,
        storage_nbytes: np.ndarray, storage_owner: np.ndarray, side_effect: np.ndarray, coll_type: np.ndarray,
        coll_group: np.ndarray, coll_reduce_op: dict[int, str], coll_in_bytes: np.ndarray, coll_out_bytes: np.ndarray,
        coll_sync: np.ndarray, wait_of: np.ndarray, groups: Sequence[ProcessGroup], meta: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.names = names
        self.targets = targets
        self.kinds = kinds
        self.in_ptr, self.in_idx = in_ptr, in_idx
        self.dep_ptr, self.dep_idx = dep_ptr, dep_idx
        self.flops = flops
        self.buf_ptr = buf_ptr
        self.buf_shape, self.buf_dtype = buf_shape, buf_dtype
        self.buf_nbytes, self.buf_storage = buf_nbytes, buf_storage
        self.storage_nbytes, self.storage_owner = storage_nbytes, storage_owner
        self.side_effect = side_effect
        self.coll_type, self.coll_group = coll_type, coll_group
        self.coll_reduce_op = coll_reduce_op
        self.coll_in_bytes, self.coll_out_bytes = coll_in_bytes, coll_out_bytes
        self.coll_sync = coll_sync
        self.wait_of = wait_of
        self.groups = tuple(groups)
        self.meta = dict(meta or {})

    # ------------------------------------------------------------------ sizes and lookups
    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def num_storages(self) -> int:
        return len(self.storage_nbytes)

    @cached_property
    def index(self) -> dict[str, int]:
        """Node name -> id."""
        return {name: i for i, name in enumerate(self.names)}

    def id_of(self, name_or_id: str | int) -> int:
        if isinstance(name_or_id, (int, np.integer)):
            if not 0 <= int(name_or_id) < len(self):
                raise GraphError(f"node id {int(name_or_id)} is out of range: expected 0..{len(self) - 1}")
            return int(name_or_id)
        try:
            return self.index[name_or_id]
        except KeyError:
            raise GraphError(f"no node named {name_or_id!r} in the graph") from None

    def inputs(self, i: int) -> np.ndarray:
        return self.in_idx[self.in_ptr[i] : self.in_ptr[i + 1]]

    def deps(self, i: int) -> np.ndarray:
        return self.dep_idx[self.dep_ptr[i] : self.dep_ptr[i + 1]]

    def buffers(self, i: int) -> list[Buffer]:
        lo, hi = int(self.buf_ptr[i]), int(self.buf_ptr[i + 1])
        return [
            Buffer(self.buf_shape[b], self.buf_dtype[b], int(self.buf_nbytes[b]), int(self.buf_storage[b]))
            for b in range(lo, hi)
        ]

    def collective(self, i: int) -> Collective:
        if self.coll_type[i] < 0:
            raise GraphError(f"node {self.names[i]!r} ({self.targets[i]}) is not a collective")
        return Collective(
            type=CollType(int(self.coll_type[i])),
            group=int(self.coll_group[i]),
            reduce_op=self.coll_reduce_op.get(i),
            in_bytes=int(self.coll_in_bytes[i]),
            out_bytes=int(self.coll_out_bytes[i]),
            waits=tuple(int(w) for w in self.waits_of(i)),
            sync=bool(self.coll_sync[i]),
        )

    def waits_of(self, coll: int) -> np.ndarray:
        ptr, idx = self._waits_csr
        return idx[ptr[coll] : ptr[coll + 1]]

    @cached_property
    def _waits_csr(self) -> tuple[np.ndarray, np.ndarray]:
        waits = np.flatnonzero(self.wait_of >= 0)
        return csr(len(self), waits, self.wait_of[waits])

    # ------------------------------------------------------------------ derived arrays
    @cached_property
    def out_bytes(self) -> np.ndarray:
        """Bytes of all output buffers per node (int64)."""
        per_buf_node = np.repeat(np.arange(len(self)), np.diff(self.buf_ptr))
        return np.bincount(per_buf_node, weights=self.buf_nbytes, minlength=len(self)).astype(np.int64)

    @cached_property
    def in_bytes(self) -> np.ndarray:
        """Bytes read per node: the output bytes of each data input (int64)."""
        per_edge_dst = np.repeat(np.arange(len(self)), np.diff(self.in_ptr))
        return np.bincount(per_edge_dst, weights=self.out_bytes[self.in_idx], minlength=len(self)).astype(np.int64)

    @cached_property
    def comm_bytes(self) -> np.ndarray:
        """Per node: collective size in the nccl-tests convention, 0 for non-collectives (int64)."""
        out = np.where(self.coll_type == CollType.ALL_GATHER, self.coll_out_bytes, self.coll_in_bytes)
        return np.where(self.coll_type >= 0, out, 0).astype(np.int64)

    @cached_property
    def collectives(self) -> np.ndarray:
        """Ids of the collective nodes, in id order."""
        return np.flatnonzero(self.coll_type >= 0).astype(np.int32)

    def group_sizes(self) -> dict[str, tuple[int, int]]:
        """``{group name: (size, stride)}``: what ``from_fx(gm, group_sizes=...)`` needs to import a rewritten copy of
        this graph's module outside its process group with the same groups."""
        return {grp.name: (grp.size, grp.stride) for grp in self.groups}

    @cached_property
    def _pred_csr(self) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        dst = np.concatenate(
            [np.repeat(np.arange(n), np.diff(self.in_ptr)), np.repeat(np.arange(n), np.diff(self.dep_ptr))]
        )
        src = np.concatenate([self.in_idx, self.dep_idx])
        return csr(n, src, dst)

    @cached_property
    def _succ_csr(self) -> tuple[np.ndarray, np.ndarray]:
        ptr, idx = self._pred_csr
        dst = np.repeat(np.arange(len(self)), np.diff(ptr))
        return csr(len(self), dst, idx)

    def predecessors_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, idx) int32: predecessors (data inputs and control deps) of i are idx[ptr[i]:ptr[i+1]]."""
        return self._pred_csr

    def successors_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, idx) int32: successors of i are idx[ptr[i]:ptr[i+1]]."""
        return self._succ_csr

    def predecessors(self, i: int) -> np.ndarray:
        ptr, idx = self._pred_csr
        return idx[ptr[i] : ptr[i + 1]]

    def successors(self, i: int) -> np.ndarray:
        ptr, idx = self._succ_csr
        return idx[ptr[i] : ptr[i + 1]]

    @cached_property
    def storage_users(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR (ptr, idx): the nodes that read or alias each storage (producers of aliases included)."""
        n = len(self)
        buf_node = np.repeat(np.arange(n), np.diff(self.buf_ptr))
        # a node uses storage s if it produces a buffer on s or reads an input whose buffers are on s
        in_dst = np.repeat(np.arange(n), np.diff(self.in_ptr))
        src_buf_lo, src_buf_hi = self.buf_ptr[self.in_idx], self.buf_ptr[self.in_idx + 1]
        reps = (src_buf_hi - src_buf_lo).astype(np.int64)
        reader = np.repeat(in_dst, reps)
        starts = np.repeat(src_buf_lo.astype(np.int64) - np.cumsum(reps) + reps, reps)
        read_buf = starts + np.arange(int(reps.sum()))
        users = np.concatenate([buf_node, reader])
        storages = np.concatenate([self.buf_storage, self.buf_storage[read_buf]]) if len(read_buf) else self.buf_storage
        return csr(self.num_storages, users, storages)

    def ancestor_bitsets(self, nodes: Iterable[int] | None = None) -> list[int]:
        """Ancestors of each node as a Python-int bitset (bit j set: j is an ancestor).

        O(N * N/64) words in the worst case: meant for windows and graphs of a few tens of thousands of nodes.
        With ``nodes``, only nodes up to the largest requested one are expanded and only those are returned.
        """
        ptr, idx = self._pred_csr
        wanted = None if nodes is None else sorted({int(i) for i in nodes})
        last = len(self) - 1 if wanted is None else (wanted[-1] if wanted else -1)
        anc: list[int] = []
        for i in range(last + 1):
            bits = 0
            for p in idx[ptr[i] : ptr[i + 1]].tolist():
                bits |= anc[p] | (1 << p)
            anc.append(bits)
        return anc if wanted is None else [anc[i] for i in wanted]

    # ------------------------------------------------------------------ per-node view
    def node(self, name_or_id: str | int) -> NodeView:
        return NodeView(self, self.id_of(name_or_id))

    def __iter__(self):
        return (NodeView(self, i) for i in range(len(self)))

    def __repr__(self) -> str:
        counts = np.bincount(self.kinds, minlength=len(OpKind))
        parts = ", ".join(f"{k.name.lower()}={int(counts[k])}" for k in OpKind if counts[k])
        return f"Graph({len(self)} nodes: {parts}; {len(self.groups)} process groups)"

    def validate(self) -> Graph:
        """Check the contract; raise GraphError naming the first offending node. Returns self. O(N + E)."""
        validate_graph(self)
        return self


class NodeView:
    """A read-only view of one node, for edges, tests and messages (not for hot loops)."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: Graph, node_id: int) -> None:
        self.graph, self.id = graph, node_id

    name = property(lambda self: self.graph.names[self.id])
    target = property(lambda self: self.graph.targets[self.id])
    kind = property(lambda self: OpKind(int(self.graph.kinds[self.id])))
    flops = property(lambda self: float(self.graph.flops[self.id]))
    buffers = property(lambda self: self.graph.buffers(self.id))
    inputs = property(lambda self: [int(x) for x in self.graph.inputs(self.id)])
    deps = property(lambda self: [int(x) for x in self.graph.deps(self.id)])

    @property
    def collective(self) -> Collective | None:
        return self.graph.collective(self.id) if self.graph.coll_type[self.id] >= 0 else None

    @property
    def wait_of(self) -> int | None:
        w = int(self.graph.wait_of[self.id])
        return None if w < 0 else w

    def __repr__(self) -> str:
        return f"<node {self.id} {self.name!r} {self.kind.name.lower()} {self.target}>"


# ---------------------------------------------------------------- invariant checks (the contract, enforced)
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


def _check_edges_ascending(g: Graph, src: np.ndarray, dst: np.ndarray, what: str) -> None:
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


MAX_BYTES = 1 << 53
"""the largest byte count of one buffer, storage or collective (8 PiB): far beyond any device, small enough that
every sum of them in int64 and every float of them are exact"""
MAX_TOTAL_BYTES = 1 << 62
"""the largest total of a byte column (storages, buffers, collective bytes): its int64 sums cannot wrap"""
MAX_FLOPS = 1e30
"""the most flops one node may have (a whole frontier-model training step is about 1e25)"""
MAX_RANKS = (1 << 31) - 1
"""the largest process group size and stride"""


def validate_graph(g: Graph) -> None:
    """Check the contract of the module docstring; raise GraphError naming the first offending node. O(N + E)."""
    _check_nodes(g)
    _check_buffers(g)
    _check_collectives(g)
    _check_ranges(g)
    _check_collective_sizes(g)


def _check_collective_sizes(g: Graph) -> None:
    """A collective's byte counts agree (all_gather: out = in x group size; reduce_scatter: in = out x group size;
    all_reduce, broadcast: in = out; all_to_all: no rule, uneven splits are not recorded) and with its output
    tensors (out_bytes = their bytes), so it is costed at the size it moves. Exact in int64 (after _check_ranges)."""
    colls = g.collectives
    t, ib, ob = g.coll_type[colls], g.coll_in_bytes[colls], g.coll_out_bytes[colls]
    size = np.array([grp.size for grp in g.groups] + [1], np.int64)[g.coll_group[colls]]
    gather = t == CollType.ALL_GATHER
    big, small = np.where(gather, ob, ib), np.where(gather, ib, ob)
    times = np.where(gather | (t == CollType.REDUCE_SCATTER), size, 1)
    bad = np.flatnonzero((t != CollType.ALL_TO_ALL) & ((big % times != 0) | (big // times != small)))
    if len(bad):
        k = int(bad[0])
        rule = {CollType.ALL_GATHER: "out_bytes = in_bytes x group size", CollType.REDUCE_SCATTER:
                "in_bytes = out_bytes x group size"}.get(CollType(int(t[k])), "in_bytes = out_bytes")  # fmt: skip
        raise GraphError(f"{_label(g, int(colls[k]))}: {CollType(int(t[k])).name.lower()} in_bytes {int(ib[k])}, "
                         f"out_bytes {int(ob[k])}, group size {int(size[k])}; expected {rule}")  # fmt: skip
    prefix = np.concatenate([[0], np.cumsum(g.buf_nbytes, dtype=np.int64)])
    held = prefix[g.buf_ptr[colls + 1]] - prefix[g.buf_ptr[colls]]
    bad = np.flatnonzero(held != ob)
    if len(bad):
        k = int(bad[0])
        raise GraphError(f"{_label(g, int(colls[k]))}: collective out_bytes {int(ob[k])} but its output tensors hold "
                         f"{int(held[k])} bytes; expected equal")  # fmt: skip


def _check_ranges(g: Graph) -> None:
    """Numbers small enough that no time, byte count or sum of them overflows (the MAX_* limits above)."""
    bad = np.flatnonzero(~(g.flops <= MAX_FLOPS))  # also NaN
    if len(bad):
        k = int(bad[0])
        raise GraphError(f"{_label(g, k)}: flops {g.flops[k]:g} is out of range; expected <= {MAX_FLOPS:g}")
    buf_node = np.repeat(np.arange(len(g)), np.diff(g.buf_ptr))
    is_coll = g.coll_type >= 0
    for what, values, node in (
        ("buffer nbytes", g.buf_nbytes, buf_node),
        ("collective in_bytes", np.where(is_coll, g.coll_in_bytes, 0), None),
        ("collective out_bytes", np.where(is_coll, g.coll_out_bytes, 0), None),
        ("storage nbytes", g.storage_nbytes, g.storage_owner),
    ):
        bad = np.flatnonzero(values > MAX_BYTES)
        if len(bad):
            k = int(bad[0])
            where = _label(g, int(node[k]) if node is not None else k)
            raise GraphError(f"{where}: {what} {int(values[k])} is out of range; expected <= 2**53 ({MAX_BYTES})")
        total = float(np.sum(values, dtype=np.float64))
        if total > MAX_TOTAL_BYTES:
            raise GraphError(f"the graph's {what} add up to {total:.3g}; expected a total <= 2**62")
    for grp in g.groups:
        if grp.size > MAX_RANKS or grp.stride > MAX_RANKS:
            raise GraphError(
                f"process group {grp.name!r}: size {grp.size} / stride {grp.stride}; expected <= 2**31 - 1"
            )


def _check_nodes(g: Graph) -> None:
    """One entry per node in every column, unique names, known kinds, edges in topological order, flops >= 0."""
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
        _check_edges_ascending(g, idx, dst, what)
    bad = np.flatnonzero(g.flops < 0)
    if len(bad):
        raise GraphError(f"{_label(g, int(bad[0]))}: flops {g.flops[bad[0]]} must be >= 0")
    # a graph input exists before the step: with predecessors, ordering inputs first would break topology
    has_preds = (np.diff(g.in_ptr) > 0) | (np.diff(g.dep_ptr) > 0)
    bad = np.flatnonzero((g.kinds == OpKind.INPUT) & has_preds)
    if len(bad):
        raise GraphError(f"{_label(g, int(bad[0]))}: a node of kind input has inputs or deps; expected none")


def _check_buffers(g: Graph) -> None:
    """Buffer pointers and fields, storages that exist, are owned, and are not used before their owner."""
    n = len(g)
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


def _check_collectives(g: Graph) -> None:
    """Collective info exactly on collective nodes; each wait completes an earlier collective it reads; async
    collectives have a wait, synchronous ones none; process groups of size and stride >= 1."""
    n = len(g)
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
