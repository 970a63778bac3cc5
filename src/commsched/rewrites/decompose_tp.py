"""Decomposed tensor-parallel collectives (async TP with functional collectives), as an FX rewrite.

A TP layer puts a collective between two matmuls that need it; splitting the pair into ``k`` chunks lets chunk
``j``'s transfer run under chunk ``j + 1``'s (or ``j - 1``'s) matmul. Only ``_c10d_functional`` collectives are
emitted, so the result runs on gloo and NCCL alike. Patterns, as the zoo's TP, TP+SP and FSDP+TP steps trace them:

* ``ag_mm``: ``all_gather(x)`` (x: ``(S, K)`` on each of ``W`` ranks) read as the left operand of one or more
  ``mm``. Split ``"m"``: chunk ``j`` gathers rows ``[j S/k, (j+1) S/k)`` of every rank's shard (a view); its matmul
  gives rows ``r S + j S/k + i`` of the product, and the ``k`` products are interleaved back in one copy
  (``stack`` on dim 1, then a view). Other readers of the gathered tensor (a weight gradient's ``t``) read it
  reassembled the same way.
* ``mm_rs`` / ``mm_ar``: ``reduce_scatter`` / ``all_reduce`` of a sum of products (``mm``, ``add`` of products, as a
  backward's input gradient) that nothing else reads. Split ``"n"``: chunk ``j`` multiplies by column block ``j``
  of each right operand and reduces a ``(M, N/k)`` piece; the pieces are concatenated on dim 1. Split ``"m"``:
  chunk ``j`` multiplies row block ``j`` of each left operand (for reduce_scatter: block ``j`` of every rank's
  slice, gathered by a copy, so that each rank receives its rows ``[j S/k, (j+1) S/k)``); concatenated on dim 0.

A ``wait_tensor`` on a site's already-waited result (a user program's explicit extra wait) returns its input: the
site's readers are found through it, and the split folds it away (:func:`extra_waits`).

Reductions are elementwise, so every rank's result is the same function of the same operands; in floating point a
matmul over a row or column block may round differently from the whole one (BLAS blocking), so the checks compare
to a tolerance. What a split costs (smaller GEMMs at lower efficiency, more launches, each collective's latency,
the concatenation's copy) is the cost model's; whether it pays is the simulator's call
(:mod:`commsched.optimize.families.decomposed_tp`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from commsched.ir import Graph, GraphError
from commsched.rewrites.fxutil import (
    WAIT,
    RewriteResult,
    call,
    fake_mode_of,
    finish,
    ir_control_edges,
    is_op,
    nodes_by_name,
    stable_toposort,
    wait_users,
)

aten = torch.ops.aten
c10d = torch.ops._c10d_functional
AG, RS, AR = c10d.all_gather_into_tensor.default, c10d.reduce_scatter_tensor.default, c10d.all_reduce.default
MM, ADD = aten.mm.default, aten.add.Tensor
TRANSFORM_META = "commsched_transform"
"""``node.meta`` key naming the transform that created the node (the runtime widens its output check for them)"""


@dataclasses.dataclass(frozen=True)
class TPSite:
    """One collective that a decomposition can split, and along which dims."""

    collective: str
    """FX name of the collective"""
    pattern: str
    """``ag_mm``, ``mm_rs`` or ``mm_ar`` (module docstring)"""
    group: str
    matmuls: tuple[str, ...]
    """FX names of the matmuls that are split with it"""
    extents: tuple[tuple[str, int], ...]
    """(dim, length a chunk count must divide): ``m`` rows (per rank for ag_mm and mm_rs), ``n`` columns"""
    nbytes: int
    """bytes of the collective's result"""

    def can_split(self, dim: str, chunks: int) -> bool:
        return chunks >= 2 and any(d == dim and n % chunks == 0 and n >= chunks for d, n in self.extents)


@dataclasses.dataclass(frozen=True)
class TPSplit:
    """Split ``site`` (a collective's FX name) into ``chunks`` along ``dim`` ("m" or "n")."""

    site: str
    dim: str
    chunks: int


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is2d(node: Any) -> bool:
    v = _val(node)
    return isinstance(v, torch.Tensor) and v.dim() == 2


def _single_user(node: torch.fx.Node) -> bool:
    return len(node.users) == 1


