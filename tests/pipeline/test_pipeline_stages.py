"""Pipeline stages from the zoo: torchtitan's split, each stage's traced programs and costs, FSDP's per-step
collectives in the simulator, the ``commsched pipeline`` command."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsched.cli import app
from commsched.pipeline import StageCosts, lower_schedule, simulate_program
from commsched.pipeline.job import PipelineJob, simulate_job
from commsched.pipeline.split import stage_fqns, stages_of
from commsched.pipeline.stages import stage_seconds, trace_stage

runner = CliRunner()


# ---------------------------------------------------------------- torchtitan's split
def test_the_split_is_torchtitan_s_on_its_own_examples():
    """torchtitan's ``_generate_llm_fqn_per_model_part`` (pytorch/torchtitan@b5bcd76, weights 1 and 1): the embedding
    and the norm + output each count as a layer, the first ``effective % stages`` stages get one more."""
    assert stage_fqns(2, 4) == [["tok_embeddings", "layers.0", "layers.1"],
                                ["layers.2", "layers.3", "norm", "lm_head"]]  # fmt: skip
    assert stage_fqns(4, 2) == [["tok_embeddings"], ["layers.0"], ["layers.1"], ["norm", "lm_head"]]
    # Llama 3 8B, P = 4, V = 2: 34 effective layers over 8 stages, 4 each and the first two 5
    sizes = [len([n for n in names if n.startswith("layers.")]) for names in stage_fqns(8, 32)]
    assert sizes == [4, 5, 4, 4, 4, 4, 4, 3]
    assert stage_fqns(1, 3) == [["tok_embeddings", "layers.0", "layers.1", "layers.2", "norm", "lm_head"]]


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 16), st.integers(1, 64))
def test_every_layer_is_in_one_stage_in_order_and_the_effective_sizes_differ_by_at_most_one(stages, layers):
    try:
        fqns = stage_fqns(stages, layers)
    except ValueError as exc:  # torchtitan refuses: fewer effective layers than stages, or a stage too small
        assert str(exc).startswith(f"layers={layers}: {stages} pipeline stages"), exc
        assert layers + 2 < 2 * stages
        return
    flat = [name for names in fqns for name in names]
    assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "lm_head"]
    effective = [len(names) - ("lm_head" in names) for names in fqns]  # norm + output count as one
    assert max(effective) - min(effective) <= 1 and effective == sorted(effective, reverse=True)
    split = stages_of(stages, layers)
    assert [s.first for s in split] == [True] + [False] * (stages - 1)
    assert [s.last for s in split] == [False] * (stages - 1) + [True]


# ---------------------------------------------------------------- traced stages
def _job(**kw) -> PipelineJob:
    base = dict(preset="llama-tiny", parallel="fsdp+tp", world_size=8, tp_size=2, pp_size=2, schedule="1F1B",
                microbatches=4, layers=2)  # fmt: skip
    return PipelineJob(**{**base, **kw})


@pytest.mark.parametrize("pp, v", [(2, 1), (2, 2), (4, 1)])
def test_the_stages_forward_flops_sum_to_the_unsplit_model_s(pp, v):
    schedule = "1F1B" if v == 1 else "Interleaved1F1B"
    job = _job(pp_size=pp, stages_per_rank=v, schedule=schedule, world_size=4 * pp, layers=4).resolve()
    whole = trace_stage(job.compute, True, 4, True)
    parts = [trace_stage(job.compute, *s.shape) for s in job.stages]
    assert len(parts) == pp * v and sum(len(s.layers) for s in job.stages) == 4
    assert sum(p.forward_flops for p in parts) == pytest.approx(whole.forward_flops, rel=1e-12)
    assert whole.forward_flops > 0 and all(p.forward_flops > 0 for p in parts)
    # a stage sends its hidden state (tokens / tp under SP: tp alone here, so every token), in the compute dtype
    cfg = job.inner.model
    assert {p.send_bytes for p in parts[:-1]} == {job.inner.seq_len * cfg.dim * 2} and parts[-1].send_bytes == 0


def test_one_stage_is_the_zoo_step_with_the_parameters_fsdp_hands_the_blocks():
    """P = 1: the stage program of every layer (embedding to loss) takes the zoo's step time, to 1e-6, when the zoo
    step's parameters are the compute-dtype copies FSDP gathers (as the stage's are); with the zoo's fp32 master
    weights cast at each use the zoo step is slower by those casts."""
    from commsched.sim import simulate
    from commsched.workloads import trace_spec

    job = PipelineJob(preset="llama3-8b", parallel="fsdp+tp", world_size=8, tp_size=2, pp_size=2, schedule="1F1B",
                      microbatches=2, layers=2, seq_len=1024).resolve()  # fmt: skip
    secs = stage_seconds(trace_stage(job.compute, True, 2, True), "h100-sxm")
    zoo = simulate(trace_spec(job.compute).graph, "h100-sxm").makespan_s
    assert secs.forward_s + secs.backward_s == pytest.approx(zoo, rel=1e-6)
    assert secs.backward_input_s + secs.backward_weight_s == pytest.approx(secs.backward_s)
    assert 0 < secs.forward_s < secs.backward_s  # a backward does about twice a forward's matmuls
    fp32_master = dataclasses.replace(job.compute, master_dtype=job.inner.master_dtype)
    assert simulate(trace_spec(fp32_master).graph, "h100-sxm").makespan_s > zoo


def test_the_first_stage_s_backward_is_all_weight_gradient_as_torch_runs_it():
    """torch's ``backward_weight_one_chunk`` runs stage 0's whole backward in W (its input needs no gradient); a
    later stage's I computes the input gradient, its W the weight gradients."""
    job = _job(parallel="tp", world_size=4).resolve()
    first, middle = (trace_stage(job.compute, *s.shape) for s in job.stages)
    assert not (first.weight & first.forward).any()
    backward = ~first.forward & (first.graph.kinds != 6)
    assert (first.weight == backward).all()
    assert 0 < middle.weight.sum() < (~middle.forward).sum() - 1


