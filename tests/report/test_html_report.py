"""The HTML report (issue 19.11): an interactive timeline with every order on one shared, zoomable time axis, drawn
in headless Chromium without a console message; MFU and tokens/s; what the schedule moved and why each collective
that stays exposed does, every reason checked against the simulation it was read from."""

from __future__ import annotations

import re

import numpy as np
import pytest

from commsched import hardware
from commsched.cost import estimate_costs
from commsched.memory import memory_profile
from commsched.passes import schedule
from commsched.report.browser import find_chromium, load_page
from commsched.report.html import render_comparison_html, write_comparison_html
from commsched.report.rates import step_rates
from commsched.report.why import collective_facts, what_moved
from commsched.sim import simulate_costs
from commsched.workloads import build


@pytest.fixture(scope="module")
def step():
    """llama-tiny under FSDP + TP (two process groups) on 4 ranks: the traced order and our schedule."""
    w = build("llama-tiny", parallel="fsdp+tp", world_size=4, tp_size=2, layers=2)
    hw = hardware.for_graph("h100-sxm", w.graph)
    costs = estimate_costs(w.graph, hw)
    before = simulate_costs(w.graph, costs)
    after = simulate_costs(w.graph, costs, schedule(w.graph, costs).order)
    assert after.makespan_s < before.makespan_s
    return w.graph, hw, before, after


def _attrs(dom: str, tag: str, cls: str) -> list[dict[str, str]]:
    """The attributes of every ``<tag>`` element of class ``cls`` in ``dom``."""
    elements = [dict(re.findall(r'([\w-]+)="([^"]*)"', a)) for a in re.findall(rf"<{tag}\b([^>]*)>", dom)]
    return [e for e in elements if e.get("class") == cls]


def test_timeline_draws_every_order_on_one_zoomable_axis_in_chromium(step, tmp_path):
    if find_chromium() is None:
        pytest.fail("Chromium is not installed: `make test` installs it (Debian: apt-get install -y chromium)")
    g, hw, before, after = step
    peak = max(before.peak_memory_bytes, after.peak_memory_bytes)
    path = write_comparison_html([("traced order", before), ("overlap", after)], tmp_path / "report.html",
                                 hardware=hw, capacity_bytes=1.2 * peak)  # fmt: skip
    text = path.read_text()
    assert "src=" not in text and "https://" not in text  # self-contained: nothing fetched at view time
    dom, console = load_page(path)
    assert console == [], console  # no error, no log
    assert 'data-timeline="drawn 2"' in dom
    svgs = _attrs(dom, "svg", "timeline")
    assert [s["data-order"] for s in svgs] == ["0", "1"]
    axes = _attrs(dom, "g", "axis")
    axis_ns = str(max(before.makespan_ns, after.makespan_ns))
    assert len(axes) == 2 and all(a["data-axis-ns"] == axis_ns and a["data-t0"] == "0" for a in axes)
    assert all(a["data-t1"] == axis_ns for a in axes)  # both panels show the whole step on the same axis
    assert dom.count('class="tick"') >= 4 and len(_attrs(dom, "line", "capacity")) == 2
    assert len(_attrs(dom, "path", "memory")) == 2 and len(_attrs(dom, "rect", "exposed")) > 0
    bars = len(re.findall(r"<rect [^>]*data-i=", dom))
    assert bars > len(g.collectives)  # kernels, collectives and blocked waits, both orders
    # the legend sits in its own row above the panels, never inside a panel's picture
    assert dom.index('id="legend"') < dom.index('id="timeline-panels"')
    assert "comm:1" in dom and "comm:2" in dom  # one colour per process group's collectives
    # zooming one panel zooms all: the page's self-test zooms to the second quarter of the axis
    dom, console = load_page(path, fragment="selftest")
    assert console == []
    view = re.search(r'data-selftest="([^"]*)"', dom).group(1).split("|")
    t0, t1 = (int(v) for v in view[0].split("-"))
    assert view == [view[0]] * 2 and abs(t0 - int(axis_ns) / 4) <= 1 and abs(t1 - int(axis_ns) / 2) <= 1
    assert [a["data-t0"] for a in _attrs(dom, "g", "axis")] == [str(t0)] * 2


def test_mfu_and_tokens_per_second_come_from_the_step(step):
    g, hw, before, after = step
    rates = step_rates(after, hw)
    assert rates.dtype == "bfloat16" and rates.tokens_per_step == g.meta["tokens_per_step"] > 0
    assert rates.mfu == pytest.approx(g.flops.sum() / (after.makespan_s * hw.compute.peak_flops_for("bfloat16")))
    assert rates.tokens_per_s == pytest.approx(g.meta["tokens_per_step"] / after.makespan_s)
    page = render_comparison_html([("traced order", before), ("overlap", after)], hardware=hw)
    assert "MFU (bfloat16)" in page and f"{100 * rates.mfu:.1f} %" in page
    assert step_rates(after).mfu is None  # no hardware, no peak: "-" rather than a guess


