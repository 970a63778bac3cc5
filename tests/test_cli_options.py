"""Issue 36: the options several commands share. Output options write only regular files (checked before any work),
every zoo-step command takes the same options and the preset's layers unless told, one ``--json PATH|-``
convention, and the CLI-side cosmetics (signed percentages, uncut numbers, torch's INFO log, Ctrl-C, -H a device)."""

from __future__ import annotations

import json
import os
import stat

import pytest
import typer
from typer.testing import CliRunner

from commsched.cli import app

runner = CliRunner()
COMMANDS = typer.main.get_command(app).commands
OUTPUT_NAMES = ("--out", "--out-dir", "--html", "--trace", "--gantt", "--stats", "--json", "--profile")
OUTPUT_DIRS = {("optimize", "--out-dir"), ("demo", "--out-dir"), ("run", "--profile")}


def _output_options() -> list[tuple[str, str]]:
    """(command, option) of every option that names where a command writes (flags such as calibrate --trace aside)."""
    found = []
    for name, cmd in sorted(COMMANDS.items()):
        for p in cmd.params:
            long = next((o for o in p.opts if o.startswith("--")), None)
            if long in OUTPUT_NAMES and not getattr(p, "is_flag", False):
                found.append((name, long))
    return found


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def _one_error_line(res, *words: str) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (res.exit_code, res.output)
    assert all(w in lines[0] for w in words), (words, lines[0])
    return lines[0]


# ---------------------------------------------------------------- item 1: outputs are regular files, or folders
def test_every_output_option_refuses_a_fifo_before_any_work(fifo):
    """Before: a FIFO as -o was replaced by a JSON file ("wrote ..."), after the whole trace. Now every output option
    of every command refuses it as it is parsed (no preset or graph needed), naming the option and the path."""
    found = _output_options()
    assert len(found) >= 15 and ("trace", "--out") in found and ("simulate", "--gantt") in found, found
    for command, option in sorted(found, key=lambda c: c != ("trace", "--out")):  # without the check: no work
        res = runner.invoke(app, [command, option, str(fifo)])
        line = _one_error_line(res, option, str(fifo))
        assert "a FIFO" in line or (command, option) in OUTPUT_DIRS, line
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_directory_as_an_output_file_is_one_line_not_a_traceback(tmp_path):
    """Before: IsADirectoryError's traceback (exit 1) from -o, --html, --trace, --gantt, after the work."""
    folder = tmp_path / "d"
    folder.mkdir()
    for args in (
        ["trace", "llama-tiny", "-w", "2", "-l", "1", "-o", str(folder)],
        ["simulate", "g.json", "--html", str(folder)],
        ["simulate", "g.json", "--trace", str(folder)],
        ["simulate", "g.json", "--gantt", str(folder)],
        ["rewrite", "llama-tiny", "--stats", str(folder)],
        ["sweep", "llama-tiny", "--json", str(folder)],
        ["compare", "llama-tiny", "--json", str(folder)],
    ):
        _one_error_line(runner.invoke(app, args), str(folder), "is a directory")
    assert folder.is_dir() and not list(folder.iterdir())


def test_an_output_folder_that_is_a_file_is_refused(tmp_path):
    """optimize -o and demo --out-dir name folders: a regular file (or a device) there is not one."""
    file = tmp_path / "f.txt"
    file.write_text("mine")
    demo = ["demo", "--world-size", "2", "--layers", "1", "--out-dir"]
    for args in ([*demo, str(file)], [*demo, str(file / "sub")], ["optimize", "llama-tiny", "-o", str(file)]):
        _one_error_line(runner.invoke(app, args), str(file), "a regular file")
    assert file.read_text() == "mine"


