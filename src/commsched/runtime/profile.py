"""``commsched run --profile``: one more step of each order under the PyTorch profiler, a Chrome (Kineto) trace per
order and rank, for ``commsched replay`` and ``calibrate --trace``."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_variants(
    folder: str, modules: dict[str, torch.fx.GraphModule], inputs: list[torch.Tensor], device: torch.device, rank: int
) -> None:
    """One more step of each variant under the profiler, its Chrome trace written to ``folder`` (atomically)."""
    import tempfile

    from commsched.io import atomic_write_bytes

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    Path(folder).mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for name, module in modules.items():
            dist.barrier()
            sync_device(device)
            with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
                with torch.profiler.record_function(f"step:{name}"):
                    module(*inputs)
                sync_device(device)
            with tempfile.TemporaryDirectory() as tmp:
                exported = Path(tmp) / "trace.json.gz"  # torch writes gzip for a .gz name
                prof.export_chrome_trace(str(exported))
                atomic_write_bytes(Path(folder) / f"{name}-rank{rank}.json.gz", exported.read_bytes())
