"""The optimizer step (issue 38): AdamW over each rank's local parameters, traced through torch's own functional
AdamW (torch 2.13 ``torch/optim/adam.py``: ``_multi_tensor_adam`` with ``foreach=True``, ``_fused_adam`` with
``fused=True``); its bytes, launches and time as the cost model charges them, its states in the step's persistent
memory, and on real gloo ranks the same update as ``torch.optim.AdamW`` on the unsharded model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from typer.testing import CliRunner
from zoo_helpers import FP32, check_ir, traced

from commsched.cost import estimate_costs, graph_features
from commsched.cost.multi_tensor import CHUNK_ELEMENTS, MAX_BLOCKS, launches
from commsched.hardware import for_graph
from commsched.memory import memory_profile
from commsched.workloads import init_full_params, resolve, shard_for_rank
from commsched.workloads.optimizer import parse_optimizer, reference_adamw
from commsched.workloads.real import expected_rank_outputs, reference_outputs, run_on_gloo, unshard

KW = dict(layers=1, seq_len=256)
FOREACH_AFTER_STEP = {  # torch's _multi_tensor_adam after the step counters, and the bytes each moves per P
    "aten._foreach_mul_.Scalar": 2,  # weight decay, then exp_avg_sq *= beta2: read + write
    "aten._foreach_lerp_.Scalar": 3,  # exp_avg: read it and the grad, write it
    "aten._foreach_addcmul_.Scalar": 3,  # exp_avg_sq += (1 - beta2) g * g: read it and the grad, write it
    "aten._foreach_sqrt.default": 2,  # a new list
    "aten._foreach_div_.ScalarList": 2,
    "aten._foreach_add_.Scalar": 2,  # + eps
    "aten._foreach_addcdiv_.ScalarList": 4,  # param += step_size * exp_avg / denom: read 3, write 1
}


def _optimizer_nodes(g) -> list[int]:
    return [i for i, t in enumerate(g.targets) if t.startswith(("aten._foreach_", "aten._fused_adamw_"))]


def _local_param_bytes(w) -> int:
    return sum(math.prod(p.shard_shape) for p in w.spec.layout) * FP32


# ---------------------------------------------------------------- options
def test_optimizer_option_is_checked_before_tracing():
    assert parse_optimizer(" AdamW-Fused ") == "adamw-fused"
    for bad, words in ((dict(optimizer="sgd"), ["optimizer='sgd'", "adamw-fused"]),
                       (dict(optimizer="adamw", mode="prefill", parallel="tp"), ["mode='train'"])):  # fmt: skip
        with pytest.raises(ValueError) as err:
            resolve("llama3-8b", **{"parallel": "fsdp", "world_size": 8, **bad})
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
    from commsched.rewrites.split_batch import why_not_split

    split = why_not_split(resolve("llama-tiny", parallel="ddp", world_size=2, batch=4, optimizer="adamw"))
    assert split is not None and "each micro-batch's step would update the parameters" in split
    res = CliRunner().invoke(__import__("commsched.cli", fromlist=["app"]).app, ["trace", "llama-tiny", "--optimizer",
                                                                                  "lion"])  # fmt: skip
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "--optimizer" in lines[0], lines


# ---------------------------------------------------------------- traced
@pytest.mark.parametrize("kind", ["adamw", "adamw-fused"])
def test_the_step_ends_with_torchs_adamw_over_the_local_shards(kind):
    """FSDP over 8 ranks: the optimizer's ops come after every reduce_scatter's wait, work on the 9 + 2 x 9 + 2 local
    shards (their states: inputs of the step), and their bytes are the hand count: fused, 7 bytes moved per parameter
    byte (param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written) plus the step counters read;
    foreach, the 20 of its 7 kernels after the counters'."""
    w = traced("llama3-8b", "fsdp", 8, optimizer=kind, **KW)
    none = traced("llama3-8b", "fsdp", 8, **KW)
    check_ir(w)
    g, n = w.graph, len(w.spec.layout)
    assert w.meta["inputs"][: len(none.meta["inputs"])] == none.meta["inputs"]
    assert w.meta["inputs"][len(none.meta["inputs"]) :][::n] == [f"{k}.tok_embeddings.weight" for k in
                                                                 ("exp_avg", "exp_avg_sq", "step")]  # fmt: skip
    nodes = _optimizer_nodes(g)
    last_wait = max(int(wt) for c in g.collectives.tolist() for wt in g.waits_of(c))
    assert min(nodes) > last_wait
    p_bytes, nbytes = _local_param_bytes(w), graph_features(g).nbytes
    assert w.meta["optimizer_state_bytes"] == 2 * p_bytes
    steps = [i for i in nodes if g.targets[i].startswith("aten._foreach_add_") and nbytes[i] < 64 * n]
    assert len(steps) == 1 and nbytes[steps[0]] <= 3 * 4 * n + 8  # the counters: scalars
    rest = [i for i in nodes if i not in steps]
    if kind == "adamw-fused":
        assert [g.targets[i] for i in rest] == ["aten._fused_adamw_.default"]
        assert nbytes[rest[0]] == 7 * p_bytes + 4 * n  # and each counter read
    else:
        assert sorted(g.targets[i] for i in rest) == sorted([*FOREACH_AFTER_STEP, "aten._foreach_mul_.Scalar"])
        for i in rest:
            assert nbytes[i] == FOREACH_AFTER_STEP[g.targets[i]] * p_bytes, g.targets[i]
        assert sum(nbytes[i] for i in rest) == 20 * p_bytes


