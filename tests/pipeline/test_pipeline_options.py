"""Every option ``predict`` takes, under pipeline parallelism (issue 39): AC per stage, float8, compile, async TP,
the optimizer step and gradient clipping (the norm all-reduced over the pipeline ranks too), HSDP, DDP, CP and EP,
each traced on fake tensors as the zoo traces it without PP, and the ``commsched pipeline`` options that give them."""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsched.cli import app
from commsched.ir import CollType, OpKind
from commsched.pipeline import StageCosts, lower_schedule, simulate_program
from commsched.pipeline.job import PipelineJob, simulate_job, with_optimizer
from commsched.pipeline.per_step import TailSeconds, float8_gathered, sync_seconds
from commsched.pipeline.stages import stage_seconds, trace_stage

runner = CliRunner()
HW = "h100-sxm"
BASE = dict(preset="llama-tiny", parallel="fsdp+tp", world_size=8, tp_size=2, pp_size=2, schedule="1F1B",
            microbatches=4, layers=2)  # fmt: skip
MM = "aten.mm.default"


def _job(**kw) -> PipelineJob:
    return PipelineJob(**{**BASE, **kw})


@functools.cache
def _cached(items: tuple) -> object:
    return simulate_job(_job(**dict(items)), HW)


def _step(**kw):
    """The simulated step of BASE with ``kw`` (shared between tests)."""
    return _cached(tuple(sorted(kw.items())))


def _flops(traced, target: str | None = None) -> float:
    g = traced.graph
    return float(sum(g.flops[i] for i in range(len(g)) if target is None or g.targets[i] == target))


def _colls(traced, kind: CollType) -> int:
    g = traced.graph
    return int(sum(g.coll_type[i] == kind for i in g.collectives.tolist()))


# ---------------------------------------------------------------- AC
def test_ac_recomputes_each_checkpointed_block_and_its_stage_holds_less():
    """A middle stage of two blocks on one rank: full AC adds exactly the stage's forward flops (the recompute) and
    holds only the blocks' inputs and the output sent (three hidden states); selective-op recomputes every second
    matmul (wk, wo, w3: the zoo's expectation, tests/workloads/test_ac.py) and holds in between."""
    spec = _job(parallel="fsdp", tp_size=None, world_size=4, layers=4).resolve().compute
    none, sel, full = (trace_stage(spec, False, 2, False, (p, p)) for p in ("none", "selective-op", "full"))
    assert _flops(full) == pytest.approx(_flops(none) + none.forward_flops, rel=1e-9)
    assert full.forward_flops == none.forward_flops
    cfg, tokens = spec.model, spec.batch * spec.seq_len
    kv = cfg.n_kv_heads * cfg.head_dim
    assert _flops(sel, MM) == _flops(none, MM) + 2 * tokens * cfg.dim * (kv + cfg.dim + cfg.ffn_dim) * 2
    hidden = tokens * cfg.dim * spec.dtype.itemsize
    assert full.activation_bytes == 3 * hidden < sel.activation_bytes < none.activation_bytes
    secs = [stage_seconds(t, HW, fusion=False) for t in (none, sel, full)]
    assert secs[0].forward_s == secs[2].forward_s and secs[0].backward_s < secs[1].backward_s < secs[2].backward_s


def test_a_layer_rule_checkpoints_each_stage_s_blocks_by_their_global_index():
    """selective-layer:2 over 4 layers in 2 stages (torchtitan's split: layers 0-1, 2-3): the 0-based layers 1 and 3
    are checkpointed, so each stage's second block; each stage then holds less and recomputes more than without."""
    job = _job(ac="selective-layer:2", layers=4).resolve()
    assert [job.policies(s) for s in job.stages] == [("none", "full"), ("none", "full")]
    ac, none = _step(ac="selective-layer:2", layers=4), _step(layers=4)
    assert all(a < n for a, n in zip(ac.costs.activation_bytes, none.costs.activation_bytes))
    assert all(a > n for a, n in zip(ac.costs.backward_s, none.costs.backward_s))
    assert ac.costs.forward_s == none.costs.forward_s
    assert ac.result.peak_memory_bytes < none.result.peak_memory_bytes and ac.step_s > none.step_s


