"""Versioned JSON format of a Graph (documented in docs/graph-format.md): strict load, atomic save."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from commsched.io import atomic_write_text, read_input_json
from commsched.ir import CollType, Graph, GraphBuilder, GraphError, OpKind
from commsched.ir.graph import MAX_BYTES, MAX_FLOPS, MAX_RANKS

FORMAT = "commsched.graph"
VERSION = 1
SUPPORTED_VERSIONS = (1,)

_KINDS = {k.name.lower(): k for k in OpKind}
_COLL_TYPES = {c.name.lower(): c for c in CollType}
_NODE_FIELDS = {"name", "target", "kind", "inputs", "deps", "flops", "outputs", "side_effect", "collective", "wait_of"}
_REQUIRED_NODE_FIELDS = ("name", "target", "kind")
_REQUIRED_NODE_FIELDS_SET = frozenset(_REQUIRED_NODE_FIELDS)
_BUFFER_FIELDS = {"shape", "dtype", "nbytes", "storage"}
_COLL_FIELDS = {"type", "group", "reduce_op", "in_bytes", "out_bytes", "sync"}
_INT64_MAX = (1 << 63) - 1
# torch's dtype names (str(torch.<dtype>) without "torch."), as the FX frontend writes them
DTYPES = frozenset(
    [
        "bfloat16",
        "bits16",
        "bits1x8",
        "bits2x4",
        "bits4x2",
        "bits8",
        "bool",
        "complex128",
        "complex32",
        "complex64",
        "float16",
        "float32",
        "float4_e2m1fn_x2",
        "float64",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "int1",
        "int16",
        "int2",
        "int3",
        "int32",
        "int4",
        "int5",
        "int6",
        "int64",
        "int7",
        "int8",
        "qint32",
        "qint8",
        "quint2x4",
        "quint4x2",
        "quint8",
        "uint1",
        "uint16",
        "uint2",
        "uint3",
        "uint32",
        "uint4",
        "uint5",
        "uint6",
        "uint64",
        "uint7",
        "uint8",
    ]
)


def _short(v: Any) -> str:
    """``repr(v)`` cut to 60 characters (an error names the value, not a megabyte of it)."""
    text = repr(v) if not isinstance(v, (dict, list)) else type(v).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def graph_to_dict(g: Graph) -> dict[str, Any]:
    """The JSON-ready dict of ``g`` (format ``commsched.graph``, version 1)."""
    nodes = []
    buf_ptr = g.buf_ptr.tolist()
    in_ptr, in_idx = g.in_ptr.tolist(), g.in_idx.tolist()
    dep_ptr, dep_idx = g.dep_ptr.tolist(), g.dep_idx.tolist()
    buf_nbytes, buf_storage = g.buf_nbytes.tolist(), g.buf_storage.tolist()
    for i in range(len(g)):
        node: dict[str, Any] = {
            "name": g.names[i],
            "target": g.targets[i],
            "kind": OpKind(int(g.kinds[i])).name.lower(),
            "inputs": in_idx[in_ptr[i] : in_ptr[i + 1]],
        }
        if dep_ptr[i + 1] > dep_ptr[i]:
            node["deps"] = dep_idx[dep_ptr[i] : dep_ptr[i + 1]]
        if g.flops[i]:
            node["flops"] = float(g.flops[i])
        node["outputs"] = [
            {"shape": list(g.buf_shape[b]), "dtype": g.buf_dtype[b], "nbytes": buf_nbytes[b], "storage": buf_storage[b]}
            for b in range(buf_ptr[i], buf_ptr[i + 1])
        ]
        if g.side_effect[i]:
            node["side_effect"] = True
        if g.coll_type[i] >= 0:
            node["collective"] = {
                "type": CollType(int(g.coll_type[i])).name.lower(),
                "group": int(g.coll_group[i]),
                "reduce_op": g.coll_reduce_op.get(i),
                "in_bytes": int(g.coll_in_bytes[i]),
                "out_bytes": int(g.coll_out_bytes[i]),
                "sync": bool(g.coll_sync[i]),
            }
        if g.wait_of[i] >= 0:
            node["wait_of"] = int(g.wait_of[i])
        nodes.append(node)
    return {
        "format": FORMAT,
        "version": VERSION,
        "meta": g.meta,
        "groups": [{"name": p.name, "size": p.size, "stride": p.stride} for p in g.groups],
        "storages": [
            {"nbytes": int(nb), "owner": int(o)}
            for nb, o in zip(g.storage_nbytes.tolist(), g.storage_owner.tolist(), strict=False)
        ],
        "nodes": nodes,
    }


def save_graph(g: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``g`` as JSON; the file appears complete or not at all."""
    try:
        text = json.dumps(graph_to_dict(g), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise GraphError(f"{path}: graph metadata is not JSON-serialisable: {exc}") from None
    atomic_write_text(path, text)


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, item: str, msg: str) -> GraphError:
        return GraphError(f"{self.where}: {item}: {msg}")

    def int_(self, item: str, v: Any, lo: int = 0) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(item, f"expected an integer, got {_short(v)}")
        if not lo <= v <= _INT64_MAX:
            raise self.fail(item, f"expected an integer in [{lo}, 2**63 - 1], got {_short(v)}")
        return v

    def str_(self, item: str, v: Any) -> str:
        if not isinstance(v, str):
            raise self.fail(item, f"expected a string, got {_short(v)}")
        return v

    def choice(self, item: str, v: Any, choices: dict[str, Any]) -> Any:
        """``choices[v]`` for a string ``v`` among its keys (an unhashable value is an error like any other)."""
        found = choices.get(v) if isinstance(v, str) else None
        if found is None:
            raise self.fail(item, f"expected one of {sorted(choices)}, got {_short(v)}")
        return found

    def list_(self, item: str, v: Any) -> list:
        if not isinstance(v, list):
            raise self.fail(item, f"expected a list, got {type(v).__name__}")
        return v

    def dict_(self, item: str, v: Any, allowed: set[str]) -> dict:
        if not isinstance(v, dict):
            raise self.fail(item, f"expected an object, got {type(v).__name__}")
        extra = set(v) - allowed
        if extra:
            raise self.fail(item, f"unknown field(s) {sorted(extra)}; expected only {sorted(allowed)}")
        return v


