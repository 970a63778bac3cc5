"""Two layout options plan judges: FSDP's ``reshard_after_forward=False`` (the zoo traces it: no re-gather in the
backward, the gathered weights held until then) and async TP (rewritten right after the trace, cached as such).
Each: enumerated where it applies, judged numbers moving the right way, written in the torchtitan TOML and read back
by ``experiments/torchtitan.py``, bad values one line (CLI exit 2)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_errors import one_error_line
from commsched.experiments.predict import StepConfig, predict_workload, trace
from commsched.experiments.torchtitan import from_torchtitan_config
from commsched.plan import Layout, PlanRequest
from commsched.plan.enumerate import enumerate_layouts
from commsched.plan.explain import candidate_changes, parse_layout
from commsched.plan.judge import judge_task
from commsched.plan.layout import pipeline_job, step_config
from commsched.plan.prune import memory_lower_bound_bytes
from commsched.plan.python_out import fsdp2_python
from commsched.plan.search import plan_hardware
from commsched.plan.toml_out import torchtitan_toml
from commsched.plan.traced import trace_key_of

GATHERS = "_c10d_functional.all_gather_into_tensor"


def _step(layers: int, reshard: bool) -> tuple[int, int, int]:
    """(all_gathers, peak bytes, one block's gathered bytes) of llama3-8b under FSDP 8, few tokens (the weights
    dominate the memory)."""
    config = StepConfig(preset="llama3-8b", parallel="fsdp", world_size=8, layers=layers, seq_len=256,
                        reshard_after_forward=reshard)  # fmt: skip
    w = trace(config)
    gathers = sum(1 for t in w.graph.targets if str(t).startswith(GATHERS))
    block = sum(math.prod(p.full_shape) for p in w.spec.layout if p.unit == "layers.0") * w.spec.dtype.itemsize
    return gathers, predict_workload(w, config, "h100-sxm").peak_memory_bytes, block


def test_without_reshard_the_backward_gathers_nothing_and_holds_each_block() -> None:
    steps = {(n, r): _step(n, r) for n in (2, 4) for r in (True, False)}
    for n in (2, 4):
        # forward: the embedding, each block, the final unit; the backward re-gathers the embedding and the blocks
        assert steps[n, True][0] == 2 * (n + 1) + 1 and steps[n, False][0] == n + 2
        assert steps[n, False][1] > steps[n, True][1]
    block = steps[2, True][2]
    rise = [steps[n, False][1] - steps[n, True][1] for n in (2, 4)]
    assert rise[1] - rise[0] == pytest.approx(2 * block, rel=0.05)  # two more blocks held: two blocks' weights


def test_without_reshard_our_peak_matches_torchs_fsdp_mem_tracker() -> None:
    """FSDP2's ``fully_shard(reshard_after_forward=False)`` under torch's FSDPMemTracker (fake tensors) holds the
    embedding's gathered weight too, which its backward never reads."""
    from commsched.peers.torch_memory import compare_peak

    config = StepConfig(preset="llama3-8b", parallel="fsdp", world_size=8, layers=2, batch=1, seq_len=1024,
                        optimizer="adamw", reshard_after_forward=False)  # fmt: skip
    assert abs(compare_peak(config).ratio - 1) <= 0.05


@pytest.mark.slow
def test_without_reshard_the_step_is_the_unsharded_models_on_gloo() -> None:
    """2 real FSDP ranks that keep their gathered weights (with full AC: the recompute reads the held weights, no
    re-gather): each rank's loss and gradient shards are the unsharded model's."""
    from commsched.workloads import resolve
    from commsched.workloads.real import expected_rank_outputs, reference_outputs, run_on_gloo

    common = dict(parallel="fsdp", world_size=2, seq_len=16, batch=2, dtype="float32", attention="sdpa",
                  fsdp_bucket="block", reshard_after_forward=False)  # fmt: skip
    specs = [resolve("llama-tiny", **common), resolve("llama-tiny", ac="full", **common)]
    for spec, per_rank in zip(specs, run_on_gloo(specs, seed=3), strict=True):
        reference = reference_outputs(spec, seed=3)
        for rank, outputs in enumerate(per_rank):
            expected = expected_rank_outputs(spec, rank, reference)
            assert len(outputs) == len(expected) == 1 + len(spec.layout)
            for got, want in zip(outputs, expected, strict=True):
                assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item(), (spec.ac, rank)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["llama3-8b", "llama3-70b"]), st.integers(1, 6), st.sampled_from(["h100-sxm", "a100-sxm-80g"]),
       st.booleans())  # fmt: skip
