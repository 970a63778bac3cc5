"""Activation checkpointing (``ac``) of the zoo's blocks, as torchtitan applies it (commsched.workloads.ac): the
same numbers as without it on real gloo ranks, the recompute in the traced backward, less peak memory for more
compute, the default ``"none"`` changing no graph, and one-line errors for bad values."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from typer.testing import CliRunner
from zoo_helpers import assert_same_trace, check_ir, loss_node, specs_traced_by

from commsched.workloads import build, resolve
from commsched.workloads.ac import checkpointed, layer_policies, parse_ac, per_layer_ac

MODES = ("none", "selective-layer:2", "selective-op", "full")
MM, FLASH = "aten.mm.default", "aten._scaled_dot_product_flash_attention.default"
LAYERS, SEQ = 2, 2048


@functools.cache
def _costed(ac: str) -> tuple:
    """llama3-8b, FSDP over 8 ranks, 2 layers of 2048 tokens: the workload, its costs on h100-sxm, its simulation."""
    from commsched.cost import estimate_costs
    from commsched.sim import simulate_costs

    w = build("llama3-8b", parallel="fsdp", world_size=8, layers=LAYERS, seq_len=SEQ, ac=ac)
    costs = estimate_costs(w.graph, "h100-sxm")
    return w, costs, simulate_costs(w.graph, costs)


def _flops(w, target: str | None = None, *, forward: bool | None = None) -> float:
    """Flops of the nodes running ``target`` (None: all), of the forward (before the loss) or the backward."""
    g, loss = w.graph, loss_node(w.graph)
    picked = [i for i in np.flatnonzero(g.flops) if target is None or g.targets[i] == target]
    return sum(float(g.flops[i]) for i in picked if forward is None or (i < loss) == forward)


def _compute_s(w, costs) -> float:
    coll = set(w.graph.collectives.tolist())
    return sum(float(costs.node_s[i]) for i in range(len(w.graph)) if i not in coll)


# ---------------------------------------------------------------- values
@pytest.mark.parametrize(
    "value", ["partial", "selective", "selective-layer", "selective-layer:0", "selective-layer:-1", "selective-layer:x"]
)
def test_bad_values_are_one_line_errors(value):
    with pytest.raises(ValueError) as exc:
        resolve("llama-tiny", parallel="fsdp", world_size=2, ac=value)
    msg = str(exc.value)
    assert "\n" not in msg and f"ac={value!r}" in msg and ("selective-layer:N" in msg or "N >= 1" in msg), msg


def test_ac_is_for_training_only_and_values_are_canonical():
    with pytest.raises(ValueError, match=r"ac='full' is for mode='train'.*not mode='prefill'") as exc:
        resolve("llama-tiny", parallel="tp", world_size=2, mode="prefill", ac="full")
    assert "\n" not in str(exc.value)
    assert resolve("llama-tiny", parallel="tp", world_size=2, mode="decode").ac == "none"
    assert parse_ac(" selective-layer:02 ") == "selective-layer:2"
    assert resolve("llama-tiny", parallel="fsdp", world_size=2, ac="selective-layer:03").ac == "selective-layer:3"


def test_layer_rule_is_torchtitans():
    """torchtitan's ``_apply_layer_sac``: a counter incremented before ``count % N == 0``, i.e. 0-based layers
    N-1, 2N-1, ... are checkpointed."""
    assert [checkpointed("selective-layer:2", i) for i in range(4)] == [False, True, False, True]
    assert [checkpointed("selective-layer:3", i) for i in range(6)] == [False, False, True, False, False, True]
    assert all(checkpointed(ac, i) for ac in ("full", "selective-op", "selective-layer:1") for i in range(3))
    assert not any(checkpointed("none", i) for i in range(3))


# ---------------------------------------------------------------- traced
def test_none_changes_no_graph():
    """The default: node for node the graph traced before ``ac`` existed (same FX code, same IR)."""
    kw = dict(parallel="fsdp", world_size=8, layers=1, seq_len=256)
    plain, none = build("llama3-8b", **kw), build("llama3-8b", ac="none", **kw)
    assert_same_trace(plain, none)
    assert plain.meta["ac"] == "none" and "/ac" not in plain.meta["workload"]
    full = build("llama3-8b", ac="full", **kw)
    assert full.graph.meta["ac"] == "full" and full.meta["workload"].endswith("/ac full")


def test_recompute_is_in_the_backward_before_the_gradients_that_read_it():
    """Full AC: each block's forward is traced again after the loss (FSDP re-gathers the block for it, as without
    AC), and each attention backward reads the recomputed attention, not the forward's."""
    w, _, _ = _costed("full")
    none, _, _ = _costed("none")
    check_ir(w)
    g, loss = w.graph, loss_node(w.graph)
    flash = [i for i, t in enumerate(g.targets) if t == FLASH]
    assert len(flash) == 2 * LAYERS and sum(i > loss for i in flash) == LAYERS
    for b in (i for i, t in enumerate(g.targets) if t == FLASH.replace(".default", "_backward.default")):
        producers = {int(p) for j in g.inputs(b) for p in [j, *g.inputs(j)] if g.targets[int(p)] == FLASH}
        assert producers and all(loss < p < b for p in producers), (b, producers)
    n_mm = lambda wl: sum(t == MM for t in wl.graph.targets)  # noqa: E731
    assert n_mm(w) == n_mm(none) + 7 * LAYERS  # wq wk wv wo w1 w3 w2 of every block, once more
    ag = lambda wl: sum("all_gather" in t for t in wl.graph.targets)  # noqa: E731
    assert ag(w) == ag(none)  # the backward's re-gather of each block feeds its recompute


