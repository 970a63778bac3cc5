"""What a worker keeps between runs: traced workloads, and the finished rows of an interrupted sweep.

The **trace cache** stores a traced step's graph in the cache's binary format (:mod:`commsched.execute.graph_npz`:
the Graph's arrays in one ``.npz``, never pickle; ~20x faster to read than the user-facing JSON graph format of
:mod:`commsched.frontends.json_io`) under a key of everything that determines the trace: preset,
parallelism, world size, layers and every build option (mode, sequence length, batch, dtypes, degrees, FSDP
buckets), plus the commsched version with its source fingerprint and the torch version
(:func:`commsched.execute.base.versions`), so an entry of another version is never found. The graph's ``meta``
holds the workload meta. A file that cannot be read back is a miss (and is rewritten). The cache folder is
``$COMMSCHED_CACHE_DIR``, else ``$XDG_CACHE_HOME/commsched`` (``~/.cache/commsched``): on each machine of a cluster
its own. Beside a trace, ``features/`` keeps its cost analysis (:func:`store_features`: what costing a graph
computes whatever the hardware, :mod:`commsched.cost.features_io`), keyed by the trace and the cost package's files,
so a warm process costs a cached trace without analysing it again.

The **row store** keeps a sweep's finished rows under a hash of the sweep's configuration (its task specs, the
profiles by content, and the versions): every finished task rewrites one JSON file atomically, so an interrupted
sweep resumes where it stopped. A sweep that completes with the cache on keeps its file, so the same sweep again
takes its rows (rows are pure functions of that configuration; their wall times are the first run's); with
``--no-cache`` the file goes when the sweep completes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from commsched.execute.base import versions
from commsched.io import atomic_write_bytes, atomic_write_text, parse_json, read_input_text

TRACE_KEY_VERSION = 2  # 2: the .npz format (1: JSON)
ROWS_FORMAT = "commsched.sweep-progress"


def cache_dir() -> Path:
    """``$COMMSCHED_CACHE_DIR``, else ``$XDG_CACHE_HOME/commsched`` (default ``~/.cache/commsched``)."""
    env = os.environ.get("COMMSCHED_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "commsched"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def trace_key(preset: str, parallel: str, world_size: int, layers: int | None, options: dict[str, Any]) -> str:
    """The cache key of one traced workload (see the module docstring)."""
    v = versions()
    return _digest({
        "key_version": TRACE_KEY_VERSION, "preset": preset, "parallel": parallel, "world_size": world_size,
        "layers": layers, "options": options, "commsched": v["commsched_version"], "torch": v["torch_version"],
    })  # fmt: skip


def trace_path(key: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "traces" / f"{key}.npz"


def load_trace(key: str, root: Path | None = None) -> Any:
    """The cached Graph of ``key``, or None (absent, or unreadable: then it is overwritten by the next store)."""
    from commsched.execute.graph_npz import load_graph_npz
    from commsched.ir import GraphError

    path = trace_path(key, root)
    if not path.is_file():
        return None
    try:
        return load_graph_npz(path)
    except (GraphError, ValueError, OSError):
        return None


def store_trace(key: str, graph: Any, root: Path | None = None) -> None:
    """Write ``graph`` under ``key`` (atomically: a reader sees the whole file or none). A full disk or a read-only
    cache folder only costs the next run a trace."""
    from commsched.execute.graph_npz import save_graph_npz
    from commsched.ir import GraphError

    try:
        save_graph_npz(graph, trace_path(key, root))
    except (GraphError, OSError):
        return


@functools.cache
def cost_digest() -> str:
    """A hash of the cost package's files (its code and data): a trace's cost analysis is kept under it
    (:func:`features_path`), so no analysis of another cost model is read back, even where the source fingerprint
    is pinned (the benchmarks' ``--pin-fingerprint``)."""
    root = Path(__file__).resolve().parents[1] / "cost"
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc"):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def features_path(key: str, root: Path | None = None) -> Path:
    """Where the cost analysis of ``key``'s trace is kept (:func:`store_features`), under the cost model's digest."""
    return (root or cache_dir()) / "features" / f"{key}-{cost_digest()}.npz"


def load_features(key: str, graph: Any, root: Path | None = None) -> bool:
    """Take the stored cost analysis of ``key``'s trace as ``graph``'s (:mod:`commsched.cost.features_io`); False
    when there is none (absent, unreadable or not this graph's: the analysis is then computed as usual)."""
    from commsched.cost.features_io import remember_npz

    try:
        data = features_path(key, root).read_bytes()
    except OSError:
        return False
    return remember_npz(graph, data)


def store_features(key: str, graph: Any, root: Path | None = None) -> None:
    """Analyse ``graph`` for costing (unless this process has) and keep the analysis beside its trace (atomically;
    a full disk or a read-only folder only costs the next run the analysis)."""
    from commsched.cost.features_io import features_npz_bytes

    data = features_npz_bytes(graph)
    try:
        atomic_write_bytes(features_path(key, root), data)
    except OSError:
        return


class RowStore:
    """The finished results of one sweep, by task index, in ``sweeps/<hash of specs and versions>.json``."""

    def __init__(self, config: Any, root: Path | None = None) -> None:
        self.key = _digest({"config": config, **versions()})
        self.path = (root or cache_dir()) / "sweeps" / f"{self.key}.json"
        self.results: dict[int, Any] = {}

    def load(self) -> dict[int, Any]:
        """The results an earlier, interrupted run of the same sweep finished (empty if none or unreadable)."""
        try:
            data = parse_json(read_input_text(self.path, "sweep progress"), str(self.path))
            if data.get("format") == ROWS_FORMAT and data.get("key") == self.key:
                self.results = {int(k): v for k, v in data["results"].items()}
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            self.results = {}
        return dict(self.results)

    def add(self, index: int, result: Any) -> None:
        """Record one finished task (the file is rewritten atomically)."""
        self.results[index] = result
        text = json.dumps({"format": ROWS_FORMAT, "key": self.key, "results": self.results}, allow_nan=False)
        try:
            atomic_write_text(self.path, text)
        except OSError:
            return

    def finish(self, keep: bool = False) -> None:
        """The sweep completed: keep its rows for the next run of the same sweep, or forget them."""
        if not keep:
            self.path.unlink(missing_ok=True)
