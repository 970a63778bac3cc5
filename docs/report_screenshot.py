"""Make docs/report.png, the README's picture of the HTML report: the demo's comparison (traced order and our
``overlap`` schedule) for llama3-8b / FSDP on 64 ranks, 2 layers, on H100 nodes, rendered in headless Chromium.

    PYTHONPATH=src python docs/report_screenshot.py       # writes docs/report.png
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from commsched import hardware
from commsched.cost import estimate_costs
from commsched.passes import schedule
from commsched.passes.overlap import OverlapConfig
from commsched.report.browser import screenshot
from commsched.report.html import write_comparison_html
from commsched.sim import simulate_costs
from commsched.workloads import build

HERE = Path(__file__).resolve().parent


def main() -> None:
    w = build("llama3-8b", parallel="fsdp", world_size=64, layers=2, seq_len=2048)
    hw = hardware.for_graph("h100-sxm", w.graph)
    costs = estimate_costs(w.graph, hw)
    before = simulate_costs(w.graph, costs)
    after = simulate_costs(w.graph, costs, schedule(w.graph, costs).order)
    budget = OverlapConfig().memory_budget.limit_bytes(before.peak_memory_bytes)
    with tempfile.TemporaryDirectory() as scratch:
        orders = [("traced order", before), ("overlap", after)]
        page = write_comparison_html(orders, Path(scratch) / "report.html", hardware=hw, memory_budget_bytes=budget,
                                     context={"hardware": "h100-sxm"})  # fmt: skip
        print(screenshot(page, HERE / "report.png", width=1280, height=1000))


if __name__ == "__main__":
    main()
