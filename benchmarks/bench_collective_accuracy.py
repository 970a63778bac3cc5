"""How far off is the collective model? Every public nccl-tests / rccl-tests log shipped with commsched, against the
shipped profile of its GPU, with no calibration (issue 17's baseline).

Usage: python benchmarks/bench_collective_accuracy.py [--per-log]
Data: src/commsched/cost/data/nccl_tests (sources.toml cites each log). Ranks and nodes come from the index (some
logs' headers were elided); the model is ``plan_collective`` on the GPU's shipped profile at that placement
(``ranks / nodes`` per node). Error = model busbw / measured busbw - 1 per size (the smaller of out-of-place and
in-place time); per log and size class the median of |error|. Summary: per network class and size class, the median
and the worst of those per-log medians. Logs the index flags as degraded, a model without the collective
(sendrecv), GPUs without a profile, and multi-run summaries are left out and counted.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import tomllib

import commsched
from commsched import hardware
from commsched.cost.collectives import bus_factor, plan_collective
from commsched.cost.nccl_tests import MODELLED, read_nccl_tests

DATA = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
SIZE_CLASSES = (("1-16 MB", 1 << 20, 16 << 20), ("16-256 MB", 16 << 20, 256 << 20), ("256 MB-8 GB", 256 << 20, 8 << 30))
PROFILES = (("GB200", "b200"), ("B200", "b200"), ("H200", "h200-sxm"), ("H100", "h100-sxm"), ("A100", "a100-sxm-80g"),
            ("MI3", "mi300x"))  # fmt: skip
NETWORKS = (("efa", "EFA"), ("tcpx", "TCPX"), ("roce", "RoCE"), ("rdma", "RoCE"), ("infiniband", "IB"), ("ib ", "IB"),
            ("nvlink", "NVLink"), ("infinity fabric", "NVLink"))  # fmt: skip


def profile_of(gpu: str) -> str | None:
    return next((p for key, p in PROFILES if key in gpu), None)


def network_of(entry: dict) -> str:
    """One of NVLink (one node or one NVLink domain), IB, RoCE, EFA, TCPX, unknown."""
    if entry.get("nodes") == 1:
        return "NVLink"
    text = entry["network"].lower()
    return next((cls for key, cls in NETWORKS if key in text), "unknown")


def log_errors(entry: dict) -> dict[str, float] | str:
    """Median |busbw error| per size class of one log, or why it was left out."""
    profile = profile_of(entry["gpu"])
    if entry["kind"] != "log" or "degraded" in entry["file"]:
        return "summary" if entry["kind"] != "log" else "degraded (index)"
    if profile is None or not isinstance(entry["nranks"], int) or not isinstance(entry["nodes"], int):
        return "no profile" if profile is None else "several runs"
    (log,) = read_nccl_tests(DATA / entry["file"], collective=entry["collective"])
    if log.collective not in MODELLED:
        return f"{log.collective} not modelled"
    n, nodes = entry["nranks"], entry["nodes"]
    hw = hardware.get(profile, num_nodes=nodes, gpus_per_node=n // nodes)
    per_class: dict[str, list[float]] = defaultdict(list)
    for row in log.rows:
        for name, lo, hi in SIZE_CLASSES:
            if lo <= row.size_bytes < hi or (hi == 8 << 30 and row.size_bytes == hi):
                measured = bus_factor(log.collective, n) * row.size_bytes / row.time_s / 1e9
                model_s = plan_collective(log.collective, row.size_bytes, n, hw).time_s
                model = bus_factor(log.collective, n) * row.size_bytes / model_s / 1e9
                per_class[name].append(abs(model / measured - 1))
    return {name: statistics.median(errs) for name, errs in per_class.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-log", action="store_true", help="one row per log as well")
    args = ap.parse_args()
    index = tomllib.loads((DATA / "sources.toml").read_text())["log"]
    summary: dict[tuple[str, str], list[float]] = defaultdict(list)
    left_out: dict[str, int] = defaultdict(int)
    rows = []
    for entry in index:
        errs = log_errors(entry)
        if isinstance(errs, str):
            left_out[errs] += 1
            continue
        net = network_of(entry)
        rows.append((entry["file"], net, entry["nodes"], errs))
        for cls, e in errs.items():
            summary[(net, cls)].append(e)
    if args.per_log:
        print("| log | network | nodes | " + " | ".join(c for c, _, _ in SIZE_CLASSES) + " |")
        print("|---|---|---|" + "---|" * len(SIZE_CLASSES))
        for file, net, nodes, errs in rows:
            cells = " | ".join(f"{errs[c] * 100:.0f} %" if c in errs else "-" for c, _, _ in SIZE_CLASSES)
            print(f"| {file} | {net} | {nodes} | {cells} |")
        print()
    print("| network | logs | " + " | ".join(f"{c}: median / worst" for c, _, _ in SIZE_CLASSES) + " |")
    print("|---|---|" + "---|" * len(SIZE_CLASSES))
    for net in ("NVLink", "IB", "RoCE", "EFA", "TCPX", "unknown"):
        n_logs = sum(1 for r in rows if r[1] == net)
        if not n_logs:
            continue
        cells = []
        for cls, _, _ in SIZE_CLASSES:
            errs = summary.get((net, cls), [])
            cells.append(f"{statistics.median(errs) * 100:.0f} % / {max(errs) * 100:.0f} %" if errs else "-")
        print(f"| {net} | {n_logs} | " + " | ".join(cells) + " |")
    print(f"\nleft out: {dict(left_out)}")


if __name__ == "__main__":
    main()
