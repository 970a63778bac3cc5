"""Issue 39: ``commsched predict`` under pipeline parallelism, from the options (``--pp-size`` ...) or a torchtitan
config's ``pipeline_parallel_*`` keys: the step is :func:`commsched.pipeline.job.simulate_job` of the same job, and
bad or unsupported pipeline settings are one-line errors naming the option or the key."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_errors import one_error_line
from commsched.cli import app
from commsched.experiments.predict import StepConfig
from commsched.experiments.predict_pipeline import NOT_COUNTED, RENAMED, job_kwargs, pipeline_job
from commsched.experiments.torchtitan import from_torchtitan_config
from commsched.pipeline.job import PipelineJob, simulate_job

runner = CliRunner()
TT_8B = Path(__file__).resolve().parents[1] / "data" / "torchtitan" / "llama3_8b.toml"
# torchtitan's llama3_8b.toml with 2-way PP, Interleaved1F1B, 4 micro-batches of one 256-token sequence, no AC
PP_EDITS = (
    ("pipeline_parallel_degree = 1", 'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "Interleaved1F1B"'),
    ("seq_len = 8192", "seq_len = 256"),
    ("local_batch_size = 1", "local_batch_size = 4"),
    ('mode = "selective"', 'mode = "none"'),
)
# the same step as options (2 of the 32 layers; the config's world 8 gives FSDP 4 inside each pipeline rank)
PP_OPTIONS = ["llama3-8b", "-p", "fsdp", "-w", "8", "--layers", "2", "--seq-len", "256", "--batch", "4",
              "--pp-size", "2", "--pp-schedule", "interleaved1f1b", "-M", "4"]  # fmt: skip


def _config(tmp_path: Path, *edits: tuple[str, str], name: str = "pp.toml") -> str:
    text = TT_8B.read_text()
    for old, new in (*PP_EDITS, *edits):
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _one_error_line(args: list[str], *words: str) -> str:
    return one_error_line(["predict", *args], *words)


@pytest.fixture(scope="module")
def config_json(tmp_path_factory) -> dict:
    path = _config(tmp_path_factory.mktemp("pp"))
    res = runner.invoke(app, ["predict", "--torchtitan-config", path, "-w", "8", "-l", "2", "-H", "h100-sxm",
                              "--json", "-"])  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_a_torchtitan_config_with_pp_is_simulate_job_of_the_same_job(config_json):
    p = config_json
    # the config's other settings (torchtitan's optimizer and clipping, no AC ...) where PipelineJob takes them
    said = {"ac": "none", "compile": False, "float8": "none", "optimizer": "adamw-fused", "max_norm": 1.0}
    job = PipelineJob(preset="llama3-8b", parallel="fsdp", world_size=8, pp_size=2, schedule="Interleaved1F1B",
                      microbatches=4, stages_per_rank=2, layers=2, seq_len=256, batch=4,
                      **{k: v for k, v in said.items() if k in _job_fields()})  # fmt: skip
    step = simulate_job(job, "h100-sxm")
    assert p["step_s"] == step.step_s and p["peak_memory_bytes"] == step.result.peak_memory_bytes
    assert p["bubble_fraction"] == step.result.bubble_fraction and 0 < p["bubble_fraction"] < 1
    assert p["tokens_per_s_per_gpu"] == pytest.approx(4 * 256 / p["step_s"] / (1 * 2))  # TP 1 x PP 2
    assert p["mfu"] == pytest.approx(p["model_flops_per_token"] * p["tokens_per_s_per_gpu"] / 989e12)
    assert p["pipeline"]["per_rank"] == step.result.as_dict()["per_rank"]
    assert p["configuration"]["source"] == "pp.toml" and p["configuration_line"].endswith("(from pp.toml)")
    c = p["configuration"]
    assert (c["pp_size"], c["pp_schedule"], c["microbatches"], c["stages_per_rank"]) == (2, "Interleaved1F1B", 4, 2)
    assert p["bound"]["binding"] in ("compute", "pipeline bubble", "communication")
    assert any("optimizer step" in n for n in p["notes"]) == ("optimizer" not in _job_fields())


def test_the_options_give_the_same_job_as_the_config(tmp_path, monkeypatch):
    """The CLI's StepConfigs of PP_OPTIONS and of the config differ only in their source: the same PipelineJob."""
    import commsched.experiments.predict_pipeline as pp

    asked: list[StepConfig] = []

    def stop(step, *args, **kwargs):
        asked.append(step)
        raise ValueError("stopped before the trace")

    monkeypatch.setattr(pp, "predict_pipeline", stop)
    _one_error_line([*PP_OPTIONS, "--ac", "none"], "stopped before the trace")
    _one_error_line(["--torchtitan-config", _config(tmp_path), "-w", "8", "-l", "2"], "stopped before the trace")
    options, config = asked
    assert pipeline_job(options)[0] == pipeline_job(config)[0]
    assert dataclasses.replace(config, source="options", stages_per_rank=None) == options  # V: the config's default