# ---------------------------------------------------------------- the simulated job
@pytest.fixture(scope="module")
def memory_by_m():
    out = {}
    for schedule in ("GPipe", "1F1B"):
        for m in (2, 4, 8):
            step = simulate_job(_job(schedule=schedule, microbatches=m), "h100-sxm")
            out[schedule, m] = step
    return out


def test_gpipe_s_memory_grows_with_m_and_1f1b_s_does_not(memory_by_m):
    gpipe = [memory_by_m["GPipe", m].result.peak_memory_bytes for m in (2, 4, 8)]
    one = [memory_by_m["1F1B", m].result.peak_memory_bytes for m in (2, 4, 8)]
    assert gpipe[0] < gpipe[1] < gpipe[2]
    assert one[0] == one[1] == one[2]  # at most P micro-batches in flight on stage 0
    act = memory_by_m["GPipe", 2].costs.activation_bytes
    assert gpipe[2] - gpipe[1] == 4 * max(act)  # four more micro-batches held by the worst rank (here stage 1's)


def test_a_zoo_job_holds_each_stage_s_backward_transient_at_its_peak(memory_by_m):
    """simulate_job fills ``backward_peak_bytes`` from each traced stage (stage_memory): positive, the stage trace's
    own value, and inside the peak (the peak with it is above the peak with the field zeroed)."""
    from commsched.pipeline.stage_memory import backward_peak_bytes

    step = memory_by_m["1F1B", 4]
    job = step.job
    for stage in job.stages:
        traced = trace_stage(job.compute, *stage.shape)
        assert step.costs.backward_peak_bytes[stage.index] == backward_peak_bytes(traced) > 0
    without = dataclasses.replace(step.costs, backward_peak_bytes=0)
    hw = step.hardware
    bare = simulate_program(job.program, without, hw, ranks_between_stages=job.ranks_between_stages)
    assert step.result.peak_memory_bytes > bare.peak_memory_bytes


def test_fsdp_s_collectives_run_once_per_step_and_the_rates_follow_the_step(memory_by_m):
    step = memory_by_m["1F1B", 4]
    costs = step.costs
    assert all(u > 0 for u in costs.unshard_s) and all(
        r > costs.unshard_s[i] for i, r in enumerate(costs.reduce_grad_s)
    )  # fp32 grads vs bf16 params
    d = step.as_dict()
    assert d["tokens_per_s_per_gpu"] == pytest.approx(4 * 64 / d["step_s"] / (2 * 2))  # batch 4 x seq 64 / (TP x PP)
    assert 0 < d["mfu"] < 1 and d["mesh"] == {"pp": 2, "fsdp": 2, "tp": 2}
    slower = memory_by_m["1F1B", 8]
    assert slower.step_s > step.step_s and slower.tokens_per_s_per_gpu > step.tokens_per_s_per_gpu  # bubble shrinks


