"""How far off is the collective model? Every public nccl-tests / rccl-tests log shipped with commsched, against the
shipped profile of its GPU, with no calibration (issue 17's baseline).

Usage: python benchmarks/bench_collective_accuracy.py [--per-log] [--held-out]
Data: src/commsched/cost/data/nccl_tests (sources.toml cites each log). Ranks and nodes come from the index (some
logs' headers were elided); the model is ``plan_collective`` on the GPU's shipped profile at that placement
(``ranks / nodes`` per node). Error = model busbw / measured busbw - 1 per size (the smaller of out-of-place and
in-place time); per log and size class the median of |error|. Summary: per network class and size class, the median
and the worst of those per-log medians. Logs the index flags as degraded, a model without the collective
(sendrecv), GPUs without a profile, and multi-run summaries are left out and counted.

``--held-out``: the fit of issue 17 judged on data it was not fitted to. Per class of the data folder's suggested split
(whole sources held out), ``fit_profile`` on the fit logs, then the error of the fitted profile on the held-out logs
(bound hits allowed and reported), beside the shipped profile's error on the same held-out logs.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections import defaultdict
from pathlib import Path

import tomllib

import commsched
from commsched import hardware
from commsched.cost.collectives import bus_factor, plan_collective
from commsched.cost.nccl_fit import fit_profile
from commsched.cost.nccl_tests import MODELLED, NcclTestsLog, read_nccl_tests

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


SPLIT = {  # class: (profile, fit on, hold out), from the data folder's README ("Suggested split")
    "H100 one node": ("h100-sxm", ["xxrjun_cluster01_h100_1node_g8_all_reduce.txt",
                                   "xxrjun_cluster01_h100_1node_g8_all_gather.txt",
                                   "xxrjun_cluster01_h100_1node_g8_reduce_scatter.txt"],
                      ["nccl_tests_issue290_h100_1node_g8_ar.txt", "aws_ads_batch_p5_ar.txt"]),
    "H100 IB, several nodes": ("h100-sxm", [f"nccl_tests_issue309_h100_{n}node_ib_ar_gjaion.txt" for n in (2, 4, 8)],
                               ["nccl_tests_issue309_h100_2node_ib_ar_qoofyk.txt",
                                "nccl_tests_issue309_h100_4node_ib_vm_ar_qoofyk.txt",
                                "xxrjun_cluster01_h100_10node_g8_all_reduce.txt",
                                "xxrjun_cluster01_h100_10node_g8_all_gather.txt",
                                "xxrjun_cluster01_h100_10node_g8_reduce_scatter.txt"]),
    "H100 EFA (p5)": ("h100-sxm", ["aws_ads_p5_2node_efa_ar.txt"], ["aws_ads_p5_2node_eks_ar_excerpt.txt"]),
    "A100 RoCE (OCI)": ("a100-sxm-80g", ["oci_oke_a100_40g_2node_roce_ar_2024.txt"],
                        [f"oci_oke_a100_40g_2node_roce_ar_{v}.txt" for v in ("1g4g_2025", "1g8g_2026")]),
    "MI300X": ("mi300x", ["hisohara_aac8_mi300x_1node_rccl_ar.txt", "hisohara_aac10_mi300x_2node_roce_rccl_ar.txt"],
               ["oci_oke_mi300x_2node_roce_rccl_ar.txt"]),
}  # fmt: skip


def indexed(entry: dict) -> NcclTestsLog:
    """A shipped log with the ranks and hosts of its index entry (some logs elide their rank lines)."""
    (log,) = read_nccl_tests(DATA / entry["file"], collective=entry["collective"])
    per_node = entry["nranks"] // entry["nodes"]
    return dataclasses.replace(log, nranks=entry["nranks"], nodes=entry["nodes"],
                               ranks_per_host=(per_node,) * entry["nodes"])  # fmt: skip


def class_errors(sizes) -> dict[str, tuple[float, float, float, float]]:
    """Per size class: (median, worst) |error| of the shipped profile, then of the fitted one."""
    out = {}
    for name, lo, hi in SIZE_CLASSES:
        inside = [s for s in sizes if lo <= s.size_bytes <= hi]
        if inside:
            before = [abs(s.before_err) for s in inside]
            after = [abs(s.after_err) for s in inside]
            out[name] = (statistics.median(before), max(before), statistics.median(after), max(after))
    return out


def held_out(index: dict[str, dict]) -> None:
    print("| class | fit on | held out | size class | shipped: median / worst | fitted: median / worst | notes |")
    print("|---|---|---|---|---|---|---|")
    for cls, (profile, fit_files, hold_files) in SPLIT.items():
        fit = fit_profile([indexed(index[f]) for f in fit_files], profile, allow_bounds=True)
        sizes = fit.evaluate([indexed(index[f]) for f in hold_files])
        bounds = [p.key for p in fit.parameters if p.status.startswith("at ")]
        note = f"bound: {', '.join(bounds)}" if bounds else ""
        for name, (mb, wb, ma, wa) in class_errors(sizes).items():
            print(f"| {cls} | {len(fit_files)} | {len(hold_files)} | {name} | {mb:.0%} / {wb:.0%} | "
                  f"{ma:.0%} / {wa:.0%} | {note} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-log", action="store_true", help="one row per log as well")
    ap.add_argument("--held-out", action="store_true", help="fit per class, error on held-out sources")
    args = ap.parse_args()
    index = tomllib.loads((DATA / "sources.toml").read_text())["log"]
    if args.held_out:
        held_out({e["file"]: e for e in index})
        return
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
