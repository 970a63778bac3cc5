"""Issue 38: ``commsched predict``, the step as the user's framework runs it (FSDP2 / DDP eager, or compiled), from
the zoo options or a torchtitan job config; every number agrees with a direct simulation and with itself."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_errors import one_error_line
from commsched.cli import app
from commsched.experiments.predict import StepConfig, predict_workload
from commsched.experiments.torchtitan import from_torchtitan_config

runner = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "data" / "torchtitan"
TT_8B = DATA / "llama3_8b.toml"
# torchtitan's llama3_8b.toml at world 8, as zoo options (2 of its 32 layers, to stay quick)
OPTIONS_8B = ["llama3-8b", "-p", "fsdp", "-w", "8", "--layers", "2", "--seq-len", "8192", "--batch", "1",
              "--ac", "selective-op"]  # fmt: skip
STEP_8B = StepConfig(preset="llama3-8b", parallel="fsdp", world_size=8, layers=2, seq_len=8192, batch=1,
                     ac="selective-op")  # fmt: skip


def _predict_json(*args: str) -> dict:
    res = runner.invoke(app, ["predict", *args, "-H", "h100-sxm", "--json", "-"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _one_error_line(args: list[str], *words: str) -> str:
    return one_error_line(["predict", *args], *words)


@pytest.fixture(scope="module")
def options_8b() -> dict:
    return _predict_json(*OPTIONS_8B)


@pytest.fixture(scope="module")
def framework_8b():
    """The framework's program of the same step, traced as the references trace it."""
    from commsched.experiments.references import framework_program

    return framework_program("llama3-8b", {"parallel": "fsdp", "world_size": 8, "layers": 2, "seq_len": 8192,
                                           "batch": 1, "ac": "selective-op", "optimizer": "adamw-fused",
                                           "max_norm": 1.0})  # fmt: skip


def test_the_json_has_the_numbers_and_they_agree_with_themselves(options_8b):
    p = options_8b
    for key in ("step_s", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_bytes", "configuration", "hardware",
                "configuration_line", "bound", "order", "kernels", "warnings"):  # fmt: skip
        assert key in p, key
    c = p["configuration"]
    assert (c["preset"], c["parallel"], c["world_size"], c["layers"], c["preset_layers"]) == ("llama3-8b", "fsdp", 8,
                                                                                              2, 32)  # fmt: skip
    assert (c["seq_len"], c["batch"], c["ac"], c["compile"], c["source"]) == (8192, 1, "selective-op", False, "options")
    assert (p["tp"], p["cp"], p["tokens_per_replica"]) == (1, 1, 8192)
    assert p["tokens_per_s_per_gpu"] == pytest.approx(p["tokens_per_replica"] / p["step_s"] / (p["tp"] * p["cp"]))
    assert 0 < p["mfu"] < 1 and 0 < p["hfu"] < 1
    peak = p["hardware"]["peak_flops"]
    assert peak == pytest.approx(989e12)
    assert p["mfu"] == pytest.approx(p["model_flops_per_token"] * p["tokens_per_s_per_gpu"] / peak)
    assert p["order"] == "FSDP2 eager" and p["kernels"].startswith("eager")
    assert p["hardware"]["name"] == "h100-sxm" and p["hardware"]["num_nodes"] == 1
    assert "llama3-8b" in p["configuration_line"] and "2 of 32 layers" in p["configuration_line"]
    assert p["bound"]["what_bounds_the_step"]


def test_the_step_is_a_direct_simulation_of_the_framework_program(options_8b, framework_8b):
    """FSDP2's program (one all_gather per block), costed eager, ordered by the framework pass, simulated."""
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph
    from commsched.passes import schedule
    from commsched.sim import simulate_costs

    g = framework_8b.graph
    hw = for_graph("h100-sxm", g)
    costs = estimate_costs(g, hw, fusion=False)
    sim = simulate_costs(g, costs, schedule(g, costs, "framework").order)
    assert options_8b["step_s"] == pytest.approx(sim.makespan_s, rel=1e-9)
    assert options_8b["peak_memory_bytes"] == sim.peak_memory_bytes
    assert options_8b["step_s"] < simulate_costs(g, costs).makespan_s  # the prefetch hides some of the traced waits


