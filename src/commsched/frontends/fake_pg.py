"""A fake process group for tracing distributed programs at any world size in one process, with no GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[dist.ProcessGroup]:
    """Initialise torch.distributed with the "fake" backend for the duration of the block.

    Collectives issued under it return tensors of the right shape without communicating. If a process
    group is already initialised with the same world size it is reused and left in place.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"world_size={world_size}, rank={rank}: expected world_size >= 1 and 0 <= rank < world_size")
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(
                f"a process group of world size {dist.get_world_size()} is already initialised; "
                f"cannot trace at world size {world_size} in the same process"
            )
        yield dist.group.WORLD
        return
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
