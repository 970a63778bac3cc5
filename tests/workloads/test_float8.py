"""Float8 training (``float8``) of the zoo's linears, as torchtitan runs torchao's Float8Linear
(commsched.workloads.float8): three ``_scaled_mm`` per linear with the flops and float8 bytes a hand count gives,
FSDP's float8 all_gather (tensorwise) at half the bytes of bfloat16, the matmuls costed at the float8 peak, the
same numbers on real gloo ranks as unsharded, the default ``"none"`` changing no graph, one-line errors."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from typer.testing import CliRunner
from zoo_helpers import assert_same_trace, check_ir, specs_traced_by

from commsched.ir import OpKind
from commsched.workloads import build, resolve
from commsched.workloads.float8 import converts, parse_float8

SCALED_MM, MM = "aten._scaled_mm.default", "aten.mm.default"
LAYERS, SEQ = 1, 2048
LINEARS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")


@functools.cache
def _costed(float8: str) -> tuple:
    """llama3-8b, FSDP over 8 ranks, 1 layer of 2048 tokens: the workload, its costs on h100-sxm, its simulation."""
    from commsched.cost import estimate_costs
    from commsched.sim import simulate_costs

    w = build("llama3-8b", parallel="fsdp", world_size=8, layers=LAYERS, seq_len=SEQ, float8=float8)
    costs = estimate_costs(w.graph, "h100-sxm")
    return w, costs, simulate_costs(w.graph, costs)


def _shapes(cfg) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear of a Llama block."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    d, f = cfg.dim, cfg.ffn_dim
    return {"wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q), "w1": (f, d), "w3": (f, d), "w2": (d, f)}


def _nodes(w, target: str) -> list[int]:
    return [i for i, t in enumerate(w.graph.targets) if t == target]


def _out_shape(g, i: int) -> tuple[int, ...]:
    return tuple(g.buf_shape[g.buf_ptr[i]])


def _source_dtype(g, i: int) -> str:
    """The dtype of the tensor a node reads through views (a collective's data before a ``view(uint8)``)."""
    while g.kinds[i] == OpKind.VIEW and len(g.inputs(i)):
        i = int(g.inputs(i)[0])
    return g.buf_dtype[g.buf_ptr[i]]


def _all_gathers(w) -> list[int]:
    g = w.graph
    return [c for c in g.collectives.tolist() if "all_gather" in g.targets[c]]


def _float8_gathers(w) -> list[int]:
    g = w.graph
    return [c for c in _all_gathers(w) if _source_dtype(g, int(g.inputs(c)[0])).startswith("float8")]


# ---------------------------------------------------------------- values
@pytest.mark.parametrize("value", ["fp8", "e4m3", "row", "", "tensor-wise"])
def test_bad_values_are_one_line_errors(value):
    with pytest.raises(ValueError) as exc:
        resolve("llama-tiny", parallel="fsdp", world_size=2, float8=value)
    msg = str(exc.value)
    assert "\n" not in msg and f"float8={value!r}" in msg and "none, tensorwise, rowwise" in msg, msg


def test_training_only_values_canonical():
    with pytest.raises(ValueError, match=r"float8='rowwise' is for mode='train'.*not mode='decode'") as exc:
        resolve("llama-tiny", parallel="tp", world_size=2, mode="decode", float8="rowwise")
    assert "\n" not in str(exc.value)
    assert resolve("llama-tiny", parallel="tp+sp", world_size=2, float8="tensorwise").float8_tp  # test_float8_tp.py
    assert resolve("llama-tiny", parallel="tp+sp", world_size=2, float8=" Rowwise ").float8 == "rowwise"
    assert parse_float8("TENSORWISE") == "tensorwise"
    assert resolve("llama-tiny", parallel="tp", world_size=2, mode="prefill").float8 == "none"


def test_converted_linears_are_torchtitans():
    """Every nn.Linear with both dimensions multiples of 16 but the output head and the MoE router (torchtitan's
    filter_fqns); MoE experts (grouped GEMMs), the embedding and the norms stay in the compute dtype."""
    dense = resolve("llama3-8b", parallel="fsdp", world_size=8, layers=2, float8="tensorwise")
    assert sorted({dense.layout[i].key for i in dense.float8_params}) == sorted(LINEARS)
    assert len(dense.float8_params) == 7 * 2 and dense.float8_all_gather
    moe = resolve("mixtral-8x7b", parallel="fsdp+ep", world_size=8, ep_size=8, layers=1, float8="tensorwise")
    assert sorted({moe.layout[i].key for i in moe.float8_params}) == ["wk", "wo", "wq", "wv"]
    assert not converts("output", (128256, 4096)) and not converts("gate", (16, 4096))
    assert not converts("w1", (8, 14336, 4096)) and not converts("wq", (4096, 4104))
    rowwise = resolve("llama3-8b", parallel="fsdp", world_size=8, layers=1, float8="rowwise")
    assert not rowwise.float8_all_gather  # torchao's float8 all_gather is tensorwise only
    assert not resolve("llama3-8b", parallel="ddp", world_size=8, layers=1, float8="tensorwise").float8_all_gather


# ---------------------------------------------------------------- traced
def test_none_changes_no_graph():
    """The default: node for node the graph traced without the option (same FX code, same IR), no float8 op."""
    kw = dict(parallel="fsdp", world_size=8, layers=1, seq_len=256)
    plain, none = build("llama3-8b", **kw), build("llama3-8b", float8="none", **kw)
    assert_same_trace(plain, none)
    assert not any(d.startswith("float8") or d == "uint8" for d in plain.graph.buf_dtype)
    assert SCALED_MM not in plain.graph.targets and plain.meta["float8"] == "none"
    assert "/float8" not in plain.meta["workload"] and "float8_linears" not in plain.meta


@pytest.mark.parametrize("float8", ["tensorwise", "rowwise"])
def test_three_scaled_mm_per_linear_with_hand_counted_flops_and_bytes(float8):
    """One block of 2048 tokens: each linear (N, K) runs its forward [T, N], grad_input [T, K] and grad_weight
    [N, K] as ``_scaled_mm`` of 2 T N K flops on float8 operands (1 byte per element); only the output head's
    three matmuls stay ``aten.mm``; the matmul flops are those of bfloat16."""
    w, _, _ = _costed(float8)
    none, _, _ = _costed("none")
    check_ir(w)
    g, cfg, t = w.graph, w.spec.model, w.spec.new_tokens
    expected = Counter()
    for n, k in _shapes(cfg).values():
        flops = 2.0 * t * n * k
        expected.update([((t, n), flops), ((t, k), flops), ((n, k), flops)])
    got = Counter((_out_shape(g, i), float(g.flops[i])) for i in _nodes(w, SCALED_MM))
    assert got == expected and len(_nodes(w, SCALED_MM)) == 3 * 7 * LAYERS
    assert len(_nodes(w, MM)) == len(_nodes(none, MM)) - 3 * 7 * LAYERS == 3
    block_mm = sum(float(g.flops[i]) for i in _nodes(w, SCALED_MM))
    assert block_mm == 6.0 * t * (cfg.block_params() - 2 * cfg.dim) * LAYERS
    mm_flops = lambda wl, ts: sum(float(wl.graph.flops[i]) for t_ in ts for i in _nodes(wl, t_))  # noqa: E731
    assert mm_flops(w, (SCALED_MM, MM)) == mm_flops(none, (MM,))
    # the forward of wq: a [T, D] float8 input, a [D, D] float8 weight (column-major), two scales, a bf16 output
    d = cfg.dim
    wq = next(i for i in _nodes(w, SCALED_MM) if _out_shape(g, i) == (t, d))
    operands = [g.buf_dtype[g.buf_ptr[p]] for p in g.inputs(wq).tolist()]
    assert operands[:2] == ["float8_e4m3fn"] * 2 and g.buf_dtype[g.buf_ptr[wq]] == "bfloat16"
    scale_bytes = 4 * (2 if float8 == "tensorwise" else t + d)  # one scale per tensor, or per row of each
    assert g.in_bytes[wq] == t * d + d * d + scale_bytes and g.out_bytes[wq] == 2 * t * d
    if float8 == "tensorwise":  # the output gradient in e5m2 (torchao's tensorwise recipe)
        assert "float8_e5m2" in g.buf_dtype
    assert w.meta["workload"].endswith(f"/float8 {float8}") and w.meta["float8_linears"] == sorted(LINEARS)


def test_fsdp_float8_all_gather_halves_the_weights_bytes():
    """Tensorwise: the block's seven weights are gathered in float8 (1 byte per element), forward and backward
    re-gather, their scales from one all_reduce (max) of the seven amaxes; the norms, embedding and output stay
    bfloat16. Rowwise: no float8 all_gather, the bytes of bfloat16."""
    (none, c0, _), (tw, c1, _), (rw, c2, _) = (_costed(f) for f in ("none", "tensorwise", "rowwise"))
    g, cfg = tw.graph, tw.spec.model
    weights = [n * k for n, k in _shapes(cfg).values()]
    f8 = _float8_gathers(tw)
    assert sorted(int(g.comm_bytes[c]) for c in f8) == sorted(weights * 2 * LAYERS)
    ag_bytes = lambda w: sum(int(w.graph.comm_bytes[c]) for c in _all_gathers(w))  # noqa: E731
    assert ag_bytes(none) - ag_bytes(tw) == 2 * sum(weights) * LAYERS  # bf16: 2 bytes each, float8: 1
    assert len(_all_gathers(tw)) == len(_all_gathers(none))
    others = Counter(int(g.comm_bytes[c]) for c in _all_gathers(tw) if c not in f8)
    assert others == Counter(int(none.graph.comm_bytes[c]) for c in _all_gathers(none)) - Counter(
        2 * b for b in weights * 2 * LAYERS
    )  # norms, embedding and output: their bfloat16 bytes
    assert 2 * cfg.dim in others  # a norm weight: 2 bytes per element
    reduces = [c for c in g.collectives.tolist() if "all_reduce" in g.targets[c]]
    assert [int(g.comm_bytes[c]) for c in reduces] == [4 * 7 * LAYERS]
    ar = [n for n in tw.graph_module.graph.nodes if n.target == torch.ops._c10d_functional.all_reduce.default]
    assert len(ar) == 1 and ar[0].args[1] == "max"
    assert not _float8_gathers(rw) and ag_bytes(rw) == ag_bytes(none)
    assert not any("all_reduce" in rw.graph.targets[c] for c in rw.graph.collectives.tolist())
    ag_s = lambda w, c: float(c.node_s[_all_gathers(w)].sum())  # noqa: E731
    assert ag_s(tw, c1) < ag_s(none, c0) and ag_s(rw, c2) == pytest.approx(ag_s(none, c0))


def test_matmuls_run_at_the_float8_peak():
    """h100-sxm: the block's 21 matmuls take about half the time of their bfloat16 ``mm`` (1979 vs 989 TFLOP/s,
    the same tile / wave / K-depth efficiency); a profile without float8 tensor cores (a100) costs them at the
    bfloat16 peak. The simulated step reports the matmul, all_gather and step times."""
    from commsched.cost.estimate import _peak_per_node, graph_features
    from commsched.hardware import for_graph

    (none, c0, s0), (tw, c1, s1), (rw, c2, s2) = (_costed(f) for f in ("none", "tensorwise", "rowwise"))
    cfg, t = none.spec.model, none.spec.new_tokens
    head = 2.0 * t * cfg.vocab_size * cfg.dim  # the output head's matmuls' flops
    block_mm = [i for i in _nodes(none, MM) if none.graph.flops[i] != head]
    assert len(block_mm) == 21
    bf16 = float(c0.node_s[block_mm].sum())
    for w, c in ((tw, c1), (rw, c2)):
        f8 = float(c.node_s[_nodes(w, SCALED_MM)].sum())
        assert 0.45 < f8 / bf16 < 0.65, (w.spec.float8, f8, bf16)
    g = tw.graph
    scaled = _nodes(tw, SCALED_MM)
    h100, a100 = for_graph("h100-sxm", g), for_graph("a100-sxm-80g", g)
    assert set(_peak_per_node(graph_features(g), h100)[scaled]) == {h100.compute.peak_flops_for("float8_e4m3fn")}
    assert set(_peak_per_node(graph_features(g), a100)[scaled]) == {a100.compute.peak_flops_for("bfloat16")}
    for name, (w, c, s) in {"none": (none, c0, s0), "tensorwise": (tw, c1, s1), "rowwise": (rw, c2, s2)}.items():
        mm = _nodes(w, SCALED_MM) or block_mm
        print(f"{name}: block matmuls {c.node_s[mm].sum() * 1e3:.2f} ms, all_gathers "
              f"{sum(int(w.graph.comm_bytes[i]) for i in _all_gathers(w)) / 2**20:.0f} MiB "
              f"{c.node_s[_all_gathers(w)].sum() * 1e3:.2f} ms, step {s.makespan_s * 1e3:.2f} ms")  # fmt: skip


def test_float8_with_activation_checkpointing_recomputes_the_scaled_mm():
    """Selective-op AC with float8: torchtitan's save list has no ``_scaled_mm`` (it saves ``max``, the amaxes), so
    every block forward matmul is recomputed in the backward."""
    w = build("llama3-8b", parallel="fsdp", world_size=8, layers=1, seq_len=256, float8="tensorwise",
              ac="selective-op")  # fmt: skip
    check_ir(w)
    assert len(_nodes(w, SCALED_MM)) == 3 * 7 + 7 and len(_float8_gathers(w)) == 2 * 7


# ---------------------------------------------------------------- real gloo ranks
@pytest.mark.slow
def test_gloo_ranks_match_the_unsharded_float8_step():
    """2 gloo ranks in float32, torch's CPU ``_scaled_mm``: FSDP tensorwise (float8 all_gather, per parameter and
    per block) and rowwise, and TP+SP tensorwise (torchao's float8 TP styles: float8 activation gathers) return the
    loss and gradient shards of the same float8 step unsharded (the all_reduced amaxes give the unsharded tensors'
    scales); float8 moves the loss by quantization noise only."""
    from commsched.workloads.real import expected_rank_outputs, reference_outputs, run_on_gloo

    common = dict(world_size=2, layers=1, seq_len=16, batch=1, dtype="float32", attention="sdpa")
    cases = [("fsdp", "tensorwise", "param"), ("fsdp", "tensorwise", "block"), ("fsdp", "rowwise", "param"),
             ("tp+sp", "tensorwise", "param")]  # fmt: skip
    specs = [resolve("llama-tiny", parallel=p, float8=f, fsdp_bucket=b, **common) for p, f, b in cases]
    assert [s.float8_tp for s in specs] == [False, False, False, True]
    results = run_on_gloo(specs, seed=5)
    plain_loss = reference_outputs(resolve("llama-tiny", parallel="fsdp", **common), seed=5)["losses"][0].item()
    for case, spec, got in zip(cases, specs, results, strict=True):
        ref = reference_outputs(spec, seed=5)
        for rank in range(2):
            want = expected_rank_outputs(spec, rank, ref)
            assert len(got[rank]) == len(want) == 1 + len(spec.layout)
            for a, b in zip(got[rank], want, strict=True):
                assert (a - b).abs().max().item() <= 1e-6, (case, rank)
        assert got[0][0].item() != plain_loss and abs(got[0][0].item() - plain_loss) < 0.05, case


# ---------------------------------------------------------------- CLI
def test_cli_float8_option(monkeypatch):
    """``--float8`` reaches the traced spec; a bad value is a usage error (exit 2, one line) before any work."""
    from commsched.cli import app

    runner = CliRunner()
    specs = specs_traced_by(monkeypatch, ("trace", "compare"), ["--float8", "Rowwise"])
    assert [spec.float8 for spec in specs] == ["rowwise"] * 2
    res = runner.invoke(app, ["trace", "llama3-8b", "--float8", "fp8"])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "--float8" in lines[0] and "tensorwise" in lines[0], lines
    assert len(specs) == 2  # refused as parsed: nothing traced