def product_tree(root: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes of the sum of products computing ``root`` (``mm`` / ``add`` nodes on 2-D values, each read only by
    its parent; root first), or None when ``root`` is not one or holds no ``mm``: what a reduce site's split
    rewrites, here and on the IR (:mod:`commsched.rewrites.decompose_graph`)."""
    tree: list[torch.fx.Node] = []
    stack = [root]
    while stack:
        n = stack.pop()
        if not (_single_user(n) and _is2d(n)):
            return None
        if is_op(n, MM) and all(_is2d(a) for a in n.args[:2]):
            tree.append(n)
        elif is_op(n, ADD) and len(n.args) == 2 and not n.kwargs and all(_is2d(a) for a in n.args):
            tree.append(n)
            a, b = n.args
            if _val(a).shape != _val(b).shape:
                return None
            stack += [x for x in (a, b) if isinstance(x, torch.fx.Node) and is_op(x, MM, ADD) and _single_user(x)]
        else:
            return None
    return tree if any(is_op(n, MM) for n in tree) else None


def extra_waits(wait: torch.fx.Node) -> list[torch.fx.Node]:
    """The ``wait_tensor`` nodes that wait again on ``wait``'s result, directly or on one another (a user program
    may wait explicitly on a tensor already waited). No work is pending on a completed tensor, so such a wait
    returns its input: each is an alias of ``wait``, and a split folds it away. O(their users)."""
    out: list[torch.fx.Node] = []
    stack = [wait]
    while stack:
        n = stack.pop()
        for u in n.users:
            if is_op(u, WAIT) and u.args[0] is n:
                out.append(u)
                stack.append(u)
    return out


def _readers(wait: torch.fx.Node) -> tuple[set[torch.fx.Node], list[torch.fx.Node]]:
    """(``wait`` and its :func:`extra_waits`, the nodes that read any of them other than those waits)."""
    aliases = {wait, *extra_waits(wait)}
    return aliases, list(dict.fromkeys(u for a in aliases for u in a.users if u not in aliases))


def _fold_extra_waits(wait: torch.fx.Node) -> list[torch.fx.Node]:
    """Rewire the readers of ``wait``'s :func:`extra_waits` to ``wait`` itself; returns those waits (read by
    nothing, still reading ``wait`` until the caller erases them)."""
    extra = extra_waits(wait)
    for e in extra:
        e.replace_all_uses_with(wait)
    return extra


def _site(node: torch.fx.Node) -> TPSite | None:
    waits = wait_users(node)
    if len(waits) != 1 or len(node.users) != 1:
        return None
    out = _val(waits[0])
    nbytes = out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0
    if is_op(node, AG):
        x, world, group = node.args[:3]
        aliases, readers = _readers(waits[0])
        mms = [u for u in readers if is_op(u, MM) and u.args[0] in aliases and _is2d(u.args[1])]
        if not (_is2d(x) and mms):
            return None
        rows = int(_val(x).shape[0])
        return TPSite(node.name, "ag_mm", str(group), tuple(m.name for m in mms), (("m", rows),), nbytes)
    if is_op(node, RS, AR) and isinstance(node.args[0], torch.fx.Node):
        tree = product_tree(node.args[0])
        if tree is None:
            return None
        m, n = (int(s) for s in _val(node.args[0]).shape)
        world = int(node.args[2]) if is_op(node, RS) else 1
        pattern = "mm_rs" if is_op(node, RS) else "mm_ar"
        group = str(node.args[3] if is_op(node, RS) else node.args[2])
        if m % world:
            return None
        mms = tuple(t.name for t in tree if is_op(t, MM))
        return TPSite(node.name, pattern, group, mms, (("m", m // world), ("n", n)), nbytes)
    return None


def find_tp_sites(gm: torch.fx.GraphModule) -> list[TPSite]:
    """Every collective of ``gm`` a decomposition can split (module docstring), in graph order. O(N)."""
    return [s for n in gm.graph.nodes if n.op == "call_function" and (s := _site(n)) is not None]


def node_prefix(names: Sequence[str]) -> str:
    """The prefix of the new nodes' names (``tpd``, ``tpdx``, ...: one no existing name starts with)."""
    prefix = "tpd"
    while any(n.startswith(prefix) for n in names):
        prefix += "x"
    return prefix


def new_priority(anchor_pos: float, seq: int) -> float:
    """The sort priority of the ``seq``-th new node (from 1) anchored at position ``anchor_pos``: after the anchor,
    before the next original node, in creation order."""
    return anchor_pos + 1.0 - 1.0 / (1.0 + seq)


