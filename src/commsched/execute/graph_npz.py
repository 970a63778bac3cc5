"""The trace cache's binary graph format: a Graph's own arrays in one uncompressed ``.npz`` (no pickle).

Internal to the cache (the user-facing file format stays the JSON of :mod:`commsched.frontends.json_io`): a
reader of the same commsched version (the cache key holds it) gets back an equal Graph. Reading is a few array
loads instead of parsing and validating a JSON node by node (llama3-70b at 4 layers on 512 GPUs: ~20x faster).
Lists of strings are numpy unicode arrays; shapes are one flat int64 array with a per-buffer rank; the reduce ops,
process groups and meta are one JSON string.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from commsched.io import atomic_write_bytes
from commsched.ir import Graph, GraphError, ProcessGroup

FORMAT = "commsched.graph-npz/1"
ARRAYS = ("kinds", "in_ptr", "in_idx", "dep_ptr", "dep_idx", "flops", "buf_ptr", "buf_nbytes", "buf_storage",
          "storage_nbytes", "storage_owner", "side_effect", "coll_type", "coll_group", "coll_in_bytes",
          "coll_out_bytes", "coll_sync", "wait_of")  # fmt: skip
"""the Graph fields that are numpy arrays already, stored as they are (dtype included)"""
STRINGS = ("names", "targets", "buf_dtype")
"""the Graph fields that are lists of strings"""


def graph_to_npz_bytes(g: Graph) -> bytes:
    """``g`` as the bytes of an ``.npz`` (see the module docstring). GraphError if its meta is not JSON."""
    ranks = np.fromiter((len(s) for s in g.buf_shape), np.int64, count=len(g.buf_shape))
    dims = np.fromiter((d for s in g.buf_shape for d in s), np.int64, count=int(ranks.sum()))
    try:
        rest = json.dumps({"format": FORMAT, "meta": g.meta, "reduce_ops": sorted(g.coll_reduce_op.items()),
                           "groups": [[p.name, p.size, p.stride] for p in g.groups]}, allow_nan=False)  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise GraphError(f"graph metadata is not JSON-serialisable: {exc}") from None
    arrays = {name: getattr(g, name) for name in ARRAYS}
    arrays.update({name: np.array(getattr(g, name), dtype=str) for name in STRINGS})
    out = io.BytesIO()
    np.savez(out, shape_rank=ranks, shape_dims=dims, rest=np.array(rest), **arrays)
    return out.getvalue()


def save_graph_npz(g: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``g`` to ``path`` atomically (a reader sees the whole file or none)."""
    atomic_write_bytes(path, graph_to_npz_bytes(g))


def load_graph_npz(path: str | os.PathLike[str]) -> Graph:
    """The Graph :func:`save_graph_npz` wrote. GraphError (naming the file) for a file of another format; OSError
    for one that cannot be read. Not validated again: the cache wrote it from a validated Graph."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            rest = json.loads(str(data["rest"]))
            if rest.get("format") != FORMAT:
                raise GraphError(f"{path}: format {rest.get('format')!r}, expected {FORMAT!r}")
            fields: dict[str, Any] = {name: data[name] for name in ARRAYS}
            fields.update({name: data[name].tolist() for name in STRINGS})
            ranks, dims = data["shape_rank"], data["shape_dims"].tolist()
    except (KeyError, ValueError, AttributeError, EOFError, zipfile.BadZipFile) as exc:
        raise GraphError(f"{path}: not a commsched graph npz ({type(exc).__name__}: {exc})") from None
    ends = np.cumsum(ranks).tolist()
    starts = [0, *ends[:-1]]
    fields["buf_shape"] = [tuple(dims[a:b]) for a, b in zip(starts, ends, strict=True)]
    fields["coll_reduce_op"] = {int(i): op for i, op in rest["reduce_ops"]}
    fields["groups"] = [ProcessGroup(name, size, stride) for name, size, stride in rest["groups"]]
    return Graph(**fields, meta=rest["meta"])
