"""Memory model: storage liveness, the memory-over-time curve of an order, incremental peak tracking for passes.

The semantics (when a storage is allocated and freed) are defined once, in :mod:`commsched.memory.liveness`.

>>> prof = memory_profile(g, order)          # peak_bytes, peak_position, curve_bytes, after_bytes, persistent_bytes
>>> mem = IncrementalMemory(g, order)        # for passes
>>> mem.potential_peak_after_move(node, new_position)   # O(k): the peak if node moved there
>>> mem.apply_move(node, new_position)                  # make the move, returns the new peak
"""

from commsched.memory.incremental import IncrementalMemory
from commsched.memory.liveness import Liveness, MemoryProfile, liveness, memory_profile

__all__ = ["IncrementalMemory", "Liveness", "MemoryProfile", "liveness", "memory_profile"]