def test_peak_memory_falls_and_compute_rises():
    """The traced step on h100-sxm: peak memory none > selective-op > full, compute the other way. Full AC adds
    one forward of the blocks: total flops ``(B + F_blocks) / B`` with ``B`` the step's flops without AC and
    ``F_blocks`` the blocks' forward flops (``~ (3F + F_blocks) / 3F``: backward ~ 2x forward); its matmul flops
    exactly the blocks' forward matmuls more. Selective-op recomputes every second matmul (wk, wo, w3)."""
    (none, c0, s0), (sel, c1, s1), (full, c2, s2) = (_costed(ac) for ac in ("none", "selective-op", "full"))
    assert s2.peak_memory_bytes < s1.peak_memory_bytes < s0.peak_memory_bytes
    assert _compute_s(none, c0) < _compute_s(sel, c1) < _compute_s(full, c2)
    cfg, tokens = none.spec.model, none.spec.new_tokens
    output = 2 * tokens * cfg.dim * cfg.vocab_size
    f_blocks = _flops(none, forward=True) - output  # matmuls and attention of the blocks' forward
    assert _flops(full) / _flops(none) == pytest.approx((_flops(none) + f_blocks) / _flops(none), rel=1e-9)
    mm_blocks = _flops(none, MM, forward=True) - output
    assert mm_blocks == 2 * tokens * (cfg.block_params() - 2 * cfg.dim) * LAYERS
    assert _flops(full, MM) == _flops(none, MM) + mm_blocks
    kv = cfg.n_kv_heads * cfg.head_dim
    assert _flops(sel, MM) == _flops(none, MM) + 2 * tokens * cfg.dim * (kv + cfg.dim + cfg.ffn_dim) * LAYERS
    assert _flops(sel, FLASH) == _flops(none, FLASH)  # attention saved
    ratio = _flops(full) / _flops(none)
    f = _flops(none, forward=True)
    assert ratio == pytest.approx((3 * f + f_blocks) / (3 * f), rel=0.02)


def test_selective_layer_checkpoints_every_second_block():
    layer, _, _ = _costed("selective-layer:2")
    none, _, _ = _costed("none")
    g, loss = layer.graph, loss_node(layer.graph)
    assert sum(t == MM for t in g.targets) == sum(t == MM for t in none.graph.targets) + 7
    assert sum(t == FLASH and i > loss for i, t in enumerate(g.targets)) == 1
    assert layer.meta["workload"].endswith("/ac selective-layer:2")


# ---------------------------------------------------------------- per layer
def test_per_layer_values_are_canonical_and_checked():
    """``per-layer:P,P,...``: runs merged as ``P*K``; a bad item, or a count other than the model's layers, is a
    one-line error naming ``ac``."""
    assert parse_ac(" per-layer:full, full,none*1 ") == "per-layer:full*2,none"
    assert layer_policies("per-layer:selective-op*2,full", 3) == ("selective-op", "selective-op", "full")
    assert layer_policies("selective-layer:2", 4) == ("none", "full", "none", "full")
    assert per_layer_ac(layer_policies("per-layer:none,full*3,none", 5)) == "per-layer:none,full*3,none"
    for bad in ("per-layer:", "per-layer:fll", "per-layer:full*0", "per-layer:full*x"):
        with pytest.raises(ValueError) as exc:
            parse_ac(bad)
        assert "\n" not in str(exc.value) and f"ac={bad!r}" in str(exc.value)
    with pytest.raises(ValueError, match=r"ac='per-layer:full,none': gives 2 block policies, expected one per layer "
                                         r"\(3\)"):  # fmt: skip
        resolve("llama-tiny", parallel="fsdp", world_size=2, layers=3, ac="per-layer:full,none")


