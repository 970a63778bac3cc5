"""FX frontend: a torch.fx GraphModule with ``_c10d_functional`` collectives and FakeTensor meta -> Graph.

Works on graphs traced with ``make_fx`` and on ATen / post-grad graphs captured through ``torch.compile``.
Every node needs ``meta['val']`` (a FakeTensor, a list of them, a SymInt or None); run FakeTensorProp first
otherwise.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from commsched.ir import CAUSAL_META, PERMUTE_META, CollType, Graph, GraphBuilder, GraphError, OpKind
from commsched.ir.inplace import WriteOrder
from commsched.ir.transform import FX_TAGS_KEY, MODULE_META_KEY, NODE_TAGS_META, inheritable_meta


@dataclass(frozen=True)
class _CollSpec:
    type: CollType
    sync: bool = False  # no wait_tensor follows (the op blocks)
    writes_arg: str | None = None  # argument the op writes into (in-place / _out variants)


# Schema names of the recognised collectives. `_out` and in-place variants write into an argument.
COLLECTIVE_OPS: dict[str, _CollSpec] = {
    "_c10d_functional::all_reduce": _CollSpec(CollType.ALL_REDUCE),
    "_c10d_functional::all_reduce_": _CollSpec(CollType.ALL_REDUCE, writes_arg="input"),
    "_c10d_functional::all_reduce_coalesced": _CollSpec(CollType.ALL_REDUCE),
    "_c10d_functional::all_reduce_coalesced_": _CollSpec(CollType.ALL_REDUCE, writes_arg="inputs"),
    "_c10d_functional::all_gather_into_tensor": _CollSpec(CollType.ALL_GATHER),
    "_c10d_functional::all_gather_into_tensor_out": _CollSpec(CollType.ALL_GATHER, writes_arg="out"),
    "_c10d_functional::all_gather_into_tensor_coalesced": _CollSpec(CollType.ALL_GATHER),
    "_c10d_functional::reduce_scatter_tensor": _CollSpec(CollType.REDUCE_SCATTER),
    "_c10d_functional::reduce_scatter_tensor_out": _CollSpec(CollType.REDUCE_SCATTER, writes_arg="out"),
    "_c10d_functional::reduce_scatter_tensor_coalesced": _CollSpec(CollType.REDUCE_SCATTER),
    "_c10d_functional::all_to_all_single": _CollSpec(CollType.ALL_TO_ALL),
    "_c10d_functional::broadcast": _CollSpec(CollType.BROADCAST),
    "_c10d_functional::broadcast_": _CollSpec(CollType.BROADCAST, writes_arg="input"),
    "_dtensor::shard_dim_alltoall": _CollSpec(CollType.ALL_TO_ALL, sync=True),
    "symm_mem::one_shot_all_reduce": _CollSpec(CollType.ALL_REDUCE, sync=True),
}
WAIT_OPS = frozenset({"_c10d_functional::wait_tensor"})
_FSDP2_OPS = frozenset({"fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat"})
"""FSDP2's own ops, as ``make_fx`` records a ``fully_shard`` step (with c10d's in-place collectives)"""
FSDP2_AS_TRACED = (
    "a step of an FSDP2 (fully_shard) module traced as is (FSDP2's own ops, c10d's in-place collectives, "
    "parameters as constants): trace it with commsched.trace_fsdp2(model, loss_fn, example), whose graph passes "
    "make it importable"
)
_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _is_causal(node: torch.fx.Node) -> bool:
    """Whether an op with an ``is_causal`` argument in its schema (the SDPA family, forward and backward) sets it."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    for i, arg in enumerate(schema.arguments):
        if arg.name == "is_causal":
            value = node.kwargs.get("is_causal", node.args[i] if i < len(node.args) else arg.default_value)
            return value is True
    return False


