"""Issue 36.9: ``optimize`` reports its gain against what the user's framework runs today and against torch's best
configuration, in the same run with the same costs; the traced order is a detail."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsched.cli import app

runner = CliRunner()


@pytest.mark.parametrize(("parallel", "framework"), [("fsdp", "FSDP2 eager"), ("ddp", "DDP eager")])
def test_optimize_judges_the_kept_step_against_the_framework_and_torchs_best(parallel, framework, tmp_path):
    html = tmp_path / "opt.html"
    res = runner.invoke(app, ["optimize", "llama-tiny", "--parallel", parallel, "--world-size", "8",
                              "--html", str(html), "--json", str(tmp_path / "opt.json")])  # fmt: skip
    assert res.exit_code == 0, res.output
    answer = json.loads((tmp_path / "opt.json").read_text())
    refs = answer["references"]
    assert refs["framework"]["label"] == framework
    assert [r["label"] for r in refs["torch"]] == ["torch plain", "torch bucketing", "torch pre-bucketing + bucketing"]
    best = min((r for r in refs["torch"] if r["step_s"] is not None), key=lambda r: r["step_s"])
    assert refs["torch_best"] == best["label"]
    assert answer["speedup_vs_framework"] == pytest.approx(refs["framework"]["step_s"] / answer["step_s"])
    assert answer["speedup_vs_torch_best"] == pytest.approx(best["step_s"] / answer["step_s"])
    assert answer["speedup_vs_traced"] == pytest.approx(refs["traced"]["step_s"] / answer["step_s"])
    # the framework overlaps: it is faster than the traced order, which is only a detail of the answer
    assert refs["framework"]["step_s"] < refs["traced"]["step_s"]
    out = " ".join(res.output.split())
    assert f"faster than {framework}" in out or f"slower than {framework}" in out
    assert "torch's best configuration" in out and "what bounds the step:" in out
    assert answer["layers"] == answer["preset_layers"] == 2  # the preset's layers when --layers is not given
    page = html.read_text()
    assert framework in page and best["label"] in page and answer["bound"]["binding"]
