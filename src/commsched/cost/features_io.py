"""A graph's hardware-independent cost analysis (:class:`commsched.cost.estimate.GraphFeatures` and its fusion
regions' boundary bytes) as the bytes of one uncompressed ``.npz`` (no pickle), kept beside a cached trace.

Costing a warm trace spent most of its time here, not on the hardware (llama3-70b on 512 GPUs, CP 32 at 2 layers:
the analysis was 0.23 of the framework round's 0.42 CPU-s), and the analysis is a pure function of the graph and
the cost model's code: the trace cache stores it once (:func:`commsched.execute.cache.store_features`, keyed by the
trace and the cost package's files), and a process that reads the trace back takes it with
:func:`remember_npz`. Read back, the costs are the same to the bit (``tests/cost/test_features_io.py``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile

import numpy as np

from commsched.cost.estimate import GraphFeatures, fusion_boundary_bytes, graph_features, remember_features
from commsched.ir import Graph

FORMAT = "commsched.graph-features/1"
_OPTIONAL = ("operand_dtype_id", "launches")  # GraphFeatures fields that may be None
_ARRAYS = tuple(f.name for f in dataclasses.fields(GraphFeatures) if f.name not in ("dtypes", "training"))


def features_npz_bytes(g: Graph) -> bytes:
    """``g``'s features and fusion boundary bytes (computed here if this process has not yet) as ``.npz`` bytes."""
    f = graph_features(g)
    read, written = fusion_boundary_bytes(g)
    arrays = {name: getattr(f, name) for name in _ARRAYS if getattr(f, name) is not None}
    rest = {"format": FORMAT, "nodes": len(g), "dtypes": list(f.dtypes), "training": bool(f.training)}
    out = io.BytesIO()
    np.savez(out, rest=np.array(json.dumps(rest)), boundary_read=read, boundary_written=written, **arrays)
    return out.getvalue()


def remember_npz(g: Graph, data: bytes) -> bool:
    """Take ``data`` (:func:`features_npz_bytes` of an equal graph) as ``g``'s analysis; False, taking nothing, when
    it is of another format or another node count (then the analysis is computed as usual)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            rest = json.loads(str(z["rest"]))
            if rest.get("format") != FORMAT or rest.get("nodes") != len(g):
                return False
            arrays = {name: z[name] if name in z.files else None for name in _ARRAYS}
            boundary = (z["boundary_read"], z["boundary_written"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return False
    if any(arrays[name] is None for name in _ARRAYS if name not in _OPTIONAL):
        return False
    remember_features(g, GraphFeatures(**arrays, dtypes=tuple(rest["dtypes"]), training=rest["training"]), boundary)
    return True
