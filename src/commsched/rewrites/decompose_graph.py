"""Decomposed TP collectives applied to the IR: the graph ``from_fx`` would import from :func:`decompose_tp`'s module.

:mod:`commsched.optimize.families.decomposed_tp` judges decomposed-TP plans; rewriting the FX module (a FakeTensor
dispatch per new node, a copy of the module) and re-importing it costs about a second per plan on a 5k-node step.
This module builds the same :class:`Graph` from the source IR: the same new nodes (names, targets, kinds, shapes,
storages, flops), made in the same order with the same priorities, placed by the same stable topological sort
(:mod:`commsched.rewrites.graph_emit` replays it). Only the kept plan is rewritten in FX.
``tests/rewrites/test_decompose_graph.py`` checks the two agree field by field on traced zoo TP, TP+SP and FSDP+TP
steps, on the traced program and on a bucketed one.

What the IR does not hold comes from the traced FX module (:func:`fx_facts`): which nodes form each site's sum of
products (the rule is :func:`commsched.rewrites.decompose_tp.product_tree`'s) and which operands are not contiguous.
Where the rewrite would change an in-place ordering dependency (a storage it reads or frees is written in place) or
the order in which process groups first appear, :class:`Unsupported` is raised: the caller rewrites the FX module.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from torch.utils.flop_counter import flop_registry

from commsched.ir import Graph, GraphError, OpKind
from commsched.rewrites.decompose_tp import (
    ADD,
    AG,
    AR,
    MM,
    RS,
    WAIT,
    TPSite,
    TPSplit,
    aten,
    new_priority,
    node_prefix,
    product_tree,
)
from commsched.rewrites.graph_emit import NewNode, emit_graph

T_SLICE, T_VIEW, T_SELECT = str(aten.slice.Tensor), str(aten.view.default), str(aten.select.int)
T_STACK, T_CAT, T_CLONE = str(aten.stack.default), str(aten.cat.default), str(aten.clone.default)
T_MM, T_ADD, T_WAIT = str(MM), str(ADD), str(WAIT)
_COLL_TARGETS = {str(AG): "ag", str(RS): "rs", str(AR): "ar"}


class Unsupported(GraphError):
    """The IR rewrite cannot promise the FX rewrite's graph here (see the module docstring): rewrite the FX module."""


@dataclasses.dataclass(frozen=True)
class FxFacts:
    """What the IR rewrite needs of the traced FX module: per site, its sum-of-products node names (root first);
    the names of 2-D nodes whose value is not contiguous."""

    trees: Mapping[str, tuple[str, ...]]
    noncontiguous: frozenset[str]
    names: frozenset[str]


