"""``estimate_costs``: per-node seconds for a graph on a hardware profile, as a :class:`CostEstimate`.

Order of precedence for a node's time: the user's ``estimate(node)`` callable (when it returns a number), then a
measured table entry, then the model (fused roofline for compute, NCCL-like plans for collectives). Overridden nodes
are left out of fusion: a measured or user time is the op's own kernel.

Everything hardware-independent about a graph (op classes, GEMM shapes, iteration sizes, fusion regions) is computed
once per graph and cached, keyed by the graph object; the per-hardware part is numpy over nodes. Nodes that repeat a
(target, shape, flops) signature share their shape analysis.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from commsched.cost.collectives import normalize_kind, plan_collective
from commsched.cost.compute import (
    attention_dims,
    attention_shape_efficiency,
    backward_attention_rate,
    causal_attention_factor,
    forward_attention_extra_s,
    forward_attention_factor,
    gemm_dims,
    gemm_shape_efficiency,
    kernel_times,
    memory_time,
    runs_power_saturated,
)
from commsched.cost.fusion import fusion_regions, region_boundary_bytes, view_sources
from commsched.cost.model import CostEstimate
from commsched.cost.multi_tensor import MULTI_TENSOR_REDUCTIONS, is_multi_tensor, multi_tensor_launches
from commsched.cost.opclass import GATHERS, OpClass, classify_target
from commsched.cost.symm_mem import apply_copy_engine_costs, apply_one_shot_costs
from commsched.cost.table import MeasuredTable
from commsched.hardware import Hardware, for_graph
from commsched.ir import CAUSAL_META, PERMUTE_META, CollType, Graph, NodeView, OpKind

EstimateFn = Callable[[NodeView], "float | None"]
SCALED_MM = "aten._scaled_mm"
"""the target prefix of torch's scaled (float8) matmul: its flops run at its operands' dtype's peak"""
_FREE_KINDS = (OpKind.INPUT, OpKind.WAIT, OpKind.VIEW, OpKind.OUTPUT)


@dataclass(frozen=True, eq=False)
class GraphFeatures:
    """Hardware-independent per-node arrays of one graph (cached by :func:`graph_features`)."""

    cls: np.ndarray  # OpClass per node
    fusible: np.ndarray  # bool
    key: np.ndarray  # iteration size (elements) for fusion grouping
    nbytes: np.ndarray  # bytes read + written, unfused
    dtype_id: np.ndarray  # index into dtypes (dtype of the first output), -1 without outputs
    dtypes: tuple[str, ...]
    gemm: np.ndarray  # (n, 4) M, N, K, batch for MATMUL; (bh, q, kv, 1 backward / 0 forward) for ATTENTION; 0 otherwise
    flops: np.ndarray  # the graph's flops, derived from shapes for attention nodes without a count
    src: np.ndarray  # view base per node
    region: np.ndarray  # fusion region per node, -1 unfused
    causal: np.ndarray  # int8: 1 / 2 a causal attention forward / backward (ir.CAUSAL_META), 0 otherwise
    read_cap: np.ndarray  # bytes a node reads of any one input at most (a gather's output bytes; inf otherwise)
    # a scaled matmul's operand dtype (index into dtypes: float8), the dtype its tensor cores run at; -1 otherwise
    operand_dtype_id: np.ndarray | None = None
    launches: np.ndarray | None = None  # kernel launches per node: a multi-tensor op's (cost.multi_tensor); else 1
    training: bool = False  # a training step: its matmuls run power-saturated (compute.runs_power_saturated)


_features: weakref.WeakKeyDictionary[Graph, GraphFeatures] = weakref.WeakKeyDictionary()
_boundaries: weakref.WeakKeyDictionary[Graph, tuple[np.ndarray, np.ndarray]] = weakref.WeakKeyDictionary()