# ---------------------------------------------------------------- float8, compile, async TP
def test_float8_stages_run_scaled_matmuls_and_fsdp_holds_tensorwise_weights_in_one_byte():
    """FSDP gathers tensorwise weights in float8 (torchtitan's enable_fsdp_float8_all_gather), rowwise in bf16."""
    plain, tensorwise = _step(), _step(float8="tensorwise")
    rowwise = _job(float8="rowwise").resolve()
    job = tensorwise.job
    for resolved in (job, rowwise):
        assert any("_scaled_mm" in t for t in resolved.trace(resolved.stages[0], HW).graph.targets)
    assert not float8_gathered(rowwise.inner)
    names = {job.inner.layout[i].name for i in job.inner.float8_params}
    for stage in job.stages:
        f8 = sum(math.prod(p.local_shape) for p in job.stage_layout(stage) if p.name in names)
        i = stage.index
        assert f8 > 0 and plain.costs.static_bytes[i] - tensorwise.costs.static_bytes[i] == f8  # 2 bytes -> 1
        assert tensorwise.costs.unshard_s[i] < plain.costs.unshard_s[i]
        assert sync_seconds(rowwise.inner, stage, plain.hardware)[0] == plain.costs.unshard_s[i]


def test_compile_fuses_each_stage_s_kernels_as_predict_does():
    eager, compiled = _step(), _step(compile=True)
    for i, stage in enumerate(compiled.job.stages):
        traced = compiled.job.trace(stage, HW)
        assert compiled.costs.forward_s[i] == stage_seconds(traced, HW, fusion=True).forward_s
        assert eager.costs.forward_s[i] == stage_seconds(traced, HW, fusion=False).forward_s
        assert compiled.costs.forward_s[i] < eager.costs.forward_s[i]
        assert compiled.costs.backward_s[i] < eager.costs.backward_s[i]
    assert compiled.step_s < eager.step_s


def test_async_tp_fuses_each_stage_s_sequence_parallel_sites_and_keeps_its_halves():
    """TP + SP: the blocks' all_gather -> matmul and matmul -> reduce_scatter become copy-engine transfers under
    partial matmuls (predict's rewrite); the forward stays the graph's prefix, the flops are the same, F and B
    shrink."""
    sync, fused = _step(parallel="fsdp+tp+sp", compile=True), _step(parallel="fsdp+tp+sp", compile=True, async_tp=True)
    for i, stage in enumerate(fused.job.stages):
        before, after = sync.job.trace(stage, HW), fused.job.trace(stage, HW)
        assert after.graph.meta["async_tp"]["sites"] > 0
        n = int(after.forward.sum())
        assert after.forward[:n].all() and not after.forward[n:].any() and not (after.weight & after.forward).any()
        assert _flops(after) == pytest.approx(_flops(before), rel=1e-12)
        f, s = fused.costs, sync.costs
        assert f.forward_s[i] < s.forward_s[i] and f.backward_s[i] < s.backward_s[i]
        assert f.backward_input_s[i] + f.backward_weight_s[i] == pytest.approx(f.backward_s[i])


@pytest.mark.parametrize("kw, words", [
    (dict(async_tp=True), ["async_tp", "compile"]),
    (dict(async_tp=True, compile=True, parallel="fsdp", tp_size=None), ["async_tp", "tensor parallelism"]),
])  # fmt: skip
def test_async_tp_is_refused_as_predict_refuses_it(kw, words):
    with pytest.raises(ValueError) as err:
        _job(**kw).resolve()
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value)