def fx_facts(gm, sites: Sequence[TPSite]) -> FxFacts:
    """:class:`FxFacts` of ``gm`` (the traced module) for ``sites`` (its :func:`find_tp_sites`). O(N)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    trees = {}
    for s in sites:
        if s.pattern != "ag_mm":
            tree = product_tree(by_name[s.collective].args[0])
            trees[s.collective] = tuple(n.name for n in tree or ())
    noncontig = set()
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if hasattr(v, "is_contiguous") and v.dim() == 2 and not v.is_contiguous():
            noncontig.add(n.name)
    return FxFacts(trees, frozenset(noncontig), frozenset(by_name))


class IRBuilder:
    """The new nodes as :class:`commsched.rewrites.decompose_tp.IRBuilder` creates them: names, priorities, and for
    each its buffer (shape, dtype, bytes, the node whose storage it aliases or None)."""

    def __init__(self, g: Graph, facts: FxFacts):
        self.g, self.facts, self.index = g, facts, g.index
        self.added: list[NewNode] = []
        self.meta: dict[str, tuple[tuple[int, ...], str, int, str | None]] = {}
        self.seq = 0
        self.prefix = node_prefix(g.names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.buf(name)[0]

    def buf(self, name: str) -> tuple[tuple[int, ...], str, int]:
        """(shape, dtype, itemsize) of a node's (first) tensor."""
        if name in self.meta:
            shape, dtype, itemsize, _ = self.meta[name]
            return shape, dtype, itemsize
        v = self.index[name]
        b = int(self.g.buf_ptr[v])
        if b >= int(self.g.buf_ptr[v + 1]):
            raise Unsupported(f"node {name!r} has no tensor")
        shape = tuple(int(s) for s in self.g.buf_shape[b])
        numel = math.prod(shape)
        return shape, self.g.buf_dtype[b], int(self.g.buf_nbytes[b]) // numel if numel else 0

    def storage_of(self, name: str) -> str:
        """The node whose storage ``name``'s output lives on, for a view of it (new views chain to their base)."""
        return self.meta[name][3] or name if name in self.meta else name

    def new(self, anchor: float, target: str, kind: OpKind, inputs: list[str], shape, like: str, *, view_of=None,
            flops=0.0, coll=None, wait_of=None, name=None) -> str:  # fmt: skip
        """Add one node (``like``: the node whose dtype it has); returns its name."""
        self.seq += 1
        name = name or f"{self.prefix}{self.seq}"
        _, dtype, itemsize = self.buf(like)
        shape = tuple(int(s) for s in shape)
        nbytes = math.prod(shape) * itemsize
        storage = None if view_of is None else self.storage_of(view_of)
        self.meta[name] = (shape, dtype, itemsize, storage)
        side = kind in (OpKind.COLLECTIVE, OpKind.WAIT)
        self.added.append(NewNode(name, target, kind, inputs, [(shape, dtype, nbytes, storage)],
                                  new_priority(anchor, self.seq), side_effect=side, coll=coll, wait_of=wait_of,
                                  flops=flops))  # fmt: skip
        return name

    def view(self, anchor: float, target: str, src: str, shape) -> str:
        return self.new(anchor, target, OpKind.VIEW, [src], shape, src, view_of=src)

    def mm(self, anchor: float, a: str, b: str) -> str:
        (m, k), (_, n) = self.shape(a), self.shape(b)
        flops = float(flop_registry[aten.mm]((m, k), (k, n), out_val=None))
        return self.new(anchor, T_MM, OpKind.COMPUTE, [a] if a == b else [a, b], (m, n), a, flops=flops)

    def collective(self, anchor: float, orig: int, src: str, shape, name: str) -> str:
        g = self.g
        _, _, itemsize = self.buf(src)
        in_bytes = math.prod(self.shape(src)) * itemsize
        coll = (int(g.coll_type[orig]), int(g.coll_group[orig]), g.coll_reduce_op.get(orig), in_bytes,
                math.prod(shape) * itemsize)  # fmt: skip
        return self.new(anchor, g.targets[orig], OpKind.COLLECTIVE, [src], shape, src, coll=coll, name=name)

    def wait(self, anchor: float, coll: str) -> str:
        return self.new(anchor, T_WAIT, OpKind.WAIT, [coll], self.shape(coll), coll, view_of=coll, wait_of=coll)


def _users(g: Graph, v: int) -> list[int]:
    """The nodes that read ``v`` as data (FX's ``users``), ascending."""
    rows = np.repeat(np.arange(len(g)), np.diff(g.in_ptr))
    return sorted(set(rows[g.in_idx == v].tolist()))


def operands(g: Graph, v: int) -> tuple[str, str]:
    """The two operands of an ``mm`` / ``add`` node (one node read twice: that node twice)."""
    ins = [g.names[int(i)] for i in g.inputs(v)]
    return (ins[0], ins[0]) if len(ins) == 1 else (ins[0], ins[1])


def site_waits(g: Graph, coll: int) -> tuple[int, list[int]]:
    """(the wait that reads ``coll``, the waits on that wait's result, directly or on one another): the latter are
    :func:`commsched.rewrites.decompose_tp.extra_waits`, which the FX rewrite folds away. Any other shape of waits:
    :class:`Unsupported`."""
    waits = sorted(int(w) for w in g.waits_of(coll))  # topological: a wait after what it reads
    known: set[int] = set()
    extra: list[int] = []
    for w in waits:
        ins = g.inputs(w).tolist()
        if not known and ins == [coll]:
            known.add(w)
        elif known and len(ins) == 1 and ins[0] in known:
            known.add(w)
            extra.append(w)
        else:
            raise Unsupported(f"collective {g.names[coll]!r}: {len(waits)} waits")
    if not known:
        raise Unsupported(f"collective {g.names[coll]!r}: no wait")
    return waits[0], extra


def alias_users(g: Graph, wait: int, extra: list[int]) -> list[int]:
    """The nodes reading ``wait`` or one of its ``extra`` waits, other than those waits, ascending."""
    aliases = {wait, *extra}
    return sorted({u for a in aliases for u in _users(g, a)} - aliases)


def _interleave(b: IRBuilder, anchor: float, pieces: list[str], world: int, s: int) -> str:
    n = b.shape(pieces[0])[1]
    views = [b.view(anchor, T_VIEW, p, (world, s, n)) for p in pieces]
    stacked = b.new(anchor, T_STACK, OpKind.OTHER, views, (world, len(pieces), s, n), views[0])
    return b.view(anchor, T_VIEW, stacked, (world * len(pieces) * s, n))