def test_clipping_is_torchs_clip_grad_norm_on_dtensor_grads():
    """``max_norm`` (torchtitan's ``training.max_norm``), FSDP 4 x TP 2: after the backward's last wait, one
    ``_foreach_norm`` of the local gradients; the stacked norms (one fp32 per parameter) all-reduced over the FSDP
    group, then over TP (DTensor's redistribute, one mesh dimension at a time), each between ``pow(2)`` and
    ``pow(0.5)``; then the clip coefficient and one ``_foreach_mul_`` of the gradients, before AdamW's first kernel.
    Off (None), the graph is node for node the one without the option; DDP's gradients are whole: no all_reduce."""
    from zoo_helpers import assert_same_trace, colls

    from commsched.ir import CollType

    w = traced("llama-tiny", "fsdp+tp", 8, optimizer="adamw-fused", max_norm=1.0, tp_size=2, **KW)
    check_ir(w)
    g, n = w.graph, len(w.spec.layout)
    assert w.meta["max_norm"] == 1.0 and "max_norm 1" in w.meta["workload"]
    (norm,) = [i for i, t in enumerate(g.targets) if t == "aten._foreach_norm.Scalar"]
    (mul,) = [i for i, t in enumerate(g.targets) if t == "aten._foreach_mul_.Tensor"]
    fused = g.targets.index("aten._fused_adamw_.default")
    last_wait = max(int(wt) for c in g.collectives.tolist() for wt in g.waits_of(c) if c < norm)
    reduces = [c for c in g.collectives.tolist() if c > norm]
    assert last_wait < norm < min(reduces) and max(reduces) < mul < fused
    fsdp, tp = w.meta["groups"]["fsdp"]["name"], w.meta["groups"]["tp"]["name"]
    assert [g.groups[g.coll_group[c]].name for c in reduces] == [fsdp, tp]
    assert all(g.coll_type[c] == CollType.ALL_REDUCE and g.comm_bytes[c] == n * FP32 for c in reduces)
    assert [g.targets[i] for i in g.inputs(reduces[0])] == ["aten.pow.Tensor_Scalar"]
    assert len(g.inputs(mul)) == n + 1  # every local gradient and the coefficient
    plain = traced("llama-tiny", "fsdp+tp", 8, optimizer="adamw-fused", tp_size=2, **KW)
    assert_same_trace(plain, traced("llama-tiny", "fsdp+tp", 8, optimizer="adamw-fused", tp_size=2, max_norm=None,
                                    **KW))  # fmt: skip
    assert "max_norm" not in plain.meta and len(plain.graph.collectives) == len(g.collectives) - 2
    ddp = traced("llama-tiny", "ddp", 4, max_norm=0.5, **KW)
    assert "aten._foreach_norm.Scalar" in ddp.graph.targets
    assert len(colls(ddp, CollType.ALL_REDUCE)) == len(ddp.meta["ddp_buckets"]["dp"])  # the buckets' only