def test_dev_null_is_refused_and_left_a_device():
    """Before, as root: ``trace -o /dev/null`` replaced the device node with a JSON file. The check is asked first
    (so that this test cannot harm /dev/null on code without it), then the commands."""
    from commsched.io import check_output_file

    with pytest.raises(ValueError, match="character device"):
        check_output_file("/dev/null")
    for args in (["trace", "llama-tiny", "-w", "2", "-l", "1", "-o", "/dev/null"],
                 ["simulate", "g.json", "--gantt", "/dev/null"], ["info", "g.json", "--json", "/dev/null"],
                 ["optimize", "llama-tiny", "-o", "/dev/null"]):  # fmt: skip
        _one_error_line(runner.invoke(app, args), "/dev/null", "character device")
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ---------------------------------------------------------------- items 4 and 11: one definition of a zoo step
ZOO_COMMANDS = ("trace", "compare", "optimize", "rewrite", "run", "sweep", "predict")


def _longs(command: str) -> set[str]:
    options = (p for p in COMMANDS[command].params if p.param_type_name == "option")
    return {next(o for o in p.opts if o.startswith("--")) for p in options}


def test_every_zoo_command_takes_the_same_step_options():
    """Before: optimize lacked --tp-size and --ep-size, rewrite --dtype, sweep --dtype and --kv-len, ..."""
    from commsched.cli.options import ZOO_STEP_OPTIONS

    step = {"--" + name.replace("_", "-") for name in ZOO_STEP_OPTIONS}
    assert {"--parallel", "--world-size", "--layers", "--mode", "--tp-size", "--ep-size", "--seq-len"} <= step
    for command in ZOO_COMMANDS:
        assert step <= _longs(command), (command, sorted(step - _longs(command)))
    for command in ("compare", "optimize", "rewrite", "sweep"):  # the cluster they are costed on, alike
        assert {"--hardware", "--gpus-per-node"} <= _longs(command), command
    helps = {c: runner.invoke(app, [c, "--help"], env={"COLUMNS": "200"}).output for c in ZOO_COMMANDS}
    for command, text in helps.items():
        assert all(opt in text for opt in step), command
        assert "transformer blocks, at most the preset's (unset: all of them)" in text, command


@pytest.fixture
def traced_layers(monkeypatch):
    """Stops each command at its trace, recording how many layers it asked for (nothing is traced)."""
    import commsched.workloads
    import commsched.workloads.trace

    asked: list[int] = []

    def stop(spec, progress=None):
        asked.append(spec.model.n_layers)
        raise ValueError("stopped at the trace")

    monkeypatch.setattr(commsched.workloads, "trace_spec", stop)
    monkeypatch.setattr(commsched.workloads.trace, "trace_spec", stop)
    return asked


def test_every_command_traces_the_whole_preset_unless_told(traced_layers):
    """Before: optimize, compare and rewrite silently traced 4 of llama3-8b's 32 layers; trace took all of them."""
    for command in ("trace", "compare", "optimize", "rewrite"):
        res = runner.invoke(app, [command, "llama3-8b", "-w", "64"])
        assert res.exit_code == 2 and "stopped at the trace" in res.stderr, (command, res.output)
    assert traced_layers == [32] * 4
    runner.invoke(app, ["optimize", "llama3-8b", "-l", "2"])
    assert traced_layers[-1] == 2


def test_more_layers_than_the_preset_has_is_refused_with_the_maximum(traced_layers):
    """Before: ``trace llama3-8b -l 40`` was accepted silently (a 40-layer model that does not exist)."""
    for command in ("trace", "compare", "optimize", "rewrite", "sweep"):
        res = runner.invoke(app, [command, "llama3-8b", "-l", "40"])
        _one_error_line(res, "--layers 40", "llama3-8b has 32 layers", "1 to 32")
    res = runner.invoke(app, ["demo", "--layers", "33"])
    _one_error_line(res, "--layers 33", "32 layers")
    assert traced_layers == []