def _split_ag(b: IRBuilder, coll: int, site: TPSite, split: TPSplit, records: tuple) -> None:
    """The IR twin of :func:`commsched.rewrites.decompose_tp._split_ag`."""
    g, index = b.g, b.index
    removed, rename, smap_late = records
    pos = float(coll)
    x = g.names[int(g.inputs(coll)[0])]
    wait, extra = site_waits(g, coll)
    world, k = int(g.groups[int(g.coll_group[coll])].size), split.chunks
    rows, cols = b.shape(x)
    s = rows // k
    mms = sorted(index[m] for m in site.matmuls)
    first = float(mms[0])
    gathered = []
    for j in range(k):
        xj = b.view(pos, T_SLICE, x, (s, cols))
        gathered.append(b.collective(pos, coll, xj, (world * s, cols), f"{g.names[coll]}_tp{j}"))
    waited, pieces = [], {u: [] for u in mms}
    for c in gathered:
        w = b.wait(first, c)
        waited.append(w)
        for u in mms:
            pieces[u].append(b.mm(first, w, operands(g, u)[1]))
    for u in mms:
        out = _interleave(b, float(u), pieces[u], world, s)
        rename[g.names[u] + "\0data"] = out
        smap_late[int(g.buf_storage[g.buf_ptr[u]])] = out
    others = [v for v in alias_users(g, wait, extra) if v not in pieces]  # other readers of the gathered tensor
    if others:  # reassembled for them alone
        out = _interleave(b, float(others[0]), waited, world, s)
        for w in (wait, *extra):
            rename[g.names[w] + "\0data"] = out
        smap_late[int(g.buf_storage[g.buf_ptr[coll]])] = out
    removed.update([*mms, *extra, wait, coll])