# ---------------------------------------------------------------- the optimizer step and clipping
def test_the_optimizer_step_follows_each_rank_s_last_reduce_and_clipping_waits_for_every_rank():
    bare = _step(optimizer="none", max_norm=None)
    assert bare.step_s == bare.schedule_result.step_s and all(t.total_s == 0 for t in bare.tails)
    fused, foreach, clipped = _step(max_norm=None), _step(optimizer="adamw", max_norm=None), _step()
    assert all(t.norm_s == 0 < t.after_s for t in fused.tails)
    assert all(a.after_s > b.after_s for a, b in zip(foreach.tails, fused.tails))  # foreach: more kernels
    ends = [int(e.max()) * 1e-9 for e in fused.schedule_result.end_ns]
    assert fused.step_s == pytest.approx(max(e + t.total_s for e, t in zip(ends, fused.tails)), abs=2e-9)
    assert all(t.norm_s > 0 for t in clipped.tails)  # the local norms and their all_reduce over FSDP and TP
    from commsched.cost.collectives import plan_collective

    pp_norm = plan_collective("all_reduce", 4, 2, clipped.hardware, stride=4).time_s
    barrier = max(e + t.norm_s for e, t in zip(ends, clipped.tails)) + pp_norm
    assert clipped.step_s == pytest.approx(barrier + max(t.after_s for t in clipped.tails), abs=4e-9)
    # AdamW's two states per parameter shard, in the master dtype
    for i, stage in enumerate(bare.job.stages):
        shard = sum(math.prod(p.shard_shape) for p in bare.job.stage_layout(stage)) * 4
        assert fused.costs.static_bytes[i] - bare.costs.static_bytes[i] == 2 * shard


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([("1F1B", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2)]),
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), min_size=4, max_size=4),
    st.one_of(st.none(), st.integers(0, 500)),
    st.integers(0, 3),
    st.integers(1, 1000),
)
def test_the_optimizer_never_shrinks_the_step_and_grows_it_with_its_cost(case, tails_us, pp_norm_us, rank, more_us):
    name, v = case
    program = lower_schedule(name, 4, 8, v)
    res = simulate_program(program, StageCosts(forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=5e-4),
                           free_comm=True)  # fmt: skip
    tails = tuple(TailSeconds(n * 1e-6, a * 1e-6) for n, a in tails_us)
    pp_norm = None if pp_norm_us is None else pp_norm_us * 1e-6
    full = with_optimizer(res, tails, pp_norm)
    assert full.step_s >= res.step_s
    for r, before in zip(full.per_rank, res.per_rank):
        assert r.busy_s + r.bubble_s == pytest.approx(full.step_s) and r.busy_s >= before.busy_s
        assert before.exposed_comm_s <= r.exposed_comm_s <= r.bubble_s + 1e-12
        assert r.peak_memory_bytes == before.peak_memory_bytes
    grown = list(tails)
    grown[rank] = dataclasses.replace(tails[rank], after_s=tails[rank].after_s + more_us * 1e-6)
    assert with_optimizer(res, tuple(grown), pp_norm).step_s >= full.step_s
    if pp_norm is not None:  # the norm's all_reduce is a barrier: every rank steps after the slowest one's norm
        ends = [int(e.max()) * 1e-9 for e in res.end_ns]
        barrier = max(e + t.norm_s for e, t in zip(ends, tails)) + pp_norm
        assert full.step_s == pytest.approx(max(res.step_s, barrier + max(t.after_s for t in tails)), abs=1e-8)


# ---------------------------------------------------------------- HSDP, DDP, CP, EP
def test_hsdp_all_reduces_each_reduced_shard_across_the_replicas_and_sits_in_torchtitan_s_mesh_order():
    fsdp, hsdp = _step(), _step(world_size=16, dp_replicate=2)
    assert hsdp.costs.unshard_s == fsdp.costs.unshard_s and hsdp.costs.forward_s == fsdp.costs.forward_s
    assert all(h > f for h, f in zip(hsdp.costs.reduce_grad_s, fsdp.costs.reduce_grad_s))
    assert list(hsdp.as_dict()["mesh"].items()) == [("pp", 2), ("dp_replicate", 2), ("fsdp", 2), ("tp", 2)]
    assert hsdp.job.ranks_between_stages == 8  # PP outermost: pipeline rank r's ranks start at 8 r
    assert hsdp.tokens_per_s_per_gpu == pytest.approx(4 * 64 / hsdp.step_s / (2 * 2))