def _pp_line(extra: str, schedule: str = "Interleaved1F1B") -> tuple[str, str]:
    """An edit of the PP config: its schedule line, and ``extra`` keys of [parallelism] after it."""
    return 'pipeline_parallel_schedule = "Interleaved1F1B"', f'pipeline_parallel_schedule = "{schedule}"\n{extra}'


def test_torchtitan_derives_m_and_v_as_pipeline_llm_does(tmp_path):
    """M = local_batch_size / pipeline_parallel_microbatch_size; V = ceil((32 layers + 2) / layers_per_stage) / PP,
    1 for GPipe / 1F1B and 2 for the others when layers_per_stage is unset; the data-parallel degree excludes PP."""

    def pp_fields(*edits: tuple[str, str]) -> tuple:
        s = from_torchtitan_config(_config(tmp_path, *edits), world_size=8)
        return s.pp_size, s.pp_schedule, s.microbatches, s.stages_per_rank, s.parallel, s.batch

    assert pp_fields() == (2, "Interleaved1F1B", 4, 2, "fsdp", 4)
    assert pp_fields(_pp_line("pipeline_parallel_microbatch_size = 2", "1f1b")) == (2, "1F1B", 2, 1, "fsdp", 4)
    assert pp_fields(_pp_line("pipeline_parallel_layers_per_stage = 3"))[3] == 6  # ceil(34 / 3) = 12 stages
    assert pp_fields(_pp_line("pipeline_parallel_layers_per_stage = 17", "GPipe"))[3] == 1
    # global batch: local 4 x dp 4 (world 8 / pp 2) = 16 is no accumulation
    assert pp_fields(("max_norm = 1.0", "max_norm = 1.0\nglobal_batch_size = 16"))[5] == 4


def test_bad_pipeline_keys_and_options_are_one_line_errors(tmp_path):
    bad = [  # (edit of the PP config, words of the error)
        (_pp_line("pipeline_parallel_microbatch_size = 3"), ["[parallelism] pipeline_parallel_microbatch_size", "3"]),
        (_pp_line("pipeline_parallel_layers_per_stage = 5"), ["pipeline_parallel_layers_per_stage", "7 stages"]),
        (_pp_line("pipeline_parallel_layers_per_stage = 17"), ["pipeline_parallel_layers_per_stage", "at least 2"]),
        (_pp_line("", "Looped1F1B"), ["[parallelism] pipeline_parallel_schedule", "'Looped1F1B'", "GPipe"]),
        (_pp_line('pipeline_parallel_schedule_csv = "s.csv"'), ["pipeline_parallel_schedule_csv", "not yet"]),
        (_pp_line("pipeline_parallel_first_stage_less_layers = 2"), ["first_stage_less_layers", "not yet"]),
        (_pp_line("pipeline_parallel_microbatch_size = true"), ["pipeline_parallel_microbatch_size", "an integer"]),
        (("max_norm = 1.0", "max_norm = 1.0\nglobal_batch_size = 32"), ["global_batch_size", "degree 4 = 16"]),
    ]  # DDP under PP (data_parallel_replicate_degree alone, -p ddp) runs since h-ppopts
    for edit, words in bad:
        path = _config(tmp_path, edit)
        _one_error_line(["--torchtitan-config", path, "-w", "8", "-l", "2"], path, *words)  # -l 2: quick if not
    path = _config(tmp_path)
    _one_error_line(["--torchtitan-config", path, "-w", "8", "-M", "8"], "--microbatches 8 conflicts", "batch_size")
    _one_error_line(["llama3-8b", "-M", "4"], "--microbatches", "--pp-size > 1")
    _one_error_line(["llama3-8b", "--pp-schedule", "ZBV"], "--pp-schedule", "ZBVZeroBubble")
    _one_error_line([*PP_OPTIONS[:-2], "-M", "3"], "microbatches=3", "batch=4")
    _one_error_line(["llama3-8b", "-l", "2", "--pp-size", "2", "-V", "2"], "stages_per_rank=2", "1F1B runs one")


