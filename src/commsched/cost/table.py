"""Measured times: ops keyed by (target, input shapes, dtype), collectives by (type, group size) over sizes.

Files are JSON (``{"format": "commsched.cost-table", "version": 1, "ops": [...], "collectives": [...]}``) or CSV
with the header ``kind,target,shapes,dtype,group_size,nbytes,time_s`` (``kind`` is ``op`` or a collective type;
``shapes`` like ``128x64;64x256``, ``-`` for a 0-d tensor). Between measured collective sizes times are interpolated
log-log; below the smallest size the smallest's time holds (latency-bound), above the largest the time grows in
proportion to the bytes (bandwidth-bound).

Op keys: the target without its overload (``aten.mm``), the shapes of the tensor inputs (0-d tensors included,
non-tensor arguments not), and the dtype of the first tensor input.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from commsched.cost.collectives import normalize_kind
from commsched.io import atomic_write_text, parse_json, read_input_text
from commsched.ir import Graph
from commsched.ir.graph import MAX_BYTES, MAX_RANKS

FORMAT = "commsched.cost-table"
VERSION = 1
_CSV_FIELDS = ("kind", "target", "shapes", "dtype", "group_size", "nbytes", "time_s")

OpKey = tuple[str, tuple[tuple[int, ...], ...], str]
MAX_TIME_S = 1e6
"""the longest measured time one row may hold (11.6 days; far beyond any kernel or collective)"""


def op_packet(target: str) -> str:
    """``aten.mm.default`` / ``aten::mm`` -> ``aten.mm``."""
    t = target.replace("::", ".")
    parts = t.split(".")
    if len(parts) >= 3:
        return ".".join(parts[:2])
    return t


def _shapes_text(shapes: Iterable[Iterable[int]]) -> str:
    return ";".join("x".join(str(int(d)) for d in s) or "-" for s in shapes)


def _parse_shapes(text: str, where: str) -> tuple[tuple[int, ...], ...]:
    if not text:
        return ()
    out = []
    for part in text.split(";"):
        if part == "-":
            out.append(())
            continue
        dims = part.split("x")
        if not all(d.isdigit() and len(d) <= 16 for d in dims):
            raise ValueError(f"{where}: shapes {text[:60]!r}: expected e.g. 128x64;64x256")
        out.append(tuple(_int(int(d), where, "shapes", 0, MAX_BYTES) for d in dims))
    return tuple(out)


def _time(v: object, where: str) -> float:
    """Seconds in [0, MAX_TIME_S] from a number (or, in a CSV, its text)."""
    try:
        t = float(v) if isinstance(v, str) and len(v) < 64 else v
    except ValueError:
        t = v
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TIME_S:
        raise ValueError(f"{where}: time_s {_brief(v)}: expected seconds in [0, {MAX_TIME_S:g}]")
    return float(t)


def _int(v: object, where: str, name: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (an integral float is taken; a CSV cell's text too)."""
    if isinstance(v, str) and v.strip().isdigit() and len(v) < 24:
        v = int(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 2.0**63:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{where}: {name} {_brief(v)}: expected an integer in [{lo}, {hi}]")
    return v


def _brief(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _str(v: object, where: str, name: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{where}: {name} {_brief(v)}: expected a string")
    return v


class MeasuredTable:
    """A table of measured op and collective times; see the module docstring."""

    def __init__(self, source: str = "<memory>") -> None:
        self.ops: dict[OpKey, float] = {}
        self.op_counts: dict[OpKey, int] = {}
        self._colls: dict[tuple[str, int], dict[int, float]] = {}
        self._interp: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        self.source = source

    # ------------------------------------------------------------------ building
    def add_op(
        self, target: str, shapes: Iterable[Iterable[int]], dtype: str, time_s: float, count: int = 1, where: str = ""
    ) -> None:
        """One op's time; ValueError naming ``where`` (default: the op) and the field out of range."""
        where = where or f"op {_brief(target)}"
        if not isinstance(shapes, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in shapes):
            raise ValueError(f"{where}: shapes: expected a list of shapes (lists of integers)")
        dims = tuple(tuple(_int(d, where, "shapes", 0, MAX_BYTES) for d in s) for s in shapes)
        key = (op_packet(_str(target, where, "target")), dims, _str(dtype, where, "dtype"))
        self.ops[key] = _time(time_s, where)
        self.op_counts[key] = _int(count, where, "count", 1, 1 << 53)

    def add_collective(self, kind: str, group_size: int, nbytes: int, time_s: float, where: str = "") -> None:
        """One collective's time at one size; ValueError naming ``where`` (default: the collective) and the field."""
        where = where or f"collective {_brief(kind)}"
        try:
            normalized = normalize_kind(_str(kind, where, "type"))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        k = (normalized, _int(group_size, where, "group_size", 1, MAX_RANKS))
        size = _int(nbytes, where, "nbytes", 0, MAX_BYTES)
        self._colls.setdefault(k, {})[size] = _time(time_s, where)
        self._interp.pop(k, None)

    @property
    def collectives(self) -> list[tuple[str, int, int, float]]:
        """(kind, group_size, nbytes, time_s) rows, sorted."""
        return sorted((k, g, b, t) for (k, g), sizes in self._colls.items() for b, t in sizes.items())

    def __len__(self) -> int:
        return len(self.ops) + sum(len(v) for v in self._colls.values())

    # ------------------------------------------------------------------ lookups
    @staticmethod
    def node_key(g: Graph, i: int) -> OpKey:
        """The op key of node ``i`` (see the module docstring)."""
        shapes, dtype = [], ""
        for p in g.inputs(i).tolist():
            lo, hi = int(g.buf_ptr[p]), int(g.buf_ptr[p + 1])
            if hi > lo:
                shapes.append(tuple(g.buf_shape[lo]))
                dtype = dtype or g.buf_dtype[lo]
        if not dtype and g.buf_ptr[i + 1] > g.buf_ptr[i]:
            dtype = g.buf_dtype[int(g.buf_ptr[i])]
        return op_packet(g.targets[i]), tuple(shapes), dtype

    def op_time(self, g: Graph, i: int) -> float | None:
        return self.ops.get(self.node_key(g, i)) if self.ops else None

    def collective_time(self, kind: str, group_size: int, nbytes: int) -> float | None:
        """Measured seconds for ``nbytes`` (nccl-tests convention), interpolated; None when this (kind, group size)
        was never measured."""
        k = (normalize_kind(kind), int(group_size))
        sizes = self._colls.get(k)
        if not sizes:
            return None
        arr = self._interp.get(k)
        if arr is None:
            b = np.array(sorted(sizes), dtype=np.float64)
            t = np.array([sizes[int(x)] for x in b])
            arr = self._interp[k] = (b, t)
        b, t = arr
        x = float(max(nbytes, 1))
        if x <= b[0]:
            return float(t[0])
        if x >= b[-1]:
            return float(t[-1] * x / max(b[-1], 1.0))
        lb, lt = np.log(np.maximum(b, 1.0)), np.log(np.maximum(t, 1e-15))
        return float(np.exp(np.interp(math.log(x), lb, lt)))

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "ops": [
                {
                    "target": k[0],
                    "shapes": [list(s) for s in k[1]],
                    "dtype": k[2],
                    "time_s": t,
                    "count": self.op_counts.get(k, 1),
                }
                for k, t in sorted(self.ops.items())
            ],
            "collectives": [
                {"type": k, "group_size": gsz, "nbytes": b, "time_s": t} for k, gsz, b, t in self.collectives
            ],
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write as JSON, or CSV when the path ends in ``.csv`` (atomically)."""
        path = Path(path)
        if path.suffix.lower() == ".csv":
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(_CSV_FIELDS)
            for (target, shapes, dtype), t in sorted(self.ops.items()):
                w.writerow(["op", target, _shapes_text(shapes), dtype, "", "", repr(t)])
            for kind, gsz, b, t in self.collectives:
                w.writerow([kind, "", "", "", gsz, b, repr(t)])
            atomic_write_text(path, buf.getvalue())
        else:
            atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> MeasuredTable:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{source}: not a {FORMAT} file (missing or wrong 'format')")
        version = data.get("version")
        if type(version) is not int or version != VERSION:
            raise ValueError(f"{source}: unknown {FORMAT} version {_brief(version)}: expected {VERSION}")
        table = cls(source)
        for j, e in enumerate(_rows(data, "ops", ("target", "shapes", "dtype", "time_s"), {"count"}, source)):
            where = f"{source}: ops[{j}]"
            table.add_op(e["target"], e["shapes"], e["dtype"], e["time_s"], e.get("count", 1), where=where)
        for j, e in enumerate(_rows(data, "collectives", ("type", "group_size", "nbytes", "time_s"), set(), source)):
            where = f"{source}: collectives[{j}]"
            table.add_collective(e["type"], e["group_size"], e["nbytes"], e["time_s"], where=where)
        return table

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MeasuredTable:
        """Read a JSON or CSV table (by suffix); errors name the file and the row."""
        path = Path(path)
        text = read_input_text(path, "measured table")
        if ".csv" not in [s.lower() for s in path.suffixes]:
            return cls.from_dict(parse_json(text, str(path), "commsched.cost-table JSON"), str(path))
        return cls.from_csv(text, str(path))

    @classmethod
    def from_csv(cls, text: str, source: str) -> MeasuredTable:
        """A table from CSV text (see the module docstring); errors name ``source`` and the line."""
        table = cls(source)
        try:
            reader = csv.DictReader(io.StringIO(text))
            missing = set(_CSV_FIELDS) - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{source}: CSV header lacks {sorted(missing)}: expected {','.join(_CSV_FIELDS)}")
            for row in reader:
                where = f"{source}:{reader.line_num}"
                if None in row.values() or None in row:
                    raise ValueError(f"{where}: expected the {len(_CSV_FIELDS)} fields {','.join(_CSV_FIELDS)}")
                if row["kind"] == "op":
                    shapes = _parse_shapes(row["shapes"], where)
                    table.add_op(row["target"], shapes, row["dtype"], row["time_s"], where=where)
                else:
                    table.add_collective(row["kind"], row["group_size"], row["nbytes"], row["time_s"], where=where)
        except csv.Error as exc:
            raise ValueError(f"{source}: not a CSV table: {exc}") from None
        return table


def _rows(data: dict, key: str, required: tuple[str, ...], optional: set[str], source: str) -> list[dict]:
    """``data[key]``, a list of objects with the ``required`` fields (and only those and ``optional``)."""
    rows = data.get(key, [])
    if not isinstance(rows, list):
        raise ValueError(f"{source}: field {key!r}: expected a list of objects")
    for j, e in enumerate(rows):
        if not isinstance(e, dict):
            raise ValueError(f"{source}: {key}[{j}]: expected an object with {', '.join(required)}")
        missing = [f for f in required if f not in e]
        if missing:
            raise ValueError(f"{source}: {key}[{j}]: missing field {missing[0]!r}; expected {', '.join(required)}")
        extra = set(e) - set(required) - optional
        if extra:
            raise ValueError(f"{source}: {key}[{j}]: unknown field {sorted(extra)[0]!r}")
    return rows
