"""Read the text that nccl-tests / rccl-tests print (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``alltoall_perf``, ``sendrecv_perf``, ``broadcast_perf``, ``reduce_perf``, ...) and compare it with the cost model.

A log holds one or more tests. Each test is an optional header (``# Collective test starting: NAME``,
``# nThread .. nGpus .. minBytes .. maxBytes ..``, one ``#  Rank N [Group G] Pid P on HOST device D [BUS] GPU`` line
per rank), the column header line (``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time ...``:
out-of-place then in-place), the table rows, and the trailer (``# Avg bus bandwidth : X``). Rows are read by the
names of that column header line, never by fixed positions, so versions without ``redop`` / ``root``, with
``error`` for ``#wrong``, ``N/A`` error counts or extra columns all read alike; a table pasted without its column
header is read with the standard 13-column layout when its rows have that width. Anything else (``NCCL INFO`` lines,
launcher output, shell prompts, markdown, ``...`` elisions) is skipped; ``[1,0]<stdout>:`` (after any launcher
prefix) / ``[0]`` / ``0:`` launcher tags are dropped first. The text is only read: nothing in it is evaluated.

Bad input raises one ``ValueError`` ``"FILE:LINE: what was expected, got ..."``: no table, a row before the column
header, a row with the wrong number of fields or a non-numeric number, a column header without ``size``, ``count``,
``type``, ``time``, ``algbw`` or ``busbw``, sizes that do not increase, or a second table (or a row after a test's
trailer) with no test header in between.

Measured time per size: the smaller of the out-of-place and in-place times (:attr:`NcclTestsRow.time_s`). Both
columns measure the same collective over the same sizes and ranks; each is a mean over ``iters`` launches that
stragglers and clock jitter only ever lengthen, so the smaller is the closer to what the collective costs, and the
difference between the two placements (a local copy at most) is below what the model resolves.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
from collections import Counter

from commsched import hardware as hw_mod
from commsched.cost.collectives import bus_factor, plan_collective
from commsched.hardware import Hardware
from commsched.io import read_input_bytes

# binary stem -> collective name; the names the cost model knows follow commsched.cost.collectives.KINDS
COLLECTIVES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
               "alltoall": "all_to_all", "all_to_all": "all_to_all", "sendrecv": "sendrecv",
               "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
               "hypercube": "hypercube"}  # fmt: skip
MODELLED = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")
ONE_MIB = 1 << 20

_TAG = re.compile(r"^(?:\[\d+(?:,\d+)*\](?:<std(?:out|err)>)?:?\s?|\d+:\s+)")
_MPI_TAG = re.compile(r"\[\d+(?:,\d+)*\]<std(?:out|err)>:")  # mpirun --tag-output, after any launcher prefix
_PLACEMENT_COLUMNS = ("time", "algbw", "busbw", "#wrong")  # once out-of-place, once in-place
STANDARD_COLUMNS = ("size", "count", "type", "redop", "root", *_PLACEMENT_COLUMNS, *_PLACEMENT_COLUMNS)
"""the layout nccl-tests 2.x prints; a table pasted without its column header line is read with it"""
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_END = re.compile(r"^#\s*Collective test concluded:\s*(\S+)")
_NTHREAD = re.compile(r"^#?\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_RANK = re.compile(
    r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$"
)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(.*)$")
_BINARY = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(COLLECTIVES) + r")_perf(?:_mpi)?(?![A-Za-z0-9_])")
_ERROR_COLUMNS = ("#wrong", "wrong", "error", "#errors", "errors")


@dataclasses.dataclass(frozen=True)
class NcclTestsRow:
    """One table row. Times in microseconds and bandwidths in GB/s (1e9 bytes/s) as nccl-tests prints them;
    ``ip_*`` are None where the log has no in-place columns (or prints ``N/A`` there)."""

    line: int  # 1-based line of the log
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    oop_time_us: float
    oop_algbw_GBps: float
    oop_busbw_GBps: float
    ip_time_us: float | None
    ip_algbw_GBps: float | None
    ip_busbw_GBps: float | None

    @property
    def in_place_faster(self) -> bool:
        return self.ip_time_us is not None and self.ip_time_us < self.oop_time_us

    @property
    def time_s(self) -> float:
        """Measured seconds: the smaller of the out-of-place and in-place times (module docstring: why)."""
        if self.ip_time_us is not None and self.ip_time_us < self.oop_time_us:
            return self.ip_time_us * 1e-6
        return self.oop_time_us * 1e-6

    @property
    def busbw_GBps(self) -> float:
        """The printed busbw of the placement :attr:`time_s` comes from."""
        busbw = self.ip_busbw_GBps if self.in_place_faster else self.oop_busbw_GBps
        return self.oop_busbw_GBps if busbw is None else busbw


@dataclasses.dataclass(frozen=True)
class NcclTestsLog:
    """One test of a log: what ran (collective, ranks, hosts, GPU) and its rows, sizes strictly increasing
    (rows of 0 bytes, which nccl-tests prints for sizes below one element per rank, may repeat)."""

    source: str  # the file (or the name given for a text)
    line: int  # line of the column header
    collective: str | None  # a COLLECTIVES value; None where the log does not say and none was given
    nranks: int | None  # distinct ranks of the "# Rank" lines; None without them
    nodes: int | None  # distinct hosts of those lines
    gpu: str | None
    ranks_per_host: tuple[int, ...]  # ranks on each host, in order of first appearance
    rows: tuple[NcclTestsRow, ...]
    avg_busbw_GBps: float | None  # the trailer's "# Avg bus bandwidth"
    nthreads: int | None = None
    ngpus: int | None = None  # GPUs per process (-g)
    min_bytes: int | None = None
    max_bytes: int | None = None

    @property
    def ranks_per_node(self) -> int | None:
        """Ranks on every host, where all hosts have the same number; else None."""
        counts = set(self.ranks_per_host)
        return counts.pop() if len(counts) == 1 else None

    def measured_time_s(self) -> dict[int, float]:
        """Size in bytes (nccl-tests convention) -> measured seconds (:attr:`NcclTestsRow.time_s`); 0-byte rows
        left out."""
        return {r.size_bytes: r.time_s for r in self.rows if r.size_bytes > 0}


def collective_name(name: str) -> str:
    """A COLLECTIVES value for a binary or collective name (``all_reduce_perf_mpi``, ``alltoall``, ``all-gather``);
    ValueError for an unknown one."""
    stem = name.strip().lower().replace("-", "_").removesuffix("_mpi").removesuffix("_perf")
    stem = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}.get(stem, stem)
    if stem not in COLLECTIVES:
        raise ValueError(f"unknown nccl-tests collective {name!r}: expected one of {', '.join(sorted(COLLECTIVES))}")
    return COLLECTIVES[stem]


def read_nccl_tests(path: str | os.PathLike[str], collective: str | None = None) -> list[NcclTestsLog]:
    """Every test of an nccl-tests log file (see :func:`parse_nccl_tests`); ValueError naming the file and line."""
    data = read_input_bytes(path, "nccl-tests log")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{os.fspath(path)}:{line}: expected UTF-8 text (an nccl-tests log), got bytes") from None
    return parse_nccl_tests(text, source=os.fspath(path), collective=collective)


def parse_nccl_tests(text: str, source: str = "<text>", collective: str | None = None) -> list[NcclTestsLog]:
    """The tests of an nccl-tests log, in order. ``collective`` names the test where the log does not (no binary
    name, no ``Collective test starting`` line); where the log names another, that is an error."""
    parser = _Parser(source, None if collective is None else collective_name(collective))
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        parser.feed(number, _strip_tag(raw.rstrip()))
    return parser.finish(len(lines))


def _strip_tag(line: str) -> str:
    """The nccl-tests text of a line: launcher output before an ``[r,p]<stdout>:`` tag (e.g. SkyPilot's
    ``(head, rank=0, pid=1) ``), then a leading ``[r]`` / ``r:`` tag (slurm's ``srun --label``) are dropped."""
    m = _MPI_TAG.search(line)
    if m is not None:
        return line[m.end() :]
    return _TAG.sub("", line.lstrip(), count=1)


@dataclasses.dataclass
class _Columns:
    """Positions of the named columns of one column header line."""

    names: list[str]
    size: int
    count: int
    dtype: int
    redop: int | None
    root: int | None
    oop: dict[str, int]  # time / algbw / busbw / wrong
    ip: dict[str, int] | None


def _group(names: list[str], start: int, stop: int) -> dict[str, int]:
    found = {"time": start}
    for k in range(start + 1, stop):
        name = names[k].lower()
        if name in ("algbw", "busbw"):
            found.setdefault(name, k)
        elif name in _ERROR_COLUMNS:
            found.setdefault("wrong", k)
    return found


def _columns(names: list[str], where: str) -> _Columns:
    lower = [n.lower() for n in names]
    times = [k for k, n in enumerate(lower) if n == "time"]
    prefix = lower[: times[0]] if times else lower
    missing = [n for n in ("size", "count", "type") if n not in prefix]
    oop = _group(lower, times[0], times[1] if len(times) > 1 else len(names)) if times else {}
    ip = _group(lower, times[1], times[2] if len(times) > 2 else len(names)) if len(times) > 1 else None
    missing += [n for n in ("time", "algbw", "busbw") if n not in oop]
    missing += [f"{n} (in-place)" for n in ("algbw", "busbw") if ip is not None and n not in ip]
    if missing:
        raise ValueError(
            f"{where}: expected a column header naming size, count, type, then time, algbw, busbw (out-of-place, "
            f"then in-place); missing {', '.join(missing)} in {' '.join(names)!r}"
        )
    opt = {n: prefix.index(n) if n in prefix else None for n in ("redop", "root")}
    return _Columns(names, prefix.index("size"), prefix.index("count"), prefix.index("type"), opt["redop"],
                    opt["root"], oop, ip)  # fmt: skip


def _float(token: str, column: str, where: str) -> float:
    """A finite number >= 0 (a time or a bandwidth)."""
    try:
        value = float(token)
    except ValueError:
        raise ValueError(f"{where}: expected a number in column {column!r}, got {token!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a finite number >= 0 in column {column!r}, got {token!r}")
    return value


def _int(token: str, column: str, where: str, *, negative: bool = False) -> int:
    """An integer, >= 0 unless ``negative`` (the root column prints -1)."""
    try:
        value = int(token)
    except ValueError:
        raise ValueError(f"{where}: expected an integer in column {column!r}, got {token!r}") from None
    if value < 0 and not negative:
        raise ValueError(f"{where}: expected an integer >= 0 in column {column!r}, got {token!r}")
    return value


def _parse_row(tokens: list[str], cols: _Columns, where: str, time_scale: float, line: int) -> NcclTestsRow:
    if len(tokens) != len(cols.names):
        expected = f"{len(cols.names)} fields ({' '.join(cols.names)})"
        raise ValueError(f"{where}: expected {expected}, got {len(tokens)}: {' '.join(tokens)!r}")

    def in_place(name: str) -> float | None:  # "N/A" (or no in-place columns): None
        index = (cols.ip or {}).get(name)
        if index is None or tokens[index].upper() == "N/A":
            return None
        return _float(tokens[index], f"{name} (in-place)", where)

    for group, label in ((cols.oop, "out-of-place"), (cols.ip or {}, "in-place")):
        wrong = tokens[group["wrong"]].rstrip("*") if "wrong" in group else "N/A"  # rccl marks errors with "*"
        if wrong.upper() != "N/A":
            _float(wrong, f"{cols.names[group['wrong']]} ({label})", where)
    ip_time_us = in_place("time")
    return NcclTestsRow(
        line=line,
        size_bytes=_int(tokens[cols.size], "size", where),
        count=_int(tokens[cols.count], "count", where),
        dtype=tokens[cols.dtype],
        redop=None if cols.redop is None else tokens[cols.redop],
        root=None if cols.root is None else _int(tokens[cols.root], "root", where, negative=True),
        oop_time_us=_float(tokens[cols.oop["time"]], "time (out-of-place)", where) * time_scale,
        oop_algbw_GBps=_float(tokens[cols.oop["algbw"]], "algbw (out-of-place)", where),
        oop_busbw_GBps=_float(tokens[cols.oop["busbw"]], "busbw (out-of-place)", where),
        ip_time_us=None if ip_time_us is None else ip_time_us * time_scale,
        ip_algbw_GBps=in_place("algbw"),
        ip_busbw_GBps=in_place("busbw"),
    )


@dataclasses.dataclass
class _Test:
    """One test while it is read."""

    collective: tuple[str, int] | None = None  # (name, line) from "# Collective test starting"
    header: tuple[int, int, int, int] | None = None  # nThread, nGpus, minBytes, maxBytes
    ranks: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)  # rank -> (host, gpu)
    binaries: dict[str, int] = dataclasses.field(default_factory=dict)  # collective named by a binary -> line
    columns: _Columns | None = None
    columns_line: int = 0
    time_scale: float = 1.0  # to microseconds
    rows: list[NcclTestsRow] = dataclasses.field(default_factory=list)
    avg_busbw_GBps: float | None = None
    closed_line: int = 0  # the trailer's line once read


