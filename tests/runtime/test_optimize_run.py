"""The ``optimize`` variant of ``commsched run``: the program ``commsched.optimize`` keeps (collectives bucketed)
runs on real gloo ranks with the original order's outputs, bit-identical or within the tolerance of reductions
whose summation order may change; the report says which, with the diffs."""

from __future__ import annotations

import dataclasses
import io
import math
import re

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from commsched.report.run_report import OutputCheck, ProgramChange, RunReport
from commsched.report.terminal_run import print_run_report
from commsched.runtime.numerics import compare_outputs, reduction_rtol
from run_reports import small_run_report

F32_RTOL_2_RANKS = 4 * 2 * torch.finfo(torch.float32).eps  # 4 x ranks x eps: see numerics.reduction_rtol


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One real run through the CLI: 2 gloo ranks, the original order and the optimize variant."""
    from commsched.cli import app

    path = tmp_path_factory.mktemp("optimize_run") / "run.json"
    args = "run llama-tiny --parallel fsdp --world-size 2 --seq-len 16 --batch 2 --iters 2 --warmup 1 --seed 5"
    res = CliRunner().invoke(app, [*args.split(), "--variants", "original,optimize", "--json", str(path)])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    return RunReport.load(path), " ".join(res.output.split())


@pytest.mark.slow
def test_optimize_runs_a_bucketed_program_with_the_original_outputs(cli_run):
    report, _ = cli_run
    assert list(report.variants) == ["original", "optimize"], report.skipped
    opt = report.variants["optimize"]
    # the program that ran really is bucketed: fewer collectives, reductions among the merged ones
    assert opt.program is not None and opt.program.kept.startswith("bucketed"), opt.program
    assert opt.program.collectives < report.graph.collectives
    assert opt.outputs is not None and opt.outputs.merged_reductions > 0
    # bucketed reduce_scatters may sum in another order: compared within 4 x ranks x eps(float32)
    assert opt.outputs.expected == "within tolerance"
    assert opt.outputs.rtol == pytest.approx(F32_RTOL_2_RANKS)
    assert opt.outputs.within, opt.outputs
    assert opt.outputs.max_rel_diff <= 2 * opt.outputs.rtol  # |diff| <= rtol (|x| + max|x|) <= 2 rtol max|x|
    assert opt.bit_identical == (opt.outputs.max_abs_diff == 0.0)
    # the original order still matches the unsharded model, and the optimize variant was predicted and timed
    assert report.variants["original"].bit_identical and report.variants["original"].outputs is None
    assert report.reference_max_rel_error < 1e-4
    assert set(opt.predicted) == {"measured", "profile", "measured, comm unslowed"}
    assert all(p > 0 and math.isfinite(p) for p in opt.predicted.values())
    assert len(opt.measured.samples_s) == 2 and opt.moved_nodes > 0 and opt.speedup_measured > 0
    assert report.timings_s.optimize > 0 and opt.program.search_s > 0


@pytest.mark.slow
def test_the_terminal_says_what_optimize_kept_and_how_its_outputs_compared(cli_run):
    report, text = cli_run
    opt = report.variants["optimize"]
    assert re.search(r"optimize │ [\d.]+ │", text)  # a row of the table, like the other orders
    assert f"optimize kept {opt.program.kept}: {report.graph.collectives} -> {opt.program.collectives}" in text
    verdict = "bit-identical" if opt.bit_identical else f"within rtol {opt.outputs.rtol:.1e}"
    assert f"outputs {verdict} (expected within tolerance, {opt.outputs.merged_reductions} reductions" in text


def test_a_bucketed_program_from_optimize_computes_the_original_outputs_in_one_process():
    """No process group: both modules run for both ranks in this process (``run_spmd``, exact collectives that add
    in rank order), so even the bucketed reductions must give bit-identical outputs here."""
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.optimize import optimize
    from commsched.rewrites import run_spmd
    from commsched.runtime.numerics import merged_reductions, reduction_dtypes, reduction_ranks
    from commsched.runtime.plan import run_memory_budget
    from commsched.workloads import build
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.program import StepProgram

    w = build("llama-tiny", parallel="fsdp", world_size=2, seq_len=16, batch=2, attention="sdpa")
    # what the run does: the run's hardware profile and memory rule (torch's default), the same on every rank
    budget = run_memory_budget(w.graph, None)
    o = optimize(w.graph_module, "cpu-local", memory_budget=budget, group_sizes=w.graph.group_sizes())
    assert o.label.startswith("bucketed") and len(o.graph.collectives) < len(w.graph.collectives), o.summary()
    assert merged_reductions(w.graph, o.graph) > 0
    rtol = reduction_rtol(reduction_dtypes(o.gm), reduction_ranks(o.graph))
    assert rtol == pytest.approx(F32_RTOL_2_RANKS)
    inputs = []
    for rank in range(2):
        with fake_process_group(2, rank=rank):
            inputs.append(StepProgram(w.spec, create_groups(w.spec.plan, rank), rank).real_inputs(seed=3))
    before, after = run_spmd(w.graph_module, inputs), run_spmd(o.gm, inputs)
    for rank in range(2):
        assert len(after[rank]) == len(before[rank]) > 1
        diff = compare_outputs(after[rank], before[rank], rtol)
        assert diff.exact and diff.within and diff.max_abs_diff == 0.0, (rank, diff)
        assert any(t.abs().sum() > 0 for t in before[rank][1:])  # real gradients, not zeros


def test_the_tolerance_admits_a_reassociated_sum_and_nothing_much_larger():
    gen = torch.Generator().manual_seed(0)
    for ranks in (2, 4, 8):
        terms = [torch.randn(100_000, generator=gen) for _ in range(ranks)]
        forward, backward = terms[0].clone(), terms[-1].clone()
        for t in terms[1:]:
            forward += t
        for t in reversed(terms[:-1]):
            backward += t
        rtol = reduction_rtol([torch.float32], ranks)
        if ranks > 2:  # two terms commute: only three or more can round differently
            assert not torch.equal(forward, backward)
        diff = compare_outputs([forward], [backward], rtol)
        assert diff.within and diff.max_rel_diff <= rtol, (ranks, diff)
        # a real error (one element off by 1e-4 of the tensor's scale) is outside it
        off = backward.clone()
        off[17] += 1e-4 * backward.abs().max()
        assert not compare_outputs([off], [backward], rtol).within
    assert reduction_rtol([torch.bfloat16, torch.float32], 2) == 4 * 2 * torch.finfo(torch.bfloat16).eps
    assert reduction_rtol([torch.int64], 2) == 0.0  # integers must be equal


def test_outputs_that_differ_in_structure_are_infinitely_far():
    a = [torch.ones(3), torch.zeros(2)]
    assert compare_outputs(a, a, 0.0).exact
    for other in ([torch.ones(3)], [torch.ones(3), torch.zeros(3)], [torch.ones(3), torch.zeros(2).double()]):
        diff = compare_outputs(other, a, 1.0)
        assert not diff.within and diff.max_abs_diff == math.inf
    nudged = [torch.ones(3), torch.tensor([0.0, 1e-30])]  # rtol 0: any difference is outside
    assert not compare_outputs(nudged, a, 0.0).within
    assert compare_outputs([torch.tensor([float("nan")])], [torch.tensor([1.0])], 1.0).within is False


def test_optimize_needs_the_original_order_and_a_given_order_overrides_it():
    from commsched.runtime import RunConfig
    from commsched.workloads import resolve

    spec = resolve("llama-tiny", parallel="fsdp", world_size=2, dtype="float32", attention="sdpa")
    with pytest.raises(ValueError, match="run 'original' too"):
        RunConfig(spec=spec, variants=("optimize",))
    assert RunConfig(spec=spec, variants=("original", "optimize")).runs_optimize
    given = RunConfig(spec=spec, variants=("overlap", "optimize"), orders={"optimize": ("a",)})
    assert not given.runs_optimize  # an order of the traced graph, by that name, as for any variant
    assert not RunConfig(spec=spec).runs_optimize  # opt-in: not in the default variants


def _with_optimize(within: bool, max_abs_diff: float) -> RunReport:
    report = small_run_report()
    check = OutputCheck(
        expected="within tolerance", rtol=F32_RTOL_2_RANKS, within=within, max_abs_diff=max_abs_diff,
        max_rel_diff=max_abs_diff / 2, merged_reductions=3,
    )  # fmt: skip
    program = ProgramChange(kept="bucketed (cap 0.9)", nodes=400, collectives=9, tried=13, search_s=1.5)
    opt = dataclasses.replace(report.variants["original"], bit_identical=False, program=program, outputs=check)
    return dataclasses.replace(report, variants={**report.variants, "optimize": opt})


@pytest.mark.parametrize(
    ("within", "bits", "verdict"),
    [(True, "~", "outputs within rtol 9.5e-07"), (False, "NO", "outputs outside rtol 9.5e-07")],
)
def test_report_keeps_and_renders_the_program_and_its_output_check(within, bits, verdict, tmp_path):
    report = _with_optimize(within, 1e-7)
    data = report.to_dict()
    assert data["variants"]["optimize"]["outputs"]["rtol"] == F32_RTOL_2_RANKS
    assert "outputs" not in data["variants"]["original"]  # optional: absent unless a program was rewritten
    assert RunReport.load(report.save(tmp_path / "r.json")) == report
    console = Console(file=io.StringIO(), width=300)
    print_run_report(report, console)
    text = console.file.getvalue()
    assert re.search(rf"optimize\s+│.*│\s+{bits}\s", text), text
    assert "optimize kept bucketed (cap 0.9): 34 -> 9 collectives, 400 nodes (13 program variants" in text
    assert f"{verdict} (expected within tolerance, 3 reductions merged; max diff 1.0e-07 abs, 5.0e-08 rel)" in text