def test_options_are_enumerated_where_they_apply(preset: str, log_gpus: int, hardware: str, compiled: bool) -> None:
    req = PlanRequest(preset=preset, gpus=1 << log_gpus, hardware=hardware, seq_len=1024, compile=compiled,
                      ac_policies=("full",), float8_recipes=("none",))  # fmt: skip
    layouts = set(enumerate_layouts(req, 8, float8_ok=False))
    for lay in layouts:
        if not lay.reshard_after_forward:
            assert lay.fsdp > 1 and lay.pp == 1
        if lay.async_tp:
            assert lay.tp > 1 and lay.sp and compiled and hardware == "h100-sxm"
        plain = dataclasses.replace(lay, reshard_after_forward=True, async_tp=False)
        assert plain in layouts  # each option doubles a layout, never replaces it
        if lay.fsdp > 1 and lay.pp == 1:
            assert dataclasses.replace(lay, reshard_after_forward=not lay.reshard_after_forward) in layouts
        if lay.tp > 1 and lay.sp and compiled and hardware == "h100-sxm" and (lay.pp == 1 or lay.async_tp):
            assert dataclasses.replace(lay, async_tp=not lay.async_tp) in layouts
    only = dataclasses.replace(req, reshard_after_forward=(True,), async_tp=(False,))
    assert all(lay.reshard_after_forward and not lay.async_tp for lay in enumerate_layouts(only, 8, False))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([Layout(dp_shard=256, ac="full"), Layout(dp_shard=32, tp=8, sp=True, ac="full"),
                        Layout(dp_shard=64, dp_replicate=4, ac="selective-op", float8="tensorwise")]),
       st.sampled_from([1, 2, 4]))  # fmt: skip
def test_the_memory_bound_charges_the_held_weights(layout: Layout, batch_per_gpu: int) -> None:
    req = PlanRequest(preset="llama3-70b", gpus=256, seq_len=8192, global_batch=256 * batch_per_gpu)
    held = dataclasses.replace(layout, reshard_after_forward=False)
    weights = req.model().total_params() / layout.tp  # at least one byte each (float8), gathered
    assert memory_lower_bound_bytes(req, held) >= memory_lower_bound_bytes(req, layout)
    assert memory_lower_bound_bytes(req, held) >= weights


def _judged(req: PlanRequest, layout: Layout) -> dict:
    spec = {"request": dataclasses.asdict(req), "hardware": plan_hardware(req), "optimize": True,
            "layouts": [layout.to_dict()]}  # fmt: skip
    row = judge_task(spec)[0]
    assert row["error"] is None, row["error"]
    return row


def test_judged_numbers_move_the_right_way(tmp_path, monkeypatch) -> None:
    """Without reshard: more memory, the same or a shorter framework step (fewer gathers). Async TP: less
    exposed communication and a shorter framework step, the rewritten trace cached under its own key."""
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    req = PlanRequest(preset="llama-tiny", gpus=4, seq_len=2048, layers_scale=0)
    fsdp = Layout(dp_shard=4, ac="full")
    kept = _judged(req, dataclasses.replace(fsdp, reshard_after_forward=False))
    base = _judged(req, fsdp)
    assert kept["framework_peak_bytes"] > base["framework_peak_bytes"]
    assert kept["framework_step_s"] <= base["framework_step_s"]
    tp = Layout(dp_shard=2, tp=2, sp=True)
    fused, plain = _judged(req, dataclasses.replace(tp, async_tp=True)), _judged(req, tp)
    assert fused["framework_exposed_s"] < plain["framework_exposed_s"]
    assert fused["framework_step_s"] < plain["framework_step_s"]
    configs = [step_config(req, dataclasses.replace(tp, async_tp=a), None) for a in (False, True)]
    assert trace_key_of(configs[0]) != trace_key_of(configs[1])
    again = _judged(req, dataclasses.replace(tp, async_tp=True))  # from the cache: the rewrite is not applied twice
    assert again["framework_step_s"] == pytest.approx(fused["framework_step_s"])