def _is_permute(bound: Mapping[str, Any]) -> bool:
    """Whether an ``all_to_all_single``'s split sizes send to one peer and receive from one (``permute_tensor``)."""
    splits = [bound.get("output_split_sizes"), bound.get("input_split_sizes")]
    if not all(isinstance(s, (list, tuple)) for s in splits):
        return False
    try:
        return all(sum(1 for x in s if _concrete(x) != 0) == 1 for s in splits)
    except (TypeError, GraphError):
        return False


def _shape_key(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("val")
        return (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else ("?", id(a))
    if isinstance(a, (list, tuple)):
        return tuple(_shape_key(x) for x in a)
    return a


def _tensors(val: Any) -> list:
    """The tensors (or TensorMetadata) in a node's meta value, flattened."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in val):
        return list(val)
    return [t for t in tree_flatten(val)[0] if hasattr(t, "shape") and hasattr(t, "dtype")]


@dataclass(frozen=True)
class _TargetInfo:
    """What the importer needs to know about an op, computed once per target."""

    name: str  # the target string stored in the IR
    schema_name: str | None
    is_view: bool  # every return aliases an input without writing it
    write_args: tuple[str, ...]  # schema arguments annotated as written (Tensor(a!))
    formula: Any  # flop formula from torch.utils.flop_counter, or None
    impure: bool  # has side effects (mutation, RNG, wait, ...)


def _concrete(x: Any) -> int:
    if isinstance(x, torch.SymInt):
        hint = x.node.hint
        if hint is None:
            raise GraphError(f"symbolic size {x} has no hint; trace with concrete or hinted shapes")
        return int(hint)
    return int(x)


def target_name(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    if node.op in ("placeholder", "get_attr", "output"):
        return node.op
    if node.op == "call_method":
        return f"method.{t}"
    if node.op == "call_module":
        return f"module.{t}"
    return getattr(t, "__name__", str(t))


def _schema_name(target: Any) -> str | None:
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else None


def _bind(node: torch.fx.Node) -> dict[str, Any]:
    """Arguments by schema name."""
    names = [a.name for a in node.target._schema.arguments]
    bound = dict(zip(names, node.args, strict=False))
    bound.update(node.kwargs)
    return bound


def _write_arg_names(target: Any) -> tuple[str, ...]:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return ()
    return tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def _written_args(node: torch.fx.Node, names: tuple[str, ...]) -> list[torch.fx.Node]:
    """Nodes whose storage this op writes, from the schema's alias annotations (``Tensor(a!)``)."""
    if not names:
        return []
    bound = _bind(node)
    out: list[torch.fx.Node] = []
    for name in names:
        if name in bound:
            flat, _ = tree_flatten(bound[name])
            out.extend(a for a in flat if isinstance(a, torch.fx.Node))
    return out


def _returns_view(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    return all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def _returns_nothing(target: Any) -> bool:
    """An op whose schema returns nothing (``-> ()``): the in-place ``_foreach_*_`` family, the fused optimizers."""
    schema = getattr(target, "_schema", None)
    return schema is not None and not schema.returns


UNWRITTEN_GRADS = re.compile(r"^aten\._fused_(adam|adamw|sgd|adagrad)_\.")
"""torch's fused optimizers: their schema marks ``grads`` written, but the CUDA kernels store a gradient only when they
unscale it (``if (i != kGradIdx || grad_scale_ptr)`` in ``aten/src/ATen/native/cuda/fused_adam_utils.cuh``)"""


def _written_results(node: torch.fx.Node, info: _TargetInfo) -> list[torch.fx.Node]:
    """The tensors an op that returns nothing writes, as its results: every written argument (its schema's
    ``Tensor(a!)``), but a fused optimizer's gradients without a ``grad_scale``."""
    names = info.write_args
    if UNWRITTEN_GRADS.match(info.name) and _bind(node).get("grad_scale") is None:
        names = tuple(n for n in names if n != "grads")
    return _written_args(node, names)


class _FxImporter:
    def __init__(self, gm: torch.fx.GraphModule | torch.fx.Graph, group_sizes: Mapping[str, Any] | None) -> None:
        self.graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
        self.group_sizes = dict(group_sizes or {})
        self.b = GraphBuilder()
        self.ids: dict[torch.fx.Node, int] = {}
        self.storage_of_key: dict[StorageWeakRef, int] = {}
        self.write_order = WriteOrder()  # the ordering deps of in-place writes (commsched.ir.inplace's one rule)
        self.pending_coll_writes: dict[int, list[int]] = {}
        self.flop_errors: list[str] = []
        self.causal: list[str] = []  # attention nodes with is_causal set (CAUSAL_META)
        self.permutes: list[str] = []  # all_to_all collectives to and from one peer each (PERMUTE_META)
        self.tags: dict[str, list[str]] = {}  # tag -> tagged node names (NODE_TAGS_META)
        self.target_info: dict[Any, _TargetInfo] = {}
        self.flop_cache: dict[Any, float] = {}

    def _info(self, node: torch.fx.Node) -> _TargetInfo:
        key = (node.op, node.target)
        info = self.target_info.get(key)
        if info is None:
            target = node.target
            packet = getattr(target, "overloadpacket", None)
            info = self.target_info[key] = _TargetInfo(
                name=target_name(node),
                schema_name=_schema_name(target),
                is_view=_returns_view(target),
                write_args=_write_arg_names(target),
                formula=flop_registry.get(packet) if packet is not None else None,
                impure=node.op == "call_function" and node.is_impure(),
            )
        return info

    # -------------------------------------------------------------- helpers
    def _val(self, node: torch.fx.Node) -> Any:
        if "val" in node.meta:
            return node.meta["val"]
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            # an element of a tuple result: the parent's metadata says what it is (None for an output the op
            # did not produce, e.g. a gradient that was not asked for)
            parent = node.args[0].meta.get("val")
            k = node.args[1]
            if isinstance(parent, (list, tuple)) and isinstance(k, int) and -len(parent) <= k < len(parent):
                return parent[k]
        if "tensor_meta" in node.meta and node.meta["tensor_meta"] is not None:
            return node.meta["tensor_meta"]
        if node.op == "output" or _returns_nothing(node.target):
            return None
        raise GraphError(
            f"FX node {node.name!r} ({target_name(node)}) has no meta['val']: expected FakeTensor metadata "
            "(trace with make_fx / torch.compile, or run torch.fx.passes.fake_tensor_prop.FakeTensorProp first)"
        )

    def _group(self, node: torch.fx.Node, group: Any, size_hint: Any) -> int:
        if isinstance(group, str):
            name = group
        elif hasattr(group, "group_name"):
            name = group.group_name
        else:
            name = str(group)
        given = self.group_sizes.get(name)
        size, stride = given if isinstance(given, tuple) else (given, 1)
        ranks = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            try:
                from torch.distributed.distributed_c10d import _resolve_process_group

                pg = _resolve_process_group(name)
                ranks = torch.distributed.get_process_group_ranks(pg)
            except (ValueError, RuntimeError, KeyError):
                ranks = None
        if ranks is not None:
            size = size or len(ranks)
            steps = {b - a for a, b in itertools.pairwise(ranks)}
            if len(steps) == 1:
                stride = max(1, steps.pop())
        if size is None and size_hint is not None:
            size = _concrete(size_hint)
        if size is None:
            raise GraphError(
                f"FX node {node.name!r} ({target_name(node)}): cannot tell the size of process group {name!r}; "
                "initialise the (fake) process group before importing, or pass group_sizes={name: size}"
            )
        return self.b.group(name, int(size), stride)

    def _tensor_buffer(self, t: Any, alias_storage: int | None, nid: int) -> tuple:
        shape = tuple(t.shape)
        if not all(type(s) is int for s in shape):
            shape = tuple(_concrete(s) for s in shape)
        dtype = _DTYPE_NAMES.get(t.dtype) or str(t.dtype).removeprefix("torch.")
        nbytes = math.prod(shape) * t.dtype.itemsize
        if alias_storage is not None:
            return (shape, dtype, nbytes, alias_storage)
        key = None
        if isinstance(t, torch.Tensor):
            try:
                key = StorageWeakRef(t.untyped_storage())
            except (NotImplementedError, RuntimeError):
                key = None
        if key is not None and key in self.storage_of_key:
            return (shape, dtype, nbytes, self.storage_of_key[key])
        storage_bytes = nbytes
        if isinstance(t, torch.Tensor):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                storage_bytes = max(nbytes, _concrete(t.untyped_storage().nbytes()))
        sid = self.b.new_storage(storage_bytes, nid)
        if key is not None:
            self.storage_of_key[key] = sid
        return (shape, dtype, nbytes, sid)

    def _read_storages(self, inputs: list[int]) -> set[int]:
        return {s for i in inputs for s in self.b.node_storages(i)}

    def _order_writes(self, nid: int, reads: set[int], writes: set[int], kind: OpKind) -> None:
        for before in self.write_order.visit(nid, kind, reads, writes):
            self.b.add_dep(nid, before)

    # -------------------------------------------------------------- main loop
    def run(self) -> Graph:
        b = self.b
        for node in self.graph.nodes:
            name = node.name
            target = node.target
            inputs = [self.ids[a] for a in node.all_input_nodes]
            if node.op in ("placeholder", "get_attr"):
                val = self._val(node)
                nid = len(b)
                bufs = [self._tensor_buffer(t, None, nid) for t in _tensors(val)]
                self.ids[node] = b.add_node(name, node.op, OpKind.INPUT, buffers=bufs)
                continue
            if node.op == "output":
                nid = b.add_node(name, "output", OpKind.OUTPUT, inputs, side_effect=True)
                self._order_writes(nid, self._read_storages(inputs), set(), OpKind.OUTPUT)
                self.ids[node] = nid
                continue
            self.ids[node] = self._add_call(node, target, inputs)
            for tag in sorted(node.meta.get(FX_TAGS_KEY, ())):
                self.tags.setdefault(tag, []).append(name)
        g = b.build(validate=True)
        if self.flop_errors:
            g.meta["flop_errors"] = self.flop_errors[:20]
        if self.causal:
            g.meta[CAUSAL_META] = self.causal
        if self.permutes:
            g.meta[PERMUTE_META] = self.permutes
        if self.tags:
            g.meta[NODE_TAGS_META] = self.tags
        return g

    def _add_call(self, node: torch.fx.Node, target: Any, inputs: list[int]) -> int:
        b = self.b
        nid = len(b)
        val = self._val(node)
        info = self._info(node)
        sname, tname = info.schema_name, info.name
        flat_val = _tensors(val)

        if target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            src = self.ids[node.args[0]]
            k = node.args[1]
            parent = node.args[0].meta.get("val")
            if isinstance(k, int) and isinstance(parent, (list, tuple)) and -len(parent) <= k < len(parent):
                k %= len(parent)
                if not isinstance(parent[k], torch.Tensor):
                    # an output the op did not produce (None): nothing to alias, nothing to run
                    return b.add_node(node.name, tname, OpKind.VIEW, inputs)
                # buffers hold only the tensor outputs: element k is buffer number (tensors before it)
                k = sum(isinstance(t, torch.Tensor) for t in parent[:k])
            if isinstance(k, int) and b.buf_node_ptr[src] + k < b.buf_node_ptr[src + 1]:
                shape, dtype, nbytes, storage = b.node_buffer(src, k)
                return b.add_node(node.name, tname, OpKind.VIEW, inputs, buffers=[(shape, dtype, nbytes, storage)])

        if sname in WAIT_OPS:
            src_node = node.args[0]
            src = self.ids[src_node]
            coll = src
            # through views (getitem) and earlier waits (waiting twice is a no-op) to the collective
            while b.kinds[coll] in (OpKind.VIEW, OpKind.WAIT) and b.inputs[coll]:
                coll = b.wait_of[coll] if b.kinds[coll] == OpKind.WAIT else b.inputs[coll][0]
            if b.kinds[coll] != OpKind.COLLECTIVE:
                kind = OpKind(b.kinds[coll]).name.lower()
                raise GraphError(
                    f"FX node {node.name!r} (wait_tensor): input {src_node.name!r} is {kind}, "
                    "expected the result of a collective"
                )
            storages = b.node_storages(src)
            bufs = [self._tensor_buffer(t, storages[0] if storages else None, nid) for t in flat_val[:1]]
            nid = b.add_node(node.name, tname, OpKind.WAIT, inputs, buffers=bufs, side_effect=True)
            b.set_wait(nid, coll)
            # readers after the collective's in-place write must wait for its completion
            self.write_order.complete(nid, self.pending_coll_writes.get(coll, ()))
            return nid

        written = _written_args(node, info.write_args)
        write_storages = self._read_storages([self.ids[w] for w in written])
        spec = COLLECTIVE_OPS.get(sname) if sname else None
        if spec is None and sname and sname.startswith("c10d::"):  # imported as compute, its transfer would be lost
            raise GraphError(
                f"FX node {node.name!r} ({tname}): an eager c10d collective, which the importer cannot time; "
                "trace with torch.distributed._functional_collectives (the _c10d_functional ops)"
            )
        if spec is not None:
            return self._add_collective(node, spec, inputs, flat_val, written, write_storages)

        # alias analysis: outputs on an input's storage are views (or in-place results)
        is_view = info.is_view
        base_storages = self._read_storages(inputs)
        if is_view and inputs:
            first = self.ids[node.args[0]] if node.args and isinstance(node.args[0], torch.fx.Node) else inputs[0]
            alias = b.node_storages(first)[0] if b.node_storages(first) else None
            bufs = [self._tensor_buffer(t, alias, nid) for t in flat_val]
        elif written and not flat_val and _returns_nothing(target):
            # an in-place op with no result (a _foreach_*_ op, a fused optimizer): what it writes is its result, an
            # alias of each written tensor, so that its bytes count the writes
            results = [self.ids[w] for w in _written_results(node, info)]
            bufs = [b.node_buffer(r, k) for r in results for k in range(len(b.node_storages(r)))]
        elif written:
            alias = b.node_storages(self.ids[written[0]])[0]
            bufs = [self._tensor_buffer(t, alias, nid) for t in flat_val]
        else:
            bufs = [self._tensor_buffer(t, None, nid) for t in flat_val]
        all_alias = bool(bufs) and all(buf[3] in base_storages for buf in bufs)
        flops, has_formula = self._flops(node, info.formula, val)
        if is_view or (all_alias and not written and not has_formula):
            kind = OpKind.VIEW
        elif has_formula:
            kind = OpKind.COMPUTE
        else:
            kind = OpKind.OTHER
        side = bool(written) or info.impure
        if kind != OpKind.VIEW and _is_causal(node):
            self.causal.append(node.name)
        nid = b.add_node(node.name, tname, kind, inputs, buffers=bufs, flops=flops, side_effect=side)
        self._order_writes(nid, base_storages, write_storages, kind)
        return nid

    def _add_collective(self, node, spec: _CollSpec, inputs, flat_val, written, write_storages) -> int:
        b = self.b
        nid = len(b)
        bound = _bind(node)
        group = self._group(node, bound.get("group_name"), bound.get("group_size"))
        data = bound.get("input", bound.get("inputs"))
        in_vals = [a.meta.get("val") for a in tree_flatten(data)[0] if isinstance(a, torch.fx.Node)]
        in_bytes = 0
        for v in in_vals:
            if v is None or not hasattr(v, "shape"):
                raise GraphError(f"FX node {node.name!r}: collective input has no tensor meta['val']")
            numel = 1
            for s in v.shape:
                numel *= _concrete(s)
            in_bytes += numel * v.dtype.itemsize
        if spec.writes_arg == "input" or spec.writes_arg == "inputs" or spec.writes_arg == "out":
            alias = [s for w in written for s in b.node_storages(self.ids[w])]
        else:
            alias = []
        bufs = [self._tensor_buffer(t, alias[k] if k < len(alias) else None, nid) for k, t in enumerate(flat_val)]
        if spec.type == CollType.ALL_TO_ALL and _is_permute(bound):
            self.permutes.append(node.name)
        reduce_op = bound.get("reduce_op")
        nid = b.add_node(node.name, self._info(node).name, OpKind.COLLECTIVE, inputs, buffers=bufs, side_effect=True)
        b.set_collective(
            nid,
            spec.type,
            group,
            str(reduce_op) if reduce_op is not None else None,
            in_bytes,
            sum(buf[2] for buf in bufs),
            sync=spec.sync,
        )
        self._order_writes(nid, self._read_storages(inputs), write_storages, OpKind.COLLECTIVE)
        if write_storages and not spec.sync:
            self.pending_coll_writes[nid] = sorted(write_storages)
        return nid

    def _flops(self, node: torch.fx.Node, formula: Any, val: Any) -> tuple[float, bool]:
        if formula is None:
            return 0.0, False
        # the same op on the same shapes recurs once per layer: cache by target and argument shapes
        try:
            key = (node.target, _shape_key(node.args), _shape_key(tuple(node.kwargs.items())))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self.flop_cache:
            return self.flop_cache[key], True

        def to_val(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return a.meta.get("val")
            if isinstance(a, (list, tuple)):
                return type(a)(to_val(x) for x in a)
            return a

        try:
            args, kwargs = to_val(node.args), {k: to_val(v) for k, v in node.kwargs.items()}
            flops = float(formula(*args, **kwargs, out_val=val))
        except Exception as exc:  # a formula that cannot evaluate these shapes: count nothing, say so
            self.flop_errors.append(f"{node.name}: {type(exc).__name__}: {exc}")
            return 0.0, True
        if key is not None:
            self.flop_cache[key] = flops
        return flops, True


def from_fx(
    gm: torch.fx.GraphModule | torch.fx.Graph,
    *,
    group_sizes: Mapping[str, int | tuple[int, int]] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Graph:
    """Import an FX graph. Node names are kept; node ids follow the FX node order.

    ``group_sizes`` gives the size (or ``(size, stride)``) of process groups that are not registered in this process
    (e.g. a graph loaded from disk, or a rewritten copy of a traced one); registered groups (a real or fake process
    group) are resolved automatically.
    ``meta`` is added to the graph's meta, but for what the import derives from this graph itself (its causal
    attention nodes, its flop errors): a rewritten copy imported with the traced graph's meta keeps its own.
    Raises GraphError naming the FX node when metadata is missing or a collective cannot be understood (an eager
    c10d collective; a ``fully_shard`` step traced with ``make_fx`` alone: use ``commsched.trace_fsdp2``).
    """
    importer = _FxImporter(gm, group_sizes)
    try:
        g = importer.run()
    except GraphError as exc:  # FSDP2's ops with eager collectives: not yet through its graph passes
        names = [_schema_name(n.target) or "" for n in importer.graph.nodes]
        fsdp2 = next((n for n, k in zip(importer.graph.nodes, names, strict=True) if k in _FSDP2_OPS), None)
        if fsdp2 is None or not any(k.startswith("c10d::") for k in names):
            raise
        raise GraphError(f"FX node {fsdp2.name!r} ({target_name(fsdp2)}): {FSDP2_AS_TRACED}") from exc
    carried = getattr(gm, "meta", {}).get(MODULE_META_KEY) or {}  # the workload the module was traced for
    g.meta.update(inheritable_meta({**carried, **(meta or {})}))
    g.meta.setdefault("source", "fx")
    return g