def test_max_norm_is_checked_before_tracing():
    from commsched.workloads.optimizer import parse_max_norm

    assert parse_max_norm("none") is None and parse_max_norm(" 1 ") == 1.0 and parse_max_norm(None) is None
    for bad, words in (
        (dict(max_norm="-1"), ["max_norm='-1'", "> 0"]),
        (dict(max_norm="x"), ["max_norm='x'"]),
        (dict(max_norm=1.0, mode="prefill", parallel="tp"), ["max_norm=1.0", "mode='prefill'"]),
    ):
        with pytest.raises(ValueError) as err:
            resolve("llama3-8b", **{"parallel": "fsdp", "world_size": 8, **bad})
        assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
    res = CliRunner().invoke(__import__("commsched.cli", fromlist=["app"]).app, ["trace", "llama-tiny", "--max-norm",
                                                                                  "0"])  # fmt: skip
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "--max-norm" in lines[0], lines


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_framework_order_waits_the_gradients_before_the_optimizer(parallel):
    """``optimizer.step()`` runs after ``backward()`` returns, when FSDP2 / DDP have waited their reductions: in the
    framework order no optimizer op (not even the weight decay, which reads no gradient) comes before a wait."""
    from commsched.passes import schedule

    w = traced("llama3-8b", parallel, 8, optimizer="adamw", **KW)
    g = w.graph
    order = schedule(g, estimate_costs(g, "h100-sxm", fusion=False), "framework").order
    pos = {int(v): k for k, v in enumerate(order)}
    waits = [pos[int(wt)] for c in g.collectives.tolist() for wt in g.waits_of(c)]
    assert max(waits) < min(pos[i] for i in _optimizer_nodes(g))


def test_launches_follow_multi_tensor_apply():
    """``MultiTensorApply.cuh``: a launch per 2240 chunks of 65536 elements, or per full list of tensors."""
    assert launches([1], depth=1) == 1 and launches([], depth=4) == 0
    assert launches([CHUNK_ELEMENTS * MAX_BLOCKS], depth=4) == 1
    assert launches([CHUNK_ELEMENTS * MAX_BLOCKS + 1], depth=4) == 2
    assert launches([CHUNK_ELEMENTS * 1000] * 5, depth=4) == 3  # 5000 chunks: 2240 + 2240 + 520
    assert launches([10] * 252, depth=4) == 1 and launches([10] * 253, depth=4) == 2  # 252 tensors at depth 4
    assert launches([10] * 770, depth=1) == 1 and launches([10] * 770, depth=1, scalar_list=True) == 2


def test_fused_adamw_time_is_its_bytes_at_the_elementwise_bandwidth():
    """On h100-sxm the fused kernel is memory-bound: its bytes over HBM bandwidth x the elementwise efficiency, plus
    a launch overhead per launch (and the profile's small-kernel ramp, negligible at gigabytes)."""
    w = traced("llama3-8b", "fsdp", 8, optimizer="adamw-fused", **KW)
    g = w.graph
    hw = for_graph("h100-sxm", g)
    c, f = estimate_costs(g, hw, fusion=False), graph_features(g)
    (fused,) = [i for i in _optimizer_nodes(g) if g.targets[i] == "aten._fused_adamw_.default"]
    ideal = f.nbytes[fused] / (hw.compute.hbm_bandwidth_bytes_per_s * hw.compute.efficiency.elementwise)
    chunks = sum(math.ceil(math.prod(p.shard_shape) / CHUNK_ELEMENTS) for p in w.spec.layout)
    assert f.launches[fused] == math.ceil(chunks / MAX_BLOCKS)
    overhead = f.launches[fused] * hw.compute.launch_overhead_s
    assert ideal < c.node_s[fused] <= ideal * 1.001 + overhead
    assert estimate_costs(g, hw, fusion=True).node_s[fused] == c.node_s[fused]  # never fused (eager, torchtitan)
    foreach = traced("llama3-8b", "fsdp", 8, optimizer="adamw", **KW)
    fc = estimate_costs(foreach.graph, hw, fusion=False)
    total = sum(fc.node_s[i] for i in _optimizer_nodes(foreach.graph))
    assert total == pytest.approx(20 / 7 * c.node_s[fused], rel=0.02)