def graph_from_dict(data: Any, where: str = "<graph>") -> Graph:
    """Build a Graph from the JSON dict, validating every field; errors name the node and field."""
    r = _Reader(where)
    top = r.dict_("top level", data, {"format", "version", "meta", "groups", "storages", "nodes"})
    if top.get("format") != FORMAT:
        raise r.fail("field 'format'", f"expected {FORMAT!r}, got {top.get('format')!r}")
    version = top.get("version")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise r.fail(
            "field 'version'", f"unknown schema version {version!r}; this commsched reads {SUPPORTED_VERSIONS}"
        )
    meta = top.get("meta", {})
    if not isinstance(meta, dict):
        raise r.fail("field 'meta'", "expected an object")
    world = meta.get("world_size")
    if world is not None and (type(world) is not int or not 1 <= world <= MAX_RANKS):
        raise r.fail("field 'meta.world_size'", f"expected an integer in [1, 2**31 - 1], got {_short(world)}")
    b = GraphBuilder(meta)
    for k, grp in enumerate(r.list_("field 'groups'", top.get("groups", []))):
        item = f"groups[{k}]"
        grp = r.dict_(item, grp, {"name", "size", "stride"})
        name = r.str_(f"{item}.name", grp.get("name"))
        if name in b._group_index:
            raise r.fail(item, f"duplicate process group name {name!r}")
        b.group(name, r.int_(f"{item}.size", grp.get("size"), 1), r.int_(f"{item}.stride", grp.get("stride", 1), 1))
    nodes = r.list_("field 'nodes'", top.get("nodes"))
    num_nodes = len(nodes)
    storages = r.list_("field 'storages'", top.get("storages", []))
    num_storages = len(storages)
    for k, st in enumerate(storages):
        st = r.dict_(f"storages[{k}]", st, {"nbytes", "owner"})
        b.storage_nbytes.append(r.int_(f"storages[{k}].nbytes", st.get("nbytes")))
        owner = r.int_(f"storages[{k}].owner", st.get("owner"))
        if owner >= num_nodes:
            raise r.fail(f"storages[{k}].owner", f"node id {owner} does not exist (expected 0..{num_nodes - 1})")
        b.storage_owner.append(owner)
    names_seen: set[str] = set()
    for i, node in enumerate(nodes):
        if type(node) is not dict or not node.keys() <= _NODE_FIELDS or not node.keys() >= _REQUIRED_NODE_FIELDS_SET:
            node = r.dict_(f"nodes[{i}]", node, _NODE_FIELDS)
            missing = [f for f in _REQUIRED_NODE_FIELDS if f not in node]
            raise r.fail(f"nodes[{i}]", f"missing required field {missing[0]!r}")
        name = node["name"]
        if type(name) is not str:
            r.str_(f"nodes[{i}].name", name)
        item = f"node {i} {name!r}"
        if name in names_seen:
            raise r.fail(item, f"duplicate node name {name!r}: node names must be unique")
        names_seen.add(name)
        kind = r.choice(f"{item} field 'kind'", node["kind"], _KINDS)
        target = node["target"]
        if type(target) is not str:
            r.str_(f"{item} field 'target'", target)
        inputs, deps = node.get("inputs", []), node.get("deps", [])
        for fld, vals in (("inputs", inputs), ("deps", deps)):
            # ids that exist; their order is checked (with node names) by Graph.validate
            if type(vals) is not list or not all(type(v) is int and 0 <= v < num_nodes for v in vals):
                for v in r.list_(f"{item} field {fld!r}", vals):
                    if r.int_(f"{item} field {fld!r}", v) >= num_nodes:
                        raise r.fail(
                            f"{item} field {fld!r}", f"node id {v} does not exist (expected 0..{num_nodes - 1})"
                        )
        flops = node.get("flops", 0.0)
        if type(flops) not in (int, float) or not (0 <= flops <= MAX_FLOPS):
            raise r.fail(f"{item} field 'flops'", f"expected a number in [0, {MAX_FLOPS:g}], got {_short(flops)}")
        outputs = node.get("outputs", [])
        if type(outputs) is not list:
            r.list_(f"{item} field 'outputs'", outputs)
        for k, out in enumerate(outputs):
            bi = f"{item} outputs[{k}]"
            if type(out) is not dict or out.keys() != _BUFFER_FIELDS:
                out = r.dict_(bi, out, _BUFFER_FIELDS)
                missing = sorted(_BUFFER_FIELDS - out.keys())
                raise r.fail(bi, f"missing field(s) {missing}")
            shape, storage, nbytes, dtype = out["shape"], out["storage"], out["nbytes"], out["dtype"]
            if type(shape) is not list or not all(type(v) is int and 0 <= v <= MAX_BYTES for v in shape):
                for v in r.list_(f"{bi}.shape", shape):
                    if r.int_(f"{bi}.shape", v) > MAX_BYTES:
                        raise r.fail(f"{bi}.shape", f"dimension {v} is out of range; expected <= 2**53")
            if type(storage) is not int or not 0 <= storage < num_storages:
                r.int_(f"{bi}.storage", storage)
                raise r.fail(f"{bi}.storage", f"storage {storage} does not exist ({num_storages} storages)")
            if type(nbytes) is not int or not 0 <= nbytes <= _INT64_MAX:
                r.int_(f"{bi}.nbytes", nbytes)
            if type(dtype) is not str or dtype not in DTYPES:
                raise r.fail(f"{bi}.dtype", f"expected a torch dtype name such as 'float32', got {_short(dtype)}")
            b.buf_shape.append(tuple(shape))
            b.buf_dtype.append(dtype)
            b.buf_nbytes.append(nbytes)
            b.buf_storage.append(storage)
        b.buf_node_ptr.append(len(b.buf_nbytes))
        side = node.get("side_effect", False)
        if type(side) is not bool:
            raise r.fail(f"{item} field 'side_effect'", f"expected true or false, got {side!r}")
        b.names.append(name)
        b.targets.append(target)
        b.kinds.append(int(kind))
        b.inputs.append(inputs if len(set(inputs)) == len(inputs) else list(dict.fromkeys(inputs)))
        b.deps.append(deps if len(set(deps)) == len(deps) else list(dict.fromkeys(deps)))
        b.flops.append(float(flops))
        b.side_effect.append(side)
        nid = i
        if node.get("collective") is not None:
            ci = f"{item} field 'collective'"
            c = r.dict_(ci, node["collective"], _COLL_FIELDS)
            ctype = r.choice(f"{ci}.type", c.get("type"), _COLL_TYPES)
            grp = r.int_(f"{ci}.group", c.get("group"))
            if grp >= len(b.groups):
                raise r.fail(f"{ci}.group", f"process group {grp} does not exist ({len(b.groups)} groups)")
            rop = c.get("reduce_op")
            if rop is not None:
                r.str_(f"{ci}.reduce_op", rop)
            sync = c.get("sync", False)
            if not isinstance(sync, bool):
                raise r.fail(f"{ci}.sync", f"expected true or false, got {sync!r}")
            b.set_collective(
                nid,
                ctype,
                grp,
                rop,
                r.int_(f"{ci}.in_bytes", c.get("in_bytes")),
                r.int_(f"{ci}.out_bytes", c.get("out_bytes")),
                sync=sync,
            )
        if "wait_of" in node:
            w = r.int_(f"{item} field 'wait_of'", node["wait_of"])
            if w >= nid:
                raise r.fail(f"{item} field 'wait_of'", f"collective {w} must come before its wait (id {nid})")
            b.wait_of[nid] = w
            if w not in inputs and w not in deps:
                raise r.fail(f"{item} field 'wait_of'", f"collective {w} must also be listed in 'inputs' or 'deps'")
    try:
        return b.build(validate=True)
    except GraphError as exc:
        raise GraphError(f"{where}: {exc}") from None


def load_graph(path: str | os.PathLike[str]) -> Graph:
    """Read a graph written by :func:`save_graph` (or by hand, following docs/graph-format.md)."""
    path = Path(path)
    try:
        data = read_input_json(path, "commsched.graph JSON")
    except FileNotFoundError:
        raise GraphError(f"{path}: no such file") from None
    except ValueError as exc:
        raise GraphError(str(exc)) from None
    return graph_from_dict(data, str(path))