def _is_row(tokens: list[str]) -> bool:
    """Before any column header: a line shaped like a table row (``size count ...``)."""
    return len(tokens) >= 6 and tokens[0].isdigit() and tokens[1].isdigit()


def _row_like(tokens: list[str], cols: _Columns) -> bool:
    """In a table: a row, however damaged: a number first, or as many fields as columns with an integer count."""
    try:
        float(tokens[0])
        return True
    except ValueError:
        return len(tokens) == len(cols.names) and tokens[cols.count].isdigit()


class _Parser:
    """Reads a log line by line (:meth:`feed`), then :meth:`finish` returns its tests."""

    def __init__(self, source: str, collective: str | None) -> None:
        self.source = source
        self.given = collective
        self.tests: list[NcclTestsLog] = []
        self.test = _Test()
        self.carry: dict[str, int] = {}  # binaries named after a test's trailer: the next test's

    def where(self, line: int) -> str:
        return f"{self.source}:{line}"

    def named(self, line: int, name: str) -> str:
        try:
            return collective_name(name)
        except ValueError as exc:
            raise ValueError(f"{self.where(line)}: {exc}") from None

    def new_test(self) -> None:
        """Close the test being read, if its table has begun; binary names seen since its trailer go to the next."""
        if self.test.columns is not None:
            self.tests.append(self.finish_test(self.test))
            self.test = _Test(binaries=self.carry)
            self.carry = {}

    def feed(self, line: int, text: str) -> None:
        test = self.test
        tokens = text.lstrip("#").split()
        if not tokens:
            return
        if m := _START.match(text):
            self.new_test()
            self.test.collective = (self.named(line, m.group(1)), line)
        elif m := _NTHREAD.match(text):
            self.new_test()
            self.test.header = (int(m[1]), int(m[2]), int(m[3]), int(m[4]))
        elif m := _END.match(text):
            self.end_test(line, m.group(1))
        elif test.columns is None:
            self.before_table(line, text, tokens)
        else:
            self.in_table(line, text, tokens)

    def before_table(self, line: int, text: str, tokens: list[str]) -> None:
        test = self.test
        if m := _RANK.match(text):
            test.ranks.setdefault(int(m.group(1)), (m.group(2), m.group(3).strip()))
        elif tokens[0].lower() == "size" and "time" in (t.lower() for t in tokens):
            test.columns = _columns(tokens, self.where(line))
            test.columns_line = line
        elif _is_row(tokens) and not text.startswith("#"):
            if len(tokens) != len(STANDARD_COLUMNS):
                raise ValueError(
                    f"{self.where(line)}: expected the column header line ('#  size  count  type ... time  algbw  "
                    f"busbw ...') before the first table row, or a row of the standard {len(STANDARD_COLUMNS)} "
                    f"columns, got {text.strip()!r}"
                )
            # a table pasted without its header: nccl-tests 2.x's standard layout (the row's width matches it)
            test.columns = _columns(list(STANDARD_COLUMNS), self.where(line))
            test.columns_line = line
            self.in_table(line, text, tokens)
        else:
            for name in _BINARY.findall(text):
                test.binaries.setdefault(COLLECTIVES[name], line)

    def in_table(self, line: int, text: str, tokens: list[str]) -> None:
        test = self.test
        assert test.columns is not None
        if tokens[0].lower() == "size" and "time" in (t.lower() for t in tokens):
            if test.rows or test.closed_line:
                raise ValueError(
                    f"{self.where(line)}: a second table in the test whose table starts at line {test.columns_line}:"
                    " expected a test header ('# Collective test starting: ...' or '# nThread ...') between two tests"
                )
            if tokens != test.columns.names:  # a repeated identical header (several processes printing) is harmless
                test.columns = _columns(tokens, self.where(line))
                test.columns_line = line
        elif tokens[0] == "(B)":
            test.time_scale = 1000.0 if "(ms)" in tokens else 1.0
        elif m := _AVG.match(text):
            self.trailer(line, m.group(1))
        elif text.startswith("#") or not _row_like(tokens, test.columns):
            if test.closed_line:  # between this test and the next: binary names are the next test's
                for name in _BINARY.findall(text):
                    self.carry.setdefault(COLLECTIVES[name], line)
        else:
            if test.closed_line:
                raise ValueError(
                    f"{self.where(line)}: a table row after the trailer at line {test.closed_line}: expected a test"
                    f" header ('# Collective test starting: ...' or '# nThread ...') first, got {text.strip()!r}"
                )
            self.add_row(line, tokens)

    def add_row(self, line: int, tokens: list[str]) -> None:
        test = self.test
        assert test.columns is not None
        row = _parse_row(tokens, test.columns, self.where(line), test.time_scale, line)
        prev = test.rows[-1] if test.rows else None
        # strictly increasing, but for rows of 0 bytes at the start
        if prev is not None and row.size_bytes <= prev.size_bytes and (row.size_bytes > 0 or prev.size_bytes > 0):
            raise ValueError(
                f"{self.where(line)}: expected sizes to increase, got {row.size_bytes} after {prev.size_bytes} "
                f"(line {prev.line}); two tests in one log need a test header between them"
            )
        test.rows.append(row)

    def trailer(self, line: int, value: str) -> None:
        test = self.test
        if not test.rows:
            raise ValueError(f"{self.where(line)}: expected table rows before '# Avg bus bandwidth'")
        test.avg_busbw_GBps = _float(value.strip(), "Avg bus bandwidth", self.where(line))
        test.closed_line = line

    def end_test(self, line: int, name: str) -> None:
        test = self.test
        if test.collective is not None and self.named(line, name) != test.collective[0]:
            started, start_line = test.collective
            raise ValueError(
                f"{self.where(line)}: expected the end of the {started} test started at line {start_line}, "
                f"got '# Collective test concluded: {name}'"
            )
        if test.collective is None:  # a test that only says its name at its end
            test.collective = (self.named(line, name), line)
        if test.columns is not None:
            self.new_test()

    def collective_of(self, test: _Test) -> str | None:
        if test.collective is not None:
            named, line = test.collective
        elif len(test.binaries) == 1:
            named, line = next(iter(test.binaries.items()))
        else:
            return self.given  # none named, or several binaries named: the caller's word
        if self.given is not None and self.given != named:
            raise ValueError(f"{self.where(line)}: the log names {named}, but the collective given is {self.given}")
        return named

    def finish_test(self, test: _Test) -> NcclTestsLog:
        if not test.rows:
            raise ValueError(
                f"{self.where(test.columns_line)}: expected table rows after this column header, found none"
            )
        hosts = Counter(host for host, _ in test.ranks.values())
        gpus = sorted({gpu for _, gpu in test.ranks.values() if gpu})
        header = test.header or (None, None, None, None)
        return NcclTestsLog(
            source=self.source,
            line=test.columns_line,
            collective=self.collective_of(test),
            nranks=len(test.ranks) or None,
            nodes=len(hosts) or None,
            gpu=" / ".join(gpus) or None,
            ranks_per_host=tuple(hosts.values()),
            rows=tuple(test.rows),
            avg_busbw_GBps=test.avg_busbw_GBps,
            nthreads=header[0],
            ngpus=header[1],
            min_bytes=header[2],
            max_bytes=header[3],
        )

    def finish(self, num_lines: int) -> list[NcclTestsLog]:
        self.new_test()
        if not self.tests:
            raise ValueError(
                f"{self.where(max(num_lines, 1))}: not an nccl-tests log: expected a column header line ('#  size  "
                "count  type ... time  algbw  busbw ...') and table rows, found none"
            )
        return self.tests