REQ = PlanRequest(preset="llama3-8b", gpus=16, seq_len=8192, global_batch=32)


def test_a_pipeline_job_takes_every_option_of_its_layout() -> None:
    """Under PP the options the enumeration gives reach the pipeline job (none is dropped); reshard-after-forward
    is no choice there (the stages keep their weights, torchtitan's default)."""
    layout = Layout(dp_shard=2, dp_replicate=2, cp=2, tp=2, sp=True, pp=2, pp_schedule="1F1B", microbatches=2,
                    async_tp=True, ac="full")  # fmt: skip
    job = pipeline_job(REQ, layout, 4)
    assert (job.cp_size, job.dp_replicate, job.async_tp, job.compile, job.ac) == (2, 2, True, REQ.compile, "full")
    assert job.world_size == layout.world_size and job.tp_size == 2
    with pytest.raises(ValueError, match="reshard_after_forward=False is a choice without PP only"):
        pipeline_job(REQ, dataclasses.replace(layout, reshard_after_forward=False), 4)


@pytest.mark.parametrize("layout", [
    Layout(dp_shard=16, ac="full", reshard_after_forward=False),
    Layout(dp_shard=4, dp_replicate=2, tp=2, sp=True, ac="selective-op", reshard_after_forward=False, async_tp=True),
    Layout(dp_shard=2, tp=8, sp=True, ac="full", async_tp=True),
], ids=lambda lay: lay.label())  # fmt: skip
def test_toml_and_python_carry_the_options(tmp_path, layout: Layout) -> None:
    path = tmp_path / "job.toml"
    path.write_text(torchtitan_toml(REQ, layout))
    back, mine = from_torchtitan_config(path), step_config(REQ, layout, None)
    assert (back.reshard_after_forward, back.async_tp) == (layout.reshard_after_forward, layout.async_tp)
    assert back == dataclasses.replace(mine, source=back.source, notes=back.notes)
    text = fsdp2_python(REQ, layout)
    compile(text, "layout.py", "exec")
    assert f"RESHARD_AFTER_FORWARD = {layout.reshard_after_forward}" in text
    assert f"ASYNC_TP = {layout.async_tp}" in text and "enable_symm_mem_for_group" in text


def test_explain_offers_each_option_as_one_change() -> None:
    req = PlanRequest(preset="llama3-70b", gpus=256, global_batch=256)
    layout = Layout(dp_shard=32, tp=8, sp=True, ac="full")
    changes = {lay: what for what, _, lay in candidate_changes(req, layout, float8_ok=True)}
    assert "no reshard" in changes[dataclasses.replace(layout, reshard_after_forward=False)]
    assert changes[dataclasses.replace(layout, async_tp=True)] == "async TP"
    assert parse_layout("dp_shard=32,tp=8,sp=true,ac=full,async_tp=true,reshard_after_forward=false") == (
        dataclasses.replace(layout, async_tp=True, reshard_after_forward=False))  # fmt: skip


def test_torchtitan_reader_takes_each_reshard_value(tmp_path) -> None:
    def read(value: str, pp: int = 1) -> StepConfig:
        path = tmp_path / "job.toml"
        path.write_text(f'[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_shard_degree = '
                        f'{8 // pp}\npipeline_parallel_degree = {pp}\n'
                        f'fsdp_reshard_after_forward = "{value}"\n')  # fmt: skip
        return from_torchtitan_config(path)

    assert read("never").reshard_after_forward is False
    assert read("always").reshard_after_forward is True and read("default").reshard_after_forward is True
    with pytest.raises(ValueError, match=r"fsdp_reshard_after_forward: 'sometimes': expected one of") as info:
        read("sometimes")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="'always' under pipeline parallelism"):
        read("always", pp=2)


@pytest.mark.parametrize(("args", "words"), [
    (["--reshard-after-forward", "maybe"], ("--reshard-after-forward", "'maybe'", "true or false")),
    (["--async-tp", "yes,no"], ("--async-tp", "'yes'", "true or false")),
    (["--explain", "--layout", "dp_shard=2,async_tp=on"], ("async_tp='on'", "true or false")),
])  # fmt: skip
def test_bad_option_values_are_one_line(args: list[str], words: tuple[str, ...]) -> None:
    one_error_line(["plan", "llama-tiny", "--gpus", "2", "-j", "1", *args], *words)