class _Builder:
    """Creates the new nodes (with fake values) and gives each a priority next to its anchor's position, so that
    one stable topological sort puts them where the split program issues them. Every new node is named: a split
    collective ``{collective}_tp{j}``, the others ``{prefix}{seq}`` (:func:`node_prefix`; no name ends in ``_``
    and digits, so FX keeps it), the names :mod:`commsched.rewrites.decompose_graph` gives on the IR."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.graph = gm.graph
        self.mode = fake_mode_of(gm)
        self.pos = {n: float(i) for i, n in enumerate(gm.graph.nodes)}
        self.priority: dict[torch.fx.Node, float] = {}
        self.seq = 0
        self.prefix = node_prefix([n.name for n in gm.graph.nodes])

    def new(self, anchor: torch.fx.Node, target: Any, args: tuple, kwargs: dict | None = None, name: str | None = None):
        self.seq += 1
        with self.graph.inserting_before(self.graph.output_node()):
            node = call(self.graph, self.mode, target, args, kwargs, name=name or f"{self.prefix}{self.seq}")
        node.meta[TRANSFORM_META] = "decompose_tp"
        self.priority[node] = new_priority(self.pos[anchor], self.seq)
        return node


def _split_ag(b: _Builder, coll: torch.fx.Node, split: TPSplit) -> list[torch.fx.Node]:
    """``ag_mm`` split along rows of each rank's shard; returns the nodes it replaced."""
    x, world, group = coll.args[:3]
    wait = wait_users(coll)[0]
    folded = _fold_extra_waits(wait)
    world, k = int(world), split.chunks
    s = int(_val(x).shape[0]) // k
    # in program order (a module rewritten in place keeps its users in creation order)
    mms = sorted((u for u in wait.users if is_op(u, MM) and u.args[0] is wait), key=lambda u: b.pos[u])
    first = mms[0]
    gathered = []
    for j in range(k):
        xj = b.new(coll, aten.slice.Tensor, (x, 0, j * s, (j + 1) * s))
        gathered.append(b.new(coll, AG, (xj, world, group), name=f"{coll.name}_tp{j}"))
    waited = []
    pieces: dict[torch.fx.Node, list[torch.fx.Node]] = {u: [] for u in mms}
    for g in gathered:  # chunk j's matmuls right after its wait: they run while chunk j + 1 is in flight
        w = b.new(first, WAIT, (g,))
        waited.append(w)
        for u in mms:
            pieces[u].append(b.new(first, MM, (w, u.args[1])))
    for u in mms:
        u.replace_all_uses_with(_interleave(b, u, pieces[u], world, s))
    # the split matmuls and the folded waits still read it until they are erased
    others = [v for v in wait.users if v not in pieces and v not in folded]
    if others:  # other readers of the gathered tensor: reassemble it for them alone
        joined = _interleave(b, min(others, key=lambda v: b.pos[v]), waited, world, s)
        wait.replace_all_uses_with(joined, delete_user_cb=lambda v: v not in pieces and v not in folded)
    return [*mms, *folded, wait, coll]


def _interleave(b: _Builder, anchor: torch.fx.Node, pieces: list[torch.fx.Node], world: int, s: int):
    """Rows ``r S + j s + i`` from piece ``j``'s rows ``r s + i``: the gathered layout from per-chunk gathers."""
    n = int(_val(pieces[0]).shape[1])
    views = [b.new(anchor, aten.view.default, (p, [world, s, n])) for p in pieces]
    stacked = b.new(anchor, aten.stack.default, (views, 1))
    return b.new(anchor, aten.view.default, (stacked, [world * len(pieces) * s, n]))


