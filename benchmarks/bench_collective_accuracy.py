"""How far off is the collective model? Every public nccl-tests / rccl-tests log shipped with commsched, against the
shipped profile of its GPU, with no calibration (issue 17's baseline).

Usage: python benchmarks/bench_collective_accuracy.py [--per-log] [--held-out] [--families] [--cross-cluster]
Data: src/commsched/cost/data/nccl_tests (sources.toml cites each log). Ranks and nodes come from the index (some
logs' headers were elided); the model is ``plan_collective`` on the GPU's shipped profile at that placement
(``ranks / nodes`` per node). Error = model busbw / measured busbw - 1 per size (the smaller of out-of-place and
in-place time); per log and size class the median of |error|. Summary: per network class and size class, the median
and the worst of those per-log medians. Logs the index flags as degraded, a model without the collective
(sendrecv), GPUs without a profile, and multi-run summaries are left out and counted.

``--held-out``: the fit of issue 17 judged on data it was not fitted to. Per class of the data folder's suggested split
(whole sources held out), ``fit_profile`` on the fit logs (classes whose fit logs all span nodes: only the network's
fields, as ``calibrate --fit --network`` and the shipped network profiles), then the error of the fitted profile on the
held-out logs (bound hits allowed and reported), beside the shipped profile's error on the same held-out logs: the
median over sizes, the worst log's median, the worst size. Then how far two H100 InfiniBand clusters measure from
each other at the same sizes and node counts: a floor for any model not fitted to the cluster at hand.

``--families``: issue 17's bar per network family (IB, RoCE, EFA): every held-out log of the family (whole sources no
network profile was fitted to) under its GPU profile and the family's shipped network profile, median |busbw error|
over the held-out sizes and the worst log's median, per size class.

``--cross-cluster``: leave one cluster out over the H100 InfiniBand clusters of the data folder (whole sources): the
network's fields fitted on each other cluster alone and on all the others at once, judged on the one left out; does a
network fitted on several clusters sit between them and hold better on a cluster it never saw?
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
from collections import defaultdict
from pathlib import Path

import tomllib

import commsched
from commsched import hardware
from commsched.cost.collectives import bus_factor, plan_collective
from commsched.cost.nccl_fit import fit_profile
from commsched.cost.nccl_tests import MODELLED, NcclTestsLog, compare_with_model, read_nccl_tests

DATA = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
SIZE_CLASSES = (("1-16 MB", 1 << 20, 16 << 20), ("16-256 MB", 16 << 20, 256 << 20), ("256 MB-8 GB", 256 << 20, 8 << 30))
PROFILES = (("GB200", "gb200-nvl72"), ("B200", "b200"), ("H200", "h200-sxm"), ("H100", "h100-sxm"),
            ("A100", "a100-sxm-80g"), ("MI3", "mi300x"))  # fmt: skip
NETWORKS = (("efa", "EFA"), ("tcpx", "TCPX"), ("roce", "RoCE"), ("rdma", "RoCE"), ("infiniband", "IB"), ("ib ", "IB"),
            ("nvlink", "NVLink"), ("infinity fabric", "NVLink"))  # fmt: skip


def profile_of(gpu: str) -> str | None:
    return next((p for key, p in PROFILES if key in gpu), None)


def network_of(entry: dict) -> str:
    """One of NVLink (one node or one NVLink domain), IB, RoCE, EFA, TCPX, unknown."""
    nodes = nvlink_domains(entry)[0] if profile_of(entry["gpu"]) == "gb200-nvl72" else entry.get("nodes")
    if nodes == 1:
        return "NVLink"
    text = entry["network"].lower()
    return next((cls for key, cls in NETWORKS if key in text), "unknown")


def nvlink_domains(entry: dict) -> tuple[int, int]:
    """(NVL72 racks, ranks per rack) of a GB200 log: the model's node is the rack's NVLink domain, not the 4-GPU tray
    the index counts as a host. CoreWeave's 2-rack run used 64 GPUs per rack (sources.toml)."""
    n = entry["nranks"]
    per_rack = 64 if n == 128 else min(n, 72)
    return -(-n // per_rack), per_rack


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
    nodes, per_node = nvlink_domains(entry) if profile == "gb200-nvl72" else (nodes, n // nodes)
    # the GPU profile's own network (NCCL's constants), not its default fitted one: issue 17's uncalibrated baseline
    hw = hardware.get(f"{profile}@{hardware.NCCL_DEFAULTS}", num_nodes=nodes, gpus_per_node=per_node)
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
    "H100 IB, several nodes": ("h100-sxm@ib-ndr-8x400",
                               [f"nccl_tests_issue309_h100_{n}node_ib_ar_gjaion.txt" for n in (2, 4, 8)],
                               ["nccl_tests_issue309_h100_2node_ib_ar_qoofyk.txt",
                                "nccl_tests_issue309_h100_4node_ib_vm_ar_qoofyk.txt",
                                "dstack_nebius_h100_2node_ib_ar.txt",
                                "skypilot_together_h100_2node_ib_ar.txt",
                                "xxrjun_cluster01_h100_10node_g8_all_reduce.txt",
                                "xxrjun_cluster01_h100_10node_g8_all_gather.txt",
                                "xxrjun_cluster01_h100_10node_g8_reduce_scatter.txt"]),
    "H100 EFA (p5), 2024 stack": ("h100-sxm@efa-p5", ["aws_ads_p5_2node_efa_ar.txt"],
                                  ["aws_do_eks_p5_2node_efa_ar.txt"]),
    "H100 EFA (p5), 2023 stack": ("h100-sxm@efa-p5", ["aws_ads_p5_2node_efa_ar.txt"],
                                  ["aws_ads_p5_2node_eks_ar_excerpt.txt"]),
    "H200 RoCE 8x400G (GCP A3 Ultra)": ("h200-sxm@roce-8x400", ["skypilot_gcp_a3ultra_h200_2node_rdma_all_gather.txt"],
                                        ["skypilot_gcp_a3ultra_h200_2node_rdma_all_gather_gcppods.txt"]),
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


def class_errors(sizes) -> dict[str, tuple[float, ...]]:
    """Per size class, of the shipped profile then of the fitted one: (median over sizes, worst log's median, worst
    size) |busbw error|."""
    out = {}
    for name, lo, hi in SIZE_CLASSES:
        inside = [s for s in sizes if lo <= s.size_bytes <= hi]
        if not inside:
            continue
        row: list[float] = []
        for err in (lambda s: abs(s.before_err), lambda s: abs(s.after_err)):
            per_log = defaultdict(list)
            for s in inside:
                per_log[s.source].append(err(s))
            worst_log = max(statistics.median(v) for v in per_log.values())
            row += [statistics.median(err(s) for s in inside), worst_log, max(err(s) for s in inside)]
        out[name] = tuple(row)
    return out


def cluster_spread(pairs: list[tuple[str, str]], index: dict[str, dict]) -> dict[str, list[float]]:
    """Per size class, |time of one cluster / time of the other - 1| at the same size, collective and node count:
    how far apart two clusters of the same hardware measure (a floor for any model not fitted to the cluster)."""
    out: dict[str, list[float]] = defaultdict(list)
    for a, b in pairs:
        times_b = {r.size_bytes: r.time_s for r in indexed(index[b]).rows}
        for r in indexed(index[a]).rows:
            for name, lo, hi in SIZE_CLASSES:
                if lo <= r.size_bytes <= hi and r.size_bytes in times_b:
                    out[name].append(abs(r.time_s / times_b[r.size_bytes] - 1))
    return out


SPREAD = [  # (cluster gj-aion, cluster qoofyk) at 2 and 4 nodes of 8 H100 on 8 x 400G InfiniBand
    ("nccl_tests_issue309_h100_2node_ib_ar_gjaion.txt", "nccl_tests_issue309_h100_2node_ib_ar_qoofyk.txt"),
    ("nccl_tests_issue309_h100_4node_ib_ar_gjaion.txt", "nccl_tests_issue309_h100_4node_ib_vm_ar_qoofyk.txt"),
]


def _pct3(a: float, b: float, c: float) -> str:
    return f"{a:.0%} / {b:.0%} / {c:.0%}"


SHIPPED_NETWORKS = [  # (log, GPU profile, network profile or None): logs no network profile was fitted to
    ("dstack_nebius_h100_2node_ib_ar.txt", "h100-sxm", "ib-ndr-8x400"),
    ("dstack_lambda_b200_2node_ib_ar.txt", "b200", "ib-ndr-8x400"),
    ("dstack_gcp_a4_b200_2node_roce_ar.txt", "b200", "roce-8x400"),
    ("oci_hpc_h100_2node_roce_ar.txt", "h100-sxm", "roce-8x400"),
    ("dstack_crusoe_a100_2node_ib_ar.txt", "a100-sxm-80g", None),  # 8 x 200G HDR: the GPU profile's own network
]


def _class_median(comparison, lo: int, hi: int) -> str:
    errs = [abs(s.rel_err) for s in comparison.sizes if lo <= s.size_bytes <= hi and s.rel_err is not None]
    return f"{statistics.median(errs):.0%}" if errs else "-"


def shipped_networks(index: dict[str, dict]) -> None:
    """The shipped profiles, unfitted, on held-out logs: the GPU profile alone (NCCL's constants) and under its
    network profile. Median |busbw error| per size class."""
    print("| log | GPU | network | " + " | ".join(f"{c}: GPU alone / with network" for c, _, _ in SIZE_CLASSES) + " |")
    print("|---|---|---|" + "---|" * len(SIZE_CLASSES))
    for file, gpu, network in SHIPPED_NETWORKS:
        nets = (hardware.NCCL_DEFAULTS, network)
        errs = [compare_with_model(indexed(index[file]), f"{gpu}@{n}") for n in nets]
        cells = [" / ".join(_class_median(c, lo, hi) for c in errs) for _, lo, hi in SIZE_CLASSES]
        net = network or "none (its own 8 x 200G, NCCL constants)"
        print(f"| {file} | {gpu} | {net} | " + " | ".join(cells) + " |")


FAMILIES = {  # network family: held-out logs (whole sources no network profile was fitted to), GPU@shipped network
    "IB": [(f, "h100-sxm@ib-ndr-8x400") for f in SPLIT["H100 IB, several nodes"][2]]
          + [("dstack_lambda_b200_2node_ib_ar.txt", "b200@ib-ndr-8x400")],
    "RoCE": [("skypilot_gcp_a3ultra_h200_2node_rdma_all_gather_gcppods.txt", "h200-sxm@roce-8x400"),
             ("dstack_gcp_a4_b200_2node_roce_ar.txt", "b200@roce-8x400"),
             ("oci_hpc_h100_2node_roce_ar.txt", "h100-sxm@roce-8x400")],
    "EFA": [("aws_do_eks_p5_2node_efa_ar.txt", "h100-sxm@efa-p5")],
}  # fmt: skip


def family_errors(index: dict[str, dict], *, skip_doubtful: bool = False) -> dict[str, dict[str, tuple]]:
    """Per network family and size class: (median |busbw error| over the held-out sizes, the worst log's median, the
    number of logs with sizes there, the worst log), each log under its GPU and the shipped network profile of its
    family. ``skip_doubtful``: without the logs the index flags ``doubtful`` (not issue 17's bar, which counts all)."""
    out: dict[str, dict[str, tuple]] = {}
    for family, logs in FAMILIES.items():
        per_class: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for file, hw in logs:
            if skip_doubtful and "doubtful" in index[file]:
                continue
            for s in compare_with_model(indexed(index[file]), hw).sizes:
                for name, lo, hi in SIZE_CLASSES:
                    if lo <= s.size_bytes <= hi and s.rel_err is not None:
                        per_class[name][file].append(abs(s.rel_err))
        out[family] = {}
        for name, logs_ in per_class.items():
            worst = max(logs_, key=lambda f: statistics.median(logs_[f]))
            out[family][name] = (statistics.median(e for v in logs_.values() for e in v),
                                 statistics.median(logs_[worst]), len(logs_), worst)  # fmt: skip
    return out


def self_consistency(log: NcclTestsLog, lo: int, hi: int) -> tuple[float, float, int]:
    """A log's own agreement over its sizes in [lo, hi]: (median and largest |in-place time / out-of-place time -
    1|, how many times the measured time falls as the size doubles). Both placements run the same algorithm, and
    a latency + bandwidth time grows with the size, so both are noise in the measurement, not in a model."""
    rows = [r for r in log.rows if lo <= r.size_bytes <= hi]
    gaps = [abs(r.ip_time_us / r.oop_time_us - 1) for r in rows if r.ip_time_us]
    falls = sum(b.time_s < a.time_s for a, b in itertools.pairwise(rows))
    return (statistics.median(gaps), max(gaps), falls) if gaps else (math.nan, math.nan, falls)


def families(index: dict[str, dict]) -> None:
    head = " | ".join(f"{c}: median / worst log" for c, _, _ in SIZE_CLASSES)
    print(f"| network family | held-out logs | {head} |")
    print("|---|---|" + "---|" * len(SIZE_CLASSES))
    table = family_errors(index)
    for family, classes in table.items():
        cells = [f"{classes[c][0]:.0%} / {classes[c][1]:.0%} ({classes[c][2]})" if c in classes else "-"
                 for c, _, _ in SIZE_CLASSES]  # fmt: skip
        print(f"| {family} | {len(FAMILIES[family])} | " + " | ".join(cells) + " |")
    print("\nCells over the bar (median > 10 % or worst log > 25 %), with the worst log and the index's doubtful flag:")
    for family, classes in table.items():
        for c, (median, worst, _, file) in classes.items():
            if median > 0.10 or worst > 0.25:
                flag = f"doubtful: {index[file]['doubtful']}" if "doubtful" in index[file] else "not flagged"
                print(f"* {family} {c}: {median:.0%} / {worst:.0%}, worst log {file} ({flag})")
    lo, hi = SIZE_CLASSES[1][1:]
    print("\nThe InfiniBand held-out logs at 16-256 MB: the model's error (median |busbw error|), the log's agreement:")
    print("| log | model error | in-place vs out-of-place: median / largest | times that fall as the size doubles |")
    print("|---|---|---|---|")
    for file, hw in FAMILIES["IB"]:
        errs = [abs(s.rel_err) for s in compare_with_model(indexed(index[file]), hw).sizes
                if lo <= s.size_bytes <= hi and s.rel_err is not None]  # fmt: skip
        if not errs:
            continue
        gap, worst_gap, falls = self_consistency(indexed(index[file]), lo, hi)
        print(f"| {file} | {statistics.median(errs):.0%} | {gap:.0%} / {worst_gap:.0%} | {falls} |")
    cells = [f"{c} {v[0]:.0%} / {v[1]:.0%}" for c, v in family_errors(index, skip_doubtful=True)["IB"].items()]
    print(f"\nInfiniBand without the logs the index flags doubtful (not the bar): {', '.join(cells)}")


def _before_is_the_gpu_alone(sizes, profile: str) -> list:
    """``sizes`` with the "before" model replaced by the GPU profile as shipped (NCCL's constants) where ``profile``
    names a network (``GPU@NETWORK``: the fit then starts from the shipped network, and refits it)."""
    if "@" not in profile:
        return list(sizes)
    gpu = hardware.get(profile.split("@")[0], network=hardware.NCCL_DEFAULTS)
    out = []
    for s in sizes:
        hw = gpu.with_nodes(s.num_nodes, s.nranks // s.num_nodes)
        before_s = plan_collective(s.collective, s.size_bytes, s.nranks, hw).time_s
        out.append(dataclasses.replace(s, before_time_s=before_s))
    return out


def held_out(index: dict[str, dict]) -> None:
    print("| class | fit on | held out | fitted fields | size class | NCCL's constants: median / worst log / worst "
          "size | fitted: median / worst log / worst size | notes |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for cls, (profile, fit_files, hold_files) in SPLIT.items():
        logs = [indexed(index[f]) for f in fit_files]
        network = all(log.nodes > 1 for log in logs)  # all across nodes: the network's fields only, as `--network`
        fit = fit_profile(logs, profile, allow_bounds=True, network_only=network)
        sizes = _before_is_the_gpu_alone(fit.evaluate([indexed(index[f]) for f in hold_files]), profile)
        bounds = [p.key for p in fit.parameters if p.status.startswith("at ")]
        note = f"bound: {', '.join(bounds)}" if bounds else ""
        for name, errs in class_errors(sizes).items():
            print(f"| {cls} | {len(fit_files)} | {len(hold_files)} | {'network' if network else 'NVLink'} | {name} | "
                  f"{_pct3(*errs[:3])} | {_pct3(*errs[3:])} | {note} |")  # fmt: skip
    print()
    shipped_networks(index)
    spread = cluster_spread(SPREAD, index)
    cells = ", ".join(f"{name}: median {statistics.median(v):.0%}, worst {max(v):.0%}" for name, v in spread.items())
    print(f"\nTwo H100 IB clusters measured against each other (gj-aion vs qoofyk, 2 and 4 nodes): {cells}")


IB_CLUSTERS = {  # H100, 8 per node, 8 x 400G InfiniBand NDR; default NCCL settings (the tuned runs are left out)
    "gj-aion (2/4/8 nodes)": [f"nccl_tests_issue309_h100_{n}node_ib_ar_gjaion.txt" for n in (2, 4, 8)],
    "qoofyk (2/4 nodes)": ["nccl_tests_issue309_h100_2node_ib_ar_qoofyk.txt",
                           "nccl_tests_issue309_h100_4node_ib_vm_ar_qoofyk.txt"],
    "xxrjun cluster01 (10 nodes)": [f"xxrjun_cluster01_h100_10node_g8_{c}.txt"
                                    for c in ("all_reduce", "all_gather", "reduce_scatter")],
    "Nebius (dstack, 2 nodes)": ["dstack_nebius_h100_2node_ib_ar.txt"],
}  # fmt: skip


IB = "h100-sxm@ib-ndr-8x400"  # the fits start from the shipped network (its structure, refitted values)


def _network_fit(files: list[str], index: dict[str, dict]):
    return fit_profile([indexed(index[f]) for f in files], IB, allow_bounds=True, network_only=True)


def cross_cluster(index: dict[str, dict]) -> None:
    """Leave one H100 IB cluster out: fitted on each other cluster alone, then on all the others at once."""
    print("| held out | network fitted on | size class | NCCL's constants: median / worst log / worst size | "
          "fitted: median / worst log / worst size |")  # fmt: skip
    print("|---|---|---|---|---|")
    pooled: dict[str, list] = defaultdict(list)  # held-out sizes of fits on one cluster / on several
    for held, held_files in IB_CLUSTERS.items():
        others = [c for c in IB_CLUSTERS if c != held]
        for fit_on in [[c] for c in others] + [others]:
            fit = _network_fit([f for c in fit_on for f in IB_CLUSTERS[c]], index)
            sizes = _before_is_the_gpu_alone(fit.evaluate([indexed(index[f]) for f in held_files]), IB)
            label = " + ".join(c.split(" (")[0] for c in fit_on)
            for name, errs in class_errors(sizes).items():
                print(f"| {held} | {label} | {name} | {_pct3(*errs[:3])} | {_pct3(*errs[3:])} |")
            pooled["several" if len(fit_on) > 1 else "one"] += sizes
    for kind in ("one", "several"):
        cells = ", ".join(f"{name} {errs[3]:.0%}" for name, errs in class_errors(pooled[kind]).items())
        print(f"\nFitted on {kind} cluster{'s' if kind == 'several' else ''}, median over every held-out size: {cells}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-log", action="store_true", help="one row per log as well")
    ap.add_argument("--held-out", action="store_true", help="fit per class, error on held-out sources")
    ap.add_argument("--cross-cluster", action="store_true", help="leave one H100 IB cluster out, fit on the others")
    ap.add_argument("--families", action="store_true", help="shipped network profiles on held-out logs, per family")
    args = ap.parse_args()
    index = tomllib.loads((DATA / "sources.toml").read_text())["log"]
    if args.families:
        families({e["file"]: e for e in index})
        return
    if args.held_out:
        held_out({e["file"]: e for e in index})
        return
    if args.cross_cluster:
        cross_cluster({e["file"]: e for e in index})
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