def test_compile_fuses_the_kernels_and_says_how_it_orders(framework_8b):
    """torchtitan compiles each block: Inductor fuses its kernels; FSDP2's hooks stay eager around the blocks, so the
    collectives keep FSDP2's order, and the record says so."""
    eager = predict_workload(framework_8b, STEP_8B)
    compiled = predict_workload(framework_8b, dataclasses.replace(STEP_8B, compile=True))
    assert compiled.step_s < eager.step_s
    assert (eager.order, compiled.order) == ("FSDP2 eager", "FSDP2 eager hooks around compiled blocks")
    assert compiled.kernels.startswith("Inductor-fused") and eager.kernels.startswith("eager")
    assert compiled.order_note == eager.order_note and "moved as FSDP2 eager" in eager.order_note
    assert list(compiled.sim.order) == list(eager.sim.order)
    assert compiled.to_dict()["configuration"]["compile"] is True


def test_compile_on_a_ddp_step_through_the_cli():
    base = ["llama-tiny", "-p", "ddp", "-w", "2"]
    eager, compiled = _predict_json(*base), _predict_json(*base, "--compile")
    assert (eager["order"], compiled["order"]) == ("DDP eager", "DDP eager hooks around compiled blocks")
    assert compiled["step_s"] < eager["step_s"] and compiled["configuration"]["compile"] is True


def test_torchtitan_8b_config_gives_the_same_step_as_the_equivalent_options(options_8b):
    assert from_torchtitan_config(TT_8B, world_size=8) == dataclasses.replace(STEP_8B, layers=None,
                                                                              source="llama3_8b.toml")  # fmt: skip
    p = _predict_json("--torchtitan-config", str(TT_8B), "--world-size", "8", "--layers", "2")
    for key in ("step_s", "tokens_per_s_per_gpu", "mfu", "hfu", "peak_memory_bytes", "order", "kernels"):
        assert p[key] == options_8b[key], key
    same = {k: v for k, v in p["configuration"].items() if k != "source"}
    assert same == {k: v for k, v in options_8b["configuration"].items() if k != "source"}
    assert p["configuration"]["source"] == "llama3_8b.toml"
    assert p["configuration_line"].endswith("(from llama3_8b.toml)")


@pytest.fixture
def traced_steps(monkeypatch):
    """Stops predict at its trace, recording the StepConfig it would trace (nothing is traced)."""
    import commsched.experiments.predict

    asked: list[StepConfig] = []

    def stop(step, progress=None):
        asked.append(step)
        raise ValueError("stopped at the trace")

    monkeypatch.setattr(commsched.experiments.predict, "trace", stop)
    return asked


def test_the_world_comes_from_the_degrees_the_world_size_or_the_nodes(traced_steps, tmp_path):
    """torchtitan configs say degrees: with data_parallel_shard_degree -1 the world is --world-size, or every GPU of
    --num-nodes nodes (8 per h100-sxm node, or --gpus-per-node); a config whose degrees fix it needs neither."""
    nodes = (["-w", "16"], 16), (["--num-nodes", "2"], 16), (["--num-nodes", "2", "--gpus-per-node", "4"], 8)
    for args, world in nodes:
        _one_error_line(["--torchtitan-config", str(TT_8B), *args], "stopped at the trace")
        assert traced_steps[-1].world_size == world and traced_steps[-1].parallel == "fsdp"
    fixed = _variant(tmp_path, "data_parallel_shard_degree = -1", "data_parallel_shard_degree = 4", "fixed.toml")
    _one_error_line(["--torchtitan-config", fixed], "stopped at the trace")
    assert traced_steps[-1].world_size == 4
    _one_error_line(["llama3-8b", "--num-nodes", "4"], "stopped at the trace")  # the options alike
    assert traced_steps[-1].world_size == 32