@pytest.mark.parametrize("kind", ["adamw", "adamw-fused"])
def test_states_are_persistent_memory_and_raise_the_peak(kind):
    """The two states of every local parameter (fp32, as the master weights) exist before the step and stay: the
    persistent bytes rise by 2 x the local parameter bytes (and the scalar step counters); the peak at least as
    much."""
    from commsched.sim import simulate_costs

    w, none = traced("llama3-8b", "fsdp", 8, optimizer=kind, **KW), traced("llama3-8b", "fsdp", 8, **KW)
    p_bytes, n = _local_param_bytes(w), len(w.spec.layout)
    prof, prof0 = (memory_profile(x.graph) for x in (w, none))
    constant = 4 if kind == "adamw" else 0  # the foreach step's CPU tensor(1.0), added to the counters
    assert prof.persistent_bytes - prof0.persistent_bytes == 2 * p_bytes + 4 * n + constant
    peak, peak0 = (simulate_costs(x.graph, estimate_costs(x.graph, "h100-sxm")).peak_memory_bytes for x in (w, none))
    assert peak >= peak0 + 2 * p_bytes


# ---------------------------------------------------------------- real gloo ranks
# foreach and fused AdamW over HSDP's shards (2 replicas x 2), DDP's full parameters and TP's slices (SP's norms);
# clipped (torchtitan's max_norm, small enough to clip) over HSDP's shards, TP's slices and FSDP+EP's experts
MAX_NORM = 0.05
CASES = [("fsdp", "adamw", {"dp_replicate": 2, "fsdp_bucket": "block", "max_norm": MAX_NORM}),
         ("ddp", "adamw-fused", {}), ("tp+sp", "adamw-fused", {"max_norm": MAX_NORM}),
         ("fsdp+ep", "adamw-fused", {"max_norm": MAX_NORM, "ep_size": 2})]  # fmt: skip


@pytest.mark.slow
def test_updates_are_torch_adamw_on_the_unsharded_model():
    """4 gloo ranks, fp32: each rank's updated shards are ``torch.optim.AdamW`` (foreach / fused alike) applied to the
    unsharded parameters with the gradients the ranks computed (to 1e-6: the same elementwise arithmetic); and those
    gradients are the unsharded model's (to 1e-4), so the update is within a step of AdamW on the unsharded model's
    own gradients (Adam divides each gradient by its root mean square: a relative 1e-6 in a gradient near 0 can move
    its update by up to 2 lr). With ``max_norm``, the unsharded model's gradients are first clipped by
    ``torch.nn.utils.clip_grad_norm_``: the ranks' all-reduced norm is the whole model's, so each rank's gradient
    shards (and then its update) are the clipped ones."""
    specs = [resolve("mixtral-tiny" if "ep" in par else "llama-tiny", parallel=par, world_size=4, seq_len=16,
                     batch=2, dtype="float32", attention="sdpa", optimizer=kind, **kw)
             for par, kind, kw in CASES]  # fmt: skip
    for spec, per_rank in zip(specs, run_on_gloo(specs, seed=7), strict=True):
        n, label = len(spec.layout), f"{spec.plan.parallel} {spec.optimizer} {spec.plan.mesh}"
        reference = reference_outputs(spec, seed=7)
        if spec.max_norm is not None:  # the clipping clips: the unclipped norm is above max_norm
            unclipped = reference_outputs(dataclasses.replace(spec, max_norm=None, optimizer="none"), seed=7)
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in unclipped["grads"].values()]))
            assert norm > 2 * spec.max_norm, (label, norm)
            clipped = torch.linalg.vector_norm(torch.stack([g.norm() for g in reference["grads"].values()]))
            assert clipped == pytest.approx(spec.max_norm, rel=1e-4)
        computed = unshard(spec, [outputs[1 : 1 + n] for outputs in per_rank])
        updated = reference_adamw(spec.optimizer, init_full_params(spec.model, seed=7), computed)
        for rank, outputs in enumerate(per_rank):
            expected = expected_rank_outputs(spec, rank, reference)
            assert len(outputs) == len(expected) == 1 + 2 * n
            for got, want in zip(outputs[: 1 + n], expected[: 1 + n], strict=True):
                assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item(), label
            for p, got, want in zip(spec.layout, outputs[1 + n :], expected[1 + n :], strict=True):
                exact = shard_for_rank(p, updated[p.name], spec.plan, rank)
                assert (got - exact).abs().max().item() <= 1e-6 * exact.abs().max().item(), (label, p.name)
                assert (got - want).abs().max().item() <= 2.01 * 8e-4, (label, p.name)
            first = spec.layout[1]  # any parameter moved
            initial = shard_for_rank(first, init_full_params(spec.model, seed=7)[first.name], spec.plan, rank)
            assert not torch.equal(outputs[2 + n], initial), label


