"""plan --explain (one layout's one-step changes, each judged), the FSDP2 / pipelining snippet of a layout, and
plan's HTML page. The judged cases run llama-tiny on 2 GPUs at every layer (one module fixture, shared)."""

from __future__ import annotations

import ast
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.plan.torchtitan_shapes import tiny_torchtitan_llama

from commsched.plan import Judged, Layout, PlanRequest, PlanResult
from commsched.plan.explain import candidate_changes, explain, parse_layout
from commsched.plan.judge import judge_task
from commsched.plan.python_out import MESH_ORDER, fsdp2_python
from commsched.plan.search import plan_hardware

REQ = PlanRequest(preset="llama-tiny", gpus=2, layers_scale=0)
GIVEN = Layout(dp_shard=2, ac="full")


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMMSCHED_CACHE_DIR", str(tmp_path_factory.mktemp("explain_cache")))
        return explain(REQ, GIVEN, jobs=1)


def _text(layout: Layout) -> str:
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in layout.to_dict().items()
                    if v is not None)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.builds(Layout, dp_shard=st.integers(1, 64), dp_replicate=st.integers(1, 8), tp=st.sampled_from([1, 2, 8]),
                 sp=st.booleans(), cp=st.integers(1, 4), ep=st.integers(1, 8),
                 ac=st.sampled_from(["none", "full", "selective-op"]),
                 float8=st.sampled_from(["none", "tensorwise"])))  # fmt: skip
def test_layout_text_round_trips(layout: Layout) -> None:
    assert parse_layout(_text(layout)) == layout


@pytest.mark.parametrize(("text", "message"), [
    ("tp=8", "expected dp_shard=N"), ("dp_shard=0", "dp_shard='0': expected an integer >= 1"),
    ("dp_shard=4,wide=2", "'wide=2': expected KEY=VALUE"), ("dp_shard=4,sp=maybe", "sp='maybe'"),
])  # fmt: skip
def test_bad_layout_text_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_layout(text)
    assert "\n" not in str(info.value)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([Layout(dp_shard=32, tp=8, sp=True, ac="full"), Layout(dp_shard=256, ac="selective-op"),
                        Layout(dp_shard=8, cp=2, tp=4, sp=True, float8="tensorwise", ac="full"),
                        Layout(dp_shard=4, pp=8, tp=8, sp=True, pp_schedule="1F1B", microbatches=16)]),
       st.booleans())  # fmt: skip
