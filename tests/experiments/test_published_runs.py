"""benchmarks/bench_published.py (issue 38): the published runs parse and carry a source and a metric, each maps to
a step the zoo resolves or says why not, and the layer extrapolation agrees with a traced step."""

from __future__ import annotations

import dataclasses

import pytest

from benchmark_modules import benchmark
from commsched.experiments.predict import StepConfig
from commsched.experiments.predict_pipeline import pipeline_job

bench = benchmark("bench_published")
RUNS = bench.load_runs()
PLANS = [bench.plan_run(r) for r in RUNS]


def test_every_run_has_a_source_a_metric_and_a_framework():
    assert len(RUNS) == 36
    assert len({r["id"] for r in RUNS}) == len(RUNS)
    for r in RUNS:
        assert r["source_url"].startswith("https://"), r["id"]
        assert "torchtitan/blob" not in r["source_url"] or "/benchmarks/" not in r["source_url"], r["id"]  # held out
        assert r["metric"] in ("tokens_per_s_per_gpu", "mfu", "step_s"), r["id"]
        assert float(r["value"]) > 0, r["id"]
        assert r["framework"], r["id"]


def test_supported_runs_resolve_and_the_others_say_why():
    supported = [p for p in PLANS if p.supported]
    assert supported and len(supported) < len(PLANS)
    for p in supported:
        assert isinstance(p.config, StepConfig) and not p.reasons, p.id
        if p.run["pp"] > 1:  # no tracing: every option checked, torch's schedule lowered, the stages split
            job = pipeline_job(p.config)[0].resolve()
            assert job.job.world_size == p.run["num_gpus"] and job.program.pp_size == p.run["pp"], p.id
            assert job.batch == p.run["local_batch"] and job.inner.seq_len == p.run["seq_len"], p.id
            continue
        spec = p.config.resolve()  # no tracing: every dimension checked, the mesh planned
        assert spec.plan.world_size == p.run["num_gpus"], p.id
        assert spec.batch == p.run["local_batch"] and spec.seq_len == p.run["seq_len"], p.id
        assert p.profile in bench.SOURCE_PEAK_TFLOPS or p.profile == "mi300x", p.id
    for p in PLANS:
        if not p.supported:
            assert p.reasons and all(p.reasons), p.id
        if p.run["framework"].startswith("Megatron"):
            assert not p.supported, p.id  # a different program: not predicted as torch's FSDP2 step


def test_groups_and_reliability():
    for p in PLANS:
        if p.id.startswith(("tt2404", "tt2408")):
            assert p.group == bench.TT_DOCS
        if p.id.startswith("llama3paper"):
            assert not p.reliable  # the table's numbers as reconstructed, not read
    assert not bench.plan_run(next(r for r in RUNS if r["id"].startswith("fmsfsdp-llama2-70b"))).reliable


def test_a_gpu_variant_the_source_does_not_name_is_mapped_with_its_evidence():
    """torchao's H100 runs go to the 95 GiB HBM2e part (the note says why); the 80 GB part is their sensitivity."""
    for p in (p for p in PLANS if p.id.startswith("torchao-llama3-8b-h100")):
        assert p.profile == "h100-sxm-96g" and any("95.0 GiB" in note for note in p.notes)
        assert bench.ALTERNATIVES["torchao-llama3-8b-h100"] == "h100-sxm"
    assert all(p.profile == "mi300x" for p in PLANS if p.id.startswith("torchao-llama3-8b-mi300x"))


def test_linear_extrapolation_formula():
    assert bench.extrapolate(1.0, 1.5, 2, 32) == pytest.approx(1.0 + 15 * 0.5)
    assert bench.extrapolate(3.0, 5.0, 1, 1) == 3.0


def test_extrapolated_step_matches_a_traced_one():
    """llama-tiny FSDP 8: the 4-layer step extrapolated from 1 and 2 layers within 2 % of the traced one."""
    pr = bench.Predictor(log=lambda msg: None)
    config = StepConfig(preset="llama-tiny", parallel="fsdp", world_size=8, batch=2, ac="full")
    traced = pr.one(config, "h100-sxm", 4)
    est = pr.estimate(config, "h100-sxm", 1, depth=4)
    assert est.how == "1 and 2 layers extrapolated to 4"
    assert est.step_s == pytest.approx(traced.step_s, rel=0.02)
    assert est.model_flops_per_token == pytest.approx(traced.model_flops_per_token, rel=1e-9)  # linear in layers
    full = pr.estimate(dataclasses.replace(config, source="another run"), "h100-sxm", None, depth=4)  # trace shared
    assert full.how == "all 4 layers" and full.step_s == traced.step_s


def test_pipeline_runs_map_to_the_pipeline_path_or_say_why():
    """PP rows: the schedule, V and M = local_batch / micro_batch from the TOML or the assumption; Megatron's VP is
    its interleaved schedule; an option the pipeline path lacks is the one-line refusal; a llama-tiny PP step is
    predict_pipeline's at full depth whatever --layers-scale says."""
    by_id = {p.id: p for p in PLANS}
    c = by_id["llama3paper-405b-h100-8192-tp8-pp16-dp64"].config
    assert (c.pp_size, c.pp_schedule, c.microbatches, c.stages_per_rank, c.ac) == (16, "Interleaved1F1B", 32, 2, "none")
    cp = by_id["llama3paper-405b-h100-16384-tp8-cp16-pp16-dp8-128k"]
    assert cp.supported and dict(cp.config.extra)["cp_size"] == 16  # CP under PP: h-ppopts
    nemo = next(r for r in RUNS if r["id"].startswith("nemo260401-llama3-70b"))
    assert (
        bench.schedule_of(nemo, None) == "Interleaved1F1B" and bench.pipeline_fields(nemo, None)["microbatches"] == 128
    )
    from commsched.experiments.predict_pipeline import predict_pipeline

    config = StepConfig(preset="llama-tiny", parallel="fsdp", world_size=4, pp_size=2, microbatches=2, batch=2,
                        optimizer="none", max_norm=None)  # fmt: skip
    est = bench.Predictor(log=lambda msg: None).estimate(config, "h100-sxm", 1)
    p = predict_pipeline(config, "h100-sxm")
    assert est.step_s == p.step_s and est.tokens_per_s_per_gpu == p.tokens_per_s_per_gpu
    assert est.how.startswith("all 2 layers (PP") and f"bubble {100 * p.bubble_fraction:.0f} %" in est.how
