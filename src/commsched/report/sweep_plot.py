"""A picture of a what-if sweep (matplotlib, headless): step time and peak memory per configuration.

Configurations are grouped on the x axis by (parallel, world size), one bar per hardware profile. The top panel
splits the scheduled step time into its compute-bound part and exposed communication, marks the step time of the
traced (input) order (a black line) and the lower bound; the bottom panel shows peak memory, scheduled (bars) and
traced (black line).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

from commsched.experiments.sweep_row import SweepRow
from commsched.io import atomic_write_bytes

HARDWARE_COLORS = ("#3b75af", "#ef8636", "#519e3e", "#c53a32", "#8d69b8", "#84584e", "#d57dbf", "#7f7f7f")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _time_scale(rows: Sequence[SweepRow]) -> tuple[float, str]:
    top = max((max(r.step_time_s, r.step_time_input_s) for r in rows if r.ok), default=0.0)
    return (1.0, "s") if top >= 1 else (1e3, "ms") if top >= 1e-3 else (1e6, "us")


def sweep_png(rows: Sequence[SweepRow], *, title: str | None = None, width_in: float | None = None) -> bytes:
    """A PNG of ``rows`` (from :func:`commsched.experiments.sweep.run_sweep`); failed configurations are marked "error".
    Raises ValueError when no row succeeded (there is nothing to draw)."""
    if not any(r.ok for r in rows):
        raise ValueError("no configuration of the sweep succeeded; nothing to plot")
    plt = _pyplot()
    groups = list(dict.fromkeys((r.parallel, r.world_size) for r in rows))
    profiles = list(dict.fromkeys(r.hardware for r in rows))
    color = {h: HARDWARE_COLORS[i % len(HARDWARE_COLORS)] for i, h in enumerate(profiles)}
    scale, unit = _time_scale(rows)
    width = 0.8 / len(profiles)
    fig_w = width_in or min(6.0 + 0.55 * len(groups) * len(profiles), 26.0)
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(fig_w, 7.0), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    peak = max((max(r.peak_memory_bytes, r.peak_memory_input_bytes) for r in rows if r.ok), default=0)
    mem_scale, mem_unit = (2**30, "GiB") if peak >= 2**30 else (2**20, "MiB")

    for r in rows:
        x = groups.index((r.parallel, r.world_size)) - 0.4 + width * (profiles.index(r.hardware) + 0.5)
        if not r.ok:
            for a in (ax, axm):
                a.text(x, 0, "error", rotation=90, ha="center", va="bottom", fontsize=7, color="#c53a32")
            continue
        c = color[r.hardware]
        compute = r.compute_bound_s * scale
        exposed = r.exposed_comm_s * scale
        ax.bar(x, compute, width * 0.9, color=c)
        ax.bar(x, exposed, width * 0.9, bottom=compute, color=c, alpha=0.45, hatch="///", edgecolor="white")
        tick = [x - width * 0.45, x + width * 0.45]
        ax.plot(tick, [r.step_time_input_s * scale] * 2, color="black", lw=1.5)
        if not math.isnan(r.lower_bound_s):
            ax.plot(x, r.lower_bound_s * scale, marker="v", color="#444444", ms=4, ls="none")
        axm.bar(x, r.peak_memory_bytes / mem_scale, width * 0.9, color=c)
        axm.plot(tick, [r.peak_memory_input_bytes / mem_scale] * 2, color="black", lw=1.5)

    ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.set_ylabel(f"step time ({unit})")
    ax.grid(axis="y", alpha=0.3)
    schedule = next((r.schedule for r in rows if r.ok), None)
    preset = rows[0].preset
    ax.set_title(title or f"{preset}: step time per configuration (schedule: {schedule or 'traced order'})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[h], label=h) for h in profiles]
    handles += [
        plt.Rectangle((0, 0), 1, 1, facecolor="#aaaaaa", label="compute-bound part"),
        plt.Rectangle((0, 0), 1, 1, fc="#aaaaaa", alpha=0.45, hatch="///", ec="white", label="exposed comm"),
        plt.Line2D([], [], color="black", lw=1.5, label="traced order"),
        plt.Line2D([], [], color="#444444", marker="v", ls="none", label="lower bound"),
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axm.set_ylabel(f"peak memory ({mem_unit})")
    axm.grid(axis="y", alpha=0.3)
    many = len({p for p, _ in groups}) > 1
    axm.set_xticks(range(len(groups)), [f"{p}\nworld {w}" if many else f"world {w}" for p, w in groups])
    axm.set_xlim(-0.6, len(groups) - 0.4)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_sweep_plot(rows: Sequence[SweepRow], path: str | Path, **kw) -> Path:
    """Write :func:`sweep_png` to ``path`` atomically (temp file + rename)."""
    return atomic_write_bytes(path, sweep_png(rows, **kw))
