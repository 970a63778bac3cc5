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
from commsched.cost.table import FORMAT as TABLE_FORMAT
from commsched.cost.table import MeasuredTable
from commsched.io import parse_json, read_input_text
from commsched.ir.graph import MAX_BYTES, MAX_RANKS

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


class TraceEvents:
    """A trace's events, read field by field: a value the importer uses is checked, and a bad one is a ValueError
    naming the file, the event and the field, with what was expected. The one reader of profiler traces: the
    measured table, ``calibrate --trace`` (:func:`trace_collectives`) and ``commsched replay`` all read through it."""

    def __init__(self, path: Path, events: list[Any]) -> None:
        self.path, self.events = path, events

    def fail(self, e: dict, field: str, expected: str, value: Any) -> ValueError:
        i = next((k for k, x in enumerate(self.events) if x is e), -1)
        text = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ValueError(f"{self.path}: traceEvents[{i}] field {field!r}: expected {expected}, got {text}")

    def args(self, e: dict) -> dict:
        a = e.get("args", {})
        if not isinstance(a, dict):
            raise self.fail(e, "args", "an object", a)
        return a

    def us(self, e: dict, value: Any, field: str = "dur") -> float:
        """Microseconds >= 0 (a Chrome trace's durations)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e12:
            raise self.fail(e, field, "microseconds in [0, 1e12]", value)
        return float(value)

    def count(self, e: dict, value: Any, field: str, lo: int = 0, hi: int = MAX_BYTES) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(e, f"args.{field}", f"an integer in [{lo}, {hi}]", value)
        return value

    def name(self, e: dict) -> str:
        n = e.get("name", "")
        return n if isinstance(n, str) else ""


def collective_of(ev: TraceEvents, e: dict, world: int, *, kernels: bool = False) -> tuple[str, int, int] | None:
    """(kind, group size, nbytes in the nccl-tests convention) of a communication event, or None. With ``kernels``
    also device kernels that carry ``Collective name`` (NCCL kernels in recent Kineto traces)."""
    args = ev.args(e)
    name = ev.name(e)
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
    group = ev.count(e, args.get("Group size") or world, "Group size", 1, MAX_RANKS)
    dtype = _DTYPES.get(str(args.get("dtype", "")), "")
    if not dtype:
        types = args.get("Input type", [])
        types = [t for t in types if isinstance(t, str) and t in _DTYPES] if isinstance(types, list) else []
        dtype = _DTYPES[types[0]] if types else "float32"
    itemsize = _ITEMSIZE.get(dtype, 4)
    if "In msg nelems" in args:
        in_bytes = ev.count(e, args["In msg nelems"], "In msg nelems") * itemsize
        out_bytes = ev.count(e, args.get("Out msg nelems", 0), "Out msg nelems") * itemsize
    else:
        dims = args.get("Input Dims", [])
        dims = (
            [d for d in dims if isinstance(d, list) and all(type(x) is int for x in d)]
            if isinstance(dims, list)
            else []
        )
        if not dims:
            return None
        in_bytes = math.prod(ev.count(e, x, "Input Dims") for x in dims[0]) * itemsize
        out_bytes = in_bytes * group if kind == "all_gather" else in_bytes
    nbytes = max(out_bytes, in_bytes * group) if kind == "all_gather" else in_bytes
    if nbytes > MAX_BYTES:
        raise ev.fail(e, "args", f"a message of at most 2**53 bytes ({nbytes} from its sizes)", "...")
    return kind, group, nbytes


_WHAT = "PyTorch profiler Chrome trace"


def load_trace(path: Path, data: Any = None) -> tuple[TraceEvents, dict[str, Any], int]:
    """(events, distributedInfo, world size) of a Chrome trace file (or of its parsed ``data``); ValueError naming
    the file when it is not one."""
    if data is None:
        data = parse_json(read_input_text(path, _WHAT), str(path), _WHAT)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no 'traceEvents' list: expected a {_WHAT}")
    info = data.get("distributedInfo") if isinstance(data, dict) else None
    info = info if isinstance(info, dict) else {}
    world = info.get("world_size", 1)
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_RANKS:
        raise ValueError(f"{path}: distributedInfo.world_size: expected an integer in [1, {MAX_RANKS}], got {world!r}")
    return TraceEvents(path, events), info, world


def external_id(e: dict, args: dict) -> Any:
    """An event's ``External id`` where it is a number or a string (else None: it links nothing)."""
    ext = args.get("External id")
    return ext if isinstance(ext, (int, float, str)) and not isinstance(ext, bool) else None


def _device_us(ev: TraceEvents) -> dict[Any, float]:
    """Summed device time (us) of the kernels, memcpys and memsets per ``External id``."""
    device_us: dict[Any, float] = defaultdict(float)
    for e in ev.events:
        if isinstance(e, dict) and e.get("cat") in _DEVICE_CATS and e.get("ph") == "X":
            ext = external_id(e, ev.args(e))
            if ext is not None:
                device_us[ext] += ev.us(e, e.get("dur", 0.0))
    return device_us