def test_what_moved_and_why_are_read_off_the_simulation(step):
    g, _hw, before, after = step
    budget = 1.05 * before.peak_memory_bytes
    rows = what_moved(before, after, memory_budget_bytes=budget)
    assert len(rows) == len(g.collectives)
    assert sum(r.exposed_after_ns for r in rows) == int(after.exposed_ns_per_collective.sum())
    assert {r.status for r in rows} >= {"hidden now", "still exposed"}
    for r in rows:
        assert (r.status in ("still exposed", "newly exposed")) == (r.exposed_after_ns > 0)
        assert (r.reason == "hidden") == (r.why == "hidden behind compute") == (r.exposed_after_ns == 0)
    pos = np.empty(len(g), np.int64)
    pos[after.order] = np.arange(len(g))
    for facts, res, cap in ((collective_facts(before, memory_budget_bytes=before.peak_memory_bytes), before,
                             before.peak_memory_bytes), (collective_facts(after), after, None)):  # fmt: skip
        assert {f.reason for f in facts} - {"hidden"} >= {"group order", "dependency"}
        for f in facts:
            c = f.node
            if f.reason == "queued":  # started after its issue, behind its group's previous collective
                prev = g.id_of(f.previous)
                assert res.start_ns[c] > res.issue_ns[c] and res.end_ns[prev] > res.issue_ns[c]
                assert g.coll_group[prev] == g.coll_group[c] and res.issue_ns[prev] <= res.issue_ns[c]
            if f.reason == "group order":  # its group's previous one came after its inputs were ready
                assert res.issue_ns[g.id_of(f.previous)] > res.issue_ns[c] - f.held_ns
            if f.reason == "dependency":  # not enough time between its issue and its first use to run it
                assert f.window_ns + f.held_ns < f.duration_ns + f.sync_ns
            if f.peak_if_early_bytes is not None:  # the memory model, with the collective issued earlier
                moved = [int(i) for i in res.order if i != c]
                early = max(int(np.flatnonzero(res.order == p)[0]) for p in g.predecessors(c)) + 1
                moved.insert(early, c)
                assert f.peak_if_early_bytes == memory_profile(g, np.array(moved)).peak_bytes and "peaks at" in f.why
                if cap is not None and f.peak_if_early_bytes > cap:
                    assert "memory budget" in f.why
    first = min(collective_facts(before), key=lambda f: f.position)
    # the first gather feeds the embedding, the first op of the step: nothing can hide it
    assert first.reason == "dependency" and "needed by embedding as soon as its inputs are ready" in first.why
    # here no collective issued earlier raises the traced order's peak (FSDP2 frees a unit's gathered parameters
    # together): a budget just below what an early issue needs makes the memory reason appear, and only where it holds
    early = max(f.peak_if_early_bytes for f in collective_facts(before) if f.peak_if_early_bytes is not None)
    memory = [f for f in collective_facts(before, memory_budget_bytes=early - 1) if "budget" in f.why]
    assert memory and all(f.peak_if_early_bytes > early - 1 for f in memory)
    page = render_comparison_html([("traced order", before), ("overlap", after)])
    assert 'id="what-moved"' in page and "hidden now" in page and "needed by embedding" in page


def test_single_order_report_draws_its_timeline_without_console_messages(step, tmp_path):
    from commsched.report.html import write_html

    if find_chromium() is None:
        pytest.fail("Chromium is not installed: `make test` installs it (Debian: apt-get install -y chromium)")
    _g, hw, _before, after = step
    dom, console = load_page(write_html(after, tmp_path / "one.html", hardware=hw), fragment="selftest")
    assert console == [] and 'data-timeline="drawn 1"' in dom and "data-selftest=" in dom
    assert "Top exposed collectives, and why" in dom and "MFU (bfloat16)" in dom


def test_recomputed_kernels_are_marked_in_chromium(tmp_path):
    """Issue 38: full activation checkpointing (llama-tiny, FSDP over 2 ranks, 2 layers): each kernel the backward
    recomputes (the ``recompute`` tag of the traced step) is drawn in its own colour with class ``recompute``, the
    legend names it, and a step without AC marks none."""
    if find_chromium() is None:
        pytest.fail("Chromium is not installed: `make test` installs it (Debian: apt-get install -y chromium)")
    from commsched.ir.transform import NODE_TAGS_META
    from commsched.report.html_assets import COLORS
    from commsched.report.timeline import COMPUTE, OTHER, timeline_data

    pages = {}
    for ac in ("full", "none"):
        w = build("llama-tiny", parallel="fsdp", world_size=2, layers=2, seq_len=64, ac=ac)
        res = simulate_costs(w.graph, estimate_costs(w.graph, "h100-sxm"))
        data = timeline_data([("traced order", res)])
        tagged = set(w.graph.meta.get(NODE_TAGS_META, {}).get("recompute", ()))
        kernels = [b for b in data["orders"][0]["bars"] if b[3] in (COMPUTE, OTHER)]
        marked = [b for b in kernels if data["names"][b[4]] in tagged]
        assert (len(marked) > 0) == (ac == "full") and len(marked) < len(kernels)
        pages[ac] = (write_comparison_html([("traced order", res)], tmp_path / f"{ac}.html"), len(marked))
    for ac, (path, expected) in pages.items():
        dom, console = load_page(path)
        assert console == [], console
        rects = _attrs(dom, "rect", "recompute")
        assert len(rects) == expected, ac  # every recomputed kernel, and nothing else
        assert all(r["fill"] == COLORS["recompute"] for r in rects)
        assert ("recomputed kernel (activation checkpointing)" in dom) == (ac == "full")
