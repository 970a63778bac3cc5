"""Peak memory per GPU against torch's FSDPMemTracker (issue #38): models x activation checkpointing x world sizes.

Usage: python benchmarks/bench_memory_peer.py [--models M,...] [--ac A,...] [--worlds W,...] [--layers L]
       [--batch B] [--seq S] [--json PATH]

Each row is one zoo FSDP training step (``parallel="fsdp"``, AdamW state held, bf16 compute, fp32 reduction) at a
small layer count: our peak (``predict``'s trace in the ``framework`` order, :mod:`commsched.memory.liveness`) beside
the peak torch's ``FSDPMemTracker`` records running the same model under ``fully_shard`` on fake tensors
(:mod:`commsched.peers.torch_memory`), both over the forward and backward. Nothing is fitted. None of the default
configurations is a published run's (those are judged by ``bench_published.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from commsched.experiments.predict import StepConfig  # noqa: E402
from commsched.peers.torch_memory import compare_peak  # noqa: E402


def _row(preset: str, world: int, ac: str, layers: int, batch: int, seq: int) -> dict:
    config = StepConfig(preset=preset, parallel="fsdp", world_size=world, layers=layers, ac=ac, batch=batch,
                        seq_len=seq, optimizer="adamw")  # fmt: skip
    start = time.perf_counter()
    c = compare_peak(config)
    return {"preset": preset, "world_size": world, "ac": ac, "layers": layers, "batch": batch, "seq_len": seq,
            "ours_bytes": c.ours_bytes, "torch_bytes": c.torch.peak_bytes, "ratio": c.ratio,
            "torch_at_peak_bytes": c.torch.at_peak_bytes, "seconds": time.perf_counter() - start}  # fmt: skip


def _table(rows: list[dict]) -> str:
    lines = ["| model | FSDP | AC | layers | batch x seq | ours GiB | FSDPMemTracker GiB | ours / torch |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ours, theirs = r["ours_bytes"] / 2**30, r["torch_bytes"] / 2**30
        lines.append(f"| {r['preset']} | {r['world_size']} | {r['ac']} | {r['layers']} | {r['batch']}x{r['seq_len']} "
                     f"| {ours:.3f} | {theirs:.3f} | {r['ratio']:.3f} |")  # fmt: skip
    errors = [abs(r["ratio"] - 1) for r in rows]
    lines.append(f"\n|ours / torch - 1|: median {100 * statistics.median(errors):.1f} %, worst "
                 f"{100 * max(errors):.1f} %, n = {len(rows)}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama3-8b,llama2-13b,llama2-70b")
    parser.add_argument("--ac", default="none,full,selective-op")
    parser.add_argument("--worlds", default="8,64")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for preset in args.models.split(","):
        for ac in args.ac.split(","):
            for world in (int(w) for w in args.worlds.split(",")):
                rows.append(_row(preset, world, ac, args.layers, args.batch, args.seq))
                r = rows[-1]
                print(f"{preset} fsdp {world} ac {ac}: ours / torch {r['ratio']:.3f} ({r['seconds']:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
    print(f"{platform.machine()}, {platform.python_version()}, {len(rows)} rows\n")
    print(_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