def remember_features(g: Graph, features: GraphFeatures, boundary: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Take ``features`` (and ``boundary``, :func:`fusion_boundary_bytes`'s) as ``g``'s, as if computed here: the
    trace cache keeps them beside a graph (:mod:`commsched.cost.features_io`), so a warm process skips the analysis."""
    _features[g] = features
    if boundary is not None:
        _boundaries[g] = boundary


def fusion_boundary_bytes(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(bytes read, bytes written) per fusion region of ``g``'s own regions (:func:`graph_features`), computed once
    per graph object (:func:`commsched.cost.fusion.region_boundary_bytes`)."""
    cached = _boundaries.get(g)
    if cached is None:
        f = graph_features(g)
        cached = _boundaries[g] = region_boundary_bytes(g, f.region, f.src, f.read_cap, f.cls == OpClass.ELEMENTWISE)
    return cached


def _first_numel(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Elements of each node's first output buffer (0 without), and the largest such count among its inputs."""
    n = len(g)
    buf_numel = np.fromiter((math.prod(s) for s in g.buf_shape), dtype=np.int64, count=len(g.buf_shape))
    has = np.diff(g.buf_ptr) > 0
    first = np.zeros(n, np.int64)
    first[has] = buf_numel[g.buf_ptr[:-1][has]]
    in_max = np.zeros(n, np.int64)
    if len(g.in_idx):
        vals = first[g.in_idx]
        nonempty = np.diff(g.in_ptr) > 0
        starts = g.in_ptr[:-1][nonempty]
        in_max[nonempty] = np.maximum.reduceat(vals, starts)
    return first, in_max


def graph_features(g: Graph) -> GraphFeatures:
    """The hardware-independent analysis of ``g`` (computed once per graph object)."""
    cached = _features.get(g)
    if cached is not None:
        return cached
    n = len(g)
    kinds = g.kinds
    flops = g.flops
    cls = np.full(n, OpClass.FREE, np.int8)
    fusible = np.zeros(n, bool)
    work = np.flatnonzero((kinds == OpKind.COMPUTE) | (kinds == OpKind.OTHER))
    targets = g.targets
    per_target: dict[tuple[str, bool], tuple[OpClass, bool]] = {}
    for i in work.tolist():
        k = (targets[i], bool(flops[i] > 0))
        r = per_target.get(k)
        if r is None:
            r = per_target[k] = classify_target(*k)
        cls[i], fusible[i] = r
    cls[kinds == OpKind.COLLECTIVE] = OpClass.COLLECTIVE
    # torch's multi-tensor kernels (an optimizer's _foreach_* ops, _fused_adamw_) run eagerly, each a kernel of its
    # own over whole tensor lists: never fused, elementwise but for the per-tensor reductions (_foreach_norm)
    multi = np.zeros(n, bool)
    multi[[i for i in work.tolist() if is_multi_tensor(targets[i])]] = True
    fusible[multi] = False

    first, in_max = _first_numel(g)
    gather = np.zeros(n, bool)
    gather[[i for i in work.tolist() if targets[i] in GATHERS]] = True
    key = np.where(gather, first, np.maximum(first, in_max))
    # an elementwise-named op whose output is smaller than an input reduces (e.g. aten.sum.dim_IntList variants)
    cls[(cls == OpClass.ELEMENTWISE) & (first < in_max) & (first > 0) & ~gather & ~multi] = OpClass.REDUCTION
    cls[[i for i in np.flatnonzero(multi).tolist() if MULTI_TENSOR_REDUCTIONS.match(targets[i])]] = OpClass.REDUCTION
    nbytes = (g.in_bytes + g.out_bytes).astype(np.float64)
    read_cap = np.where(gather, g.out_bytes, np.inf)  # a gather reads no more of a source than it writes
    nbytes[gather] = np.minimum(g.in_bytes[gather], g.out_bytes[gather]) + g.out_bytes[gather]

    has = np.diff(g.buf_ptr) > 0
    dtypes = tuple(sorted(set(g.buf_dtype)))
    dindex = {d: j for j, d in enumerate(dtypes)}
    dtype_id = np.full(n, -1, np.int64)
    first_buf = g.buf_ptr[:-1]
    dtype_id[has] = [dindex[g.buf_dtype[b]] for b in first_buf[has].tolist()]
    operand_dtype_id = np.full(n, -1, np.int64)
    for i in np.flatnonzero(cls == OpClass.MATMUL).tolist():
        if targets[i].startswith(SCALED_MM):  # float8 operands (and float32 scales), a bfloat16 output
            operands = [g.buf_dtype[first_buf[p]] for p in g.inputs(i).tolist() if has[p]]
            low = [d for d in operands if d.startswith("float8")]
            if low:
                operand_dtype_id[i] = dindex[low[0]]

    gemm = np.zeros((n, 4))
    node_flops = flops.astype(np.float64).copy()
    shape_cache: dict[tuple, tuple[float, ...]] = {}
    for i in np.flatnonzero(cls == OpClass.MATMUL).tolist():
        shape = g.buf_shape[first_buf[i]] if has[i] else ()
        sig = (targets[i], shape, float(flops[i]))
        dims = shape_cache.get(sig)
        if dims is None:
            dims = shape_cache[sig] = gemm_dims(targets[i], shape, float(flops[i]))
        gemm[i] = dims
    for i in np.flatnonzero(cls == OpClass.ATTENTION).tolist():
        shapes = [g.buf_shape[g.buf_ptr[p]] for p in g.inputs(i).tolist() if g.buf_ptr[p + 1] > g.buf_ptr[p]]
        sig = (targets[i], tuple(shapes), float(flops[i]))
        dims = shape_cache.get(sig)
        if dims is None:
            dims = shape_cache[sig] = attention_dims(targets[i], shapes, float(flops[i]))
        gemm[i] = (*dims[:3], 1.0 if "backward" in targets[i] else 0.0)
        node_flops[i] = dims[3]

    src = view_sources(g)
    region = fusion_regions(g, fusible, key, cls == OpClass.ELEMENTWISE, src)
    causal = np.zeros(n, np.int8)
    for name in g.meta.get(CAUSAL_META, ()):
        i = g.index.get(name)
        if i is not None and cls[i] == OpClass.ATTENTION:
            causal[i] = 2 if "backward" in targets[i] else 1
    launches = multi_tensor_launches(g) if multi.any() else np.ones(n, np.int64)
    feats = GraphFeatures(cls, fusible, key, nbytes, dtype_id, dtypes, gemm, node_flops, src, region, causal, read_cap,
                          operand_dtype_id, launches, runs_power_saturated(targets))  # fmt: skip
    _features[g] = feats
    return feats


_tables: dict[tuple[str, float], MeasuredTable] = {}


def _profile_table(path: str) -> MeasuredTable:
    """A profile's measured table, read once per file version."""
    key = (path, os.stat(path).st_mtime) if os.path.exists(path) else (path, 0.0)
    if key not in _tables:
        _tables[key] = MeasuredTable.load(path)
    return _tables[key]


def _shape_efficiency(g: Graph, f: GraphFeatures, hw: Hardware) -> np.ndarray:
    eff = np.ones(len(f.cls))
    mm = f.cls == OpClass.MATMUL
    if mm.any():
        d = f.gemm[mm]
        eff[mm] = gemm_shape_efficiency(d[:, 0], d[:, 1], d[:, 2], d[:, 3], hw)
    backward = np.flatnonzero((f.cls == OpClass.ATTENTION) & (f.gemm[:, 3] == 1))
    if len(backward):
        d = f.gemm[backward]
        eff[backward] = attention_shape_efficiency(d[:, 0], d[:, 1], d[:, 2], hw)
        eff[backward] *= backward_attention_rate([g.targets[i] for i in backward.tolist()])
        causal = f.causal[backward] == 2  # the flops count the masked blocks too: a causal pass runs faster
        eff[backward[causal]] /= causal_attention_factor(d[causal], hw)
    forward = np.flatnonzero((f.cls == OpClass.ATTENTION) & (f.gemm[:, 3] == 0))
    if len(forward):
        eff[forward] = forward_attention_factor(f.gemm[forward], f.causal[forward] == 1, hw)
    return eff


def _peak_per_node(f: GraphFeatures, hw: Hardware) -> np.ndarray:
    """Each node's peak FLOP/s: its output dtype's entry of the profile (float32's where it has none); a scaled
    matmul's (``aten._scaled_mm``: float8 operands) its operands' dtype's, where the profile has one (a profile
    without float8 tensor cores: its output dtype's, the rate of the same GEMM unquantized)."""
    table = dict(hw.compute.peak_flops)
    per_dtype = np.array([table.get(d, table["float32"]) for d in f.dtypes] + [table["float32"]])
    peak = per_dtype[f.dtype_id]  # dtype_id -1 picks the float32 entry appended last
    if f.operand_dtype_id is not None:
        operand = np.array([table.get(d, np.nan) for d in f.dtypes] + [np.nan])[f.operand_dtype_id]
        scaled = (f.operand_dtype_id >= 0) & ~np.isnan(operand)
        peak = np.where(scaled, operand, peak)
    return peak


def _fused_times(
    g: Graph, f: GraphFeatures, region: np.ndarray, unfused: np.ndarray, peak: np.ndarray, hw: Hardware
) -> np.ndarray:
    """Node times with each fusion region charged one launch and its boundary bytes, shared by unfused weight."""
    num = int(region.max()) + 1 if len(region) and region.max() >= 0 else 0
    if num == 0:
        return unfused
    c = hw.compute
    members = (region >= 0) & (g.kinds != OpKind.VIEW)
    if region is f.region:  # the graph's own regions (no node overridden): their bytes once per graph
        read, written = fusion_boundary_bytes(g)
    else:
        read, written = region_boundary_bytes(g, region, f.src, f.read_cap, f.cls == OpClass.ELEMENTWISE)
    moved = read + written
    flops = np.bincount(region[members], weights=f.flops[members], minlength=num)
    is_red = np.bincount(region[members], weights=(f.cls[members] == OpClass.REDUCTION), minlength=num) > 0
    first_member = np.full(num, len(g))
    np.minimum.at(first_member, region[members], np.flatnonzero(members))
    rpeak = peak[first_member]
    eff_max = np.where(is_red, c.efficiency.reduction, c.efficiency.elementwise)
    t_mem = memory_time(moved, eff_max, hw)
    t_flop = flops / (rpeak * c.efficiency.elementwise)
    weight = unfused[members]
    wsum = np.bincount(region[members], weights=weight, minlength=num)
    # Inductor keeps a fusion only when it is faster (Scheduler.speedup_by_fusion): never above the unfused sum
    t_region = np.minimum(c.launch_overhead_s + np.maximum(t_mem, t_flop), wsum)
    count = np.bincount(region[members], minlength=num)
    share = np.where(wsum[region[members]] > 0, weight / np.maximum(wsum[region[members]], 1e-300),
                     1.0 / count[region[members]])  # fmt: skip
    out = unfused.copy()
    out[members] = t_region[region[members]] * share
    return out


def estimate_costs(
    graph: Graph,
    hardware: str | os.PathLike[str] | Hardware,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    table: MeasuredTable | None = None,
    estimate: EstimateFn | None = None,
    fusion: bool = True,
) -> CostEstimate:
    """Per-node costs of ``graph`` on ``hardware`` (see the module docstring for precedence and caching).

    ``hardware``, ``num_nodes``, ``gpus_per_node``: a profile name or ``.toml`` path (sized for the graph's world
    size unless ``num_nodes`` is given) or a Hardware, as :func:`commsched.hardware.for_graph` reads them.
    ``table``: measured times (default: the profile's own table, if it names one). ``estimate``: a callable
    ``estimate(node) -> seconds | None`` that overrides any node where it returns a number. ``fusion``: charge
    Inductor-style fusion regions as one kernel each (turn off to model eager execution).
    """
    g, hw = graph, for_graph(hardware, graph, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    n = len(g)
    f = graph_features(g)
    if table is None and hw.table_path:
        table = _profile_table(hw.table_path)
    peak = _peak_per_node(f, hw)
    node_s = kernel_times(f.cls, f.flops, f.nbytes, peak, _shape_efficiency(g, f, hw), hw, sustained=f.training)
    if f.launches is not None:  # a multi-tensor op's further launches (kernel_times charged one)
        node_s += np.where(node_s > 0, (f.launches - 1) * hw.compute.launch_overhead_s, 0.0)
    forward = np.flatnonzero((f.cls == OpClass.ATTENTION) & (f.gemm[:, 3] == 0))
    if len(forward):  # a split forward's combine kernel: one more launch
        node_s[forward] += forward_attention_extra_s(f.gemm[forward], hw)
    coll_latency = np.zeros(n)
    coll_link = np.full(n, -1, np.int8)
    algorithms: dict[int, str] = {}
    copy_engine = None

    overridden = np.zeros(n, bool)
    if table is not None and len(table.ops):
        for i in np.flatnonzero(f.cls != OpClass.FREE).tolist():
            if f.cls[i] != OpClass.COLLECTIVE:
                t = table.op_time(g, i)
                if t is not None:
                    node_s[i], overridden[i] = t, True

    colls = g.collectives
    if len(colls):
        # one plan per distinct (type, group, bytes, permute): layers repeat the same collectives
        permute = np.zeros(n, np.int64)
        permute[[g.index[name] for name in g.meta.get(PERMUTE_META, ()) if name in g.index]] = 1
        keys = np.stack(
            [g.coll_type[colls].astype(np.int64), g.coll_group[colls].astype(np.int64), g.comm_bytes[colls],
             permute[colls]]
        )  # fmt: skip
        uniq, inverse = np.unique(keys, axis=1, return_inverse=True)
        u_time, u_lat, u_link, u_algo = np.zeros(uniq.shape[1]), np.zeros(uniq.shape[1]), [], []
        for j, (ctype, gid, nbytes, ring) in enumerate(uniq.T.tolist()):
            grp = g.groups[gid]
            kind = "sendrecv" if ring else normalize_kind(CollType(ctype))  # a permute: one peer each way
            plan = plan_collective(kind, nbytes, grp.size, hw, stride=grp.stride)
            u_time[j], u_lat[j], algo = plan.time_s, plan.latency_s, f"{plan.algorithm}/{plan.protocol}"
            measured = table.collective_time(kind, grp.size, nbytes) if table is not None else None
            if measured is not None:
                # keep the model's latency share, capped by the measured time
                u_time[j], u_lat[j], algo = measured, min(plan.latency_s, measured), "measured"
            u_link.append(int(plan.link))
            u_algo.append(algo)
        inverse = inverse.reshape(-1)
        node_s[colls], coll_latency[colls] = u_time[inverse], u_lat[inverse]
        coll_link[colls] = np.asarray(u_link, np.int8)[inverse]
        algorithms = dict(zip(colls.tolist(), [u_algo[j] for j in inverse.tolist()], strict=True))
        apply_one_shot_costs(g, hw, node_s, coll_latency, coll_link, algorithms)
        copy_engine = apply_copy_engine_costs(g, hw, node_s, coll_latency, coll_link, algorithms)

    if estimate is not None:
        for i in range(n):
            t = estimate(g.node(i))
            if t is not None:
                t = float(t)
                if not math.isfinite(t) or t < 0:
                    raise ValueError(f"estimate({g.names[i]!r}) returned {t}: expected seconds >= 0 or None")
                node_s[i], overridden[i] = t, True
                if coll_latency[i] > t:
                    coll_latency[i] = t

    region = f.region if fusion else np.full(n, -1, np.int64)
    if fusion and overridden.any():
        region = fusion_regions(g, f.fusible & ~overridden, f.key, f.cls == OpClass.ELEMENTWISE, f.src)
    if fusion:
        node_s = _fused_times(g, f, region, node_s, peak, hw)
    node_s = np.where(np.isin(g.kinds, _FREE_KINDS) & ~overridden, 0.0, node_s)
    return CostEstimate(
        node_s=node_s,
        coll_latency_s=coll_latency,
        coll_link=coll_link,
        compute_slowdown=hw.compute_slowdown,
        stream_sync_s=hw.stream_sync_s,
        fusion_region=region,
        copy_engine=copy_engine,
        meta={
            "hardware": hw.name,
            "num_nodes": hw.num_nodes,
            "gpus_per_node": hw.gpus_per_node,
            "fusion": fusion,
            "fusion_regions": int(region.max()) + 1 if n and region.max() >= 0 else 0,
            "collective_algorithms": algorithms,
            "table": table.source if table is not None else None,
        },
    )


def estimate(
    graph: Graph,
    hardware: str | os.PathLike[str] | Hardware,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    **kw,
) -> np.ndarray:
    """Seconds per node (``estimate_costs(graph, hardware, num_nodes=..., gpus_per_node=..., **kw).node_s``)."""
    return estimate_costs(graph, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node, **kw).node_s


def resolve_costs(
    graph: Graph,
    hardware: str | os.PathLike[str] | Hardware | CostEstimate,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> CostEstimate:
    """A CostEstimate for ``graph``: ``hardware`` itself when it is one (checked against the graph), else
    :func:`estimate_costs` on the hardware arguments (the ones ``schedule`` and ``simulate`` take)."""
    if not isinstance(hardware, CostEstimate):
        return estimate_costs(graph, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    if num_nodes is not None or gpus_per_node is not None:
        raise ValueError("num_nodes / gpus_per_node shape a hardware profile; a CostEstimate is already estimated")
    if len(hardware.node_s) != len(graph):
        raise ValueError(f"the cost estimate has {len(hardware.node_s)} entries; the graph has {len(graph)} nodes")
    return hardware