def _job_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(PipelineJob)}


@pytest.mark.parametrize(
    "field, value",
    [("ac", "full"), ("compile", True), ("float8", "rowwise"), ("async_tp", True), ("dp_replicate", 2),
     ("optimizer", "adamw"), ("max_norm", 2.0)],
)  # fmt: skip
def test_each_option_passes_to_pipeline_job_or_is_refused_by_name(field, value):
    """An option PipelineJob has is passed through unchanged (so each field it gains is taken); one it lacks is
    refused in one line naming the flag (or the config key), unless off, or on at predict's default (noted)."""
    bare = StepConfig(preset="llama-tiny", parallel="fsdp", world_size=4, pp_size=2, layers=2, optimizer="none",
                      max_norm=None)  # every feature off  # fmt: skip
    target = RENAMED.get(field, field)
    step = dataclasses.replace(bare, **{field: value})
    if target in _job_fields():
        assert job_kwargs(step)[0][target] == value
        return
    flag = f"--{field.replace('_', '-')}" + ("" if value is True else f" {value}")
    with pytest.raises(ValueError, match=f"^{re.escape(flag)}: not yet supported under pipeline parallelism"):
        job_kwargs(step)
    from_config = dataclasses.replace(step, source="job.toml")
    with pytest.raises(ValueError, match="not yet supported under pipeline parallelism"):
        job_kwargs(from_config)
    assert job_kwargs(bare)[1] == ()  # off: nothing to leave out
    if field in NOT_COUNTED:  # predict's default (on) is kept, and the step says it leaves it out
        default = next(f.default for f in dataclasses.fields(StepConfig) if f.name == field)
        notes = job_kwargs(dataclasses.replace(bare, **{field: default}))[1]
        assert len(notes) == 1 and NOT_COUNTED[field].format(value=default) in notes[0]


def test_extra_options_pass_or_are_refused_and_m_defaults_to_p_times_v():
    base = StepConfig(preset="llama-tiny", parallel="fsdp", world_size=4, pp_size=2, layers=2)
    cp = dataclasses.replace(base, extra=(("cp_size", 2),))
    if "cp_size" in _job_fields():
        assert job_kwargs(cp)[0]["cp_size"] == 2
    else:
        with pytest.raises(ValueError, match=r"^--cp-size 2: not yet supported"):
            job_kwargs(cp)
    assert job_kwargs(base)[0]["microbatches"] == 2  # 1F1B: P x 1
    assert job_kwargs(dataclasses.replace(base, pp_schedule="ZBVZeroBubble"))[0]["microbatches"] == 4  # P x 2
    assert job_kwargs(dataclasses.replace(base, microbatches=6))[0]["microbatches"] == 6


def test_the_terminal_output_has_predicts_rows_the_bubble_and_each_rank():
    args = ["predict", "llama-tiny", "-p", "fsdp+tp", "-w", "8", "--tp-size", "2", "--pp-size", "2", "-M", "4"]
    res = runner.invoke(app, [*args, "-H", "h100-sxm"])
    assert res.exit_code == 0, res.output
    for words in ("step time", "tokens/s per GPU", "MFU (bfloat16)", "peak memory per GPU", "bubble", "pipeline rank",
                  "1F1B M=4 V=1", "what bounds the step"):  # fmt: skip
        assert words in res.stdout, words
