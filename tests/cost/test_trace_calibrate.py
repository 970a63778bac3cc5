"""``commsched calibrate --trace``: per-rank profiler traces of 2 real gloo ranks -> one median-across-ranks table."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.cost.table import MeasuredTable
from commsched.cost.trace_calibrate import calibrate_from_traces
from commsched.cost.trace_import import trace_collectives
from gloo_ranks import run_forked_ranks

WORLD, REPS = 2, 3
ALL_REDUCE_NELEMS, ALL_GATHER_IN_NELEMS = 1024, 256  # float32
EXPECTED = {("all_reduce", WORLD, ALL_REDUCE_NELEMS * 4), ("all_gather", WORLD, ALL_GATHER_IN_NELEMS * WORLD * 4)}
DATA = Path(__file__).parent / "data" / "kineto"
runner = CliRunner()
SLOW = pytest.mark.slow  # the fixture forks 2 profiled gloo ranks: ~5 s on 2 cores


def _rank(rank: int, port: int, folder: str) -> None:
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        with profiler:
            x, y = torch.ones(ALL_REDUCE_NELEMS), torch.ones(ALL_GATHER_IN_NELEMS)
            out = torch.empty(ALL_GATHER_IN_NELEMS * WORLD)
            for _ in range(REPS):
                dist.all_reduce(x)
                dist.all_gather_into_tensor(out, y)
        # rank 1 compressed: both file kinds are read
        profiler.export_chrome_trace(f"{folder}/rank{rank}.json" + (".gz" if rank else ""))
        dist.barrier()  # nobody tears down while a peer still talks
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """A folder with the traces of 2 real gloo ranks: rank0.json, rank1.json.gz."""
    folder = tmp_path_factory.mktemp("traces")
    run_forked_ranks(_rank, WORLD, str(folder))
    return folder


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _edited(src: Path, dst: Path, *, rank: int | None = None, dur_us: float | None = None, drop: str = "") -> Path:
    """A copy of the trace ``src`` as ``dst`` (.json): another rank, every gloo annotation lasting ``dur_us``,
    the ``drop`` annotations removed."""
    data = _load(src)
    if rank is not None:
        data["distributedInfo"]["rank"] = rank
    events = []
    for e in data["traceEvents"]:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("gloo:"):
            if drop and e["name"] == drop:
                continue
            if dur_us is not None:
                e["dur"] = dur_us
        events.append(e)
    data["traceEvents"] = events
    dst.write_text(json.dumps(data), encoding="utf-8")
    return dst


@SLOW
def test_table_has_the_programs_collectives(traces):
    cal = calibrate_from_traces([traces])
    assert {(k, g, b) for k, g, b, _ in cal.table.collectives} == EXPECTED
    assert sorted(t.rank for t in cal.traces) == [0, 1]
    for row in cal.rows:
        assert row.ranks == WORLD and row.occurrences == WORLD * REPS and row.groups == ("0",)
        assert 0 < row.min_rank_s <= row.median_s <= row.max_rank_s
    # the same table from any order of the files: every rank gets the same numbers
    files = sorted(traces.iterdir())
    assert calibrate_from_traces(files[::-1]).table.collectives == cal.table.collectives
    assert cal.table.collective_time("all_reduce", WORLD, ALL_REDUCE_NELEMS * 4) == cal.rows[1].median_s


@SLOW
def test_value_is_the_median_across_ranks(traces, tmp_path):
    files = sorted(traces.iterdir())
    per_rank = [trace_collectives(f).occurrences_s for f in files]
    rank_medians_s = {key[:3]: sorted(statistics.median(occ[key]) for occ in per_rank) for key in per_rank[0]}
    two = {(k, g, b): t for k, g, b, t in calibrate_from_traces(files).table.collectives}
    assert two == pytest.approx({key: statistics.mean(ts) for key, ts in rank_medians_s.items()})
    # a third rank far slower / far faster than both: the median is the slower / faster of the real two
    for dur_us, pick in ((1e7, max), (1e-3, min)):
        third = _edited(files[0], tmp_path / f"rank2_{dur_us:g}.json", rank=2, dur_us=dur_us)
        cal = calibrate_from_traces([*files, third])
        assert {(k, g, b): t for k, g, b, t in cal.table.collectives} == pytest.approx(
            {key: pick(ts) for key, ts in rank_medians_s.items()}
        )
        assert all(r.ranks == 3 and r.occurrences == 3 * REPS for r in cal.rows)


@SLOW
def test_cli_prints_and_writes_the_table(traces, tmp_path):
    out = tmp_path / "table.json"
    res = runner.invoke(app, ["calibrate", "--trace", str(traces), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "all_reduce" in res.output and "all_gather" in res.output and f"wrote {out}" in res.output
    written = MeasuredTable.load(out)
    assert written.collectives == calibrate_from_traces([traces]).table.collectives


def _bad_inputs(traces: Path, tmp: Path) -> dict[str, tuple[list[Path], Path, str]]:
    """name -> (arguments, the file the error must name, what it must say)."""
    not_trace = tmp / "notes.json"
    not_trace.write_text("not a trace\n", encoding="utf-8")
    quiet = tmp / "quiet.json"
    quiet.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::add", "cat": "cpu_op", "dur": 1}]}))
    rank0, rank1 = traces / "rank0.json", traces / "rank1.json.gz"
    partial = _edited(rank1, tmp / "rank1_partial.json", drop="gloo:all_gather")
    return {
        "not a trace": ([rank0, not_trace], not_trace, "not valid JSON"),
        "no collectives": ([quiet], quiet, "no collective events"),
        "same rank twice": ([rank0, rank0], rank0, "expected one file per rank"),
        "ranks disagree": ([rank0, partial], partial, "expected the same collectives on every rank"),
    }


@SLOW
@pytest.mark.parametrize("case", ["not a trace", "no collectives", "same rank twice", "ranks disagree"])
def test_cli_bad_input_exits_2_with_one_line(traces, tmp_path, case):
    args, named, message = _bad_inputs(traces, tmp_path)[case]
    res = runner.invoke(app, ["calibrate", "--trace", *map(str, args)])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1
    assert str(named) in res.output and message in res.output


def test_public_nccl_trace(tmp_path):
    """HolisticTraceAnalysis's rank-0 NCCL trace: the NCCL kernels, each call once, keyed by its process group."""
    path = DATA / "hta_nccl_data.json.gz"
    one = trace_collectives(path)
    assert one.source == "kernel" and one.rank == 0 and one.group_ranks == {"0": (0, 1)}
    cal = calibrate_from_traces([path])
    kinds = [(r.kind, r.group_size, r.occurrences, r.ranks) for r in cal.rows]
    assert kinds == [("all_reduce", 2, 3, 1)] * 5 + [("broadcast", 2, 3, 1)] * 2
    assert [r.nbytes for r in cal.rows if r.kind == "broadcast"] == [424, 212480]  # 53 int64, 53120 float32
    # a second "rank" with the same calls: still one row each, the same medians
    other = tmp_path / "rank1.json"
    data = _load(path)
    data["distributedInfo"]["rank"] = 1
    other.write_text(json.dumps(data), encoding="utf-8")
    shutil.copy(path, tmp_path / "rank0.json.gz")
    two = calibrate_from_traces([tmp_path])
    assert two.table.collectives == cal.table.collectives and all(r.ranks == 2 for r in two.rows)
