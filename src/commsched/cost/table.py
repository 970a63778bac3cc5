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
from commsched.io import atomic_write_text
from commsched.ir import Graph

FORMAT = "commsched.cost-table"
VERSION = 1
_CSV_FIELDS = ("kind", "target", "shapes", "dtype", "group_size", "nbytes", "time_s")

OpKey = tuple[str, tuple[tuple[int, ...], ...], str]


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
        try:
            out.append(tuple(int(d) for d in part.split("x")))
        except ValueError:
            raise ValueError(f"{where}: shapes {text!r}: expected e.g. 128x64;64x256") from None
    return tuple(out)


def _time(v: object, where: str) -> float:
    try:
        t = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{where}: time_s {v!r}: expected seconds") from None
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"{where}: time_s {t}: expected finite seconds >= 0")
    return t


class MeasuredTable:
    """A table of measured op and collective times; see the module docstring."""

    def __init__(self, source: str = "<memory>") -> None:
        self.ops: dict[OpKey, float] = {}
        self.op_counts: dict[OpKey, int] = {}
        self._colls: dict[tuple[str, int], dict[int, float]] = {}
        self._interp: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        self.source = source

    # ------------------------------------------------------------------ building
    def add_op(self, target: str, shapes: Iterable[Iterable[int]], dtype: str, time_s: float, count: int = 1) -> None:
        key = (op_packet(target), tuple(tuple(int(d) for d in s) for s in shapes), str(dtype))
        self.ops[key] = _time(time_s, f"op {target}")
        self.op_counts[key] = int(count)

    def add_collective(self, kind: str, group_size: int, nbytes: int, time_s: float) -> None:
        k = (normalize_kind(kind), int(group_size))
        if group_size < 1 or nbytes < 0:
            raise ValueError(f"collective {kind}: group_size={group_size} and nbytes={nbytes} must be >= 1 and >= 0")
        self._colls.setdefault(k, {})[int(nbytes)] = _time(time_s, f"collective {kind}")
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
        if data.get("version") != VERSION:
            raise ValueError(f"{source}: unknown {FORMAT} version {data.get('version')!r}: expected {VERSION}")
        table = cls(source)
        for j, e in enumerate(data.get("ops", [])):
            where = f"{source}: ops[{j}]"
            try:
                table.add_op(e["target"], e["shapes"], e["dtype"], _time(e["time_s"], where), int(e.get("count", 1)))
            except (KeyError, TypeError) as exc:
                raise ValueError(f"{where}: expected target, shapes, dtype, time_s ({exc})") from None
        for j, e in enumerate(data.get("collectives", [])):
            where = f"{source}: collectives[{j}]"
            try:
                table.add_collective(e["type"], int(e["group_size"]), int(e["nbytes"]), _time(e["time_s"], where))
            except (KeyError, TypeError) as exc:
                raise ValueError(f"{where}: expected type, group_size, nbytes, time_s ({exc})") from None
        return table

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MeasuredTable:
        """Read a JSON or CSV table (by suffix); errors name the file and the row."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(f"measured table {str(path)!r} does not exist") from None
        if path.suffix.lower() != ".csv":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: not valid JSON: {exc}") from None
            return cls.from_dict(data, str(path))
        table = cls(str(path))
        reader = csv.DictReader(io.StringIO(text))
        missing = set(_CSV_FIELDS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: CSV header lacks {sorted(missing)}: expected {','.join(_CSV_FIELDS)}")
        for row_no, row in enumerate(reader, start=2):
            where = f"{path}:{row_no}"
            t = _time(row["time_s"], where)
            if row["kind"] == "op":
                table.add_op(row["target"], _parse_shapes(row["shapes"], where), row["dtype"], t)
            else:
                try:
                    table.add_collective(row["kind"], int(row["group_size"]), int(row["nbytes"]), t)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
        return table
