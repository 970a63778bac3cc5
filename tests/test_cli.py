"""The command line: demo writes a graph, info reads it back, bad input exits 2 with a message."""

from __future__ import annotations

import gc
import html
import json
import re
import sys

import pytest
from typer.testing import CliRunner

from commsched.cli import app, main
from commsched.frontends.json_io import load_graph

runner = CliRunner()


def test_demo_then_info(tmp_path):
    """Issue 36: the demo runs the main job: optimize, judged against FSDP2 eager and torch's best in one table, with
    what bounds the step; the files are the kept step's, and every number agrees across terminal, JSON and HTML."""
    res = runner.invoke(app, ["demo", "--out-dir", str(tmp_path), "--world-size", "8", "--layers", "2"])
    assert res.exit_code == 0, res.output
    g = load_graph(tmp_path / "graph.json")
    assert len(g.collectives) > 0 and g.meta.get("preset") == "llama3-8b"
    from commsched.passes import check_schedule, load_schedule
    from commsched.sim import simulate

    sched = load_schedule(g, tmp_path / "scheduled.json")
    check_schedule(g, sched.order, expected_chains=sched.recorded_chains)
    out = " ".join(res.output.split())
    m = re.search(r"optimize: ([0-9.]+) ms .*?faster than FSDP2 eager \(([0-9.]+) ms.*?torch's best configuration "
                  r"\(torch [a-z +-]+: ([0-9.]+) ms.*?traced order ([0-9.]+) ms", out)  # fmt: skip
    assert m, out
    kept, framework, torch_best, traced = (float(x) for x in m.groups())
    assert f"{1e3 * simulate(g, 'h100-sxm', sched.order).makespan_s:.3f}" == m.group(1)  # the files are the kept step
    assert kept < framework < traced and kept <= torch_best
    assert "what bounds the step: " in out and "what would move it: " in out
    answer = json.loads((tmp_path / "optimize.json").read_text())
    assert answer["speedup_vs_framework"] == pytest.approx(framework / kept, rel=1e-3)
    assert answer["speedup_vs_torch_best"] == pytest.approx(torch_best / kept, rel=1e-3)
    assert answer["references"]["framework"]["label"] == "FSDP2 eager"
    page = (tmp_path / "report.html").read_text()
    for number in m.groups():
        assert f"{number} ms" in page
    assert answer["bound"]["what_bounds_the_step"] in html.unescape(page)
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    res = runner.invoke(app, ["info", str(tmp_path / "graph.json"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["num_nodes"] == len(g)
    assert sum(r["count"] for r in summary["collectives"]) == len(g.collectives)
    assert summary["comm_bytes"] == int(g.comm_bytes.sum())


def test_info_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "commsched.graph", "version": 7, "nodes": []}))
    res = runner.invoke(app, ["info", str(bad)])
    assert res.exit_code == 2
    assert "unknown schema version 7" in res.output


def test_a_short_flag_means_one_thing_in_every_command():
    """Issue 19.9: ``-p`` was --parallel in one command and --passes in another."""
    import typer

    meaning: dict[str, set[str]] = {}
    for cmd in typer.main.get_command(app).commands.values():
        for p in cmd.params:
            long = next((o for o in p.opts if o.startswith("--")), None)
            for short in (o for o in p.opts if len(o) == 2 and long):
                meaning.setdefault(short, set()).add(long)
    clashes = {s: sorted(longs) for s, longs in meaning.items() if len(longs) > 1}
    # -s: which passes schedule (sweep's --schedule, schedule's and run's --passes); -o: where output goes
    assert clashes == {"-s": ["--passes", "--schedule"], "-o": ["--out", "--out-dir"]}, clashes
    assert meaning["-p"] == {"--parallel"}


def test_errors_are_one_line_and_brackets_are_not_markup(tmp_path):
    """Issue 19.9: rich markup in a name ([...]) was eaten or crashed the printer, and long errors wrapped."""
    bad = tmp_path / ("[bold]" + "x" * 150 + ".json")
    bad.write_text("{")
    res = runner.invoke(app, ["info", str(bad)])
    assert res.exit_code == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "[bold]" + "x" * 150 in lines[0], res.stderr