# ------------------------------------------------------------------------------------------ against the cost model
@dataclasses.dataclass(frozen=True)
class SizeComparison:
    """One size of a log next to the model. ``measured_busbw_GBps`` is the log's busbw of the faster placement
    (:attr:`NcclTestsRow.busbw_GBps`); the model's fields are None for a collective the model does not cover."""

    size_bytes: int
    measured_time_s: float
    measured_busbw_GBps: float
    model_time_s: float | None = None
    model_busbw_GBps: float | None = None
    algorithm: str | None = None
    protocol: str | None = None

    @property
    def rel_err(self) -> float | None:
        """model busbw / measured busbw - 1, from the times (measured / model - 1, so no rounding of the printed
        busbw): > 0 where the model is faster than the measurement."""
        if not self.model_time_s:
            return None
        return self.measured_time_s / self.model_time_s - 1.0


@dataclasses.dataclass(frozen=True)
class LogComparison:
    """A log's test against a hardware profile at the log's placement."""

    log: NcclTestsLog
    hardware: str
    nranks: int | None
    num_nodes: int | None
    gpus_per_node: int | None
    sizes: tuple[SizeComparison, ...]
    note: str | None = None

    def abs_errs(self, min_bytes: int = ONE_MIB) -> list[float]:
        """|rel_err| of the sizes >= ``min_bytes`` that the model covers."""
        return [abs(s.rel_err) for s in self.sizes if s.size_bytes >= min_bytes and s.rel_err is not None]

    @property
    def median_abs_err(self) -> float | None:
        """Median |rel_err| over sizes >= 1 MiB (None without any)."""
        errs = self.abs_errs()
        return statistics.median(errs) if errs else None

    @property
    def worst_abs_err(self) -> float | None:
        """Largest |rel_err| over sizes >= 1 MiB (None without any)."""
        errs = self.abs_errs()
        return max(errs) if errs else None

    def to_json(self) -> dict:
        """Plain JSON types: the log's facts, the placement, every size and the summary."""
        log = self.log
        return {
            "file": log.source, "line": log.line, "collective": log.collective, "gpu": log.gpu,
            "hardware": self.hardware, "nranks": self.nranks, "num_nodes": self.num_nodes,
            "gpus_per_node": self.gpus_per_node, "note": self.note,
            "sizes": [{**dataclasses.asdict(s), "rel_err": s.rel_err} for s in self.sizes],
            "median_abs_err_ge_1MiB": self.median_abs_err, "worst_abs_err_ge_1MiB": self.worst_abs_err,
        }  # fmt: skip


