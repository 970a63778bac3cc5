"""commsched schedule / check on a traced workload: the schedule file round-trips and the checker catches errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import save_graph
from commsched.passes import check_schedule, load_schedule
from commsched.workloads import build

runner = CliRunner()


def test_schedule_then_check(tmp_path):
    g = build("llama-tiny", parallel="fsdp", world_size=8, layers=1).graph
    graph = tmp_path / "g.json"
    save_graph(g, graph)
    out = tmp_path / "s.json"
    res = runner.invoke(
        app, ["schedule", str(graph), "-H", "h100-sxm", "-s", "torch", "--stats", "--timeline", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "reorder_communication_preserving_peak_memory" in res.output and "stop reasons" in res.output
    assert "ISSUE" in res.output  # the text timeline
    sched = load_schedule(g, out)
    check_schedule(g, sched.order)
    assert sched.passes == [
        "reorder_communication_preserving_peak_memory",
        "sink_waits_iterative",
        "reorder_communication_preserving_peak_memory",
    ]
    res = runner.invoke(app, ["check", str(graph), str(out)])
    assert res.exit_code == 0 and "valid schedule" in res.output
    # swap the first collective with its wait: the checker names both
    data = json.loads(out.read_text())
    c = next(i for i, name in enumerate(data["order"]) if g.coll_type[g.index[name]] >= 0)
    w = next(i for i, name in enumerate(data["order"]) if g.wait_of[g.index[name]] == g.index[data["order"][c]])
    data["order"][c], data["order"][w] = data["order"][w], data["order"][c]
    out.write_text(json.dumps(data))
    res = runner.invoke(app, ["check", str(graph), str(out)])
    assert res.exit_code == 2 and "before its predecessor" in res.output


def test_schedule_knobs_and_list(tmp_path):
    g = build("llama-tiny", parallel="fsdp", world_size=8, layers=1).graph
    graph = tmp_path / "g.json"
    save_graph(g, graph)
    res = runner.invoke(app, ["schedule", "--list"])
    assert res.exit_code == 0 and "overlap" in res.output and "preset default" in res.output
    res = runner.invoke(app, ["schedule", str(graph), "-k", "memory_budget=1.0", "-k", "reorder_collectives=true"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["schedule", str(graph), "-k", "colour=1"])
    assert res.exit_code == 2 and "unknown knob" in res.output


def test_one_schedule_one_number_multi_stream(tmp_path):
    """Issue 19.3: ``simulate --order`` read only the order (not the streams) and the schedule table left out the
    contention charge multi_stream judged with; now schedule's table and --json, simulate --order and the pass's own
    verdict give one step time, and both --json outputs have the same fields."""
    import re

    g = build("llama3-8b", parallel="fsdp", world_size=64, layers=1).graph
    graph, out = tmp_path / "g.json", tmp_path / "s.json"
    save_graph(g, graph)
    args = ["-s", "overlap,multi_stream", "-k", "compute_streams=2", "-k", "compute_interference=0.3"]
    res = runner.invoke(app, ["schedule", str(graph), "-H", "h100-sxm", *args, "--stats", "-o", str(out)])
    assert res.exit_code == 0, res.output
    # the pass's note, in human units (issue 19.9): "predicted 12.345 ms (simulated ..."
    number, unit = re.search(r"applied [^:]*: predicted ([0-9.]+) (s|ms|us) \(simulated", res.output).groups()
    verdict = float(number) / {"s": 1, "ms": 1e3, "us": 1e6}[unit]
    saved = json.loads(out.read_text())
    assert saved["compute_interference"] == 0.3 and len(set(saved["streams"])) > 1
    sched = runner.invoke(app, ["schedule", str(graph), "-H", "h100-sxm", *args, "--json"])
    sim = runner.invoke(app, ["simulate", str(graph), "-H", "h100-sxm", "--order", str(out), "--json"])
    assert sched.exit_code == 0 and sim.exit_code == 0, sched.output + sim.output
    a, b = json.loads(sched.stdout), json.loads(sim.stdout)
    assert set(a) == set(b) and a["contention_s"] > 0
    assert a["makespan_s"] == b["makespan_s"] == a["simulated_makespan_s"] + a["contention_s"]
    assert abs(a["makespan_s"] - verdict) < 1e-6  # the note prints microseconds
    table = runner.invoke(app, ["simulate", str(graph), "-H", "h100-sxm", "--order", str(out)])
    ms = f"{1e3 * a['makespan_s']:.3f} ms"
    assert f"step time                  │ {ms}".replace(" ", "") in table.output.replace(" ", "")
    assert re.search(rf"scheduled\s*│\s*{ms}", res.output)  # the schedule table: the same number


def test_check_accepts_our_reordered_collectives_as_recorded(tmp_path):
    """Issue 19.5: ``check`` refused what ``reorder_collectives`` produces, since the file did not say the order was
    changed on purpose. The file now records the pass and each group's new issue order; ``check`` verifies the
    schedule against that record (and still refuses an unrecorded reordering, or one that departs from the record)."""
    g = build("llama3-8b", parallel="fsdp", world_size=64, layers=2).graph
    graph, out = tmp_path / "g.json", tmp_path / "s.json"
    save_graph(g, graph)
    res = runner.invoke(app, ["schedule", str(graph), "-k", "reorder_collectives=true", "-o", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["collectives_reordered_by"] == ["overlap"] and set(data["collective_order"]) == {"0"}
    res = runner.invoke(app, ["check", str(graph), str(out)])
    assert res.exit_code == 0 and "collectives reordered by overlap, as recorded" in res.output, res.output
    # the order departs from its record: the SPMD rule against the recorded sequence
    chain = data["collective_order"]["0"]
    k = next(k for k in range(len(chain) - 1) if chain[k].split("_")[0] != chain[k + 1].split("_")[0])
    chain[k], chain[k + 1] = chain[k + 1], chain[k]
    (tmp_path / "tampered.json").write_text(json.dumps(data))
    res = runner.invoke(app, ["check", str(graph), str(tmp_path / "tampered.json")])
    assert res.exit_code == 2 and "the recorded collective_order issues" in res.output, res.output
    # no record: the reordering is refused as before (one line, naming the group)
    del data["collectives_reordered_by"], data["collective_order"]
    (tmp_path / "unrecorded.json").write_text(json.dumps(data))
    res = runner.invoke(app, ["check", str(graph), str(tmp_path / "unrecorded.json")])
    assert res.exit_code == 2 and "process group '0'" in res.output and "(SPMD)" in res.output