def test_torchtitan_70b_and_405b_configs():
    """70B: FSDP outside 8-way TP with sequence parallelism (torchtitan's llama3 plan), full AC, 8 sequences per
    data-parallel rank; world 8 is TP only. 405B: float8 tensorwise under 8-way TP (torchao's float8 TP styles:
    float8 sequence all_gathers), compiled with async TP: predicted."""
    step = from_torchtitan_config(DATA / "llama3_70b.toml", world_size=16)
    assert (step.preset, step.parallel, step.tp_size, step.batch, step.ac) == ("llama3-70b", "fsdp+tp+sp", 8, 8, "full")
    assert from_torchtitan_config(DATA / "llama3_70b.toml", world_size=8).parallel == "tp+sp"
    p = _predict_json("--torchtitan-config", str(DATA / "llama3_70b.toml"), "-w", "16", "-l", "1")
    assert (p["tp"], p["tokens_per_replica"], p["configuration"]["mesh"]) == (8, 65536, {"fsdp": 2, "tp": 8})
    assert p["tokens_per_s_per_gpu"] == pytest.approx(65536 / p["step_s"] / 8)
    assert 0 < p["mfu"] < 1
    p = _predict_json("--torchtitan-config", str(DATA / "llama3_405b.toml"), "-w", "128", "-l", "1")
    c = p["configuration"]
    assert (p["tp"], c["float8"], c["async_tp"], c["compile"], c["mesh"]) == (8, "tensorwise", True, True,
                                                                            {"fsdp": 16, "tp": 8})  # fmt: skip
    assert p["step_s"] > 0 and p["tokens_per_s_per_gpu"] == pytest.approx(2 * 8192 / p["step_s"] / 8)
    # its TP matmuls are float8 ``_scaled_mm`` behind byte gathers: fused as torch's scaled symmetric-memory ops
    sites = re.search(r"async TP \((\d+) fused sites\)", p["configuration_line"])
    assert sites is not None and int(sites.group(1)) > 0, p["configuration_line"]


def _variant(tmp_path: Path, old: str, new: str, name: str = "job.toml") -> str:
    text = TT_8B.read_text()
    assert old in text, old
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    return str(path)


def test_bad_and_unsupported_configs_are_one_line_errors(tmp_path):
    tt = ["--world-size", "8", "--torchtitan-config"]
    bad = [  # (line of the config, its replacement, words of the error)
        ("seq_len = 8192", "seq_len = ", ["not valid TOML"]),
        ("seq_len = 8192", 'seq_len = "long"', ["[training] seq_len", "expected an integer"]),
        ("tensor_parallel_degree = 1", "tensor_paralel_degree = 1", ["tensor_paralel_degree", "unknown key"]),
        ("[job]", "[jobs]", ["[jobs]", "unknown section"]),
        (
            "context_parallel_degree = 1",
            'context_parallel_degree = 2\ncontext_parallel_rotate_method = "ring"',
            ["[parallelism] context_parallel_rotate_method", "'ring'", "allgather or alltoall"],
        ),
        (
            "context_parallel_degree = 1",
            'context_parallel_degree = 2\ncontext_parallel_load_balancer = "ptrr"',
            ["context_parallel_load_balancer", "'ptrr'", "headtail"],
        ),
        ("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 3", ["data_parallel_shard_degree", "x pp 3"]),
        ('name = "AdamW"', 'name = "Adam"', ["[optimizer] name", "'Adam'", "not yet supported"]),
        ("eps = 1e-8", 'eps = 1e-8\nimplementation = "for-loop"', ["[optimizer] implementation", "for-loop"]),
        ("eps = 1e-8", "eps = 1e-8\nfused = 1", ["[optimizer] fused", "expected true or false"]),
        ('flavor = "8B"', 'flavor = "debugmodel"', ["[model] flavor", "no zoo preset"]),
        (
            '# converters = ["float8"]',
            'converters = ["float8"]',
            ["float8 (tensorwise)", "enable_fsdp_float8_all_gather", "not yet supported"],
        ),
        ('mode = "selective"', 'mode = "memory_budget"', ["[activation_checkpoint] mode", "memory_budget"]),
    ]
    for old, new, words in bad:
        path = _variant(tmp_path, old, new)
        _one_error_line([*tt, path], path, *words)
    _one_error_line(["--torchtitan-config", str(TT_8B)], "data_parallel_shard_degree", "--world-size or --num-nodes")
    fixed = _variant(tmp_path, "data_parallel_shard_degree = -1", "data_parallel_shard_degree = 4", "fixed.toml")
    _one_error_line([*tt, fixed], "degrees", "= 4", "world size 8")
    _one_error_line(["--torchtitan-config", str(tmp_path / "missing.toml")], "missing.toml")


def test_options_that_conflict_with_the_config_are_refused(tmp_path):
    tt = ["--torchtitan-config", str(TT_8B), "-w", "8"]
    _one_error_line([*tt, "--seq-len", "2048"], "--seq-len 2048 conflicts", "[training] seq_len (8192)")
    _one_error_line([*tt, "--ac", "full"], "--ac full conflicts", "selective-op")
    _one_error_line([*tt, "--compile"], "--compile conflicts", "[compile] enable (false)")
    _one_error_line([*tt, "--tp-size", "2"], "--tp-size 2 conflicts")
    _one_error_line([*tt, "--ep-size", "2"], "--ep-size 2: not an option with --torchtitan-config")
    _one_error_line(["llama3-70b", *tt], "llama3-70b conflicts", "llama3-8b")
    step = from_torchtitan_config(TT_8B, world_size=8)  # options that agree are accepted: checked without a trace
    from commsched.experiments.torchtitan import merge_options

    assert merge_options(step, {"seq_len": 8192, "ac": "selective-op", "tp_size": 1, "layers": 2}).layers == 2