def test_ddp_replicas_all_reduce_the_gradients_once_after_the_last_backward():
    ddp, tp_ddp = _step(parallel="ddp", tp_size=None), _step(parallel="tp")
    for step in (ddp, tp_ddp):
        plan = step.job.inner.plan
        assert plan.dp == 4 // plan.tp > 1 and plan.fsdp == 1
        assert all(u == 0 for u in step.costs.unshard_s) and all(r > 0 for r in step.costs.reduce_grad_s)
        for i, stage in enumerate(step.job.stages):  # master weights, gradients, AdamW states: nothing unsharded
            numel = sum(math.prod(p.local_shape) for p in step.job.stage_layout(stage))
            assert step.costs.static_bytes[i] == 4 * 4 * numel
        tp_only = _colls(_step().job.trace(_step().job.stages[0], HW), CollType.ALL_REDUCE)  # TP's, per micro-batch
        assert _colls(step.job.trace(step.job.stages[0], HW), CollType.ALL_REDUCE) == (0 if step is ddp else tp_only)


def test_cp_splits_each_micro_batch_s_sequence_over_its_ranks():
    plain, cp = _step(parallel="fsdp", tp_size=None), _step(parallel="fsdp", tp_size=None, cp_size=2)
    assert cp.job.compute.plan.cp == 2 and cp.job.inner.plan.cp == 2
    assert [2 * b for b in cp.costs.send_bytes] == list(plain.costs.send_bytes)
    assert all(c < p for c, p in zip(cp.costs.activation_bytes, plain.costs.activation_bytes))
    ring = cp.job.trace(cp.job.stages[0], HW).graph
    assert any(ring.groups[int(ring.coll_group[i])].size == 2 for i in ring.collectives.tolist())
    assert cp.tokens_per_s_per_gpu == pytest.approx(4 * 64 / cp.step_s / (2 * 2))  # / (CP x PP)


@pytest.mark.parametrize("parallel, world", [("fsdp+ep", 8), ("ep", 4)])
def test_each_micro_batch_of_a_moe_stage_runs_its_all_to_alls(parallel, world):
    step = _step(preset="mixtral-tiny", parallel=parallel, world_size=world, tp_size=None, ep_size=2)
    assert step.job.compute.plan.ep == 2
    for stage in step.job.stages:  # per block: dispatch and combine in the forward and in the backward
        traced = step.job.trace(stage, HW)
        assert _colls(traced, CollType.ALL_TO_ALL) == 4 * len(stage.layers)
        forward = np.flatnonzero(traced.forward)
        assert int((traced.graph.kinds[forward] == OpKind.COLLECTIVE).sum()) == 2 * len(stage.layers)
    fsdp = parallel == "fsdp+ep"
    assert all((u > 0) == fsdp for u in step.costs.unshard_s) and all(r > 0 for r in step.costs.reduce_grad_s)
    assert step.step_s > 0 and step.result.peak_memory_bytes > max(step.costs.static_bytes)


# ---------------------------------------------------------------- the command
PIPELINE = ["pipeline", "llama-tiny", "--parallel", "fsdp+tp", "--world-size", "8", "--tp-size", "2", "--pp-size",
            "2", "--layers", "2", "-H", HW, "--microbatches", "4"]  # fmt: skip


def _options(command: str) -> dict[str, str]:
    """Each long option of ``command`` and its help text."""
    import typer.main

    cmd = typer.main.get_command(app).commands[command]
    return {next(o for o in p.opts if o.startswith("--")): p.help for p in cmd.params if p.param_type_name == "option"}


