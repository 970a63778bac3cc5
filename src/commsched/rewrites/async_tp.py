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
``skip_columns``). ``aten._scaled_mm`` sites (``fused_all_gather_scaled_matmul``, float8) are not matched. The
transfers' cost and where they can run: :mod:`commsched.cost.symm_mem`; that they do not slow compute:
:func:`commsched.sim.model.takes_sms`. The result keeps every data dependency of the program: each matmul's output
and the reduced value are the same functions of the same inputs (tests/rewrites/test_async_tp.py).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import numpy as np

from commsched.cost.symm_mem import COPY_ENGINE_TARGET, JOIN_TARGET
from commsched.ir import CollType, Graph, GraphError, OpKind
from commsched.ir.graph import ProcessGroup
from commsched.rewrites.decompose_graph import T_SLICE, FxFacts, IRBuilder, alias_users, operands, site_waits
from commsched.rewrites.decompose_tp import TPSite, find_tp_sites
from commsched.rewrites.graph_emit import emit_graph

T_SUM = "aten.sum.dim_IntList"
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
    return sites


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
    records: tuple[set[int], dict[str, str], dict[int, str]] = (set(), {}, {})
    for s in sites:
        coll = b.index[s.collective]
        ce_group = groups[s.group + SYMM_MEM_SUFFIX]
        if s.pattern == "ag_mm":
            _all_gather_matmul(b, coll, s, ce_group, records)
        else:
            _matmul_reduce_scatter(b, coll, ce_group, records)
    removed, rename, smap_late = records
    out = emit_graph(src, np.arange(len(g), dtype=np.float64), removed, rename, smap_late, b.added)
    out.meta["async_tp"] = {"sites": len(sites), "group": sites[0].group}
    return AsyncTPResult(out, tuple(sites))


def _transfer(b: IRBuilder, anchor: float, src: str, ce_group: int, name: str) -> str:
    """One copy-engine transfer of ``src``'s bytes to or from one peer."""
    nbytes = int(np.prod(b.shape(src))) * b.buf(src)[2]
    coll = (int(CollType.BROADCAST), ce_group, None, nbytes, nbytes)  # one buffer, from one peer to one peer
    return b.new(anchor, COPY_ENGINE_TARGET, OpKind.COLLECTIVE, [src], b.shape(src), src, coll=coll, name=name)


def _join(b: IRBuilder, anchor: float, pieces: list[str], shape: tuple[int, ...]) -> str:
    return b.new(anchor, JOIN_TARGET, OpKind.OTHER, pieces, shape, pieces[0])


def _all_gather_matmul(b: IRBuilder, coll: int, site: TPSite, ce_group: int, records: tuple) -> None:
    """``fused_all_gather_matmul``: ``W - 1`` transfers, the local matmuls first, each peer's after its wait."""
    g, index = b.g, b.index
    removed, rename, smap_late = records
    x = g.names[int(g.inputs(coll)[0])]
    wait, extra = site_waits(g, coll)
    world = int(g.groups[int(g.coll_group[coll])].size)
    rows, cols = b.shape(x)
    mms = sorted(index[m] for m in site.matmuls)
    first = float(mms[0])
    name = g.names[coll]
    transfers = [_transfer(b, float(coll), x, ce_group, f"{name}_ce{j}") for j in range(1, world)]
    pieces = {u: [b.mm(first, x, operands(g, u)[1])] for u in mms}  # the local shard while peer 1's is copied
    shards = [x]
    for t in transfers:
        shards.append(b.wait(first, t))
        for u in mms:
            pieces[u].append(b.mm(first, shards[-1], operands(g, u)[1]))
    for u in mms:
        joined = _join(b, float(u), pieces[u], (world * rows, b.shape(pieces[u][0])[1]))
        rename[g.names[u] + "\0data"] = joined
        smap_late[int(g.buf_storage[g.buf_ptr[u]])] = joined
    others = [v for v in alias_users(g, wait, extra) if v not in pieces]
    if others:  # the gathered input for its other readers (a weight gradient's transpose)
        gathered = _join(b, float(others[0]), shards, (world * rows, cols))
        for w in (wait, *extra):
            rename[g.names[w] + "\0data"] = gathered
        smap_late[int(g.buf_storage[g.buf_ptr[coll]])] = gathered
    removed.update([*mms, *extra, wait, coll])


def _matmul_reduce_scatter(b: IRBuilder, coll: int, ce_group: int, records: tuple) -> None:
    """``fused_matmul_reduce_scatter``: each peer's chunk computed and sent, the local chunk last, then the sum."""
    g = b.g
    removed, rename, smap_late = records
    root = int(g.inputs(coll)[0])
    a, w = operands(g, root)
    wait, extra = site_waits(g, coll)
    world = int(g.groups[int(g.coll_group[coll])].size)
    (m, k), n = b.shape(a), b.shape(g.names[root])[1]
    rows = m // world
    pos, name = float(coll), g.names[coll]
    sent = []
    for step in range(1, world):  # peer (0 - step) % world keeps rows [peer * rows, (peer + 1) * rows)
        chunk = b.mm(pos, b.view(pos, T_SLICE, a, (rows, k)), w)
        sent.append(_transfer(b, pos, chunk, ce_group, f"{name}_ce{step}"))
    local = b.mm(pos, b.view(pos, T_SLICE, a, (rows, k)), w)
    received = [b.wait(float(wait), t) for t in sent]  # by symmetry, each peer's chunk arrives as ours leaves
    stacked = _join(b, float(wait), [local, *received], (world, rows, n))
    total = b.new(float(wait), T_SUM, OpKind.OTHER, [stacked], (rows, n), local)
    for v in (wait, *extra):
        rename[g.names[v] + "\0data"] = total
    smap_late[int(g.buf_storage[g.buf_ptr[coll]])] = total
    removed.update([*extra, wait, coll, root])
