"""Async TP as torch runs it with symmetric memory, applied to the IR of a traced TP step.

torchtitan's ``enable_async_tensor_parallel`` (torchtitan@169ba3bd ``torchtitan/distributed/tensor_parallel.py``)
turns on Inductor's ``_micro_pipeline_tp``: in each compiled block, ``torch/_inductor/fx_passes/
micro_pipeline_tp.py`` replaces an all_gather whose result feeds matmuls as their left operand by
``symm_mem.fused_all_gather_matmul``, and a reduce_scatter of one matmul's output by
``symm_mem.fused_matmul_reduce_scatter`` (``torch/distributed/_symmetric_memory/__init__.py``). Their
implementations decompose them per peer, with the transfers on the copy engines (a second stream of
``cudaMemcpyAsync`` between symmetric-memory buffers: no SMs) overlapped with partial matmuls on the compute stream:

* ``_fused_all_gather_matmul_impl`` (``_pipelined_all_gather_and_consume``): the local shard's matmul first, while
  peer ``rank + 1``'s shard is copied in; then, step by step, each peer's shard copied and multiplied. Here (rank
  0): ``W - 1`` copy-engine transfers of one shard each (issued where the all_gather was, run in order on their own
  FIFO), and per matmul ``W`` partial matmuls of ``S`` rows, the local one first, each peer's after its transfer's
  wait; the outputs (and, for other readers, the gathered input) are the pieces joined in rank order (a
  :data:`~commsched.cost.symm_mem.JOIN_TARGET` node: torch writes the pieces in place, so it costs nothing).
* ``_fused_matmul_reduce_scatter_impl`` (``_pipelined_produce_and_all2all``): the chunk for each peer ``rank -
  step`` computed (the rows of the input that peer keeps), then copied to it while the next is computed; the local
  chunk last; the received partial chunks summed. Here: ``W - 1`` partial matmuls each followed by its transfer,
  the local matmul, the waits, the join of the ``W`` chunks and one ``sum`` over them.

Which sites: :func:`commsched.rewrites.decompose_tp.find_tp_sites`'s ``ag_mm`` sites and its ``mm_rs`` sites whose
reduced value is one matmul (micro_pipeline_tp fuses a reduce_scatter's producer matmul only, not a sum of them),
on the TP group, inside the blocks (the output projection, outside torchtitan's compiled blocks, is left alone:
``skip_columns``). Float8 sites (torchao's float8 TP styles) are fused as ``fused_all_gather_scaled_matmul`` and
``fused_scaled_matmul_reduce_scatter``, with micro_pipeline_tp's rules (torch 2.13, :func:`scaled_sites`): a gather
whose result, through torchao's dtype view of the gathered bytes (``view.dtype``, its ``type_erased`` pattern) and
aliases (``detach``: none in Inductor's post-grad graph), feeds ``_scaled_mm`` as the left operand, and only
``_scaled_mm`` (one matmul type per gather), none of whose other operands depend on it; a reduce_scatter of one
``_scaled_mm`` read by nothing else. Each partial is the same ``_scaled_mm`` on a row block of its left operand,
with the same weight and scales (a per-row scale of the left operand cut to the same rows, as torch chunks it). The
transfers' cost and where they can run: :mod:`commsched.cost.symm_mem`; that they do not slow compute:
:func:`commsched.sim.model.takes_sms`. The result keeps every data dependency of the program: each matmul's output
and the reduced value are the same functions of the same inputs (tests/rewrites/test_async_tp.py).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
import torch.fx

from commsched.cost.symm_mem import COPY_ENGINE_TARGET, JOIN_TARGET
from commsched.ir import CollType, Graph, GraphError, OpKind
from commsched.ir.graph import ProcessGroup
from commsched.ir.transform import NODE_TAGS_META
from commsched.rewrites.decompose_graph import T_MM, T_SLICE, FxFacts, IRBuilder, alias_users, operands, site_waits
from commsched.rewrites.decompose_tp import AG, MM, RS, TPSite, extra_waits, find_tp_sites
from commsched.rewrites.fxutil import is_op, wait_users
from commsched.rewrites.graph_emit import emit_graph

aten = torch.ops.aten
SCALED_MM = aten._scaled_mm.default
GATHER_VIEWS = (aten.view.dtype, aten.detach.default, aten.alias.default)
"""what may stand between a gather's wait and its ``_scaled_mm`` readers: the dtype view of a gather made on the
float8 tensor's bytes (micro_pipeline_tp's ``type_erased`` patterns) and aliases (which Inductor's post-grad graph,
where the pass runs, no longer has)"""
T_SUM = "aten.sum.dim_IntList"
T_VIEW_DTYPE = str(aten.view.dtype)
SYMM_MEM_SUFFIX = "/symm_mem"
"""the copy engines' FIFO: a group named after the TP group with this suffix (same ranks), beside NCCL's stream"""


@dataclasses.dataclass(frozen=True)
class AsyncTPResult:
    """The rewritten graph and the sites it fused (``TPSite`` of the traced module)."""

    graph: Graph
    sites: tuple[TPSite, ...]


def async_tp_sites(gm, group: str, skip_columns: int | None = None) -> list[TPSite]:
    """The sites micro_pipeline_tp fuses in ``gm`` (the traced FX module) on process group ``group`` (module
    docstring); ``skip_columns``: leave out sites whose matmuls have this many output columns or input rows (the
    output projection's vocabulary shard)."""
    by_name = {n.name: n for n in gm.graph.nodes}

    def shapes(site: TPSite) -> set[int]:
        out = set()
        for m in site.matmuls:
            node = by_name[m]
            out.update(int(d) for d in node.meta["val"].shape[1:])
            out.update(int(d) for d in node.args[1].meta["val"].shape)
        return out

    sites = []
    for s in find_tp_sites(gm):
        if s.group != group or (s.pattern == "mm_rs" and len(s.matmuls) != 1) or s.pattern == "mm_ar":
            continue
        if s.pattern == "mm_rs" and by_name[s.collective].args[0].name != s.matmuls[0]:
            continue  # the reduced value must be the matmul itself
        if skip_columns is not None and skip_columns in shapes(s):
            continue
        sites.append(s)
    scaled = [s for s in scaled_sites(gm) if s.group == group]
    sites += [s for s in scaled if skip_columns is None or skip_columns not in shapes(s)]
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    return sorted(sites, key=lambda s: order[s.collective])


def scaled_sites(gm: torch.fx.GraphModule) -> list[TPSite]:
    """The float8 sites of ``gm`` micro_pipeline_tp fuses (module docstring), in graph order: ``ag_mm`` (the
    ``matmuls`` are ``_scaled_mm``) and ``mm_rs`` (one ``_scaled_mm``). O(N) per site."""
    sites = []
    for n in gm.graph.nodes:
        site = _scaled_gather_site(n) if is_op(n, AG) else _scaled_reduce_site(n) if is_op(n, RS) else None
        if site is not None:
            sites.append(site)
    return sites


def _nbytes(node: torch.fx.Node) -> int:
    v = node.meta["val"]
    return v.numel() * v.element_size()


def _gathered_value(wait: torch.fx.Node) -> torch.fx.Node:
    """The node whose value the readers of a gather's ``wait`` take as the gathered tensor: ``wait`` (or its extra
    waits), then each :data:`GATHER_VIEWS` node that is the only reader of the one before."""
    aliases = {wait, *extra_waits(wait)}
    value, readers = wait, {u for a in aliases for u in a.users} - aliases
    while len(readers) == 1 and is_op(next(iter(readers)), *GATHER_VIEWS):
        value = next(iter(readers))
        readers = set(value.users)
    return value


def _depends_on(nodes: Sequence, target: torch.fx.Node) -> bool:
    """Whether ``target`` is one of ``nodes`` or an ancestor of one (micro_pipeline_tp's ``arg_ancestor_nodes``)."""
    stack, seen = [n for n in nodes if isinstance(n, torch.fx.Node)], set()
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if n not in seen:
            seen.add(n)
            stack += n.all_input_nodes
    return False


def _scaled_gather_site(coll: torch.fx.Node) -> TPSite | None:
    waits = wait_users(coll)
    x = coll.args[0]
    if len(waits) != 1 or len(coll.users) != 1 or x.meta["val"].dim() != 2:
        return None
    value = _gathered_value(waits[0])
    readers = list(value.users)
    mms = [u for u in readers if is_op(u, SCALED_MM) and u.args[0] is value and not _depends_on(u.args[1:], value)]
    if not mms or any(is_op(u, MM) for u in readers):  # torch fuses one matmul type per gather
        return None
    rows = int(x.meta["val"].shape[0])
    return TPSite(coll.name, "ag_mm", str(coll.args[2]), tuple(m.name for m in mms), (("m", rows),), _nbytes(waits[0]))


def _scaled_reduce_site(coll: torch.fx.Node) -> TPSite | None:
    waits, root = wait_users(coll), coll.args[0]
    if len(waits) != 1 or len(coll.users) != 1 or not is_op(root, SCALED_MM) or len(root.users) != 1:
        return None
    (m, n), world = root.meta["val"].shape, int(coll.args[2])
    if m % world:
        return None
    extents = (("m", int(m) // world), ("n", int(n)))
    return TPSite(coll.name, "mm_rs", str(coll.args[3]), (root.name,), extents, _nbytes(waits[0]))


def async_tp_graph(g: Graph, sites: Sequence[TPSite]) -> AsyncTPResult:
    """``g`` with each site of ``sites`` (from :func:`async_tp_sites` on the module ``g`` was imported from)
    decomposed as torch's fused symmetric-memory ops run it (module docstring). GraphError naming a site that is
    not in ``g``. O(N)."""
    if not sites:
        return AsyncTPResult(g, ())
    groups = {grp.name: k for k, grp in enumerate(g.groups)}
    extra: list[ProcessGroup] = []
    for s in sites:
        if s.collective not in g.index:
            raise GraphError(f"collective {s.collective!r}: not in the graph (async TP site of another program?)")
        name = s.group + SYMM_MEM_SUFFIX
        if name not in groups:
            tp = g.groups[groups[s.group]]
            groups[name] = len(g.groups) + len(extra)
            extra.append(ProcessGroup(name, tp.size, tp.stride))
    src = copy.copy(g)  # the same nodes; its groups with the copy engines' FIFO added
    src.groups = (*g.groups, *extra)
    b = IRBuilder(src, FxFacts({}, frozenset(), frozenset(g.names)))
    parts: dict[str, str] = {}  # a partial matmul -> the matmul it computes rows of
    records: tuple[set[int], dict[str, str], dict[int, str], dict[str, str]] = (set(), {}, {}, parts)
    for s in sites:
        coll = b.index[s.collective]
        ce_group = groups[s.group + SYMM_MEM_SUFFIX]
        if s.pattern == "ag_mm":
            _all_gather_matmul(b, coll, s, ce_group, records)
        else:
            _matmul_reduce_scatter(b, coll, ce_group, records)
    removed, rename, smap_late, _ = records
    out = emit_graph(src, np.arange(len(g), dtype=np.float64), removed, rename, smap_late, b.added)
    out.meta["async_tp"] = {"sites": len(sites), "group": sites[0].group}
    if NODE_TAGS_META in g.meta:  # a recompute's (or float8's) matmul is still one in parts: they keep its tags
        out.meta[NODE_TAGS_META] = {tag: [*names, *(new for new, old in parts.items() if old in set(names))]
                                    for tag, names in g.meta[NODE_TAGS_META].items()}  # fmt: skip
    return AsyncTPResult(out, tuple(sites))


def _transfer(b: IRBuilder, anchor: float, src: str, ce_group: int, name: str) -> str:
    """One copy-engine transfer of ``src``'s bytes to or from one peer."""
    nbytes = int(np.prod(b.shape(src))) * b.buf(src)[2]
    coll = (int(CollType.BROADCAST), ce_group, None, nbytes, nbytes)  # one buffer, from one peer to one peer
    return b.new(anchor, COPY_ENGINE_TARGET, OpKind.COLLECTIVE, [src], b.shape(src), src, coll=coll, name=name)


def _join(b: IRBuilder, anchor: float, pieces: list[str], shape: tuple[int, ...]) -> str:
    return b.new(anchor, JOIN_TARGET, OpKind.OTHER, pieces, shape, pieces[0])


def _partial(b: IRBuilder, anchor: float, mm: int, a_rows: str, total_rows: int, parts: dict[str, str]) -> str:
    """Matmul ``mm`` on ``a_rows``, a row block of its left operand (``total_rows`` rows): an ``mm``, or the same
    ``_scaled_mm`` with the same weight and scales, a per-row scale of the left operand cut to the block's rows (as
    torch's fused ops chunk it); recorded in ``parts``."""
    g = b.g
    if g.targets[mm] == T_MM:
        part = b.mm(anchor, a_rows, operands(g, mm)[1])
        parts[part] = g.names[mm]
        return part
    rows = b.shape(a_rows)[0]
    inputs = [a_rows]
    for name in (g.names[int(i)] for i in g.inputs(mm)[1:]):  # the first input is the left operand
        per_row = b.buf(name)[:2] == ((total_rows, 1), "float32")  # the weight is float8; its scale (1, N)
        inputs.append(b.view(anchor, T_SLICE, name, (rows, 1)) if per_row else name)
    out = g.names[mm]
    flops = float(g.flops[mm]) * rows / total_rows
    part = b.new(anchor, g.targets[mm], OpKind.COMPUTE, inputs, (rows, b.shape(out)[1]), out, flops=flops)
    parts[part] = out
    return part


def _gather_chain(g: Graph, mm: int, waits: set[int]) -> list[int]:
    """The nodes between a gather's waits and the left operand of its reader ``mm``, that operand included
    (:data:`GATHER_VIEWS`; the site finder checked them)."""
    chain = []
    v = int(g.inputs(mm)[0])
    while v not in waits:
        chain.append(v)
        v = int(g.inputs(v)[0])
    return chain


def _all_gather_matmul(b: IRBuilder, coll: int, site: TPSite, ce_group: int, records: tuple) -> None:
    """``fused_all_gather_matmul`` (``_scaled_matmul``): ``W - 1`` transfers, the local matmuls first, each peer's
    after its wait; a gather made on a float8 tensor's bytes has each shard viewed back as float8."""
    g, index = b.g, b.index
    removed, rename, smap_late, parts = records
    x = g.names[int(g.inputs(coll)[0])]
    wait, extra = site_waits(g, coll)
    world = int(g.groups[int(g.coll_group[coll])].size)
    rows, cols = b.shape(x)
    mms = sorted(index[m] for m in site.matmuls)
    chain = _gather_chain(g, mms[0], {wait, *extra})
    value = g.names[chain[0]] if chain else x  # the gathered tensor as its matmuls read it

    def shard(anchor: float, src: str) -> str:
        if b.buf(src)[1] == b.buf(value)[1]:
            return src
        return b.new(anchor, T_VIEW_DTYPE, OpKind.VIEW, [src], b.shape(src), value, view_of=src)

    first = float(mms[0])
    name = g.names[coll]
    transfers = [_transfer(b, float(coll), x, ce_group, f"{name}_ce{j}") for j in range(1, world)]
    shards = [shard(first, x)]
    pieces = {u: [_partial(b, first, u, shards[0], world * rows, parts)] for u in mms}  # while peer 1's is copied
    for t in transfers:
        shards.append(shard(first, b.wait(first, t)))
        for u in mms:
            pieces[u].append(_partial(b, first, u, shards[-1], world * rows, parts))
    for u in mms:
        joined = _join(b, float(u), pieces[u], (world * rows, b.shape(pieces[u][0])[1]))
        rename[g.names[u] + "\0data"] = joined
        smap_late[int(g.buf_storage[g.buf_ptr[u]])] = joined
    others = [v for v in alias_users(g, wait, [*extra, *chain]) if v not in pieces]
    if others:  # the gathered input for its other readers (a weight gradient's transpose)
        gathered = _join(b, float(others[0]), shards, (world * rows, cols))
        for w in (wait, *extra, *chain):
            rename[g.names[w] + "\0data"] = gathered
        smap_late[int(g.buf_storage[g.buf_ptr[coll]])] = gathered
    removed.update([*mms, *extra, *chain, wait, coll])


def _matmul_reduce_scatter(b: IRBuilder, coll: int, ce_group: int, records: tuple) -> None:
    """``fused_matmul_reduce_scatter``: each peer's chunk computed and sent, the local chunk last, then the sum."""
    g = b.g
    removed, rename, smap_late, parts = records
    root = int(g.inputs(coll)[0])
    a = operands(g, root)[0]
    wait, extra = site_waits(g, coll)
    world = int(g.groups[int(g.coll_group[coll])].size)
    (m, k), n = b.shape(a), b.shape(g.names[root])[1]
    rows = m // world
    pos, name = float(coll), g.names[coll]
    sent = []
    for step in range(1, world):  # peer (0 - step) % world keeps rows [peer * rows, (peer + 1) * rows)
        chunk = _partial(b, pos, root, b.view(pos, T_SLICE, a, (rows, k)), m, parts)
        sent.append(_transfer(b, pos, chunk, ce_group, f"{name}_ce{step}"))
    local = _partial(b, pos, root, b.view(pos, T_SLICE, a, (rows, k)), m, parts)
    received = [b.wait(float(wait), t) for t in sent]  # by symmetry, each peer's chunk arrives as ours leaves
    stacked = _join(b, float(wait), [local, *received], (world, rows, n))
    total = b.new(float(wait), T_SUM, OpKind.OTHER, [stacked], (rows, n), local)
    for v in (wait, *extra):
        rename[g.names[v] + "\0data"] = total
    smap_late[int(g.buf_storage[g.buf_ptr[coll]])] = total
    removed.update([*extra, wait, coll, root])
