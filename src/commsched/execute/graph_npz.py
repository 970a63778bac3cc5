"""The trace cache's binary graph format: a Graph's own arrays in one uncompressed ``.npz`` (no pickle).

Internal to the cache (the user-facing file format stays the JSON of :mod:`commsched.frontends.json_io`): a
reader of the same commsched version (the cache key holds it) gets back an equal Graph. Reading is a few array
loads instead of parsing and validating a JSON node by node (llama3-70b at 4 layers on 512 GPUs: ~20x faster).
Lists of strings are one UTF-8 byte array each, NUL-separated (a fixed-width unicode array would pad every name
to the longest); shapes are a table of the distinct ones and an index per buffer; the reduce ops,
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
    try:
        rest = json.dumps({"format": FORMAT, "meta": g.meta, "reduce_ops": sorted(g.coll_reduce_op.items()),
                           "groups": [[p.name, p.size, p.stride] for p in g.groups]}, allow_nan=False)  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise GraphError(f"graph metadata is not JSON-serialisable: {exc}") from None
    arrays = {name: getattr(g, name) for name in ARRAYS}
    arrays.update({name: _joined(getattr(g, name), name) for name in STRINGS})
    out = io.BytesIO()
    np.savez(out, rest=np.array(rest), **_shape_table(g.buf_shape), **arrays)
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
            fields["buf_shape"] = _shapes(data["shape_rank"], data["shape_dims"], data["shape_id"])
            counts = {
                "names": len(fields["kinds"]),
                "targets": len(fields["kinds"]),
                "buf_dtype": len(fields["buf_shape"]),
            }
            fields.update({name: _split(data[name], counts[name]) for name in STRINGS})
    except (KeyError, ValueError, AttributeError, EOFError, zipfile.BadZipFile) as exc:
        raise GraphError(f"{path}: not a commsched graph npz ({type(exc).__name__}: {exc})") from None
    fields["coll_reduce_op"] = {int(i): op for i, op in rest["reduce_ops"]}
    fields["groups"] = [ProcessGroup(name, size, stride) for name, size, stride in rest["groups"]]
    return Graph(**fields, meta=rest["meta"])


def _shape_table(shapes: list[tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Each distinct shape once (ranks, dims end to end) and each buffer's index into them (a step's buffers repeat
    a few shapes: building a tuple per buffer would take most of a load)."""
    index: dict[tuple[int, ...], int] = {}
    ids = np.fromiter((index.setdefault(s, len(index)) for s in shapes), np.int32, count=len(shapes))
    ranks = np.fromiter(map(len, index), np.int64, count=len(index))
    dims = np.fromiter((d for s in index for d in s), np.int64, count=int(ranks.sum()))
    return {"shape_rank": ranks, "shape_dims": dims, "shape_id": ids}


def _shapes(ranks: np.ndarray, dims: np.ndarray, ids: np.ndarray) -> list[tuple[int, ...]]:
    """The buffers' shapes :func:`_shape_table` stored (one tuple per distinct shape, shared)."""
    ends = np.cumsum(ranks).tolist()
    flat = dims.tolist()
    table = [tuple(flat[end - rank : end]) for rank, end in zip(ranks.tolist(), ends, strict=True)]
    return list(map(table.__getitem__, ids.tolist()))


def _joined(strings: list[str], name: str) -> np.ndarray:
    """``strings`` as NUL-separated UTF-8 bytes (uint8). GraphError if one holds a NUL itself."""
    text = "\0".join(strings)
    if text.count("\0") != max(len(strings) - 1, 0):
        raise GraphError(f"field {name!r}: a string holds a NUL character, which the cache format cannot store")
    return np.frombuffer(text.encode("utf-8"), np.uint8)


def _split(data: np.ndarray, count: int) -> list[str]:
    """The ``count`` strings :func:`_joined` wrote; ValueError if there are not that many."""
    strings = data.tobytes().decode("utf-8").split("\0") if count else []
    if len(strings) != count:
        raise ValueError(f"expected {count} strings, got {len(strings)}")
    return strings
