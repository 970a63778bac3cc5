"""torch's multi-tensor kernels (the ``_foreach_*`` ops and the fused optimizers): how many launches one op makes.

One such op works on lists of tensors (an optimizer's parameters, gradients and states). torch's
``multi_tensor_apply`` (``aten/src/ATen/native/cuda/MultiTensorApply.cuh``, torch 2.13) walks the tensors of the
first list in chunks of ``kChunkSize`` = 65536 elements, one CUDA block per chunk, and launches a kernel whenever
the launch's blocks (``depth_to_max_blocks``) or its tensors (``depth_to_max_tensors``, by the number of tensor
lists, its *depth*; ``..._scalarlist`` for the ops with a list of scalars) are full, then one for the rest. The
limits are those of the 32 KB kernel-argument build, which torch dispatches to with a CUDA >= 12.1 runtime and
driver on sm70+ (every current GPU): 2240 blocks and 770 / 448 / 336 / 252 / 210 tensors at depth 1-5. The fused
optimizers (``_fused_adamw_``: params, grads, exp_avgs, exp_avg_sqs, depth 4) use the same walk.

Their bytes are those of every tensor they read and write (the importer gives an in-place op the tensors it writes
as its results: :mod:`commsched.frontends.fx`); each launch costs the profile's launch overhead.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence

import numpy as np

from commsched.ir import Graph

MULTI_TENSOR = re.compile(r"^aten\._(foreach_\w+|fused_(adam|adamw|sgd|adagrad)_)\.")
"""targets of torch's multi-tensor ops"""
MULTI_TENSOR_REDUCTIONS = re.compile(r"^aten\._foreach_(norm|max)\.")
"""the multi-tensor ops that reduce each tensor (a scalar out of each)"""
FUSED_OPTIMIZER = re.compile(r"^aten\._fused_(adam|adamw|sgd|adagrad)_\.")
CHUNK_ELEMENTS = 65536  # kChunkSize
MAX_BLOCKS = 2240  # depth_to_max_blocks (32 KB kernel arguments), at every depth
MAX_TENSORS = (770, 448, 336, 252, 210)  # depth_to_max_tensors, depth 1-5
MAX_TENSORS_SCALARLIST = (672, 448, 336, 252, 210)  # depth_to_max_tensors_scalarlist
FUSED_OPTIMIZER_LISTS = 3
"""the lists a fused AdamW writes (params, exp_avgs, exp_avg_sqs; amsgrad, which torchtitan leaves off, a 4th)"""


@functools.cache  # called per node of every graph costed; a step has a few hundred distinct targets
def is_multi_tensor(target: str) -> bool:
    return MULTI_TENSOR.match(target) is not None


def launches(numels: Sequence[int], depth: int, scalar_list: bool = False) -> int:
    """Kernels ``multi_tensor_apply`` launches over tensors of ``numels`` elements (the first list) at ``depth``
    tensor lists: its walk, chunk by chunk, as in ``MultiTensorApply.cuh``. O(number of tensors)."""
    depth = min(max(depth, 1), 5)
    max_tensors = (MAX_TENSORS_SCALARLIST if scalar_list else MAX_TENSORS)[depth - 1]
    count = blocks = tensors = 0
    for numel in numels:
        if numel <= 0:
            continue  # empty tensors are skipped
        tensors += 1
        left = math.ceil(numel / CHUNK_ELEMENTS)
        while left:
            take = min(left, MAX_BLOCKS - blocks)
            blocks, left = blocks + take, left - take
            if blocks == MAX_BLOCKS:  # blocks full: launch; a tensor cut here carries over to the next launch
                count, blocks, tensors = count + 1, 0, (1 if left else 0)
            elif not left and tensors == max_tensors:  # tensors full
                count, blocks, tensors = count + 1, 0, 0
    return count + (1 if blocks else 0)


def multi_tensor_launches(g: Graph) -> np.ndarray:
    """Kernel launches of each node: :func:`launches` for a multi-tensor op (its first list: its first inputs, as
    many as its results, a fused optimizer's results being 3 lists), 1 for every other node."""
    out = np.ones(len(g), np.int64)
    for i, target in enumerate(g.targets):
        if not is_multi_tensor(target):
            continue
        ins = g.inputs(i).tolist()
        results = int(g.buf_ptr[i + 1] - g.buf_ptr[i])
        fused = FUSED_OPTIMIZER.match(target) is not None
        length = max(1, results // FUSED_OPTIMIZER_LISTS if fused else results) if results else len(ins)
        first = ins[:length]
        numels = [math.prod(g.buf_shape[g.buf_ptr[p]]) if g.buf_ptr[p + 1] > g.buf_ptr[p] else 0 for p in first]
        in_place = results == 0 or _aliases_inputs(g, i, ins)
        depth = 4 if fused else math.ceil(len(ins) / max(length, 1)) + (0 if in_place else 1)
        out[i] = max(1, launches(numels, depth, scalar_list=".ScalarList" in target))
    return out


def _aliases_inputs(g: Graph, i: int, ins: list[int]) -> bool:
    """Whether node ``i``'s results live on its inputs' storages (an in-place op)."""
    mine = set(g.buf_storage[g.buf_ptr[i] : g.buf_ptr[i + 1]].tolist())
    theirs = {int(s) for p in ins for s in g.buf_storage[g.buf_ptr[p] : g.buf_ptr[p + 1]].tolist()}
    return bool(mine) and mine <= theirs