def _split_reduce(b: _Builder, coll: torch.fx.Node, split: TPSplit) -> list[torch.fx.Node]:
    """``mm_rs`` / ``mm_ar`` split along ``m`` or ``n``; returns the nodes it replaced."""
    wait = wait_users(coll)[0]
    folded = _fold_extra_waits(wait)
    root = coll.args[0]
    tree = product_tree(root)
    assert tree is not None  # find_tp_sites checked it
    in_tree = set(tree)
    world = int(coll.args[2]) if is_op(coll, RS) else 1
    k, dim = split.chunks, split.dim
    leaf_cache: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}

    def leaf(x0: torch.fx.Node, j: int) -> torch.fx.Node:
        if (x0, j) in leaf_cache:
            return leaf_cache[(x0, j)]
        x = x0
        rows, cols = (int(s) for s in _val(x).shape)
        if dim == "n":
            out = b.new(coll, aten.slice.Tensor, (x, 1, j * cols // k, (j + 1) * cols // k))
        elif world == 1:
            out = b.new(coll, aten.slice.Tensor, (x, 0, j * rows // k, (j + 1) * rows // k))
        else:  # block j of every rank's slice, contiguous for the reduce_scatter
            s = rows // (world * k)
            if not _val(x).is_contiguous():
                if (x0, -1) not in leaf_cache:
                    dense = {"memory_format": torch.contiguous_format}
                    leaf_cache[(x0, -1)] = b.new(coll, aten.clone.default, (x0,), dense)
                x = leaf_cache[(x0, -1)]
            blocks = b.new(coll, aten.view.default, (x, [world, k, s, cols]))
            picked = b.new(coll, aten.select.int, (blocks, 1, j))
            dense = b.new(coll, aten.clone.default, (picked,), {"memory_format": torch.contiguous_format})
            out = b.new(coll, aten.view.default, (dense, [world * s, cols]))
        leaf_cache[(x0, j)] = out
        return out

    def chunk(node: torch.fx.Node, j: int) -> torch.fx.Node:
        if node not in in_tree:
            return leaf(node, j)
        if is_op(node, MM):
            a, w = node.args[:2]
            return b.new(coll, MM, (leaf(a, j), w) if dim == "m" else (a, leaf(w, j)))
        return b.new(coll, ADD, (chunk(node.args[0], j), chunk(node.args[1], j)))

    starts = []
    for j in range(k):
        part = chunk(root, j)
        args = (part, *coll.args[1:])
        starts.append(b.new(coll, coll.target, args, name=f"{coll.name}_tp{j}"))
    waited = [b.new(wait, WAIT, (c,)) for c in starts]
    joined = b.new(wait, aten.cat.default, (waited, 0 if dim == "m" else 1))
    wait.replace_all_uses_with(joined, delete_user_cb=lambda v: v not in folded)
    return [*folded, wait, coll, *tree]


def decompose_tp(
    gm: torch.fx.GraphModule,
    splits: Sequence[TPSplit],
    *,
    graph: Graph | None = None,
    recompile: bool = True,
    copy: bool = True,
) -> RewriteResult:
    """Split each collective in ``splits`` (with its matmuls) on a copy of ``gm``; see the module docstring.

    ``graph``: the IR of ``gm`` (its in-place ordering edges are kept by the final sort). ``recompile=False`` returns a
    lazy module (its graph linted and ready to import, its code generated when first run or read): a candidate that
    is only simulated skips a third of the rewrite's time. ``copy=False`` rewrites ``gm`` itself (a module the
    caller built and no longer needs, e.g. a bucketed program's rewrite). Raises GraphError naming the
    collective when a split does not apply (not a site, or ``chunks`` does not divide the dim). Rows: one per
    split. O(N log N)."""
    result = RewriteResult.on_copy(gm, "decompose_tp", copy=copy, lazy=not recompile)
    out = result.gm
    if not splits:
        result.notes.append("no split asked for")
        return result
    sites = {s.collective: s for s in find_tp_sites(out)}
    by_name = nodes_by_name(out)
    edges = ir_control_edges(out, graph) if graph is not None else []
    b = _Builder(out)
    dead: list[torch.fx.Node] = []
    for split in splits:
        site = sites.get(split.site)
        if site is None:
            raise GraphError(f"collective {split.site!r}: not a decomposable TP site (see find_tp_sites)")
        if not site.can_split(split.dim, split.chunks):
            raise GraphError(
                f"collective {split.site!r} ({site.pattern}): cannot split {split.chunks} ways along "
                f"{split.dim!r}; extents {dict(site.extents)}"
            )
        coll = by_name[split.site]
        fn = _split_ag if site.pattern == "ag_mm" else _split_reduce
        replaced = fn(b, coll, split)
        dead += replaced
        for n in replaced:
            result.replaced[n.name] = None
        result.rows.append(
            {"collective": site.collective, "pattern": site.pattern, "group": site.group, "dim": split.dim,
             "chunks": split.chunks, "matmuls": list(site.matmuls), "bytes": site.nbytes}
        )  # fmt: skip
        result.count(site.pattern)
    gone = set(dead)
    edges = [(s, d) for s, d in edges if s not in gone and d not in gone]
    for n in reversed(list(out.graph.nodes)):  # users before producers
        if n in gone:
            out.graph.erase_node(n)
    prio = {n: p for n, p in b.pos.items() if n not in gone}
    prio.update(b.priority)
    stable_toposort(out.graph, prio, edges)
    finish(out, recompile)
    return result
