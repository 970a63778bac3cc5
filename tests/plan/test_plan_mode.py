"""``plan --mode prefill|decode``: the inference layouts the zoo runs (hypothesis: each resolves as its step), the
weights + KV-cache memory bound, the CLI on llama-tiny (every row fits, ranked by tokens/s per GPU, the winner's
step as ``commsched trace --mode`` + ``commsched simulate`` give it), the mesh + TP plan as Python, and the
combinations refused in one line."""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsched.cli import app
from commsched.plan import Layout, PlanRequest
from commsched.plan.enumerate import inference_layouts
from commsched.plan.layout import LAYOUT_FIELDS, step_config
from commsched.plan.prune import memory_lower_bound_bytes
from commsched.plan.python_out import INFERENCE_MESH_ORDER, inference_python
from commsched.plan.search import Judged, plan_hardware

NEUTRAL = {"dp_shard": 1, "pp": 1, "pp_schedule": None, "microbatches": 1, "stages_per_rank": 1, "ac": "none",
           "float8": "none", "reshard_after_forward": True, "async_tp": False}  # fmt: skip
"""what a layout's training fields are under inference"""
GPUS, BATCH, SEQ = 4, 8, 128


def assert_valid_inference_layout(req: PlanRequest, layout: Layout, gpus_per_node: int) -> None:
    """The invariants every enumerated inference layout keeps, and the zoo resolves its step."""
    model = req.model()
    assert layout.world_size == req.gpus and {k: getattr(layout, k) for k in NEUTRAL} == NEUTRAL
    assert gpus_per_node % layout.tp == 0 and model.n_heads % layout.tp == 0 and model.n_kv_heads % layout.tp == 0
    assert req.batch % layout.dp == 0 and layout.dp == layout.dp_replicate
    assert not (layout.sp and layout.tp == 1)
    if layout.cp > 1:
        assert req.mode == "prefill" and layout.tp > 1 and req.seq % (2 * layout.cp) == 0 and req.kv % layout.cp == 0
    if layout.ep > 1:
        assert model.n_experts % layout.ep == 0 and layout.tp == layout.cp == 1 and layout.dp_replicate == req.gpus
    spec = step_config(req, layout, 1).resolve()  # raises for a step the zoo does not run
    assert spec.mode == req.mode and spec.plan.tp == layout.tp and spec.plan.cp == layout.cp
    assert spec.plan.world_size * layout.dp_replicate == req.gpus * (layout.ep if layout.ep > 1 else 1)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["llama3-8b", "llama-tiny", "mixtral-8x7b"]), st.sampled_from(["prefill", "decode"]),
       st.integers(0, 6), st.sampled_from([4, 8]), st.sampled_from([1, 3, 8]),
       st.sampled_from([256, 1000, 4096]))  # fmt: skip
def test_every_inference_layout_is_one_the_zoo_runs(preset, mode, log_gpus, gpus_per_node, per_gpu, seq) -> None:
    gpus = 1 << log_gpus
    if gpus > gpus_per_node and gpus % gpus_per_node:
        return
    req = PlanRequest(preset=preset, gpus=gpus, global_batch=per_gpu * gpus, seq_len=seq, mode=mode)
    layouts = list(inference_layouts(req, gpus_per_node))
    assert len(set(layouts)) == len(layouts)
    for layout in layouts:
        assert_valid_inference_layout(req, layout, gpus_per_node)
    assert Layout(dp_shard=1, dp_replicate=gpus) in layouts  # a replica per GPU: the batch splits over the GPUs
    assert any(lay.tp == min(gpus, gpus_per_node, 8) for lay in layouts) or gpus == 1


def test_memory_bound_counts_weights_and_the_kv_cache() -> None:
    """Each position of a sequence's cache adds layers x K, V x KV heads x head_dim x 2 bytes to the bound; TP splits
    the weights (and each sequence's heads); no optimizer state (far under a training layout's bound)."""
    req = PlanRequest(preset="llama3-8b", gpus=8, global_batch=8, seq_len=8192, mode="decode")
    m = req.model()
    one = Layout(dp_shard=1, dp_replicate=8)
    per_position = m.n_layers * 2 * m.n_kv_heads * m.head_dim * 2
    longer = dataclasses.replace(req, kv_len=2 * 8192)
    assert memory_lower_bound_bytes(longer, one) - memory_lower_bound_bytes(req, one) == per_position * 8192
    tp8 = Layout(dp_shard=1, tp=8)  # one replica of 8 sequences: each rank 1/8 of their heads (the same cache)
    weights_bytes = m.total_params() * 2
    saved = memory_lower_bound_bytes(req, one) - memory_lower_bound_bytes(req, tp8)
    assert saved == pytest.approx(weights_bytes * 7 / 8, abs=1)
    train = PlanRequest(preset="llama3-8b", gpus=8, global_batch=8, seq_len=8192)
    assert memory_lower_bound_bytes(req, one) < memory_lower_bound_bytes(train, Layout(dp_replicate=8, dp_shard=1)) / 4