def test_every_change_keeps_the_world_and_changes_one_thing(layout: Layout, float8_ok: bool) -> None:
    req = PlanRequest(preset="llama3-70b", gpus=256, global_batch=256)
    changes = candidate_changes(req, layout, float8_ok)
    assert len({(r.batch, lay) for _, r, lay in changes}) == len(changes)
    for what, r, lay in changes:
        assert lay.world_size == layout.world_size, what
        assert (lay, r.batch) != (layout, req.batch), what
        if lay.dp_replicate != layout.dp_replicate:
            assert lay.dp_replicate * lay.dp_shard == layout.dp_replicate * layout.dp_shard and lay.fsdp >= 2
    assert any(lay.tp == layout.tp // 2 for _, _, lay in changes) == (layout.tp > 1)
    assert {lay.ac for _, _, lay in changes} >= {"none", "selective-op", "full"} - {layout.ac}


def test_explain_judges_the_layout_and_sorts_its_changes(explained) -> None:
    hbm = plan_hardware(REQ).compute.hbm_capacity_bytes
    base = explained.base
    assert base.error is None and base.layout == GIVEN
    spec = {"request": dataclasses.asdict(REQ), "hardware": plan_hardware(REQ), "optimize": True,
            "layouts": [GIVEN.to_dict()]}  # fmt: skip
    assert base.step_s == pytest.approx(judge_task(spec)[0]["step_s"])  # the task plan judges with
    whats = [c.what for c in explained.changes]
    assert {"AC full -> none", "AC full -> selective-op"} <= set(whats)
    assert any("micro-batch" in w for w in whats)
    fitting = [c for c in explained.changes if c.error is None and c.fits]
    assert [c.tokens_per_s_per_gpu for c in fitting] == sorted((c.tokens_per_s_per_gpu for c in fitting), reverse=True)
    for c in fitting:
        assert c.peak_memory_bytes <= hbm
        assert c.gain(base) == pytest.approx(c.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu - 1)
    none = next(c for c in explained.changes if c.what == "AC full -> none")
    assert none.recompute_s < base.recompute_s  # full AC recomputes each block; none recomputes nothing
    from commsched.report.plan_text import explain_lines

    lines = explain_lines(explained)
    assert len(lines) == 1 + len(explained.changes) and GIVEN.label() in lines[0]
    assert all(c.what in line for c, line in zip(explained.changes, lines[1:], strict=True))
    data = json.loads(json.dumps(explained.as_dict(), allow_nan=False))
    assert data["changes"][0]["gain"] == pytest.approx(explained.changes[0].gain(base))


def test_explain_refuses_a_layout_plan_would_not_run() -> None:
    with pytest.raises(ValueError, match="not a layout plan runs") as info:
        explain(REQ, Layout(dp_shard=4), jobs=1)
    assert "\n" not in str(info.value)


def _degrees(source: str) -> dict[str, int]:
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DEGREES")
    return ast.literal_eval(node.value)


@pytest.mark.parametrize("layout", [
    Layout(dp_shard=16),
    Layout(dp_replicate=16, dp_shard=1),
    Layout(dp_shard=2, dp_replicate=2, cp=2, tp=2, sp=True, ac="selective-op", float8="tensorwise"),
    Layout(dp_shard=2, tp=2, pp=4, pp_schedule="1F1B", microbatches=8, ac="full"),
    Layout(dp_shard=2, pp=8, pp_schedule="Interleaved1F1B", microbatches=8, stages_per_rank=2, ac="selective-layer:2"),
    Layout(dp_shard=4, pp=4, pp_schedule="ZBVZeroBubble", microbatches=4, stages_per_rank=2),
], ids=lambda lay: lay.label())  # fmt: skip
def test_python_snippet_compiles_and_names_the_degrees(layout: Layout) -> None:
    req = PlanRequest(preset="llama3-8b", gpus=16, global_batch=32, seq_len=8192)
    source = fsdp2_python(req, layout)
    namespace: dict = {}
    exec(compile(source, "layout.py", "exec"), namespace)  # torch's classes it imports exist in this torch
    assert _degrees(source) == {name: getattr(layout, name) for name in MESH_ORDER}
    assert namespace["AC"] == layout.ac and namespace["FLOAT8"] == layout.float8
    if layout.pp > 1:
        assert namespace["MICROBATCHES"] == layout.microbatches
        assert f"Schedule{layout.pp_schedule}(" in source
        assert len(namespace["STAGE_FQNS"]) == layout.pp * layout.stages_per_rank
    if layout.tp > 1:
        assert ("SequenceParallel()" in source.split("TP_PLAN = ")[1].split("}")[0]) == layout.sp


def _result() -> PlanResult:
    """A hand-made two-row result (the page and the CLI's writers read nothing else)."""

    def judged(layout: Layout, step_s: float, framework_s: float) -> Judged:
        return Judged(layout, step_s, framework_s, 1e9, 0.1 * step_s, 0.2, 0.0, 1.0 / step_s, 0.4, "all layers",
                      "optimized", 1.0)  # fmt: skip

    rows = [judged(Layout(dp_shard=2), 1.0, 1.2), judged(Layout(dp_shard=1, tp=2, sp=True), 1.1, 1.1)]
    return PlanResult(REQ, plan_hardware(REQ), rows, 5, 1, 0, 2, 0, [], 3.0)


def test_plan_html_has_the_ranked_table_and_the_winners_breakdown() -> None:
    from commsched.report.plan_text import plan_html

    result = _result()
    page = plan_html(result, 5)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<table>") == 2
    for j in result.ranked:
        assert j.layout.label() in page
    assert "best without overlap optimisation" in page and "runner-up" in page


def test_cli_plan_writes_html_python_and_toml(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from commsched.cli import app

    result = _result()
    monkeypatch.setattr("commsched.plan.plan", lambda *a, **k: result)
    html, py, toml = tmp_path / "plan.html", tmp_path / "best.py", tmp_path / "best.toml"
    args = ["plan", "llama-tiny", "--gpus", "2", "--html", str(html), "--python", str(py), "--toml", str(toml)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert result.winner.layout.label() in html.read_text()
    assert _degrees(py.read_text()) == {name: getattr(result.winner.layout, name) for name in MESH_ORDER}
    assert "data_parallel_shard_degree = 2" in toml.read_text()


def test_cli_explain_writes_json_and_the_python(explained, tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from commsched.cli import app

    out, py = tmp_path / "explain.json", tmp_path / "layout.py"
    monkeypatch.setattr("commsched.plan.explain.explain", lambda *a, **k: explained)
    args = ["plan", "llama-tiny", "--gpus", "2", "--explain", "--layout", "dp_shard=2,ac=full", "--json", str(out),
            "--python", str(py)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["base"]["layout"] == GIVEN.to_dict()
    compile(py.read_text(), "layout.py", "exec")
    bad = CliRunner().invoke(app, ["plan", "llama-tiny", "--gpus", "2", "--layout", "dp_shard=2"])
    assert bad.exit_code == 2 and "--explain and --layout" in bad.output


@pytest.mark.parametrize(("layout", "built"), [
    (Layout(dp_shard=2, dp_replicate=2, tp=2, sp=True, ac="full"), "FSDPModule"),
    (Layout(dp_shard=2, cp=2, tp=2, ac="selective-op"), "FSDPModule"),
    (Layout(dp_shard=1, dp_replicate=8), "DDP"),
    (Layout(dp_shard=4, reshard_after_forward=False), "FSDPModule"),
    (Layout(dp_shard=4, pp=2, pp_schedule="1F1B", microbatches=2), "Schedule1F1B"),
], ids=lambda v: v.label() if isinstance(v, Layout) else v)  # fmt: skip
def test_python_snippet_builds_its_mesh_under_a_fake_process_group(layout: Layout, built: str) -> None:
    """The snippet's calls run on CPU under the fake backend for a tiny torchtitan-shaped model: the mesh has the
    layout's dimensions in torchtitan's order, TP's weights are DTensors on the tp dimension."""
    from torch.distributed.tensor import DTensor

    from commsched import fake_process_group

    req = PlanRequest(preset="llama-tiny", gpus=layout.world_size, global_batch=8, compile=False)
    namespace: dict = {}
    exec(compile(fsdp2_python(req, layout), "layout.py", "exec"), namespace)
    model = tiny_torchtitan_llama()
    with fake_process_group(layout.world_size):
        mesh, out = namespace["build"](model, lambda out, target: out.sum(), device_type="cpu")
        assert mesh.mesh_dim_names == tuple(n for n in MESH_ORDER if getattr(layout, n) > 1)
        assert built in " ".join(c.__name__ for c in type(out).__mro__)
        if layout.tp > 1:
            weight = model.layers["0"].attention.wq.weight
            assert isinstance(weight, DTensor) and "tp" in weight.device_mesh.mesh_dim_names
        if layout.fsdp > 1 and layout.pp == 1:  # FSDP2 reshards after forward unless the layout keeps the weights
            group = model.layers["0"]._get_fsdp_state()._fsdp_param_group
            assert (group.post_forward_mesh_info is not None) == layout.reshard_after_forward
