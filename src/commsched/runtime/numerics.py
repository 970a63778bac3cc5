"""How a rewritten program's outputs are compared with the original order's in a real run.

A reordered graph computes the same ops on the same operands, so its outputs are bit-identical. A program whose
collectives were bucketed (``commsched.optimize``) may not be: a bucketed all_gather only copies, so it is exact,
but a bucketed reduce_scatter or all_reduce hands gloo (or NCCL) one larger buffer, whose chunking decides which
rank's partial sum each element starts from, so a sum of ``W`` terms may be added in another order. Such programs
are compared with :func:`reduction_rtol`; every other one must be bit-identical.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import torch
import torch.fx
import torch.utils._pytree

from commsched.ir import CollType, Graph

REDUCTIONS = (int(CollType.ALL_REDUCE), int(CollType.REDUCE_SCATTER))


def _reductions(graph: Graph) -> list[int]:
    return [c for c in graph.collectives.tolist() if int(graph.coll_type[c]) in REDUCTIONS]


def merged_reductions(before: Graph, after: Graph) -> int:
    """How many reductions (all_reduce, reduce_scatter) bucketing folded into others between ``before`` and
    ``after`` (0: none merged, every element sums its terms as the original does)."""
    return max(0, len(_reductions(before)) - len(_reductions(after)))


def reduction_ranks(graph: Graph) -> int:
    """The largest group any reduction of ``graph`` spans (1 without reductions)."""
    return max((graph.groups[int(graph.coll_group[c])].size for c in _reductions(graph)), default=1)


def reduction_dtypes(gm: torch.fx.GraphModule) -> set[torch.dtype]:
    """The dtypes the differences may come in: the results of ``gm``'s reductions and its outputs."""
    out: set[torch.dtype] = set()
    for node in gm.graph.nodes:
        reduces = node.op == "call_function" and any(k in str(node.target) for k in ("reduce_scatter", "all_reduce"))
        if reduces or node.op == "output":
            for leaf in torch.utils._pytree.tree_leaves(node.meta.get("val") if reduces else node.args):
                val = leaf.meta.get("val") if isinstance(leaf, torch.fx.Node) else leaf
                if isinstance(val, torch.Tensor):
                    out.add(val.dtype)
    return out


def reduction_rtol(dtypes: Iterable[torch.dtype], ranks: int) -> float:
    """Relative tolerance of outputs whose cross-rank sums may be added in another order: ``4 * ranks * eps``,
    with the largest eps of the floating ``dtypes`` (0 with none: equal is expected).

    Why: reassociating a sum of W terms moves it by at most (W - 1) * eps * sum|x_i| (two evaluations, each within
    (W - 1) * eps / 2 * sum|x_i| of the exact sum; Higham, Accuracy and Stability of Numerical Algorithms, 4.2).
    The terms are not known at the output; a data-parallel gradient's terms are of the size of the result, or of
    the tensor's largest entry where they cancel, so :func:`compare_outputs` allows ``rtol * (|want| +
    max|want|)`` per element, with W for the terms and a factor 4 of slack (the average's division, terms a few
    times the result). float32 on 2 ranks: 9.5e-7; bfloat16: 0.0625."""
    eps = [torch.finfo(d).eps for d in dtypes if d.is_floating_point]
    return 4.0 * ranks * max(eps) if eps else 0.0


@dataclasses.dataclass(frozen=True)
class OutputDiff:
    """How far one program's outputs were from the reference's (over every step compared, and every rank once
    merged)."""

    exact: bool
    """every output equal, bit for bit"""
    within: bool
    """every element within the tolerance it was compared with"""
    max_abs_diff: float
    max_rel_diff: float
    """max |got - want| of a tensor over that tensor's max |want| (0 where both are all zeros)"""

    def merge(self, other: OutputDiff) -> OutputDiff:
        """The worst of both."""
        return OutputDiff(
            exact=self.exact and other.exact,
            within=self.within and other.within,
            max_abs_diff=max(self.max_abs_diff, other.max_abs_diff),
            max_rel_diff=max(self.max_rel_diff, other.max_rel_diff),
        )


SAME = OutputDiff(exact=True, within=True, max_abs_diff=0.0, max_rel_diff=0.0)


def compare_outputs(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], rtol: float) -> OutputDiff:
    """``got`` against ``want`` element by element: within when ``|got - want| <= rtol * (|want| + max|want|)``
    (the max over that tensor; see :func:`reduction_rtol`); rtol 0 asks for equality. A different number of
    outputs, or a shape or dtype that differs, is not within (and infinitely far)."""
    if len(got) != len(want):
        return OutputDiff(exact=False, within=False, max_abs_diff=math.inf, max_rel_diff=math.inf)
    out = SAME
    for a, b in zip(got, want):
        out = out.merge(_compare_tensor(a, b, rtol))
    return out


def _compare_tensor(a: torch.Tensor, b: torch.Tensor, rtol: float) -> OutputDiff:
    if a.dtype != b.dtype or a.shape != b.shape:
        return OutputDiff(exact=False, within=False, max_abs_diff=math.inf, max_rel_diff=math.inf)
    if torch.equal(a, b):
        return SAME
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    err = (a64 - b64).abs()
    scale = b64.abs().max().item() if b64.numel() else 0.0
    max_abs = err.max().item() if err.numel() else 0.0
    if math.isnan(max_abs):  # a NaN where the reference has none, or the other way round
        return OutputDiff(exact=False, within=False, max_abs_diff=math.inf, max_rel_diff=math.inf)
    within = bool((err <= rtol * (b64.abs() + scale)).all().item())
    max_rel = max_abs / scale if scale > 0 else math.inf
    return OutputDiff(exact=False, within=within, max_abs_diff=max_abs, max_rel_diff=max_rel)
