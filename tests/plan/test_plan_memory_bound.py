"""plan's memory bound on pipelines (:func:`commsched.plan.prune.memory_lower_bound_bytes` with
:func:`commsched.plan.prune.pipeline_live_layers`): below the peak plan judges for every schedule it enumerates and
the two others torch has, where each holds a different number of micro-batches."""

from __future__ import annotations

import dataclasses

import pytest

from commsched.plan import Layout, PlanRequest
from commsched.plan.judge import judge_task
from commsched.plan.prune import memory_lower_bound_bytes, pipeline_live_layers
from commsched.plan.search import plan_hardware

REQ = PlanRequest(preset="llama-tiny", gpus=4, layers=8, seq_len=256, global_batch=16, layers_scale=0)
SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": 2, "ZBVZeroBubble": 2, "InterleavedZeroBubble": 2}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMMSCHED_CACHE_DIR", str(tmp_path_factory.mktemp("memory_bound_cache")))
        layouts = [Layout(dp_shard=2, pp=2, pp_schedule=name, microbatches=8, stages_per_rank=v, ac="none")
                   for name, v in SCHEDULES.items()]  # fmt: skip
        spec = {"request": dataclasses.asdict(REQ), "hardware": plan_hardware(REQ),
                "layouts": [lay.to_dict() for lay in layouts]}  # fmt: skip
        return dict(zip(SCHEDULES, judge_task(spec), strict=True))


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_the_bound_is_below_the_judged_pipeline_peak(rows, schedule) -> None:
    row = rows[schedule]
    assert row["error"] is None
    layout = Layout.from_dict(row["layout"])
    assert 0 < memory_lower_bound_bytes(REQ, layout) <= row["peak_memory_bytes"]


def test_schedules_that_hold_more_micro_batches_have_higher_bounds(rows) -> None:
    """GPipe holds all 8 micro-batches' blocks on a rank, 1F1B 2 on the first rank (of 4 blocks each): the bounds
    and the judged peaks order alike."""
    assert pipeline_live_layers("GPipe", 2, 8, 1, 8) == 8 * 4 and pipeline_live_layers("1F1B", 2, 8, 1, 8) == 2 * 4
    bound = {name: memory_lower_bound_bytes(REQ, Layout.from_dict(r["layout"])) for name, r in rows.items()}
    assert bound["GPipe"] > bound["1F1B"]
    assert rows["GPipe"]["peak_memory_bytes"] > rows["1F1B"]["peak_memory_bytes"]