def test_usage_errors_are_one_line_when_piped_at_any_width(tmp_path):
    """Issue 19.9: typer drew usage errors in a panel that wrapped at the terminal's width (COLUMNS small, piped)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "20"}
    bad = tmp_path / ("y" * 60 + ".json")
    for args in (
        ["estimate", "--no-such-option-at-all"],
        ["compare", "llama-tiny", "--world-size", "not-a-number"],
        ["estimate"],  # a missing argument
        ["estimate", str(bad)],  # our own error
    ):
        res = subprocess.run(
            [sys.executable, "-m", "commsched", *args], capture_output=True, text=True, env=env, timeout=120
        )
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, res.stderr)
        assert res.stdout == ""
    assert "y" * 60 in lines[0]


def test_flags_show_no_type_in_help():
    """Issue 19.9: every boolean flag (and --help itself) showed a ``<bool>`` metavar, as if it took a value."""
    import typer

    commands = typer.main.get_command(app).commands
    for name in commands:
        res = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        assert "<bool>" not in res.output, name
        assert "--help" in res.output
    res = runner.invoke(app, ["compare", "--help"], env={"COLUMNS": "200"})
    assert "<int" in res.output and "--torch" in res.output  # options that take a value keep their type


def test_tables_show_human_units_and_keep_titles_on_one_line(tmp_path):
    """Issue 19.9: raw byte counts (``4158410756``, ``4366331293 B``) and Python dicts (``{'exposes': 4}``) in the
    tables, and titles wrapped at the width of a narrow table."""
    import re

    res = runner.invoke(app, ["trace", "llama-tiny", "-w", "4", "-l", "1", "-o", str(tmp_path / "g.json")])
    assert res.exit_code == 0, res.output
    assert "llama-tiny/fsdp/train/world 4/1 of 2 layers: " in res.output  # the title on one line
    outputs = [res.output]
    for args in (
        ["schedule", str(tmp_path / "g.json"), "--stats"],
        ["rewrite", "llama-tiny", "-w", "4", "-l", "1"],
        ["optimize", "llama-tiny", "-w", "4", "-l", "1"],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, (args, res.output)
        outputs.append(res.stdout)
    text = "\n".join(outputs)
    assert "closed by exposes=" in text and "peak " in text and "budget " in text
    assert not re.search(r"\d{5,}( B)?\b", text), re.findall(r".*\d{5,}.*", text)[:3]
    assert "{'" not in text and "makespan_s" not in text and "True" not in text
    for line in text.splitlines():  # no title broken over two lines: a line of a title never ends mid-word
        assert not line.rstrip().endswith(("/worl", "world", "x 1,")), line


def test_estimate_and_compare_say_what_the_table_matched(tmp_path):
    """Issue 19.8: ``--table`` never said how many ops it matched; one of another shape matched none, silently."""
    from commsched.cost import MeasuredTable
    from commsched.workloads import build

    g = build("llama-tiny", parallel="fsdp", world_size=4, layers=1).graph
    from commsched.frontends.json_io import save_graph

    save_graph(g, tmp_path / "g.json")
    mms = [i for i in range(len(g)) if g.targets[i] == "aten.mm.default"]
    keys = {MeasuredTable.node_key(g, i) for i in mms[:3]}
    matched = sum(MeasuredTable.node_key(g, i) in keys for i in mms)  # every node with one of those keys
    gathers = [i for i in g.collectives.tolist() if "all_gather" in g.targets[i]]
    table = MeasuredTable("measured")
    for target, shapes, dtype in keys:
        table.add_op(target, shapes, dtype, 1e-4)
    table.add_collective("all_gather", 4, 1 << 20, 1e-4)
    table.save(tmp_path / "t.json")
    ops = int(sum(1 for i in range(len(g)) if g.kinds[i] in (1, 5)))  # compute and other: the timed non-collectives
    res = runner.invoke(app, ["estimate", str(tmp_path / "g.json"), "--table", str(tmp_path / "t.json"), "--json"])
    assert res.exit_code == 0, res.output
    match = json.loads(res.stdout)["table_match"]
    assert (match["ops_matched"], match["collectives_matched"]) == (matched, len(gathers)) and matched >= 3
    assert match["collectives"] == len(g.collectives) and 0 < match["ops"] <= ops
    res = runner.invoke(app, ["estimate", str(tmp_path / "g.json"), "--table", str(tmp_path / "t.json")])
    line = f"matched {matched} of {match['ops']} ops (collectives {len(gathers)} of {len(g.collectives)})"
    assert line in res.stdout
    res = runner.invoke(app, ["compare", str(tmp_path / "g.json"), "--table", str(tmp_path / "t.json"),
                              "--exact-max-nodes", "0", "--json", str(tmp_path / "rows.json")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert line in res.stdout
    assert json.loads((tmp_path / "rows.json").read_text())["meta"]["table_match"] == match
    # a table of another world size matches nothing: a warning says so
    other = MeasuredTable("other")
    other.add_collective("all_gather", 64, 1 << 20, 1e-4)
    other.save(tmp_path / "o.json")
    res = runner.invoke(app, ["estimate", str(tmp_path / "g.json"), "--table", str(tmp_path / "o.json")])
    assert res.exit_code == 0 and "matched 0 of" in res.stderr and "every time is the model's" in res.stderr


def test_trace_shows_its_stages_on_a_terminal_and_nothing_when_piped(tmp_path, monkeypatch):
    """Issue 19.10: tracing a large workload took minutes with no progress. A bar over the stages (trace, import,
    write) goes to stderr where it is a terminal; piped, nothing is added."""
    import io
    import re

    from rich.console import Console

    from commsched.cli import common

    res = runner.invoke(app, ["trace", "llama-tiny", "-w", "2", "-l", "2", "-o", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    assert "import" not in res.stderr and "layer" not in res.stderr  # not a terminal: no progress
    screen = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=screen, force_terminal=True, width=120))
    res = runner.invoke(app, ["trace", "llama-tiny", "-w", "2", "-l", "2", "-o", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # the terminal's control sequences
    assert "trace: forward of layer 2/2" in shown and "import: 758 FX nodes" in shown and "write: " in shown, shown
    assert "0/3" in shown and "2/3" in shown  # the bar counts the stages
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "a.json").read_bytes()


def test_run_shows_what_runs_on_a_terminal_while_the_ranks_run(monkeypatch):
    """Issue 19.10 (run): minutes with nothing on screen. While the ranks run, a line on stderr names them, the
    orders and the steps, with the elapsed time; piped, nothing. (The ranks are stood in for: this checks the CLI.)"""
    import io
    import re

    from rich.console import Console

    import commsched.runtime.launch as launch
    from commsched.cli import common
    from run_reports import small_run_report

    screen = io.StringIO()
    during: list[str] = []

    def ranks_run(cfg, network=None, backend=None, progress=None):
        progress("step 2/5 (2 warm-up) of 2 orders")  # as run_local relays rank 0's line
        during.append(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue()))  # the screen while they run
        return small_run_report()

    monkeypatch.setattr(launch, "run_local", ranks_run)
    args = ["run", "llama-tiny", "-w", "2", "--iters", "3", "--variants", "original,overlap"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert during == [""] and "ranks" not in res.stderr  # not a terminal: nothing
    monkeypatch.setattr(common, "err_console", Console(file=screen, force_terminal=True, width=120))
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "run: step 2/5 (2 warm-up) of 2 orders" in during[-1] and "0:00:0" in during[-1]


def test_main_freezes_what_is_alive_on_the_way_out(monkeypatch):
    """Python's finalisation would walk every object torch made (1-2 s of a sweep's exit): main() freezes them."""
    monkeypatch.setattr(sys, "argv", ["commsched", "trace", "--list"])
    before = gc.get_freeze_count()
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0 and gc.get_freeze_count() > before
