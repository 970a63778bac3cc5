"""nccl-tests / rccl-tests logs: real public logs parse to the numbers they print, bad input gives one ValueError
naming file and line, and ``commsched calibrate --nccl-tests`` compares them with the model (exit 2 on bad input)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsched.cli import app
from commsched.cost.nccl_tests import compare_with_model, parse_nccl_tests, read_nccl_tests

DATA = Path(__file__).parent / "data" / "nccl_tests"
H100 = DATA / "all_reduce_2x8_h100_a3mega.txt"  # 2 x 8 H100, nccl-tests
MI300X_2 = DATA / "all_reduce_2x8_mi300x_rccl.txt"  # 2 x 8 MI300X, rccl-tests, rank lines without "Group"
MI300X_1 = DATA / "all_reduce_1x8_mi300x_rccl.txt"  # 1 x 8 MI300X, rccl-tests
SENDRECV = DATA / "sendrecv_1x8_a100.txt"  # table only, "N/A" in the in-place #wrong column
runner = CliRunner()


# -------------------------------------------------------------------------------------------------- real logs
@pytest.mark.parametrize(
    ("path", "facts", "size", "row"),
    [
        (H100, ("all_reduce", 16, 2, "NVIDIA H100 80GB HBM3", 31, 70.742, 30), 1073741824,
         (268435456, "float", "sum", 6759.0, 158.86, 297.86, 6737.4, 298.82, 59)),
        (MI300X_2, ("all_reduce", 16, 2, "AMD Instinct MI300X", 32, 92.3318, 52), 17179869184,
         (4294967296, "float", "sum", 90115.0, 190.64, 357.46, 90127.0, 357.41, 85)),
        (MI300X_1, ("all_reduce", 8, 1, "AMD Instinct MI300X", 31, 110.464, 28), 8589934592,
         (2147483648, "float", "sum", 47617.0, 180.40, 315.69, 47584.0, 315.91, 60)),
        (SENDRECV, ("sendrecv", None, None, None, 4, None, 4), 1073741824,
         (268435456, "float", "sum", 5503.4, 195.10, 195.10, 5490.5, 195.56, 9)),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else None,
)  # fmt: skip
def test_real_logs_parse_to_their_printed_numbers(path, facts, size, row):
    (log,) = read_nccl_tests(path)
    assert (log.collective, log.nranks, log.nodes, log.gpu, len(log.rows), log.avg_busbw_GBps, log.line) == facts
    r = next(r for r in log.rows if r.size_bytes == size)
    got = (r.count, r.dtype, r.redop, r.oop_time_us, r.oop_algbw_GBps, r.oop_busbw_GBps, r.ip_time_us, r.ip_busbw_GBps)
    assert got == row[:-1] and r.line == row[-1]
    sizes = [r.size_bytes for r in log.rows]
    assert sizes == sorted(set(sizes)) and log.rows[-1].size_bytes == (log.max_bytes or sizes[-1])


def test_rank_lines_give_placement():
    (h100,) = read_nccl_tests(H100)
    assert h100.ranks_per_host == (8, 8) and h100.ranks_per_node == 8
    assert (h100.nthreads, h100.ngpus, h100.min_bytes, h100.max_bytes) == (1, 1, 8, 8589934592)
    (mi300x,) = read_nccl_tests(MI300X_1)
    assert mi300x.ranks_per_host == (8,)


def test_measured_time_is_the_faster_placement():
    (log,) = read_nccl_tests(H100)
    times = log.measured_time_s()
    assert times[1 << 30] == pytest.approx(6737.4e-6)  # in-place 6737.4 us < out-of-place 6759.0 us
    assert times[8 << 30] == pytest.approx(47535e-6)  # out-of-place 47535 us < in-place 47743 us
    one_gib = next(r for r in log.rows if r.size_bytes == 1 << 30)
    assert one_gib.busbw_GBps == 298.82  # the busbw of the faster (in-place) placement


def test_columns_are_read_by_name():
    # an older layout: no redop/root columns, "error" instead of "#wrong", and an extra trailing column
    text = (
        "# nThread 1 nGpus 8 minBytes 1024 maxBytes 2048 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
        "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error  extra\n"
        "        1024           256   float    59.98    0.02    0.03  2e-07    56.81    0.02    0.03  1e-07  x\n"
        "        2048           512   float    60.10    0.03    0.06  2e-07    61.00    0.03    0.06    N/A  y\n"
    )
    (log,) = parse_nccl_tests(text, source="old.log", collective="all_gather_perf")
    assert log.collective == "all_gather" and [r.redop for r in log.rows] == [None, None]
    assert log.rows[1].oop_time_us == 60.10 and log.rows[1].ip_time_us == 61.00
    assert log.measured_time_s() == {1024: pytest.approx(56.81e-6), 2048: pytest.approx(60.10e-6)}


def test_a_name_at_the_end_names_the_test():
    text = SENDRECV.read_text().split("\n", 1)[1] + "# Collective test concluded: alltoall_perf_mpi\n"
    (log,) = parse_nccl_tests(text)
    assert log.collective == "all_to_all"


def test_launcher_tags_and_two_tests_with_headers():
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in H100.read_text().splitlines())
    second = MI300X_1.read_text()
    logs = parse_nccl_tests(tagged + second, source="both.log")
    assert [(t.collective, t.nranks, t.nodes, len(t.rows)) for t in logs] == [("all_reduce", 16, 2, 31),
                                                                              ("all_reduce", 8, 1, 31)]  # fmt: skip
    assert logs[1].line == 64 + 28  # the second test's column header, counted in the whole text


# ------------------------------------------------------------------------------------------------ bad input
def _lines() -> list[str]:
    return H100.read_text().splitlines()


def _replace_field(line: str, index: int, token: str) -> str:
    parts = line.split()
    parts[index] = token
    return "   ".join(parts)


def _set(ls: list[str], line: int, *new: str) -> list[str]:
    """``ls`` with its 1-based ``line`` replaced by ``new`` (none: deleted)."""
    return [*ls[: line - 1], *new, *ls[line:]]


ROW_1K = 39  # line of the 1024-byte row of the H100 log; its column header is line 30, its trailer line 64
CORRUPTIONS = {
    "not a log": (lambda ls: ["hello", "world"], 2, "not an nccl-tests log"),
    "row missing a field": (lambda ls: _set(ls, ROW_1K, ls[ROW_1K - 1].rsplit(None, 1)[0]), ROW_1K,
                            "expected 13 fields"),
    "non-numeric busbw": (lambda ls: _set(ls, ROW_1K, _replace_field(ls[ROW_1K - 1], 7, "fast")), ROW_1K,
                          "expected a number in column 'busbw (out-of-place)', got 'fast'"),
    "non-integer size": (lambda ls: _set(ls, ROW_1K, _replace_field(ls[ROW_1K - 1], 0, "1e3")), ROW_1K,
                         "expected an integer in column 'size'"),
    "negative time": (lambda ls: _set(ls, ROW_1K, _replace_field(ls[ROW_1K - 1], 5, "-3.0")), ROW_1K,
                      "expected a finite number >= 0 in column 'time (out-of-place)'"),
    "missing busbw column": (lambda ls: _set(ls, 30, ls[29].replace("busbw", "bw")), 30, "missing busbw"),
    "sizes not increasing": (lambda ls: [*ls[: ROW_1K - 1], ls[ROW_1K], ls[ROW_1K - 1], *ls[ROW_1K + 1 :]],
                             ROW_1K + 1, "expected sizes to increase, got 1024 after 2048"),
    "two tests, no header between": (lambda ls: [*ls, *ls[29:40]], 65, "a second table in the test"),
    "rows after the trailer": (lambda ls: [*ls, *ls[31:35]], 65, "a table row after the trailer at line 64"),
    "tables concatenated": (lambda ls: [*ls[:63], *ls[31:35], *ls[63:]], 64,
                            "expected sizes to increase, got 8 after 8589934592"),
    "no column header, rows not standard": (lambda ls: _set(_set(ls, 30), 31, " ".join(ls[31].split()[:9])), 31,
                                            "expected the column header line"),
    "no rows": (lambda ls: [*ls[:31], *ls[62:]], 33, "expected table rows before '# Avg bus bandwidth'"),
    "bad trailer": (lambda ls: _set(ls, 64, "# Avg bus bandwidth    : lots"), 64, "column 'Avg bus bandwidth'"),
}  # fmt: skip


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruptions_give_one_line_naming_file_and_line(tmp_path, name):
    corrupt, line, message = CORRUPTIONS[name]
    path = tmp_path / "bad.log"
    path.write_text("\n".join(corrupt(_lines())) + "\n")
    with pytest.raises(ValueError) as info:
        read_nccl_tests(path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}: ") and message in text and "\n" not in text


def test_binary_and_mismatched_collective(tmp_path):
    path = tmp_path / "core"
    path.write_bytes(b"# nThread 1\n\xff\xfe\x00")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: expected UTF-8 text")):
        read_nccl_tests(path)
    with pytest.raises(
        ValueError, match=r"all_reduce_2x8_h100_a3mega.txt:7: the log names all_reduce, but .* all_gather"
    ):
        read_nccl_tests(H100, collective="all_gather")
    text = "# Collective test starting: all_gather_perf\n" + SENDRECV.read_text().split("\n", 1)[1]
    text += "# Collective test concluded: alltoall_perf\n"
    with pytest.raises(
        ValueError, match=r"^x.log:10: expected the end of the all_gather test started at line 1, got .*alltoall_perf'$"
    ):
        parse_nccl_tests(text, source="x.log")


NUMERIC_FIELDS = (0, 1, 5, 6, 7, 8, 9, 10, 11, 12)  # size count time algbw busbw #wrong x2; not type / redop / root


@given(
    row=st.integers(min_value=32, max_value=62),
    field=st.sampled_from(NUMERIC_FIELDS),
    token=st.text(alphabet="abcxyz%$[]!", min_size=1, max_size=6),
)
def test_any_non_numeric_field_names_its_line(row, field, token):
    lines = _lines()
    lines[row - 1] = _replace_field(lines[row - 1], field, token)
    with pytest.raises(ValueError) as info:
        parse_nccl_tests("\n".join(lines), source="h100.log")
    assert str(info.value).startswith(f"h100.log:{row}: expected ") and repr(token) in str(info.value)


@given(row=st.integers(min_value=32, max_value=62), keep=st.integers(min_value=6, max_value=12))
def test_any_truncated_row_names_its_line(row, keep):
    lines = _lines()
    lines[row - 1] = " ".join(lines[row - 1].split()[:keep])
    with pytest.raises(ValueError, match=rf"^h100.log:{row}: expected 13 fields \(size count .*\), got {keep}:"):
        parse_nccl_tests("\n".join(lines), source="h100.log")


# --------------------------------------------------------------------------------------------- vs the model
def test_compare_with_model_uses_the_log_placement():
    (log,) = read_nccl_tests(MI300X_2)
    c = compare_with_model(log, "mi300x")
    assert (c.nranks, c.num_nodes, c.gpus_per_node) == (16, 2, 8)
    assert [s.size_bytes for s in c.sizes] == [r.size_bytes for r in log.rows]
    big = c.sizes[-1]  # 16 GiB: measured 357.46 GB/s out-of-place (the faster)
    assert big.measured_busbw_GBps == 357.46 and big.model_busbw_GBps > 0
    assert big.rel_err == pytest.approx(
        big.model_busbw_GBps / (2 * 15 / 16 * big.size_bytes / big.measured_time_s / 1e9) - 1
    )
    assert c.median_abs_err is not None and c.worst_abs_err >= c.median_abs_err
    (sendrecv,) = read_nccl_tests(SENDRECV)
    pairs = compare_with_model(sendrecv, "a100-sxm-80g", num_nodes=1, gpus_per_node=8)  # one NVLink link per pair
    assert not pairs.note and {s.algorithm for s in pairs.sizes} == {"p2p"}
    (reduce,) = parse_nccl_tests(SENDRECV.read_text().replace("sendrecv_perf", "reduce_perf"), source="reduce.log")
    assert "no model for reduce" in compare_with_model(reduce, "a100-sxm-80g").note


def test_compare_needs_ranks_or_options():
    text = "\n".join(line for line in _lines() if "Rank " not in line)
    (log,) = parse_nccl_tests(text, source="noranks.log")
    with pytest.raises(ValueError, match=r"^noranks.log:14: the log names no ranks .*--num-nodes"):
        compare_with_model(log, "h100-sxm")
    assert compare_with_model(log, "h100-sxm", num_nodes=2, gpus_per_node=8).num_nodes == 2
    (h100,) = read_nccl_tests(H100)
    with pytest.raises(ValueError, match="the log ran 16 ranks, but --num-nodes 1 x --gpus-per-node 8 make 8"):
        compare_with_model(h100, "h100-sxm", num_nodes=1, gpus_per_node=8)


# ------------------------------------------------------------------------------------------------------- CLI
def test_cli_prints_a_table_per_log(tmp_path):
    reduce = tmp_path / "reduce_perf.log"  # a collective the model does not cover: measured only
    reduce.write_text(SENDRECV.read_text().replace("sendrecv_perf", "reduce_perf"))
    res = runner.invoke(app, ["calibrate", "--nccl-tests", str(H100), str(reduce), "--hardware", "h100-sxm"])
    assert res.exit_code == 0, res.output
    for r in read_nccl_tests(H100)[0].rows:
        assert re.search(rf"│\s+{r.size_bytes} │", res.output), r.size_bytes
    assert "sizes >= 1 MiB: median" in res.output and "no model for reduce" in res.output


def test_cli_json():
    res = runner.invoke(app, ["calibrate", "--nccl-tests", str(MI300X_2), "-H", "mi300x", "--json"])
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.output)["logs"]
    assert (out["collective"], out["nranks"], out["num_nodes"], out["gpus_per_node"]) == ("all_reduce", 16, 2, 8)
    assert out["sizes"][-1]["size_bytes"] == 17179869184 and out["sizes"][-1]["measured_busbw_GBps"] == 357.46
    errs = sorted(abs(s["rel_err"]) for s in out["sizes"] if s["size_bytes"] >= 1 << 20)
    assert out["worst_abs_err_ge_1MiB"] == pytest.approx(errs[-1])


def test_cli_bad_log_exits_2_with_one_line(tmp_path):
    path = tmp_path / "bad.log"
    lines = _lines()
    lines[ROW_1K - 1] = _replace_field(lines[ROW_1K - 1], 7, "[0x8d]")  # brackets: not rich markup
    path.write_text("\n".join(lines))
    res = runner.invoke(app, ["calibrate", "--nccl-tests", str(path), "--hardware", "h100-sxm"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"error: {path}:{ROW_1K}: expected a number in column 'busbw (out-of-place)', got '[0x8d]'"
    ]
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nccl-tests", str(H100)], "expected --hardware PROFILE"),
        (["--nccl-tests", "--hardware", "h100-sxm"], "expected one or more LOG files"),
        ([str(H100), "--hardware", "h100-sxm"], "LOG arguments need --nccl-tests"),
        (["--nccl-tests", str(H100), "-H", "h100-sxm", "--quick"], "drop --quick"),
        (["--nccl-tests", "/nonexistent.log", "-H", "h100-sxm"], "/nonexistent.log"),
    ],
)
def test_cli_usage_errors_exit_2(args, message):
    res = runner.invoke(app, ["calibrate", *args])
    assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1


def test_cli_help_says_it_does_not_fit():
    res = runner.invoke(app, ["calibrate", "--help"])
    assert res.exit_code == 0 and "--nccl-tests" in res.output
    assert "does not fit" in " ".join(res.output.replace("│", " ").split())


def test_a_table_pasted_without_its_header_reads_with_the_standard_columns(tmp_path):
    """Real pastes often drop the header (e.g. a grep of the rows): rows of the standard 13 columns read alike."""
    path = tmp_path / "rows.log"
    path.write_text("\n".join(_set(_lines(), 30)) + "\n")
    (headless,) = read_nccl_tests(path, collective="all_reduce")
    (full,) = read_nccl_tests(H100)
    assert [(r.size_bytes, r.time_s) for r in headless.rows] == [(r.size_bytes, r.time_s) for r in full.rows]


def test_launcher_prefixes_before_the_mpi_tag_are_dropped(tmp_path):
    """SkyPilot / slurm wrappers print their own prefix before mpirun's ``[1,0]<stdout>:`` tag."""
    path = tmp_path / "tagged.log"
    path.write_text("\n".join(f"(head, rank=0, pid=3808) [1,0]<stdout>:{line}" for line in _lines()) + "\n")
    (tagged,) = read_nccl_tests(path)
    (full,) = read_nccl_tests(H100)
    assert (tagged.nranks, tagged.nodes) == (full.nranks, full.nodes) == (16, 2)
    assert [(r.size_bytes, r.busbw_GBps) for r in tagged.rows] == [(r.size_bytes, r.busbw_GBps) for r in full.rows]
