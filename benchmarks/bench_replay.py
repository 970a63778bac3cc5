"""``commsched replay``: accuracy on every stored trace, against two naive estimates, and import + replay speed on a
100k-event trace (goal: < 10 s).

Usage: python benchmarks/bench_replay.py [--copies 3]
Accuracy: each stored trace (tests/replay/data, tests/cost/data/kineto) is read and replayed as is; the error is
(replayed - measured) / measured step, the step being first device-work start to last device-work end. "deps only"
replays without the residual gaps (the measured time between an item's last dependency and its start: launch and
queueing latencies), so the step comes from durations and dependencies alone. The naive estimates: the sum of all
device work (everything serial) and the busiest stream's work (perfect overlap, no dependencies).
Speed: the public NCCL trace (HTA nccl_parser_config, 40,573 events) replicated ``--copies`` times back to back
(timestamps shifted by its span, correlation and flow ids offset) into one gzip file; read_trace + replay timed,
best of 3, and a what-if (comm x 2) on the same read trace.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from commsched.replay.kineto import read_trace  # noqa: E402
from commsched.replay.run import replay  # noqa: E402
from commsched.replay.whatif import Scale  # noqa: E402

NCCL_TRACE = ROOT / "tests/cost/data/kineto/hta_nccl_data.json.gz"
STORED = [*sorted((ROOT / "tests/replay/data").glob("*.json.gz")), NCCL_TRACE]


def _pct(x: float) -> str:
    return f"{100 * x:+.2f} %"


def accuracy() -> None:
    print("| trace | mode | events | items | streams | collectives | event deps | inferred deps | measured step "
          "| replay error | deps only | sum of work | busiest stream | read + replay |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in STORED:
        t0 = time.perf_counter()
        t = read_trace(path)
        full = replay(t)
        dt = time.perf_counter() - t0
        bare = replay(t, keep_gaps=False)
        m = full.measured.step_s
        streams = int(t.device.sum())
        naive = f"{_pct(full.sum_of_work_s / m - 1)} | {_pct(full.longest_stream_s / m - 1)}"
        print(f"| {path.name} | {t.mode} | {t.events:,} | {len(t):,} | {streams} | {len(t.collectives)} | "
              f"{t.event_edges} | {t.inferred_edges} | {m * 1e3:.3f} ms | {_pct(full.error)} | {_pct(bare.error)} | "
              f"{naive} | {dt * 1e3:.0f} ms |")  # fmt: skip


def what_ifs() -> None:
    """The replayed step under each what-if, as a ratio of the unchanged replay."""
    cases = [("comm x 0", [Scale("comm", "", 0.0)]), ("comm x 2", [Scale("comm", "", 2.0)]),
             ("compute x 0.5", [Scale("compute", "", 0.5)]), ("compute x 2", [Scale("compute", "", 2.0)])]  # fmt: skip
    print("\n| trace | " + " | ".join(name for name, _ in cases) + " | collectives on h100-sxm |")
    print("|---|" + "---|" * (len(cases) + 1))
    for path in STORED:
        t = read_trace(path)
        base = replay(t).replayed.step_s
        # a selector that matches nothing (comm on a trace without communication) is an error: no cell
        cells = [f"{replay(t, sc).replayed.step_s / base:.3f} x" if sc[0].matches(t).any() else "" for _, sc in cases]
        gpu_colls = t.collectives and t.mode == "gpu"
        hw = f"{replay(t, hardware='h100-sxm').replayed.step_s / base:.3f} x" if gpu_colls else ""
        print(f"| {path.name} | " + " | ".join(cells) + f" | {hw} |")


def tiled(path: Path, copies: int, out: Path) -> int:
    """``copies`` of the trace back to back in one file; returns the number of events."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    stamps = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(stamps) - min(stamps) + 1000.0
    offset = 10 ** (len(str(max(int(e.get("id", 0)) for e in events if isinstance(e.get("id"), int)))) + 1)
    tiles = []
    for k in range(copies):
        for e in events:
            e = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = e["ts"] + k * span
            if isinstance(e.get("id"), int):
                e["id"] += k * offset
            if isinstance(e.get("args"), dict) and isinstance(e["args"].get("correlation"), int):
                e["args"] = dict(e["args"], correlation=e["args"]["correlation"] + k * offset)
            tiles.append(e)
    data["traceEvents"] = tiles
    out.write_bytes(gzip.compress(json.dumps(data).encode()))
    return len(tiles)


def speed(copies: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiled.json.gz"
        n = tiled(STORED[-1], copies, path)
        best_read, best_replay, trace, rep = float("inf"), float("inf"), None, None
        for _ in range(3):
            t0 = time.perf_counter()
            trace = read_trace(path)
            t1 = time.perf_counter()
            rep = replay(trace)
            t2 = time.perf_counter()
            best_read, best_replay = min(best_read, t1 - t0), min(best_replay, t2 - t1)
        t0 = time.perf_counter()
        what_if = replay(trace, [Scale("comm", "", 2.0)])
        t_what = time.perf_counter() - t0
        size = path.stat().st_size
    print(f"\n{n:,} events ({size / 2**20:.1f} MiB gzip), {len(trace):,} items, {int(trace.work.sum()):,} device work:")
    print("| step | time |\n|---|---|")
    print(f"| read_trace (gunzip, parse, link) | {best_read:.2f} s |")
    print(f"| replay (graph, simulate, metrics) | {best_replay:.2f} s |")
    print(f"| import + replay | {best_read + best_replay:.2f} s |")
    print(f"| what-if comm x 2 on the read trace | {t_what:.2f} s |")
    print(f"\nreplay error {_pct(rep.error)}; comm x 2: step {rep.replayed.step_s * 1e3:.1f} -> "
          f"{what_if.replayed.step_s * 1e3:.1f} ms")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=3)
    args = ap.parse_args()
    accuracy()
    what_ifs()
    speed(args.copies)


if __name__ == "__main__":
    main()