def test_options_predict_refuses_what_is_not_a_framework_training_step():
    _one_error_line([], "give a PRESET")
    _one_error_line(["llama3-8b", "--mode", "prefill"], "--mode prefill", "training step")
    _one_error_line(["llama3-8b", "--fsdp-bucket", "param"], "--fsdp-bucket param", "one collective per block")
    _one_error_line(["llama3-8b", "-l", "40"], "--layers 40", "32 layers")


def test_float8_steps_as_torchtitan_runs_them(tmp_path):
    """The 8B config with float8 converters and FSDP's float8 all_gather on is the zoo's tensorwise step (weights
    gathered in float8) and predicts as ``--float8 tensorwise`` does; compiled, its matmuls at the float8 peak make
    the step faster than bf16's (llama3-8b, FSDP over 8 ranks, 1 layer, seq 8192)."""
    path = _variant(tmp_path, '# converters = ["float8"]', 'converters = ["float8"]')
    text = Path(path).read_text().replace("float8_all_gather = false", "float8_all_gather = true")
    Path(path).write_text(text.replace("[compile]\nenable=false", "[compile]\nenable=true"))
    from_config = _predict_json("--torchtitan-config", path, "-w", "8", "-l", "1")
    options = _predict_json("llama3-8b", "-p", "fsdp", "-w", "8", "-l", "1", "--seq-len", "8192", "--batch", "1",
                            "--ac", "selective-op", "--float8", "tensorwise", "--compile")  # fmt: skip
    bf16 = _predict_json("llama3-8b", "-p", "fsdp", "-w", "8", "-l", "1", "--seq-len", "8192", "--batch", "1",
                         "--ac", "selective-op", "--compile")  # fmt: skip
    assert from_config["configuration"]["float8"] == "tensorwise" and from_config["step_s"] == options["step_s"]
    assert options["step_s"] < bf16["step_s"] and options["tokens_per_s_per_gpu"] > bf16["tokens_per_s_per_gpu"]


def test_context_parallel_configs_as_torchtitan_runs_them(tmp_path):
    """``context_parallel_degree`` 2 is the zoo's ``cp_size`` 2 inside FSDP (torchtitan's fsdp = dp_shard x cp),
    rotating K/V by all-gather unless ``context_parallel_rotate_method`` says alltoall; the data-parallel degree
    (global batch) and tokens/s per GPU divide by TP x CP, as torchtitan's ``non_data_parallel_size``."""
    path = _variant(tmp_path, "context_parallel_degree = 1", "context_parallel_degree = 2")
    step = from_torchtitan_config(path, world_size=8)
    assert (step.parallel, dict(step.extra)) == ("fsdp", {"cp_size": 2, "cp_rotate": "allgather"})
    assert step.resolve().plan.cp == 2 and step.resolve().plan.data_parallel_degree == 4
    rotate = 'context_parallel_degree = 2\ncontext_parallel_rotate_method = "alltoall"'
    alltoall = _variant(tmp_path, "context_parallel_degree = 1", rotate, "a2a.toml")
    assert dict(from_torchtitan_config(alltoall, world_size=8).extra)["cp_rotate"] == "alltoall"
    p = _predict_json("--torchtitan-config", path, "-w", "8", "-l", "1")
    assert (p["cp"], p["tp"], p["tokens_per_replica"]) == (2, 1, 8192)
    assert p["tokens_per_s_per_gpu"] == pytest.approx(8192 / p["step_s"] / 2)
    assert "cp 2 allgather" in p["configuration_line"]


def test_float8_on_a_gpu_without_float8_is_refused():
    """An A100 has no float8 tensor cores: predict refuses the float8 step in one line rather than charge its
    matmuls at another dtype's rate."""
    res = runner.invoke(app, ["predict", "llama3-8b", "-p", "fsdp", "-w", "8", "-l", "1", "--seq-len", "512",
                              "--float8", "rowwise", "-H", "a100-sxm-80g"])  # fmt: skip
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "a100-sxm-80g" in lines[0] and "float8" in lines[0], lines
