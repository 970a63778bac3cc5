"""Calibrate collectives from the PyTorch profiler (Kineto) traces of several ranks, one file per rank.

Each file is read by :func:`commsched.cost.trace_import.trace_collectives`. For every (collective, group size,
nbytes) a rank's time is the median over its occurrences (in all its process groups of that size), and the table's
time is the median of those per-rank medians over the ranks that ran it (with an even count, the mean of the middle
two), as torch's profile-guided estimator and :func:`commsched.cost.align.median_across_ranks` do: one slow
occurrence, or one slow rank, does not move it. The result is a single :class:`MeasuredTable`, the same for every
rank, so every pass schedules from the same numbers.

The ranks must agree: every rank of a process group (its ``Process Group Ranks``, else every file) must have run the
same (collective, group size, nbytes) in that group; otherwise, or for a file that is not a trace or has no
collective events, a ValueError names the file and what was expected.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from commsched.cost.table import MeasuredTable
from commsched.cost.trace_import import CollectiveKey, TraceCollectives, trace_collectives

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class TraceRow:
    """One table row: ``median_s`` is the median over ranks of each rank's median over its occurrences."""

    kind: str
    group_size: int
    nbytes: int
    ranks: int
    occurrences: int
    median_s: float
    min_rank_s: float
    max_rank_s: float
    groups: tuple[str, ...]


@dataclass(frozen=True)
class TraceCalibration:
    """The aligned table, its rows for a summary, and the per-rank traces it came from."""

    table: MeasuredTable
    rows: list[TraceRow]
    traces: list[TraceCollectives]


def trace_paths(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, folders expanded to their ``*.json`` / ``*.json.gz`` files (sorted, not recursive)."""
    out: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise ValueError(f"{item}: no *.json or *.json.gz files: expected one profiler trace per rank")
            out.extend(found)
        elif not item.exists():
            raise ValueError(f"{item}: does not exist: expected a profiler trace file or a folder of them")
        else:
            out.append(item)
    if not out:
        raise ValueError("--trace: expected one or more trace files or folders")
    return out


def read_rank_traces(paths: Sequence[Path]) -> list[TraceCollectives]:
    """One :class:`TraceCollectives` per file; ValueError for a non-trace, a trace without collectives, or two files
    of the same rank. Files whose trace names no rank are numbered after the others by position."""
    traces, seen = [], {}
    for path in paths:
        try:
            t = trace_collectives(path)
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
        if not t.occurrences_s:
            raise ValueError(f"{path}: no collective events (NCCL kernels, record_param_comms, nccl:/gloo: "
                             "annotations): expected a profiler trace of a distributed run")  # fmt: skip
        if t.rank is not None:
            if t.rank in seen:
                raise ValueError(f"{path}: rank {t.rank} again (also {seen[t.rank]}): expected one file per rank")
            seen[t.rank] = path
        traces.append(t)
    next_rank = max(seen, default=-1) + 1
    for j, t in enumerate(traces):
        if t.rank is None:
            traces[j] = TraceCollectives(t.path, next_rank, t.source, t.occurrences_s, t.group_ranks)
            next_rank += 1
    return traces


def check_same_collectives(traces: Sequence[TraceCollectives]) -> None:
    """ValueError naming the first file that lacks a collective another member rank of its group ran."""
    everyone = {t.rank for t in traces}
    keys: dict[CollectiveKey, TraceCollectives] = {}
    for t in traces:
        for key in t.occurrences_s:
            keys.setdefault(key, t)
    for key, first in sorted(keys.items()):
        kind, group_size, nbytes, group = key
        members = set(first.group_ranks.get(group, everyone)) & everyone
        for t in traces:
            if t.rank in members and key not in t.occurrences_s:
                raise ValueError(
                    f"{t.path}: rank {t.rank} has no {kind} of {nbytes} B over group {group!r} ({group_size} ranks), "
                    f"which {first.path} has: expected the same collectives on every rank of a group"
                )


def calibrate_from_traces(inputs: Sequence[str | os.PathLike[str]]) -> TraceCalibration:
    """Read the per-rank traces (files or folders), check they agree, and build the median-across-ranks table."""
    traces = read_rank_traces(trace_paths(inputs))
    check_same_collectives(traces)
    per_rank: dict[tuple[str, int, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    groups: dict[tuple[str, int, int], set[str]] = defaultdict(set)
    for t in traces:
        for (kind, group_size, nbytes, group), times_s in t.occurrences_s.items():
            per_rank[(kind, group_size, nbytes)][t.rank].extend(times_s)  # type: ignore[index]
            groups[(kind, group_size, nbytes)].add(group)
    source = ", ".join(str(t.path) for t in traces)
    table, rows = MeasuredTable(f"traces: {source}"), []
    for (kind, group_size, nbytes), by_rank in sorted(per_rank.items()):
        rank_medians_s = [statistics.median(ts) for ts in by_rank.values()]
        median_s = statistics.median(rank_medians_s)
        table.add_collective(kind, group_size, nbytes, median_s)
        rows.append(TraceRow(kind, group_size, nbytes, len(by_rank), sum(len(ts) for ts in by_rank.values()),
                             median_s, min(rank_medians_s), max(rank_medians_s),
                             tuple(sorted(groups[(kind, group_size, nbytes)]))))  # fmt: skip
    return TraceCalibration(table, rows, traces)