def test_titles_and_json_say_how_many_of_the_presets_layers_ran(tmp_path):
    res = runner.invoke(app, ["trace", "llama-tiny", "-w", "2", "-l", "1", "-o", str(tmp_path / "g.json")])
    assert res.exit_code == 0, res.output
    assert "llama-tiny/fsdp/train/world 2/1 of 2 layers: " in res.stdout
    res = runner.invoke(app, ["compare", "llama-tiny", "-w", "2", "-l", "1", "--no-torch", "--exact-max-nodes", "0",
                              "--json", "-"])  # fmt: skip
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)["meta"]
    assert (meta["layers"], meta["preset_layers"]) == (1, 2)
    res = runner.invoke(app, ["rewrite", "llama-tiny", "-w", "2", "--stats", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert "llama-tiny/fsdp/train/world 2/2 of 2 layers on h100-sxm" in res.stdout
    assert json.loads((tmp_path / "s.json").read_text())["workload"].endswith("2 of 2 layers")


# ---------------------------------------------------------------- item 15: one --json convention
@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "g.json"
    res = runner.invoke(app, ["trace", "llama-tiny", "-w", "2", "-l", "1", "-o", str(path)])
    assert res.exit_code == 0, res.output
    return path


def test_json_takes_a_path_or_dash_everywhere_and_a_bare_flag_is_stdout(graph_file, tmp_path):
    """Before: --json was a flag (stdout) on simulate, estimate, schedule, replay and took a path on sweep,
    compare, run. Now ``--json PATH`` writes, ``--json -`` prints, and a bare ``--json`` still prints."""
    with_json = sorted(name for name, cmd in COMMANDS.items() if "--json" in _longs(name))
    assert {"simulate", "estimate", "schedule", "info", "replay", "sweep", "compare", "run", "calibrate"} <= set(
        with_json
    )
    for name in with_json:
        text = runner.invoke(app, [name, "--help"], env={"COLUMNS": "250"}).output
        assert "PATH|-" in text and "'-' or a bare --json: print it on stdout" in text, name
    g = str(graph_file)
    for command in ("simulate", "estimate", "info", "schedule"):
        bare = runner.invoke(app, [command, g, "--json"])
        dash = runner.invoke(app, [command, g, "--json", "-", "-H", "h100-sxm"] if command != "info" else
                             [command, g, "--json", "-"])  # fmt: skip
        assert bare.exit_code == dash.exit_code == 0, (command, bare.output, dash.output)
        assert json.loads(bare.stdout) == json.loads(dash.stdout)
        out = tmp_path / f"{command}.json"
        res = runner.invoke(app, [command, g, "--json", str(out)])
        assert res.exit_code == 0, (command, res.output)
        assert json.loads(out.read_text()) == json.loads(bare.stdout)
        assert f"wrote {out}" in res.stdout and "{" not in res.stdout.splitlines()[0]  # the tables, then the file
    res = runner.invoke(app, ["compare", g, "--exact-max-nodes", "0", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["meta"]["target"] == g  # stdout holds the JSON only


# ---------------------------------------------------------------- item 15: cosmetics
def test_a_gap_below_the_bound_is_a_signed_percentage(graph_file):
    """Before: "+-26.4%" for a row whose step is below the traced program's bound (a rewritten program)."""
    import dataclasses

    from rich.console import Console

    from commsched.cost import estimate_costs
    from commsched.experiments.compare import compare_schedulers
    from commsched.frontends.json_io import load_graph
    from commsched.report.terminal_experiments import compare_table
    from commsched.report.units import fmt_signed_percent

    assert (fmt_signed_percent(-0.264), fmt_signed_percent(0.062), fmt_signed_percent(0.0)) == (
        "-26.4 %", "+6.2 %", "+0.0 %")  # fmt: skip
    g = load_graph(graph_file)
    result = compare_schedulers(g, estimate_costs(g, "h100-sxm"), exact_max_nodes=0)
    result.rows[0] = dataclasses.replace(result.rows[0], gap_to_bound=-0.264)
    console = Console(width=200, record=True)
    console.print(compare_table(result, "t"))
    text = console.export_text()
    assert "-26.4 %" in text and "+-" not in text


def test_sweep_numbers_are_never_cut_at_80_columns():
    """Before: at 80 columns the sweep's table ellipsised numbers ("1.23 m…")."""
    from rich.console import Console

    from commsched.experiments.sweep import run_sweep
    from commsched.report.terminal_experiments import sweep_table
    from commsched.report.units import fmt_bytes, fmt_seconds_short

    rows = run_sweep("llama-tiny", parallel=["fsdp"], world_sizes=[4], hardware=["h100-sxm@ib-ndr-8x400"],
                     layers=1, processes=1, cache=False, resume=False)  # fmt: skip
    console = Console(width=80, record=True)
    console.print(sweep_table(rows, "llama-tiny (1 of 2 layers, train), schedule default"))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    r = rows[0]
    for number in (fmt_seconds_short(r.step_time_input_s), fmt_seconds_short(r.step_time_s), f"{r.speedup:.2f}x",
                   fmt_bytes(r.peak_memory_bytes), fmt_seconds_short(r.lower_bound_s)):  # fmt: skip
        assert number in text, (number, text)


def test_torch_info_records_are_held_back_while_compare_schedules():
    """Before: Inductor's FSDP pass (run by torch's OverlapScheduler) logged "pre_bucket_fsdp_collectives: ..." at
    INFO into compare's output: torch sets that logger to INFO on import."""
    import logging

    import torch._inductor.fx_passes.fsdp as fsdp_pass

    from commsched.cli.common import quiet_torch_logs

    logger = logging.getLogger(fsdp_pass.__name__)
    assert logger.isEnabledFor(logging.INFO)
    with quiet_torch_logs():
        assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
    assert logger.isEnabledFor(logging.INFO)


def test_hardware_that_is_a_device_says_what_it_is(graph_file, tmp_path):
    """Before: ``-H /dev/zero`` said the profile "does not exist"."""
    line = _one_error_line(runner.invoke(app, ["estimate", str(graph_file), "-H", "/dev/zero"]), "/dev/zero")
    assert "is a character device; expected a .toml file or a known profile name" in line
    _one_error_line(runner.invoke(app, ["estimate", str(graph_file), "-H", str(tmp_path)]), "is a directory")
    _one_error_line(runner.invoke(app, ["estimate", str(graph_file), "-H", "no/such.toml"]), "does not exist")


def test_ctrl_c_says_interrupted_and_exits_130(graph_file, monkeypatch):
    """Before: exit 130 with nothing on the screen."""
    import commsched.frontends.json_io as json_io

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json_io, "load_graph", interrupted)
    res = runner.invoke(app, ["info", str(graph_file)])
    assert res.exit_code == 130 and res.stderr.strip() == "interrupted", (res.exit_code, res.output)


def test_rewrite_says_how_it_schedules_and_can_schedule_as_optimize(graph_file):
    """Before: rewrite's "before" (collective order kept) and optimize's "traced program, scheduled" (collectives
    reordered) differed for one configuration without a word; the title says which, and
    --reorder-collectives gives optimize's step."""
    import re

    from commsched.cost import estimate_costs
    from commsched.passes import schedule
    from commsched.report.units import fmt_seconds
    from commsched.sim import simulate_costs
    from commsched.workloads import build

    g = build("llama-tiny", parallel="fsdp", world_size=2, layers=1).graph
    costs = estimate_costs(g, "h100-sxm")
    step = {r: simulate_costs(g, costs, schedule(g, costs, "default", reorder_collectives=r).order).makespan_s
            for r in (False, True)}  # fmt: skip
    for flag, reorder, how in (([], False, "each group's collective order kept"),
                               (["--reorder-collectives"], True, "collectives reordered")):  # fmt: skip
        res = runner.invoke(app, ["rewrite", "llama-tiny", "-w", "2", "-l", "1", *flag])
        assert res.exit_code == 0, res.output
        assert f"schedule 'default' ({how})" in res.stdout
        before = re.search(r"before\s+│\s+\d+\s+│\s+(\S+ \S+)", res.stdout).group(1)
        assert before == fmt_seconds(step[reorder]), (before, step)