@functools.cache
def _tiny(ac: str):
    # 256 tokens: enough that activations, not the parameters' buffers, set the peak (the AC modes move it)
    return build("llama-tiny", parallel="fsdp", world_size=4, layers=2, seq_len=256, ac=ac)


def test_per_layer_uniform_is_the_uniform_mode_node_for_node():
    """A per-layer value runs each block as its uniform mode does: every block full is ``full``, full on every
    second block is ``selective-layer:2``."""
    assert_same_trace(_tiny("full"), _tiny("per-layer:full*2"))
    assert_same_trace(_tiny("selective-layer:2"), _tiny("per-layer:none,full"))


def test_per_layer_mixed_recomputes_each_block_as_its_policy():
    """Block 0 selective-op, block 1 full: the backward recomputes 3 matmuls of block 0 (selective-op: wk, wo,
    w3) and all 7 of block 1, and one attention (block 1's); peak memory and compute lie between the uniform
    modes'."""
    from commsched.cost import estimate_costs
    from commsched.sim import simulate_costs

    mixed, none, full = _tiny("per-layer:selective-op,full"), _tiny("none"), _tiny("full")
    check_ir(mixed)
    n_mm = lambda wl: sum(t == MM for t in wl.graph.targets)  # noqa: E731
    assert n_mm(mixed) == n_mm(none) + 3 + 7
    loss = loss_node(mixed.graph)
    attention = [t for i, t in enumerate(mixed.graph.targets) if i > loss and t == FLASH]
    assert len(attention) == 1
    costs = [estimate_costs(w.graph, "h100-sxm") for w in (none, mixed, full)]
    peaks = [simulate_costs(w.graph, c).peak_memory_bytes for w, c in zip((none, mixed, full), costs, strict=True)]
    computes = [_compute_s(w, c) for w, c in zip((none, mixed, full), costs, strict=True)]
    assert peaks[0] > peaks[1] >= peaks[2] and computes[0] < computes[1] < computes[2], (peaks, computes)
    assert mixed.meta["ac"] == "per-layer:selective-op,full"


# ---------------------------------------------------------------- real gloo ranks
REAL = [("llama-tiny", "fsdp"), ("llama-tiny", "tp+sp"), ("mixtral-tiny", "ep")]


@pytest.mark.slow
def test_every_mode_computes_the_same_loss_and_gradients_on_gloo():
    """2 gloo ranks in float32: FSDP (the recompute re-gathers), TP+SP (selective-op saves the reduce_scatter) and
    EP (the MoE list saves the all_to_all; the router's matmul always recomputed): every AC mode returns the loss
    and gradient shards of ``ac="none"`` to 1e-6."""
    from commsched.workloads.real import run_on_gloo

    specs = [resolve(p, parallel=par, world_size=2, seq_len=16, batch=2, dtype="float32", attention="sdpa", ac=ac)
             for p, par in REAL for ac in MODES]  # fmt: skip
    results = run_on_gloo(specs, seed=5)
    worst = 0.0
    for k, (preset, par) in enumerate(REAL):
        base = results[k * len(MODES)]
        for m, ac in enumerate(MODES[1:], start=1):
            for rank, (got, want) in enumerate(zip(results[k * len(MODES) + m], base, strict=True)):
                assert len(got) == len(want) == 1 + len(specs[k * len(MODES)].layout)
                for a, b in zip(got, want, strict=True):
                    err = (a - b).abs().max().item()
                    worst = max(worst, err)
                    assert err <= 1e-6, f"{preset}/{par} ac={ac} rank {rank}: max |diff| {err:.2e}"
    print(f"largest |difference| to ac='none': {worst:.2e}")


# ---------------------------------------------------------------- CLI
def test_cli_ac_option(monkeypatch):
    """``--ac`` reaches the traced spec of every zoo command; a bad value is a usage error (exit 2) before any
    work."""
    from commsched.cli import app

    runner = CliRunner()
    specs = specs_traced_by(monkeypatch, ("trace", "compare", "optimize", "rewrite"), ["--ac", "selective-layer:02"])
    asked = [spec.ac for spec in specs]
    assert asked == ["selective-layer:2"] * 4
    res = runner.invoke(app, ["trace", "llama3-8b", "--ac", "sometimes"])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "--ac" in lines[0] and "selective-layer:N" in lines[0], lines
    assert len(specs) == 4  # refused as parsed: nothing traced
    res = runner.invoke(app, ["trace", "llama-tiny", "--ac", "full", "-m", "prefill", "-p", "tp"])
    assert res.exit_code == 2 and "mode='train'" in res.stderr