def test_the_command_takes_every_option_predict_takes_with_its_help():
    mine, predict = _options("pipeline"), _options("predict")
    own = {"--torchtitan-config", "--num-nodes", "--gpus-per-node"}  # predict's cluster and config-file options
    assert set(predict) - own <= set(mine)
    # --json's help names what it writes; predict's PP options say they need --pp-size > 1
    shared = set(predict) - own - {"--json", "--pp-size", "--pp-schedule", "--microbatches", "--stages-per-rank"}
    assert {"--ac", "--float8", "--compile", "--async-tp", "--dp-replicate", "--cp-size", "--ep-size"} <= shared
    assert {o: predict[o] for o in shared} == {o: mine[o] for o in shared}


def test_the_json_echoes_the_options_and_matches_the_library():
    args = ["--ac", "selective-op", "--compile", "--optimizer", "adamw", "--max-norm", "0.5", "--json"]
    res = runner.invoke(app, [*PIPELINE, *args])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    given = {"ac": "selective-op", "compile": True, "optimizer": "adamw", "max_norm": 0.5, "float8": "none"}
    assert {k: d["options"][k] for k in given} == given
    same = _step(ac="selective-op", compile=True, optimizer="adamw", max_norm=0.5)
    assert d["step_s"] == pytest.approx(same.step_s) and len(d["optimizer_s"]) == 2
    assert d["peak_memory_bytes"] == same.result.peak_memory_bytes


@pytest.mark.parametrize("args, words", [
    (["--mode", "decode"], ["--mode decode", "training"]),
    (["--kv-len", "128"], ["--kv-len 128"]),
    (["--fsdp-bucket", "param"], ["--fsdp-bucket param", "block"]),
    (["--async-tp"], ["async_tp", "--compile"]),
    (["--ac", "sometimes"], ["ac='sometimes'"]),
    (["--float8", "bf8"], ["float8"]),
    (["--dp-replicate", "2"], ["tp_size=2", "world_size=2"]),
    (["--cp-size", "3"], ["cp_size=3"]),
    (["--parallel", "ep"], ["parallel='ep'", "mixture-of-experts"]),
    (["--parallel", "bogus"], ["parallel='bogus'", "fsdp+ep"]),
    (["--optimizer", "sgd"], ["optimizer='sgd'"]),
])  # fmt: skip
def test_bad_combinations_exit_2_with_one_line_naming_the_option(args, words):
    res = runner.invoke(app, [*PIPELINE, *args])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert all(w in lines[0] for w in words), lines[0]


def test_an_async_tp_stage_is_scaled_and_cached_as_any_other(tmp_path, monkeypatch):
    """A stage of 6 blocks under async TP: costed from rewritten traces of 2 and 3 blocks, as without async TP, to
    1e-5 of the rewritten full trace (the backward 2 ns off in 1.53 ms: ns rounding); once recorded, a second
    process's lookup traces nothing (before, every PP layout with async TP traced its whole stages afresh: 7-37
    CPU-s each in a 70B plan)."""
    from commsched.pipeline import cache

    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    job = _job(parallel="fsdp+tp+sp", compile=True, async_tp=True, layers=12).resolve()
    shape = (False, 6, False)
    scaled = cache.stage_record(job.compute, shape, HW, async_tp=True)
    full = cache.stage_record(job.compute, shape, HW, async_tp=True, scale=False)
    plain = cache.stage_record(job.compute, shape, HW)
    assert scaled.traced_layers == (2, 3) and full.traced_layers == (6,)
    for name in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s"):
        got, want = getattr(scaled.times, name), getattr(full.times, name)
        assert got == pytest.approx(want, rel=1e-5), name
        assert got < getattr(plain.times, name) or name == "backward_weight_s"  # async TP hides TP's collectives
    assert scaled.activation_bytes == full.activation_bytes
    cache._RECORDS.clear()  # a new process: memory empty, the disk record read back

    def no_trace(*args, **kwargs):
        raise AssertionError("traced again")

    monkeypatch.setattr(cache, "trace_stage", no_trace)
    assert cache.stage_record(job.compute, shape, HW, async_tp=True) == scaled