def log_placement(
    log: NcclTestsLog, *, num_nodes: int | None = None, gpus_per_node: int | None = None
) -> tuple[int, int, int]:
    """(ranks, nodes, ranks per node) the log ran on: from its ``# Rank`` lines, where ``num_nodes`` /
    ``gpus_per_node`` do not say; ValueError naming the log where neither tells or they disagree."""
    where = f"{log.source}:{log.line}"
    if num_nodes is not None and gpus_per_node is not None:
        ranks = num_nodes * gpus_per_node
        if log.nranks is not None and log.nranks != ranks:
            raise ValueError(
                f"{where}: the log ran {log.nranks} ranks, but --num-nodes {num_nodes} x --gpus-per-node "
                f"{gpus_per_node} make {ranks}"
            )
        return ranks, num_nodes, gpus_per_node
    if log.nranks is None:
        raise ValueError(
            f"{where}: the log names no ranks (no '#  Rank N ... on HOST device ...' lines): expected --num-nodes "
            "and --gpus-per-node"
        )
    if gpus_per_node is not None:
        return log.nranks, math.ceil(log.nranks / gpus_per_node), gpus_per_node
    if num_nodes is not None:
        return log.nranks, num_nodes, math.ceil(log.nranks / num_nodes)
    if log.ranks_per_node is None:
        raise ValueError(
            f"{where}: ranks spread unevenly over the hosts {list(log.ranks_per_host)}: expected --gpus-per-node"
        )
    return log.nranks, len(log.ranks_per_host), log.ranks_per_node