def test_unshard_and_reduce_grad_add_their_time_to_1f1b_s_step():
    program = lower_schedule("1F1B", 2, 2)
    base = StageCosts(forward_s=1.0, backward_s=1.0)
    plain = simulate_program(program, base, free_comm=True)
    fsdp = simulate_program(program, dataclasses.replace(base, unshard_s=0.25, reduce_grad_s=[0.5, 0.125]),
                            free_comm=True)  # fmt: skip
    assert fsdp.step_s == pytest.approx(plain.step_s + 0.25 + 0.5)  # every rank starts late; rank 0 finishes last
    assert fsdp.per_rank[0].exposed_comm_s == pytest.approx(plain.per_rank[0].exposed_comm_s + 0.25 + 0.5)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([("1F1B", 1, 1), ("Interleaved1F1B", 2, 2), ("ZBVZeroBubble", 2, 1), ("GPipe", 1, 2)]),
    st.lists(st.integers(0, 2000), min_size=8, max_size=8),
    st.lists(st.integers(0, 2000), min_size=8, max_size=8),
)
def test_fsdp_times_never_shrink_the_step_and_stay_within_each_rank_s_bubble(case, unshard, reduce):
    name, v, m_per_p = case
    program = lower_schedule(name, 4, 4 * m_per_p, v)
    n = program.num_stages
    base = StageCosts(forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=5e-4)
    plain = simulate_program(program, base, free_comm=True)
    fsdp = dataclasses.replace(base, unshard_s=[u * 1e-6 for u in unshard[:n]],
                               reduce_grad_s=[r * 1e-6 for r in reduce[:n]])  # fmt: skip
    res = simulate_program(program, fsdp, free_comm=True)
    assert res.step_s >= plain.step_s - 1e-12
    for r in res.per_rank:
        assert r.exposed_comm_s <= r.bubble_s + 1e-12 and r.busy_s + r.bubble_s == pytest.approx(res.step_s)


# ---------------------------------------------------------------- the command
PIPELINE = ["pipeline", "llama-tiny", "--parallel", "fsdp+tp", "--world-size", "8", "--tp-size", "2", "--pp-size",
            "2", "--layers", "2", "-H", "h100-sxm"]  # fmt: skip


def test_the_command_s_json_has_the_issue_s_fields(memory_by_m):
    res = runner.invoke(app, [*PIPELINE, "--pp-schedule", "1F1B", "--microbatches", "4", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {"step_s", "tokens_per_s_per_gpu", "bubble_fraction", "peak_memory_bytes", "per_rank", "mfu"} <= set(d)
    fields = {"busy_s", "bubble_s", "exposed_comm_s", "peak_memory_bytes"}
    assert len(d["per_rank"]) == 2 and all(fields <= set(r) for r in d["per_rank"])
    assert d["step_s"] == pytest.approx(memory_by_m["1F1B", 4].step_s)  # the same job as the library's
    assert d["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in d["per_rank"])
    table = runner.invoke(app, [*PIPELINE, "--pp-schedule", "Interleaved1F1B", "--microbatches", "4"])
    assert table.exit_code == 0 and "Interleaved1F1B" in table.output and "tokens/s per GPU" in table.output


@pytest.mark.parametrize("args, words", [
    (["--pp-size", "4", "--world-size", "16", "-V", "2", "--pp-schedule", "Interleaved1F1B"],
     ["layers=2", "8 pipeline stages"]),
    (["--pp-schedule", "DualPipeV", "--microbatches", "2"], ["DualPipeV", "microbatches", "torch refuses"]),
    (["--pp-size", "3"], ["pp_size=3", "world_size=8"]),
    (["--parallel", "ep"], ["parallel='ep'", "mixture-of-experts"]),
    (["--pp-schedule", "1F1B", "-V", "2"], ["stages_per_rank=2", "1F1B"]),
    (["--batch", "3", "--microbatches", "2"], ["batch=3", "microbatches=2"]),
])  # fmt: skip
def test_bad_options_exit_2_with_one_line_naming_them(args, words):
    res = runner.invoke(app, [*PIPELINE, *args])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert all(w in lines[0] for w in words), lines[0]
