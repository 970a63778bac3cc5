"""What goes into a schedule, in the terminal: a graph's contents (``commsched info``, ``trace``, ``demo``), its
costs on a hardware profile (``estimate``), the workload zoo (``trace --list``) and a calibrated profile
(``calibrate``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes, fmt_flops, fmt_seconds

if TYPE_CHECKING:
    from commsched.hardware import Hardware
    from commsched.report.summary import GraphSummary
    from commsched.workloads.presets import ModelConfig


def print_graph_info(summary: GraphSummary, console: Console, title: str = "graph") -> None:
    """Nodes by kind and total flops, then the collectives by type and process group."""
    kinds = new_table(f"{title}: {summary.num_nodes} nodes", ("kind", "nodes"))
    for k, v in summary.nodes_by_kind.items():
        if v:
            kinds.add_row(k, str(v))
    kinds.add_row("[bold]total flops", fmt_flops(summary.total_flops))
    console.print(kinds)
    colls = new_table(
        "collectives (bytes in the nccl-tests convention)", ("type", "group", "group size", "count", "bytes"), left=2
    )
    for row in summary.collectives:
        colls.add_row(row["type"], row["group"], str(row["group_size"]), str(row["count"]), fmt_bytes(row["bytes"]))
    colls.add_row("[bold]all", "", "", str(sum(r["count"] for r in summary.collectives)), fmt_bytes(summary.comm_bytes))
    console.print(colls)
    shares = {tag: row for tag, row in summary.shares.items() if row["nodes"]}
    if shares:
        table = new_table("share of the step's compute", ("part", "kernels", "flops", "of flops", "time", "of time"))
        names = {"recompute": "recompute (activation checkpointing)", "float8": "float8 (_scaled_mm, amax, casts)"}
        for tag, row in shares.items():
            timed = row["time_s"] is not None
            time = (fmt_seconds(row["time_s"]), f"{row['time_share']:.1%}") if timed else ("-", "-")
            table.add_row(names.get(tag, tag), str(row["nodes"]), fmt_flops(row["flops"]), f"{row['flops_share']:.1%}",
                          *time)  # fmt: skip
        console.print(table)


def print_cost_summary(summary: Mapping[str, Any], console: Console, title: str) -> None:
    """A cost estimate (``commsched.cost.summary.cost_summary``): totals, collectives, the most expensive ops."""
    hw = f"{summary['hardware']} x {summary['num_nodes']} node(s) of {summary['gpus_per_node']}"
    totals = new_table(f"{title} on {hw}", ("", "time"))
    totals.add_row("compute (one stream, serial)", fmt_seconds(summary["compute_s"]))
    totals.add_row("communication (serial)", fmt_seconds(summary["communication_s"]))
    totals.add_row("[bold]no overlap at all", fmt_seconds(summary["serial_s"]))
    for cls, t in summary["by_class_s"].items():
        totals.add_row(f"  {cls}", fmt_seconds(t))
    totals.add_row("fusion regions", f"{summary['fusion_regions']} ({summary['fused_nodes']} nodes)")
    console.print(totals)
    if summary["collectives"]:
        columns = ("type", "group", "size", "algorithm", "link", "count", "bytes", "time")
        colls = new_table("collectives", columns, left=("type", "group", "algorithm", "link"), overflow="fold")
        for r in summary["collectives"]:
            colls.add_row(r["type"], r["group"], str(r["group_size"]), r["algorithm"], r["link"], str(r["count"]),
                          fmt_bytes(r["bytes"]), fmt_seconds(r["time_s"]))  # fmt: skip
        console.print(colls)
    top = new_table("most expensive ops", ("node", "target", "class", "time", "share"), left=3, overflow="fold")
    for r in summary["top_ops"]:
        region = f" (region {r['fusion_region']})" if r["fusion_region"] >= 0 else ""
        top.add_row(r["node"], r["target"], r["class"] + region, fmt_seconds(r["time_s"]), f"{r['share']:.1%}")
    console.print(top)


def print_zoo_list(
    presets: Iterable[ModelConfig],
    parallelisms: Mapping[str, str],
    modes: Mapping[str, str],
    console: Console,
    *,
    inference: Collection[str],
) -> None:
    """The model presets, the parallelisms (with the modes each traces; ``inference``: those that trace every
    mode, the others train only) and the modes."""
    columns = ("name", "params", "layers", "dim", "heads/kv", "ffn", "vocab", "experts")
    table = new_table("presets", columns, no_wrap=True)
    for p in presets:
        n = p.total_params()
        table.add_row(
            p.name,
            f"{n / 1e9:.1f}B" if n >= 1e8 else f"{n / 1e6:.1f}M",
            str(p.n_layers),
            str(p.dim),
            f"{p.n_heads}/{p.n_kv_heads}",
            str(p.ffn_dim),
            str(p.vocab_size),
            f"{p.n_experts}, top {p.top_k}" if p.is_moe else "-",
        )
    console.print(table)
    par = new_table("parallelisms (--parallel)", ("name", "modes", "what"), left=3)
    for name, what in parallelisms.items():
        par.add_row(name, ", ".join(modes) if name in inference else "train", what)
    console.print(par)
    mode_table = new_table("modes (--mode)", ("name", "what"), left=2)
    for name, what in modes.items():
        mode_table.add_row(name, what)
    console.print(mode_table)


def print_calibrated_profile(path: Path, hw: Hardware, console: Console) -> None:
    """The fitted numbers of a profile that ``commsched calibrate`` wrote to ``path``."""
    c = hw.compute
    t = new_table(f"wrote {path}", ("fitted", "value"))
    t.add_row("launch overhead", fmt_seconds(c.launch_overhead_s))
    for dtype, peak in c.peak_flops:
        t.add_row(f"peak {dtype}", f"{peak / 1e9:.1f} GFLOP/s")
    t.add_row("memory bandwidth", f"{c.hbm_bandwidth_bytes_per_s / 1e9:.1f} GB/s")
    if c.cache_bytes:
        t.add_row(
            f"cache (kernels <= {fmt_bytes(c.cache_bytes)}) bandwidth",
            f"{c.cache_bandwidth_bytes_per_s / 1e9:.1f} GB/s",
        )
    t.add_row("collective bus bandwidth", f"{hw.intra_node.link_bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    simple = hw.protocols[0]
    t.add_row(
        "collective latency",
        f"{fmt_seconds(simple.base_latency_s)} + {fmt_seconds(simple.intra_hop_latency_s)}/step",
    )
    console.print(t)