def _request(mode: str) -> PlanRequest:
    return PlanRequest(preset="llama-tiny", gpus=GPUS, global_batch=BATCH, seq_len=SEQ, mode=mode)


def _plan_cli(tmp_path, mode: str, *extra: str) -> tuple[Any, dict]:
    out = tmp_path / f"{mode}.json"
    args = ["plan", "llama-tiny", "--gpus", str(GPUS), "--mode", mode, "--global-batch", str(BATCH), "--seq-len",
            str(SEQ), "-j", "1", "--top", "20", "--json", str(out), *extra]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return res, json.loads(out.read_text())


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, dict]:
    """Both modes planned once (llama-tiny on 4 GPUs, every layer traced), in a scratch trace cache."""
    tmp = tmp_path_factory.mktemp("plan_mode")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMMSCHED_CACHE_DIR", str(tmp / "cache"))
        return {mode: _plan_cli(tmp, mode)[1] for mode in ("prefill", "decode")}


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_rows_fit_are_ranked_and_keep_the_json_keys(planned, mode: str) -> None:
    data, req = planned[mode], _request(mode)
    rows, hbm = data["ranked"], plan_hardware(req).compute.hbm_capacity_bytes
    assert data["request"]["mode"] == mode and len(rows) == data["candidates_judged"] - data["over_memory"] >= 5
    rates = [r["tokens_per_s_per_gpu"] for r in rows]
    assert rates == sorted(rates, reverse=True)
    tokens = BATCH * (1 if mode == "decode" else SEQ)  # decode: one new token per sequence a step
    keys = {f.name for f in dataclasses.fields(Judged)} | {"label"}
    for r in rows:
        layout = Layout.from_dict(r["layout"])
        assert set(r) == keys and set(r["layout"]) == set(LAYOUT_FIELDS)
        assert {k: r["layout"][k] for k in NEUTRAL} == NEUTRAL
        assert memory_lower_bound_bytes(req, layout) <= r["peak_memory_bytes"] <= hbm  # the bound is a bound
        assert r["tokens_per_s_per_gpu"] == pytest.approx(tokens / r["step_s"] / GPUS)
    assert {r["layout"]["cp"] > 1 for r in rows} == ({True, False} if mode == "prefill" else {False})


def test_a_mixture_of_experts_decodes_under_ep_within_its_bound(tmp_path, monkeypatch) -> None:
    """mixtral-tiny: the EP layouts (every rank its own sequences, the experts split) are judged, and the weights +
    KV-cache bound stays under each simulated peak, EP's and TP's."""
    from commsched.plan import plan

    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "cache"))
    req = PlanRequest(preset="mixtral-tiny", gpus=GPUS, global_batch=BATCH, mode="decode")
    result = plan(req, jobs=1)
    assert {j.layout.ep for j in result.ranked} == {1, 2, 4} and not result.failed
    for j in result.ranked:
        assert memory_lower_bound_bytes(req, j.layout) <= j.peak_memory_bytes
    by_ep = {j.layout.ep: j.peak_memory_bytes for j in result.ranked if j.layout.tp == 1}
    assert by_ep[4] < by_ep[2] < by_ep[1]  # EP splits the experts


