"""Other schedulers run on our graphs with our costs, for comparison (``commsched compare``, benchmarks).

``run_torch_overlap_scheduler``: torch's ``OverlapScheduler`` / ``schedule_overlap_bucketing`` (torch imported on use).
``commsched.peers.torch_memory``: torch's ``FSDPMemTracker`` on the zoo's FSDP2 step, against our peak memory.
"""

from __future__ import annotations


def __getattr__(name: str):
    # importing torch's inductor costs seconds; keep `import commsched.peers` light
    if name in ("run_torch_overlap_scheduler", "TorchPeerResult"):
        from commsched.peers import torch_overlap

        return getattr(torch_overlap, name)
    raise AttributeError(f"module 'commsched.peers' has no attribute {name!r}")


__all__ = ["TorchPeerResult", "run_torch_overlap_scheduler"]
