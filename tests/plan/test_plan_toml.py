"""The winner as a torchtitan job config: torchtitan is not installable here (not in the venv), so each TOML is read
back with the reader commsched uses for torchtitan's own configs (``experiments/torchtitan.py``: torchtitan's keys
at 4a950ea, unknown keys refused) and round-tripped through ``from_torchtitan_config`` to the same step."""

from __future__ import annotations

import dataclasses

import pytest

from commsched.experiments.torchtitan import _degrees, from_torchtitan_config, read_config
from commsched.plan import Layout, PlanRequest
from commsched.plan.layout import step_config
from commsched.plan.toml_out import torchtitan_toml

REQ = PlanRequest(preset="llama3-8b", gpus=16, seq_len=8192, global_batch=32)
FIELDS = ("preset", "parallel", "world_size", "seq_len", "batch", "tp_size", "ac", "compile", "float8",
          "float8_all_gather", "dp_replicate", "extra")  # fmt: skip


@pytest.mark.parametrize("layout", [
    Layout(dp_shard=16),
    Layout(dp_shard=2, tp=8, sp=True, ac="full"),
    Layout(dp_shard=4, dp_replicate=2, tp=2, sp=True, ac="selective-op", float8="tensorwise"),
    Layout(dp_shard=4, cp=2, tp=2, sp=True, ac="selective-layer:2", float8="rowwise"),
], ids=lambda lay: lay.label())  # fmt: skip
def test_toml_round_trips_to_the_same_step(tmp_path, layout: Layout) -> None:
    path = tmp_path / "job.toml"
    path.write_text(torchtitan_toml(REQ, layout))
    back = from_torchtitan_config(path)
    mine = step_config(REQ, layout, None)
    assert {f: getattr(back, f) for f in FIELDS} == {f: getattr(mine, f) for f in FIELDS}


def test_pipeline_toml_has_torchtitans_keys(tmp_path) -> None:
    """PP (which from_torchtitan_config refuses: the zoo's predict has no PP) is checked key by key."""
    layout = Layout(dp_shard=2, pp=4, tp=2, sp=True, pp_schedule="Interleaved1F1B", microbatches=8, stages_per_rank=2)
    path = tmp_path / "pp.toml"
    path.write_text(torchtitan_toml(REQ, layout))
    cfg = read_config(path)  # unknown keys or wrong types raise
    d = _degrees(cfg)
    assert (d.pp, d.shard, d.tp, d.replicate, d.cp) == (4, 2, 2, 1, 1)
    assert cfg.get("parallelism.pipeline_parallel_schedule") == "Interleaved1F1B"
    local = REQ.batch // layout.dp
    assert local // cfg.get("parallelism.pipeline_parallel_microbatch_size") == layout.microbatches
    parts = cfg.get("parallelism.module_fqns_per_model_part")
    assert len(parts) == layout.pp * layout.stages_per_rank
    assert [m for part in parts for m in part if m.startswith("layers.")] == [f"layers.{i}" for i in range(32)]


def test_tp_without_sp_says_so(tmp_path) -> None:
    text = torchtitan_toml(REQ, Layout(dp_shard=2, tp=8, sp=False))
    assert "always shards the sequence" in text
    path = tmp_path / "tp.toml"
    path.write_text(text)
    assert from_torchtitan_config(path).parallel == "fsdp+tp+sp"  # what torchtitan would run
    assert dataclasses.replace(Layout(dp_shard=2, tp=8, sp=True)).parallel() == "fsdp+tp+sp"
