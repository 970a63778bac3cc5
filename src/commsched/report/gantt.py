"""Pictures of a simulated step (matplotlib, headless): a Gantt chart of the streams and the memory curve."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from commsched.io import atomic_write_bytes
from commsched.ir.graph import OpKind
from commsched.sim.result import SimResult

COLORS = {
    "compute": "#3b75af",
    "other": "#9cc3e4",
    "blocked": "#d62728",
    "memory": "#2ca02c",
}
COMM_COLORS = ("#ef8636", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _time_unit(span_ns: int) -> tuple[float, str]:
    if span_ns >= 10_000_000:
        return 1e6, "ms"
    return 1e3, "us"


def gantt_png(
    res: SimResult, *, title: str | None = None, width_in: float = 12.0, capacity_bytes: float | None = None
) -> bytes:
    """A PNG: one row per stream (kernels, collectives coloured by group, blocked waits in red) above the memory
    curve on the same time axis; ``capacity_bytes`` (the device's HBM) is a red line on the memory plot when the
    peak comes within half of it. Legends sit above their plots, never over the bars or the curve."""
    plt = _figure()
    fig = gantt_figure(res, title=title, width_in=width_in, capacity_bytes=capacity_bytes)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def gantt_figure(
    res: SimResult, *, title: str | None = None, width_in: float = 12.0, capacity_bytes: float | None = None
):
    """The matplotlib figure of :func:`gantt_png` (its caller closes it)."""
    plt = _figure()
    g = res.graph
    scale, unit = _time_unit(res.makespan_ns)
    rows = len(res.stream_names)
    fig, (ax, axm) = plt.subplots(
        2,
        1,
        figsize=(width_in, 1.2 + 0.45 * rows + 1.8),
        sharex=True,
        gridspec_kw={"height_ratios": [max(rows, 2), 2.2]},
    )
    start, end = res.start_ns / scale, res.end_ns / scale
    kinds = g.kinds
    bar = 0.7

    def draw(mask: np.ndarray, row: int, color: str, left=None, width=None, **kw) -> None:
        ids = np.flatnonzero(mask)
        if not len(ids):
            return
        lefts = start[ids] if left is None else left[ids]
        widths = (end[ids] - start[ids]) if width is None else width[ids]
        ax.broken_barh(
            list(zip(lefts.tolist(), widths.tolist(), strict=True)), (row - bar / 2, bar), facecolors=color, **kw
        )

    k = res.num_compute_streams
    for s in range(k):
        on = res.stream == s
        draw(on & (kinds == OpKind.COMPUTE), s, COLORS["compute"])
        draw(on & (kinds == OpKind.OTHER), s, COLORS["other"])
        blocked = on & (res.blocked_ns > 0) & (g.coll_type < 0)
        draw(blocked, s, COLORS["blocked"], left=(res.start_ns - res.blocked_ns) / scale, width=res.blocked_ns / scale)
    for j in range(rows - k):
        draw(res.stream == k + j, k + j, COMM_COLORS[j % len(COMM_COLORS)], edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(rows), list(res.stream_names))
    ax.set_ylim(rows - 0.5, -0.5)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or f"{g.meta.get('workload', 'graph')}: makespan {res.makespan_ns / scale:.3f} {unit}",
                 loc="left")  # fmt: skip
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=COLORS["compute"], label="compute kernel"),
        plt.Rectangle((0, 0), 1, 1, color=COLORS["other"], label="other kernel"),
        plt.Rectangle((0, 0), 1, 1, color=COLORS["blocked"], label="waiting on comm"),
    ]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, fontsize=8, frameon=False)

    times, values = (a.astype(np.float64) for a in res.memory_over_time())
    mem_scale, mem_unit = (2**30, "GiB") if values.max(initial=0) >= 2**30 else (2**20, "MiB")
    axm.step(times / scale, values / mem_scale, where="post", color=COLORS["memory"])
    axm.fill_between(times / scale, values / mem_scale, step="post", alpha=0.2, color=COLORS["memory"])
    if capacity_bytes and values.max(initial=0) >= capacity_bytes / 2:
        over = values.max(initial=0) > capacity_bytes
        label = f"HBM capacity {capacity_bytes / mem_scale:.0f} {mem_unit}" + (": exceeded" if over else "")
        axm.axhline(capacity_bytes / mem_scale, color=COLORS["blocked"], linestyle="--", linewidth=1.2, label=label)
        axm.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axm.set_ylabel(f"memory ({mem_unit})")
    axm.set_xlabel(f"time ({unit})")
    axm.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_gantt(res: SimResult, path: str | Path, **kw) -> Path:
    return atomic_write_bytes(path, gantt_png(res, **kw))