def compare_with_model(
    log: NcclTestsLog,
    hardware: str | os.PathLike[str] | Hardware,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> LogComparison:
    """Every size > 0 of ``log`` next to ``plan_collective`` on ``hardware`` (a profile name, path or
    :class:`commsched.hardware.Hardware`) at the log's placement (:func:`log_placement`)."""
    measured = [(r.size_bytes, r.time_s, r.busbw_GBps) for r in log.rows if r.size_bytes > 0]
    name = hardware.name if isinstance(hardware, Hardware) else os.fspath(hardware)
    if log.collective not in MODELLED:
        what = log.collective or "an unnamed collective (pass --collective)"
        sizes = tuple(SizeComparison(*m) for m in measured)
        note = f"no model for {what}: measured only (the model covers {', '.join(MODELLED)})"
        return LogComparison(log, name, log.nranks, log.nodes, log.ranks_per_node, sizes, note)
    ranks, nodes, per_node = log_placement(log, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    if isinstance(hardware, Hardware):
        hw = hardware.with_nodes(nodes, per_node)
    else:
        hw = hw_mod.get(hardware, num_nodes=nodes, gpus_per_node=per_node)
    out = []
    for size, time_s, busbw in measured:
        plan = plan_collective(log.collective, size, ranks, hw)
        model_busbw = bus_factor(log.collective, ranks) * size / plan.time_s * 1e-9 if plan.time_s > 0 else None
        out.append(SizeComparison(size, time_s, busbw, plan.time_s or None, model_busbw, plan.algorithm,
                                  plan.protocol))  # fmt: skip
    return LogComparison(log, hw.name, ranks, nodes, per_node, tuple(out))
