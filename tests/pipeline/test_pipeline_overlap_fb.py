"""The overlap pass on pipeline stages (pipeline/overlap_fb.py): DualPipeV's OVERLAP_F_B pair on an expert-parallel
stage, and the in-stage and pair savings timed on the job's own stage programs (its AC policies, eager or compiled)."""

from __future__ import annotations

import numpy as np
import pytest

from commsched.ir import OpKind
from commsched.pipeline import cache as stage_cache
from commsched.pipeline.job import PipelineJob, simulate_job
from commsched.pipeline.optimize import with_pairs, with_stage_overlap
from commsched.pipeline.overlap_fb import ordered_twice, pair_graph, pair_seconds, stage_savings
from commsched.pipeline.stages import stage_seconds

HW = "h100-sxm"


pytestmark = pytest.mark.usefixtures("own_stage_cache")  # each test a cold process (conftest)


def _overlapping(res, colls: np.ndarray, computes: np.ndarray) -> list[int]:
    """The collectives of ``colls`` that run while some node of ``computes`` runs (positive-length intersection)."""
    s, e = res.start_ns, res.end_ns
    return [int(c) for c in colls if ((s[computes] < e[c]) & (e[computes] > s[c])).any()]


def test_a_moe_pair_hides_one_micro_batchs_all_to_all_under_the_others_compute():
    """fsdp+ep under PP (mixtral-tiny, 2 layers, seq 256, EP 4): the OVERLAP_F_B pair of a middle stage costs
    within [max(F, B), F + B] of the stage's own F and B, strictly less than F + B, because in the overlap pass's
    order an all_to_all of one micro-batch runs under the other's compute (in torch's order, the forward then the
    backward, none does); in the DualPipeV step the pairs make it no longer."""
    job = PipelineJob(preset="mixtral-tiny", parallel="fsdp+ep", world_size=8, ep_size=4, pp_size=2,
                      schedule="DualPipeV", microbatches=4, layers=2, seq_len=256).resolve()  # fmt: skip
    assert job.compute.plan.ep == 4 and [s.shape for s in job.stages][1] == (False, 1, False)
    mid = stage_cache.cached_trace(job.compute, False, 1, False)
    secs = stage_seconds(mid, HW, fusion=False)  # eager, as the job costs it (compile off)
    f_s, b_s = secs.forward_s, secs.backward_s
    pair = pair_seconds(mid, mid, HW, fusion=False)
    assert max(f_s, b_s) <= pair.pair_s < f_s + b_s, (pair, secs)

    g, fwd = pair_graph(mid, mid)
    in_turn, overlapped = ordered_twice(g, HW, fusion=False)
    a2a = np.flatnonzero(g.coll_type >= 0)
    assert len(a2a) >= 4 and all("all_to_all" in g.targets[i] for i in a2a)  # dispatch + combine, each part
    compute = np.flatnonzero((g.kinds == OpKind.COMPUTE) | (g.kinds == OpKind.OTHER))
    hidden = [*_overlapping(overlapped, a2a[fwd[a2a]], compute[~fwd[compute]]),
              *_overlapping(overlapped, a2a[~fwd[a2a]], compute[fwd[compute]])]  # fmt: skip
    assert hidden, "no all_to_all of one micro-batch ran under the other's compute"
    assert not _overlapping(in_turn, a2a[fwd[a2a]], compute[~fwd[compute]])
    assert overlapped.makespan_ns * 1e-9 == pytest.approx(pair.overlapped_s, abs=1e-12)

    step = simulate_job(job, HW)
    paired = with_pairs(step, HW)
    table, costs = paired.costs.overlap_f_b_s, step.costs
    # the two middle stages (both on rank 1) run as a pair
    assert table[1, 2] < costs.forward_s[1] + costs.backward_s[2]
    assert paired.step_s <= step.step_s


@pytest.mark.parametrize("compile_", [False, True])
def test_the_in_stage_savings_are_timed_on_the_jobs_own_stage_programs(compile_):
    """Under --optimize the overlap pass's in-stage saving comes from the stage as the job runs it: its blocks under
    the job's AC policies, its kernels eager or fused as the job's compile says. Full AC recomputes the forward's
    TP collectives in the backward, so the backward's saving differs from the one without AC; the step's F and B
    are the job's less exactly those savings."""
    job = PipelineJob(preset="llama-tiny", parallel="fsdp+tp+sp", world_size=8, tp_size=2, pp_size=2,
                      schedule="1F1B", microbatches=2, layers=2, seq_len=512, ac="full",
                      compile=compile_).resolve()  # fmt: skip
    stage = job.stages[0]
    policies = job.policies(stage)
    assert policies == ("full",)
    mine = stage_savings(job.compute, stage.shape, HW, policies=policies, fusion=compile_)
    no_ac = stage_savings(job.compute, stage.shape, HW, policies=None, fusion=compile_)
    assert mine[1] != no_ac[1]
    other = stage_savings(job.compute, stage.shape, HW, policies=policies, fusion=not compile_)
    assert mine != other
    step = simulate_job(job, HW)
    ordered = with_stage_overlap(step, HW)
    for s, st in enumerate(job.stages):
        save_f, save_b = stage_savings(job.compute, st.shape, HW, policies=job.policies(st), fusion=compile_)
        assert ordered.costs.forward_s[s] == pytest.approx(step.costs.forward_s[s] - save_f, abs=1e-15)
        assert ordered.costs.backward_s[s] == pytest.approx(step.costs.backward_s[s] - save_b, abs=1e-15)