def _op_key(ev: TraceEvents, e: dict, args: dict) -> tuple | None:
    """(name, input shapes, dtype of the first tensor) of a ``cpu_op`` event with recorded shapes, or None."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    tensors = [
        (d, _DTYPES[t]) for d, t in zip(dims, types, strict=False) if isinstance(t, str) and t in _DTYPES
        and isinstance(d, list)
    ]  # fmt: skip
    if not tensors:
        return None
    shapes = tuple(tuple(ev.count(e, x, "Input Dims") for x in d) for d, _ in tensors)
    return ev.name(e), shapes, tensors[0][1]


def table_from_chrome_trace(path: str | os.PathLike[str], data: Any = None) -> MeasuredTable:
    """Read a profiler Chrome trace (JSON, optionally gzip) into a measured table (``data``: the file's parsed JSON,
    when the caller has read it). ValueError naming the file, the event and the field for a value it cannot use."""
    path = Path(path)
    ev, _, world = load_trace(path, data)
    device_us = _device_us(ev)
    on_device = bool(device_us)
    op_times: dict[tuple, list[float]] = defaultdict(list)
    coll_times: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for e in ev.events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        coll = collective_of(ev, e, world)
        if coll is not None:
            dur = device_us.get(external_id(e, ev.args(e)), 0.0) if on_device else 0.0
            coll_times[coll].append((dur or ev.us(e, e.get("dur", 0.0))) * 1e-6)
            continue
        if e.get("cat") != "cpu_op" or ev.name(e).startswith(("c10d::", "ProfilerStep")):
            continue
        args = ev.args(e)
        key = _op_key(ev, e, args)
        if key is None:
            continue
        dur_us = device_us.get(external_id(e, args), 0.0) if on_device else ev.us(e, e.get("dur", 0.0))
        if on_device and dur_us <= 0:
            continue
        op_times[key].append(dur_us * 1e-6)

    table = MeasuredTable(str(path))
    for (target, shapes, dtype), ts in op_times.items():
        table.add_op(target, shapes, dtype, statistics.median(ts), count=len(ts), where=f"{path}: op {target!r}")
    for (kind, group, nbytes), ts in coll_times.items():
        table.add_collective(kind, group, nbytes, statistics.median(ts), where=f"{path}: {kind} of {nbytes} bytes")
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
        ok = isinstance(ranks, list) and all(type(r) is int and 0 <= r < MAX_RANKS for r in ranks)
        return tuple(ranks) if ok else None
    except (ValueError, RecursionError):
        return None


def trace_collectives(path: str | os.PathLike[str]) -> TraceCollectives:
    """The collectives of one rank's trace, each call counted once: from NCCL kernels that carry ``Collective name``
    (their device time) when there are any, else from ``record_param_comms`` (its device time on a GPU trace, its own
    duration on a CPU one), else from the ``nccl:*`` / ``gloo:*`` CPU annotations (their own duration). The process
    group is ``Process Group Name`` when recorded, else the trace's default group."""
    path = Path(path)
    ev, info, world = load_trace(path)
    configs = info.get("pg_config", [])
    configs = [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []
    default = next((str(c.get("pg_name")) for c in configs if c.get("pg_desc") == "default_pg"), "default")
    group_ranks = {str(c.get("pg_name")): r for c in configs if (r := _group_ranks(c.get("ranks"))) is not None}
    xs = [e for e in ev.events if isinstance(e, dict) and e.get("ph") == "X"]
    kernels = [e for e in xs if e.get("cat") == "kernel" and "Collective name" in ev.args(e)]
    params = [e for e in xs if e.get("name") == "record_param_comms"]
    notes = [e for e in xs if e.get("cat") == "user_annotation" and _COMM.match(ev.name(e))]
    source, chosen = next(((n, c) for n, c in (("kernel", kernels), ("record_param_comms", params),
                                                ("annotation", notes)) if c), ("none", []))  # fmt: skip
    device_us = _device_us(ev) if source == "record_param_comms" else {}
    occurrences: dict[CollectiveKey, list[float]] = defaultdict(list)
    for e in chosen:
        coll = collective_of(ev, e, world, kernels=True)
        if coll is None:
            continue
        args = ev.args(e)
        group = str(args.get("Process Group Name", default))
        ranks = _group_ranks(args.get("Process Group Ranks"))
        if ranks is not None:
            group_ranks.setdefault(group, ranks)
        dur_us = device_us.get(external_id(e, args), 0.0) or ev.us(e, e.get("dur", 0.0))
        occurrences[(*coll, group)].append(dur_us * 1e-6)
    rank = info.get("rank")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < MAX_RANKS):
        raise ValueError(f"{path}: distributedInfo.rank: expected an integer >= 0, got {rank!r}")
    return TraceCollectives(path, rank, source, dict(occurrences), group_ranks)


def load_measured(path: str | os.PathLike[str]) -> MeasuredTable:
    """A measured table from ``path``: a commsched table (CSV, or JSON with format ``commsched.cost-table``) or a
    PyTorch profiler trace (read with :func:`table_from_chrome_trace`), each optionally gzip-compressed.
    FileNotFoundError naming a missing file; ValueError naming the file for anything else."""
    p = Path(path)
    text = read_input_text(p, "measured table or profiler trace")
    if ".csv" in [s.lower() for s in p.suffixes]:
        return MeasuredTable.from_csv(text, str(p))
    data = parse_json(text, str(p), "commsched.cost-table JSON or a profiler trace")
    if isinstance(data, dict) and data.get("format") == TABLE_FORMAT:
        return MeasuredTable.from_dict(data, str(p))
    return table_from_chrome_trace(p, data)
