"""Import a PyTorch profiler Chrome trace (``prof.export_chrome_trace``) into a :class:`MeasuredTable`.

Ops: ``cpu_op`` events with recorded shapes (``record_shapes=True``). On a GPU trace an op's time is the summed
duration of the device events (kernels, memcpy, memset) that carry its ``External id``; ops that launched nothing
are skipped. On a CPU trace it is the event's own (inclusive) duration. Repeated keys keep the median.

Collectives: ``nccl:*`` / ``gloo:*`` annotations and ``record_param_comms`` events. The size comes from
``In msg nelems`` / ``Out msg nelems`` when present, else from the input shape; it is converted to the nccl-tests
convention (all_gather: the whole output). The group size is ``Group size`` when recorded, else the trace's world
size. (Gloo runs reduce_scatter as an all_reduce and labels it so; such a trace has no reduce_scatter rows.)
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commsched.cost.collectives import normalize_kind
from commsched.cost.table import MeasuredTable

# profiler "Input type" strings -> torch dtype names
_DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8", "unsigned char": "uint8",
    "bool": "bool", "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
    "Int": "int32", "Byte": "uint8", "Char": "int8", "Bool": "bool",
}  # fmt: skip
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
             "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8, "complex128": 16}  # fmt: skip
_COMM = re.compile(r"^(nccl|gloo|mpi|ucc|xccl):(\w+)$")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _collective(e: dict, world: int, *, kernels: bool = False) -> tuple[str, int, int] | None:
    """(kind, group size, nbytes in the nccl-tests convention) of a communication event, or None. With ``kernels``
    also device kernels that carry ``Collective name`` (NCCL kernels in recent Kineto traces)."""
    args = e.get("args", {})
    name = e.get("name", "")
    m = _COMM.match(name)
    if name == "record_param_comms" or (kernels and e.get("cat") == "kernel" and "Collective name" in args):
        raw_kind = str(args.get("Collective name", ""))
    elif m:
        raw_kind = m.group(2)
    else:
        return None
    try:
        kind = normalize_kind(raw_kind)
    except ValueError:
        return None  # barrier, send/recv, ...
    group = int(args.get("Group size", world) or world)
    dtype = _DTYPES.get(str(args.get("dtype", "")), "")
    if not dtype:
        types = [t for t in args.get("Input type", []) if t in _DTYPES]
        dtype = _DTYPES[types[0]] if types else "float32"
    itemsize = _ITEMSIZE.get(dtype, 4)
    if "In msg nelems" in args:
        in_bytes = int(args["In msg nelems"]) * itemsize
        out_bytes = int(args.get("Out msg nelems", 0)) * itemsize
    else:
        dims = [d for d in args.get("Input Dims", []) if isinstance(d, list) and all(isinstance(x, int) for x in d)]
        if not dims:
            return None
        in_bytes = math.prod(dims[0]) * itemsize
        out_bytes = in_bytes * group if kind == "all_gather" else in_bytes
    nbytes = max(out_bytes, in_bytes * group) if kind == "all_gather" else in_bytes
    return kind, group, nbytes


def _load_trace(path: Path) -> tuple[list[Any], dict[str, Any]]:
    """(traceEvents, distributedInfo) of a Chrome trace file; ValueError naming the file when it is not one."""
    try:
        if path.suffix == ".gz":
            import gzip

            with gzip.open(path, "rt", encoding="utf-8") as fh:
                data: Any = json.load(fh)
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"trace {str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ValueError(f"{path}: not a JSON Chrome trace: {exc}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no 'traceEvents' list: expected a PyTorch profiler Chrome trace")
    info = data.get("distributedInfo") if isinstance(data, dict) else None
    return events, info if isinstance(info, dict) else {}


def _device_us(events: list[Any]) -> dict[Any, float]:
    """Summed device time (us) of the kernels, memcpys and memsets per ``External id``."""
    device_us: dict[Any, float] = defaultdict(float)
    for e in events:
        if isinstance(e, dict) and e.get("cat") in _DEVICE_CATS and e.get("ph") == "X":
            ext = e.get("args", {}).get("External id")
            if ext is not None:
                device_us[ext] += float(e.get("dur", 0.0))
    return device_us


def table_from_chrome_trace(path: str | os.PathLike[str]) -> MeasuredTable:
    """Read a profiler Chrome trace (JSON, optionally .gz) into a measured table."""
    path = Path(path)
    events, info = _load_trace(path)
    world = int(info.get("world_size", 1))

    device_us = _device_us(events)
    on_device = bool(device_us)

    op_times: dict[tuple, list[float]] = defaultdict(list)
    coll_times: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        coll = _collective(e, world)
        if coll is not None:
            dur = device_us.get(e.get("args", {}).get("External id"), 0.0) if on_device else 0.0
            coll_times[coll].append((dur or float(e.get("dur", 0.0))) * 1e-6)
            continue
        if e.get("cat") != "cpu_op" or e.get("name", "").startswith(("c10d::", "ProfilerStep")):
            continue
        args = e.get("args", {})
        dims, types = args.get("Input Dims"), args.get("Input type")
        if not isinstance(dims, list) or not isinstance(types, list):
            continue
        tensors = [(d, _DTYPES[t]) for d, t in zip(dims, types, strict=False) if t in _DTYPES and isinstance(d, list)]
        if not tensors:
            continue
        if on_device:
            dur_us = device_us.get(args.get("External id"), 0.0)
            if dur_us <= 0:
                continue
        else:
            dur_us = float(e.get("dur", 0.0))
        key = (e["name"], tuple(tuple(int(x) for x in d) for d, _ in tensors), tensors[0][1])
        op_times[key].append(dur_us * 1e-6)

    table = MeasuredTable(str(path))
    for (target, shapes, dtype), ts in op_times.items():
        table.add_op(target, shapes, dtype, statistics.median(ts), count=len(ts))
    for (kind, group, nbytes), ts in coll_times.items():
        table.add_collective(kind, group, nbytes, statistics.median(ts))
    return table


CollectiveKey = tuple[str, int, int, str]  # (kind, group size, nbytes in the nccl-tests convention, process group)


@dataclass(frozen=True)
class TraceCollectives:
    """One trace file's collective occurrences: ``occurrences_s[(kind, group size, nbytes, process group)]`` lists
    the seconds of every occurrence, in trace order. ``source`` names the events they came from; ``group_ranks`` the
    global ranks of each process group where the trace records them; ``rank`` is None when the trace does not say."""

    path: Path
    rank: int | None
    source: str
    occurrences_s: dict[CollectiveKey, list[float]]
    group_ranks: dict[str, tuple[int, ...]]


def _group_ranks(text: object) -> tuple[int, ...] | None:
    try:
        ranks = json.loads(text) if isinstance(text, str) else text
        return tuple(int(r) for r in ranks) if isinstance(ranks, list) else None
    except (ValueError, TypeError):
        return None


def trace_collectives(path: str | os.PathLike[str]) -> TraceCollectives:
    """The collectives of one rank's trace, each call counted once: from NCCL kernels that carry ``Collective name``
    (their device time) when there are any, else from ``record_param_comms`` (its device time on a GPU trace, its own
    duration on a CPU one), else from the ``nccl:*`` / ``gloo:*`` CPU annotations (their own duration). The process
    group is ``Process Group Name`` when recorded, else the trace's default group."""
    path = Path(path)
    events, info = _load_trace(path)
    world = int(info.get("world_size", 1))
    configs = [c for c in info.get("pg_config", []) if isinstance(c, dict)]
    default = next((str(c.get("pg_name")) for c in configs if c.get("pg_desc") == "default_pg"), "default")
    group_ranks = {str(c.get("pg_name")): r for c in configs if (r := _group_ranks(c.get("ranks"))) is not None}
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    kernels = [e for e in xs if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    params = [e for e in xs if e.get("name") == "record_param_comms"]
    notes = [e for e in xs if e.get("cat") == "user_annotation" and _COMM.match(e.get("name", ""))]
    source, chosen = next(((n, c) for n, c in (("kernel", kernels), ("record_param_comms", params),
                                                ("annotation", notes)) if c), ("none", []))  # fmt: skip
    device_us = _device_us(events) if source == "record_param_comms" else {}
    occurrences: dict[CollectiveKey, list[float]] = defaultdict(list)
    for e in chosen:
        coll = _collective(e, world, kernels=True)
        if coll is None:
            continue
        args = e.get("args", {})
        group = str(args.get("Process Group Name", default))
        ranks = _group_ranks(args.get("Process Group Ranks"))
        if ranks is not None:
            group_ranks.setdefault(group, ranks)
        dur_us = device_us.get(args.get("External id"), 0.0) or float(e.get("dur", 0.0))
        occurrences[(*coll, group)].append(dur_us * 1e-6)
    rank = info.get("rank")
    return TraceCollectives(path, None if rank is None else int(rank), source, dict(occurrences), group_ranks)


def load_measured(path: str | os.PathLike[str]) -> MeasuredTable:
    """A measured table from ``path``: a commsched table (CSV, or JSON with format ``commsched.cost-table``) or a
    PyTorch profiler trace (read with :func:`table_from_chrome_trace`). FileNotFoundError naming a missing file."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"measured table {str(p)!r} does not exist")
    if p.suffix == ".csv":
        return MeasuredTable.load(p)
    if p.suffix != ".gz" and '"commsched.cost-table"' in p.read_text(encoding="utf-8", errors="replace")[:200]:
        return MeasuredTable.load(p)
    return table_from_chrome_trace(p)  # a trace (.json or .json.gz)