# ---------------------------------------------------------------- predict and torchtitan configs
def test_predict_steps_with_torchtitans_adamw(monkeypatch, tmp_path):
    """``commsched predict`` models the whole iteration: AdamW, fused as torchtitan's default ``implementation``
    (``torchtitan/config/job_config.py`` at 4a950ea), unless ``--optimizer`` or the config's ``[optimizer]`` says
    otherwise (``foreach``; 2024's ``fused = false``)."""
    from pathlib import Path

    from commsched.cli import app
    from commsched.experiments.torchtitan import from_torchtitan_config

    asked = _predict_asks(monkeypatch, "optimizer", ([], ["--optimizer", "adamw"], ["--optimizer", "none"]))
    assert asked == ["adamw-fused", "adamw", "none"]
    runner = CliRunner()
    source = Path(__file__).resolve().parents[1] / "data" / "torchtitan" / "llama3_8b.toml"
    text = source.read_text()
    assert from_torchtitan_config(source, world_size=8).optimizer == "adamw-fused"
    for old, new, kind in (("eps = 1e-8", 'eps = 1e-8\nimplementation = "foreach"', "adamw"),
                           ("eps = 1e-8", "eps = 1e-8\nfused = false", "adamw"),
                           ("eps = 1e-8", "eps = 1e-8\nfused = true", "adamw-fused")):  # fmt: skip
        path = tmp_path / "job.toml"
        path.write_text(text.replace(old, new, 1))
        assert from_torchtitan_config(path, world_size=8).optimizer == kind, new
    res = runner.invoke(app, ["predict", "--torchtitan-config", str(path), "-w", "8", "--optimizer", "adamw"])
    assert res.exit_code == 2 and "--optimizer adamw conflicts" in res.stderr, res.output


def test_predict_clips_as_torchtitan_and_reads_max_norm(monkeypatch, tmp_path):
    """``predict`` clips at torchtitan's default ``training.max_norm`` 1.0 unless ``--max-norm`` says otherwise
    (``none``: off); a config's ``[training] max_norm`` is read (a number; anything else refused in one line)."""
    from pathlib import Path

    from commsched.experiments.torchtitan import from_torchtitan_config

    asked = _predict_asks(monkeypatch, "max_norm", ([], ["--max-norm", "0.5"], ["--max-norm", "none"]))
    assert asked == [1.0, 0.5, None]
    source = Path(__file__).resolve().parents[1] / "data" / "torchtitan" / "llama3_8b.toml"
    text = source.read_text()
    assert "max_norm = 1.0" in text and from_torchtitan_config(source, world_size=8).max_norm == 1.0
    path = tmp_path / "job.toml"
    path.write_text(text.replace("max_norm = 1.0", "max_norm = 2"))
    assert from_torchtitan_config(path, world_size=8).build_kwargs()["max_norm"] == 2.0
    path.write_text(text.replace("max_norm = 1.0", 'max_norm = "big"'))
    with pytest.raises(ValueError) as err:
        from_torchtitan_config(path, world_size=8)
    assert "[training] max_norm: expected a number" in str(err.value) and "\n" not in str(err.value)


def _predict_asks(monkeypatch, field: str, extras: tuple[list[str], ...]) -> list:
    """The value of the zoo option ``field`` that ``predict llama3-8b -l 1 EXTRA`` asks the trace for, per extra
    (the trace stopped before any work)."""
    import commsched.experiments.predict
    from commsched.cli import app

    asked: list = []

    def stop(step, progress=None):
        asked.append(step.build_kwargs().get(field, "none" if field == "optimizer" else None))
        raise ValueError("stopped at the trace")

    monkeypatch.setattr(commsched.experiments.predict, "trace", stop)
    for extra in extras:
        res = CliRunner().invoke(app, ["predict", "llama3-8b", "-l", "1", *extra])
        assert res.exit_code == 2 and "stopped at the trace" in res.stderr, res.output
    return asked