def _leaf(b: IRBuilder, cache: dict, x0: str, j: int, how: tuple) -> str:
    """Chunk ``j`` of operand ``x0`` of a reduction's sum of products (``how``: the split, the reduction's world
    size, the collective's position), made once per (operand, chunk) as ``decompose_tp._split_reduce`` makes it."""
    split, world, pos = how
    k, dim = split.chunks, split.dim
    if (x0, j) in cache:
        return cache[(x0, j)]
    x = x0
    rows, cols = b.shape(x)
    if dim == "n":
        out = b.view(pos, T_SLICE, x, (rows, (j + 1) * cols // k - j * cols // k))
    elif world == 1:
        out = b.view(pos, T_SLICE, x, ((j + 1) * rows // k - j * rows // k, cols))
    else:  # block j of every rank's slice, contiguous for the reduce_scatter
        s = rows // (world * k)
        if x0 not in b.facts.names:  # made by an earlier rewrite: its strides are not known here
            raise Unsupported(f"operand {x0!r}: contiguity unknown")
        if x0 in b.facts.noncontiguous:
            if (x0, -1) not in cache:
                cache[(x0, -1)] = b.new(pos, T_CLONE, OpKind.OTHER, [x0], (rows, cols), x0)
            x = cache[(x0, -1)]
        blocks = b.view(pos, T_VIEW, x, (world, k, s, cols))
        picked = b.view(pos, T_SELECT, blocks, (world, s, cols))
        dense = b.new(pos, T_CLONE, OpKind.OTHER, [picked], (world, s, cols), picked)
        out = b.view(pos, T_VIEW, dense, (world * s, cols))
    cache[(x0, j)] = out
    return out


def _split_reduce(b: IRBuilder, coll: int, split: TPSplit, tree_names: tuple[str, ...], records: tuple) -> None:
    """The IR twin of :func:`commsched.rewrites.decompose_tp._split_reduce`."""
    g, index = b.g, b.index
    removed, rename, smap_late = records
    pos = float(coll)
    wait, extra = site_waits(g, coll)
    tree = [index[t] for t in tree_names]
    in_tree = set(tree_names)
    kind = _COLL_TARGETS[g.targets[coll]]
    world = int(g.groups[int(g.coll_group[coll])].size) if kind == "rs" else 1
    k, dim = split.chunks, split.dim
    cache: dict[tuple[str, int], str] = {}
    how = (split, world, pos)

    def chunk(name: str, j: int) -> str:
        if name not in in_tree:
            return _leaf(b, cache, name, j, how)
        v = index[name]
        left, right = operands(g, v)
        if g.targets[v] == T_MM and dim == "m":
            return b.mm(pos, _leaf(b, cache, left, j, how), right)
        if g.targets[v] == T_MM:
            return b.mm(pos, left, _leaf(b, cache, right, j, how))
        lhs = chunk(left, j)
        rhs = chunk(right, j)
        return b.new(pos, T_ADD, OpKind.OTHER, [lhs] if lhs == rhs else [lhs, rhs], b.shape(lhs), lhs)

    starts = []
    for j in range(k):
        part = chunk(tree_names[0], j)
        m, n = b.shape(part)
        shape = (m // world, n) if kind == "rs" else (m, n)
        starts.append(b.collective(pos, coll, part, shape, f"{g.names[coll]}_tp{j}"))
    waited = [b.wait(float(wait), c) for c in starts]
    shapes = [b.shape(w) for w in waited]
    joined_shape = (
        (sum(s[0] for s in shapes), shapes[0][1]) if dim == "m" else (shapes[0][0], sum(s[1] for s in shapes))
    )
    joined = b.new(float(wait), T_CAT, OpKind.OTHER, waited, joined_shape, waited[0])
    for w in (wait, *extra):
        rename[g.names[w] + "\0data"] = joined
    smap_late[int(g.buf_storage[g.buf_ptr[coll]])] = joined
    removed.update([*extra, wait, coll, *tree])


def decompose_graph(g: Graph, splits: Sequence[TPSplit], sites: Sequence[TPSite], facts: FxFacts) -> Graph:
    """``g`` with each split of ``splits`` applied: the graph ``from_fx`` imports from
    ``decompose_tp(gm_g, splits, graph=g)``, where ``gm_g`` is the module ``g`` was imported from (or built as).
    ``sites``: the sites of that module; ``facts``: :func:`fx_facts` of the traced module. Raises
    :class:`Unsupported` where it cannot promise that graph, GraphError where a split does not apply."""
    by_site = {s.collective: s for s in sites}
    b = IRBuilder(g, facts)
    removed: set[int] = set()
    rename: dict[str, str] = {}
    smap_late: dict[int, str] = {}
    for split in splits:
        site = by_site.get(split.site)
        if site is None or split.site not in b.index:
            raise GraphError(f"collective {split.site!r}: not a decomposable TP site (see find_tp_sites)")
        if not site.can_split(split.dim, split.chunks):
            raise GraphError(f"collective {split.site!r} ({site.pattern}): cannot split {split.chunks} ways along "
                             f"{split.dim!r}; extents {dict(site.extents)}")  # fmt: skip
        coll = b.index[split.site]
        if site.pattern == "ag_mm":
            _split_ag(b, coll, site, split, (removed, rename, smap_late))
        else:
            _split_reduce(b, coll, split, facts.trees[split.site], (removed, rename, smap_late))
    _check_no_hazards(g, removed)
    out = emit_graph(g, np.arange(len(g), dtype=np.float64), removed, rename, smap_late, b.added)
    first = np.unique(out.coll_group[out.coll_group >= 0], return_index=True)[1]
    if np.any(np.diff(out.coll_group[out.coll_group >= 0][np.sort(first)]) < 0):
        raise Unsupported("the split changes the order in which process groups first appear")
    return out


def _check_no_hazards(g: Graph, removed: set[int]) -> None:
    """Raise :class:`Unsupported` when a storage the removed nodes read or own may be written in place: the FX
    re-import would re-derive the in-place ordering dependencies over the new readers. Such a storage is read by
    both ends of an ordering dependency (RAW: the reader and the writer, whose written argument is an input; WAR:
    the writer and the earlier reader)."""
    src_rows = np.repeat(np.arange(len(g)), np.diff(g.dep_ptr))
    hazard = g.dep_idx != g.wait_of[src_rows]  # a wait's dependency on its collective is no hazard
    written: set[int] = set()
    for v, d in zip(src_rows[hazard].tolist(), g.dep_idx[hazard].tolist(), strict=True):
        written |= _read(g, [v]) & _read(g, [d])
    if not written:
        return
    touched = sorted(removed)
    if (_read(g, touched) | _storages(g, touched)) & written:
        raise Unsupported("a storage the split reads may be written in place")


def _read(g: Graph, nodes: list[int]) -> set[int]:
    """The storages ``nodes`` read (their inputs' buffers)."""
    return _storages(g, [int(i) for v in nodes for i in g.inputs(v).tolist()])


def _storages(g: Graph, nodes: list[int]) -> set[int]:
    out: set[int] = set()
    for v in nodes:
        out.update(g.buf_storage[g.buf_ptr[v] : g.buf_ptr[v + 1]].tolist())
    return out
