"""``commsched info`` shows the share of a step's compute that activation checkpointing recomputes and that float8
training's kernels take (issue 38), from the node tags of the traced step (``commsched.workloads.tags``): full AC's
recompute is one more forward of the blocks, as its flop count says; float8's kernels are the ``_scaled_mm`` and
their amax and cast kernels; with the options off both are zero."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import save_graph
from commsched.ir import OpKind
from commsched.ir.transform import NODE_TAGS_META
from commsched.workloads import build

STEP = dict(parallel="fsdp", world_size=8, layers=2, seq_len=256)


@functools.cache
def _traced(ac: str = "none", float8: str = "none"):
    return build("llama3-8b", ac=ac, float8=float8, **STEP)


def _info(w, tmp_path) -> dict:
    path = tmp_path / "graph.json"
    save_graph(w.graph, path)
    res = CliRunner().invoke(app, ["info", str(path), "-H", "h100-sxm", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["shares"]


def test_full_ac_recomputes_one_forward_of_the_blocks(tmp_path):
    """The recompute's flops are the blocks' forward flops ``F_blocks`` (the forward before the loss, less the output
    head's matmul): a share ``F_blocks / (B + F_blocks)`` of the step, ``B`` the step's flops without AC; its time
    share on h100-sxm is of the same order (the recompute is matmul- and attention-heavy like the rest)."""
    none, full = _traced(), _traced(ac="full")
    g0, cfg, tokens = none.graph, none.spec.model, none.spec.new_tokens
    loss = int(g0.inputs(int(np.flatnonzero(g0.kinds == OpKind.OUTPUT)[0]))[0])
    f_blocks = float(g0.flops[:loss].sum()) - 2 * tokens * cfg.dim * cfg.vocab_size
    b = float(g0.flops.sum())
    shares = _info(full, tmp_path)
    recompute, float8 = shares["recompute"], shares["float8"]
    assert recompute["flops"] == pytest.approx(f_blocks, rel=1e-9)
    assert recompute["flops_share"] == pytest.approx(f_blocks / (b + f_blocks), rel=1e-9)
    assert 0.5 * recompute["flops_share"] < recompute["time_share"] < 2 * recompute["flops_share"]
    assert recompute["time_s"] > 0 and recompute["nodes"] < len(full.graph) / 2
    assert float8 == {"nodes": 0, "flops": 0.0, "flops_share": 0.0, "time_s": 0.0, "time_share": 0.0}


def test_float8_kernels_are_the_scaled_mms_with_their_casts(tmp_path):
    """Tensorwise float8: three ``_scaled_mm`` per linear (7 per block) carry every matmul flop of the blocks' linears,
    and the amax / scale / cast kernels around them (no flops, some time) count too; no recompute without AC. With
    AC full as well, the recomputed forward's float8 kernels are in both parts."""
    w = _traced(float8="tensorwise")
    g = w.graph
    shares = _info(w, tmp_path)
    f8 = shares["float8"]
    tagged = {g.index[n] for n in g.meta[NODE_TAGS_META]["float8"]}
    scaled = [i for i, t in enumerate(g.targets) if t == "aten._scaled_mm.default"]
    assert len(scaled) == 3 * 7 * STEP["layers"] and set(scaled) <= tagged
    assert f8["flops"] == pytest.approx(float(g.flops[scaled].sum()), rel=1e-12)
    assert f8["flops_share"] == pytest.approx(f8["flops"] / float(g.flops.sum()))
    assert f8["nodes"] > 5 * len(scaled) and 0 < f8["time_share"] < 1
    assert any(g.targets[i] == "aten.abs.default" for i in tagged)  # the amax kernels
    assert shares["recompute"]["nodes"] == 0 and shares["recompute"]["time_share"] == 0.0
    both = _info(_traced(ac="full", float8="tensorwise"), tmp_path)
    assert both["recompute"]["nodes"] > 0 and both["float8"]["nodes"] > f8["nodes"]


def test_without_ac_or_float8_the_shares_are_zero(tmp_path):
    shares = _info(_traced(), tmp_path)
    zero = {"nodes": 0, "flops": 0.0, "flops_share": 0.0, "time_s": 0.0, "time_share": 0.0}
    assert shares == {"recompute": zero, "float8": zero}
    assert NODE_TAGS_META not in _traced().graph.meta
    res = CliRunner().invoke(app, ["info", str(tmp_path / "graph.json")])
    assert res.exit_code == 0 and "share of the step's compute" not in res.output


def test_the_terminal_shows_the_shares(tmp_path):
    path = tmp_path / "ac.json"
    save_graph(_traced(ac="full").graph, path)
    res = CliRunner().invoke(app, ["info", str(path)])
    out = " ".join(res.output.split())
    assert res.exit_code == 0 and "share of the step's compute" in out and "recompute (activation checkpointing)" in out