def _trace_args(req: PlanRequest, layout: Layout) -> list[str]:
    """``commsched trace`` options of the step plan judged ``layout`` on (one replica group's)."""
    config = step_config(req, layout, None)
    kw = config.build_kwargs()
    args = ["--parallel", kw["parallel"], "--world-size", str(kw["world_size"]), "--batch", str(kw["batch"]),
            "--seq-len", str(kw["seq_len"]), "--mode", kw["mode"], "--kv-len", str(kw["kv_len"])]  # fmt: skip
    for key, option in (("tp_size", "--tp-size"), ("cp_size", "--cp-size"), ("ep_size", "--ep-size")):
        if key in kw:
            args += [option, str(kw[key])]
    return args


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_the_winner_and_a_tp_row_simulate_to_the_same_step(planned, mode: str, tmp_path, monkeypatch) -> None:
    """``commsched trace PRESET --mode ...`` of the row's replica group, then ``commsched simulate``: the step plan
    ranked (every layer traced here, the framework's order kept unless ``optimize`` beat it)."""
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "cache"))
    data, req = planned[mode], _request(mode)
    tp = next(r for r in data["ranked"] if r["layout"]["tp"] > 1)
    for row in {id(r): r for r in (data["ranked"][0], tp)}.values():
        graph, summary = tmp_path / "g.json", tmp_path / "s.json"
        layout = Layout.from_dict(row["layout"])
        traced = CliRunner().invoke(app, ["trace", "llama-tiny", *_trace_args(req, layout), "-o", str(graph)])
        assert traced.exit_code == 0, traced.output
        simulated = CliRunner().invoke(app, ["simulate", str(graph), "-H", "h100-sxm", "--json", str(summary)])
        assert simulated.exit_code == 0, simulated.output
        step_s = json.loads(summary.read_text())["makespan_s"]
        assert row["framework_step_s"] == pytest.approx(step_s, rel=1e-9), shlex.join(_trace_args(req, layout))
        assert row["step_s"] <= step_s * (1 + 1e-9)


def test_cli_prints_the_latency_and_writes_the_mesh_not_a_toml(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "cache"))
    py = tmp_path / "serve.py"
    res, data = _plan_cli(tmp_path, "decode", "--python", str(py), "--top", "3")
    assert "latency (the step: a generated token per sequence): winner" in res.output
    assert "no torchtitan TOML for inference" in res.output and not list(tmp_path.glob("*.toml"))
    namespace: dict = {}
    exec(compile(py.read_text(), "serve.py", "exec"), namespace)
    winner = Layout.from_dict(data["ranked"][0]["layout"])
    assert namespace["DEGREES"] == {name: getattr(winner, name) for name in INFERENCE_MESH_ORDER}


@pytest.mark.parametrize("layout", [
    Layout(dp_shard=1, tp=4, sp=True),
    Layout(dp_shard=1, dp_replicate=2, tp=2),
    Layout(dp_shard=1, dp_replicate=4),
], ids=lambda lay: lay.label())  # fmt: skip
def test_inference_snippet_builds_its_mesh_under_a_fake_process_group(layout: Layout) -> None:
    """The snippet's calls run on CPU under the fake backend for a tiny torchtitan-shaped model: the mesh has the
    layout's dimensions, TP's weights (the root's too) are DTensors on the tp dimension, the model is in eval mode."""
    from tests.plan.torchtitan_shapes import tiny_torchtitan_llama
    from torch.distributed.tensor import DTensor

    from commsched import fake_process_group

    req = PlanRequest(preset="llama-tiny", gpus=layout.world_size, global_batch=8, mode="prefill", compile=False)
    namespace: dict = {}
    exec(compile(inference_python(req, layout), "serve.py", "exec"), namespace)
    model = tiny_torchtitan_llama()
    with fake_process_group(layout.world_size):
        mesh, out = namespace["build"](model, device_type="cpu")
    names = tuple(n for n in INFERENCE_MESH_ORDER if getattr(layout, n) > 1) or ("dp_replicate",)
    assert mesh.mesh_dim_names == names
    assert out is model and not model.training
    for weight in (model.layers["0"].attention.wq.weight, model.lm_head.weight):
        assert isinstance(weight, DTensor) == (layout.tp > 1)


@pytest.mark.parametrize(("args", "says"), [
    ("--mode serve", "mode='serve': expected one of train, prefill, decode"),
    ("--mode decode --ac full", "--ac is for --mode train, not --mode decode"),
    ("--mode prefill --max-pp 2", "--max-pp is for --mode train"),
    ("--mode prefill --toml best.toml", "no torchtitan TOML for inference"),
    ("--mode decode --explain --layout tp=2", "--explain is for --mode train"),
    ("--kv-len 128", "kv_len=128: a KV cache is for mode prefill or decode"),
    ("--mode decode --seq-len 128 --kv-len 64", "kv_len=64: expected >= seq_len=128"),
    ("--mode decode --global-batch 2 --hbm 0.001", "no layout fits"),
])  # fmt: skip
def test_bad_combinations_exit_2_in_one_line(args: str, says: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["plan", "llama-tiny", "--gpus", "2", "-j", "1", *shlex.split(args)])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], res.output
    assert not list(tmp_path.iterdir())
