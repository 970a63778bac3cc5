"""The pipeline's HTML report and Perfetto trace (``report/pipeline_*.py``, ``commsched pipeline --html --trace``):
one lane group per pipeline rank, every timed action with its micro-batch and stage at the simulation's times."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsched.cli import app
from commsched.pipeline import ActionKind, StageCosts, simulate_pipeline
from commsched.report.pipeline_html import render_pipeline_html, write_pipeline_html
from commsched.report.pipeline_trace import to_pipeline_trace, write_pipeline_trace

runner = CliRunner()
COSTS = StageCosts(forward_s=1e-3, backward_input_s=7e-4, backward_weight_s=4e-4, send_bytes=1 << 24,
                   activation_bytes=1 << 20, static_bytes=1 << 22, unshard_s=1e-4, reduce_grad_s=2e-4)  # fmt: skip
CASES = [("1F1B", 4, 8), ("Interleaved1F1B", 4, 8), ("ZBVZeroBubble", 4, 8), ("DualPipeV", 2, 4), ("GPipe", 2, 3)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def result(request):
    name, p, m = request.param
    return simulate_pipeline(name, p, m, None, COSTS, "h100-sxm", ranks_between_stages=8)


def _timed(result, rank):
    """(torch's name of the action, start ns, end ns) of every action the simulation timed on ``rank``, but FSDP's
    UNSHARD / REDUCE_GRAD where they take no time (no FSDP)."""
    program = result.program
    spans = zip(result.start_ns[rank].tolist(), result.end_ns[rank].tolist(), strict=True)
    names = [program.action_str(rank, i) for i in range(len(program.actions[rank]))]
    fsdp = [n.endswith(("UNSHARD", "REDUCE_GRAD")) for n in names]
    return {names[i]: (s, e) for i, (s, e) in enumerate(spans) if s >= 0 and not (fsdp[i] and s == e)}


def test_the_trace_has_one_process_per_rank_and_every_action_at_the_simulated_times(result, tmp_path):
    path = write_pipeline_trace(result, tmp_path / "pp.json")
    trace = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(names) == list(range(result.program.pp_size))
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for rank in range(result.program.pp_size):
        timed = _timed(result, rank)
        mine = {e["args"]["action"]: e for e in slices if e["pid"] == rank}
        assert set(mine) == set(timed), rank  # every timed action once (RESHARD takes no time: never timed)
        for action, (start, end) in timed.items():
            e = mine[action]
            assert abs(e["ts"] * 1e3 - start) <= 0.5 and abs((e["ts"] + e["dur"]) * 1e3 - end) <= 1.0, action
    assert trace["commsched"]["step_s"] == result.step_s


def test_each_slice_names_its_micro_batch_and_stage_and_sits_on_its_lane(result):
    trace = to_pipeline_trace(result)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    for e in (e for e in trace["traceEvents"] if e["ph"] == "X"):
        action, stage, mb = e["args"]["action"], e["args"]["stage"], e["args"]["microbatch"]
        lane = threads[e["pid"], e["tid"]]
        if "OVERLAP_F_B" in action:
            assert e["name"].startswith(f"F{mb} s{stage} + ") and lane.endswith("compute")
        elif re.fullmatch(r"\d+[FBIW]\d+", action):
            assert e["name"] == f"{action[len(str(stage))]}{mb} s{stage}" and lane.endswith("compute")
        elif "SEND" in action or "RECV" in action:
            assert e["name"] == f"{action[len(str(stage)) : -len(str(mb))]} {mb} s{stage}"
            assert lane.endswith("send" if "SEND" in action else "recv")
        else:
            assert e["name"] == f"{action[len(str(stage)) :]} s{stage}" and "fsdp" in lane


def test_every_transfer_flows_from_its_send_to_its_receive_on_another_rank(result):
    events = to_pipeline_trace(result)["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    sends = sum(int(a[0]) in (ActionKind.SEND_F, ActionKind.SEND_B) for acts in result.program.actions for a in acts)
    assert len(starts) == len(ends) == sends > 0
    for k, s in starts.items():
        assert s["pid"] != ends[k]["pid"] and s["ts"] == ends[k]["ts"]  # one transfer: both ends share its time


def test_the_html_has_a_panel_per_rank_with_its_lanes_and_the_summary(result, tmp_path):
    page = write_pipeline_html(result, tmp_path / "pp.html").read_text()
    data = json.loads(re.search(r'id="timeline-data">(.*?)</script>', page).group(1).replace("<\\/", "</"))
    assert [o["label"] for o in data["orders"]] == [f"rank {r}" for r in range(result.program.pp_size)]
    for rank, order in enumerate(data["orders"]):
        assert order["lanes"][:3] == ["compute", "send", "recv"] and "fsdp all_gather" in order["lanes"]
        assert len(order["bars"]) == len(_timed(result, rank))
        assert order["peak_bytes"] == result.per_rank[rank].peak_memory_bytes
    assert data["axis_ns"] == round(result.step_s * 1e9)
    assert f"{100 * result.bubble_fraction:.1f} %" in page and result.program.schedule in page
    assert all(f'<td class="">{r}</td>' in page for r in range(result.program.pp_size))


def test_the_command_writes_both_for_a_zoo_job_and_refuses_a_device_as_output(tmp_path):
    args = ["pipeline", "llama-tiny", "--parallel", "fsdp+tp", "--world-size", "8", "--tp-size", "2", "--pp-size",
            "2", "--layers", "2", "--pp-schedule", "Interleaved1F1B", "--microbatches", "4"]  # fmt: skip
    html_path, trace_path = tmp_path / "r.html", tmp_path / "t.json"
    res = runner.invoke(app, [*args, "--html", str(html_path), "--trace", str(trace_path), "--json", "-"])
    assert res.exit_code == 0, res.output
    step = json.loads(res.stdout)
    trace = json.loads(trace_path.read_text())
    assert trace["commsched"]["step_s"] == step["step_s"] and trace["commsched"]["stages"] == step["stages"]
    page = html_path.read_text()
    assert re.search(r'<td class="">[^<]*emb', page) and re.search(r'<td class="">[^<]*out<', page)  # the layers
    assert "tokens / s per GPU" in page
    bad = runner.invoke(app, [*args, "--trace", str(tmp_path)])
    assert bad.exit_code == 2 and "--trace" in bad.stderr and not (tmp_path / "t.json.tmp").exists()


def test_without_fsdp_no_fsdp_lane_is_drawn_and_the_html_needs_no_job():
    res = simulate_pipeline("1F1B", 2, 2, None, StageCosts(forward_s=1.0, backward_s=2.0), free_comm=True)
    page = render_pipeline_html(res)
    assert "rank 1" in page and "tokens / s per GPU" not in page and '"fsdp all_gather"]' not in page
    threads = [e["args"]["name"] for e in to_pipeline_trace(res)["traceEvents"] if e.get("name") == "thread_name"]
    assert sorted({t.split(" ", 2)[2] for t in threads}) == ["compute", "recv", "send"]


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([("1F1B", 1, 1), ("Interleaved1F1B", 2, 2), ("ZBVZeroBubble", 2, 1), ("InterleavedZeroBubble", 2,
                     2), ("DualPipeV", 2, 2), ("GPipe", 1, 1)]),
    st.sampled_from([2, 4]),
    st.lists(st.integers(1, 5000), min_size=4, max_size=4),
    st.booleans(),
)  # fmt: skip
def test_the_trace_s_compute_slices_never_overlap_and_sum_to_each_rank_s_busy_time(case, p, us, free):
    """Any schedule and costs: a rank's compute slices run one at a time in its program order, their durations sum
    to the simulator's busy time, and every flow joins a send to a receive of the same transfer."""
    name, v, m_per_p = case
    f, i, w, send = (x * 1e-6 for x in us)
    costs = StageCosts(forward_s=f, backward_input_s=i, backward_weight_s=w, send_bytes=int(send * 1e12),
                       unshard_s=w, reduce_grad_s=i)  # fmt: skip
    res = simulate_pipeline(name, p, p * m_per_p * v, v, costs, "h100-sxm", free_comm=free)
    events = to_pipeline_trace(res)["traceEvents"]
    for rank, stats in enumerate(res.per_rank):
        compute = [e for e in events if e["ph"] == "X" and e["pid"] == rank and e["cat"] == "kernel"]
        ends = [e["ts"] + e["dur"] for e in compute]
        assert all(b["ts"] >= a_end - 1e-3 for a_end, b in zip(ends, compute[1:], strict=False))
        assert sum(e["dur"] for e in compute) * 1e3 == pytest.approx(stats.busy_s * 1e9, abs=len(compute))
    flows = [e for e in events if e["ph"] in "sf"]
    assert len(flows) == 2 * len({e["id"] for e in flows})
