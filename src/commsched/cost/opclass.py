"""What kind of kernel each op target becomes: op classes for the roofline and Inductor fusibility.

Fusibility follows Inductor's rule (torch ``_inductor/fx_passes/fusion_regions.py`` states the same one): an ATen op
is fusible when Inductor lowers or decomposes it into loops (it has a lowering or a decomposition), it is not a
registered fallback to an eager kernel, and it has no flop formula (matmul, convolution and attention run as extern
kernels). The table of fusible targets is data (``data/inductor_fusible_ops.json``), generated from the installed
torch by ``python -m commsched.cost.opclass``, so importing commsched does not import Inductor.
"""

from __future__ import annotations

import json
import re
import sys
from enum import IntEnum
from functools import cache, lru_cache
from importlib import resources


class OpClass(IntEnum):
    """The cost class of a node (the efficiency entry of the profile it uses)."""

    FREE = 0  # inputs, views, waits, the output: cost nothing
    MATMUL = 1  # GEMM / convolution: compute-bound roofline with tile and K efficiency
    ATTENTION = 2  # fused attention kernels
    ELEMENTWISE = 3  # memory-bound pointwise / copy / gather
    REDUCTION = 4  # memory-bound reductions (sum, norms, softmax)
    COLLECTIVE = 5  # timed by the collective model


_ATTENTION = re.compile(r"(scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|flex_attention)")
_MATMUL = re.compile(
    r"^aten\.(_?(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|mv|addmv|dot|vdot|einsum|_scaled_mm|_grouped_mm|_int_mm)"
    r"|(_?convolution|conv\w*|cudnn_convolution\w*|mkldnn_convolution\w*))\b"
)
# reductions by name; anything whose output has fewer elements than its largest input is one too (see estimate)
_REDUCTION = re.compile(
    r"^aten\.(sum|mean|amax|amin|max|min|argmax|argmin|prod|var|std|var_mean|std_mean|norm|linalg_vector_norm|"
    r"logsumexp|any|all|_softmax|_log_softmax|softmax|log_softmax|_softmax_backward_data|_log_softmax_backward_data|"
    r"native_layer_norm|native_layer_norm_backward|native_group_norm|native_group_norm_backward|native_batch_norm|"
    r"_native_batch_norm_legit\w*|native_batch_norm_backward|_fused_rms_norm|_fused_rms_norm_backward|rms_norm|"
    r"layer_norm|group_norm|batch_norm|nll_loss\w*|cross_entropy\w*|cumsum|cumprod|logcumsumexp|topk|sort|"
    r"count_nonzero|nansum|embedding_dense_backward)\."
)

GATHERS = frozenset({"aten.embedding.default", "aten.index_select.default", "aten.index.Tensor", "aten.gather.default"})
"""Ops that read one source element per element they write (an embedding lookup reads the rows of its tokens, not
the table): their bytes and their iteration size are their output's, never their source's"""

DATA_FILE = "inductor_fusible_ops.json"


@lru_cache(maxsize=1)
def _fusible_targets() -> frozenset[str]:
    text = (resources.files("commsched.cost") / "data" / DATA_FILE).read_text(encoding="utf-8")
    return frozenset(json.loads(text)["fusible"])


@cache
def classify_target(target: str, has_flops: bool) -> tuple[OpClass, bool]:
    """(class, fusible) of an op target such as ``"aten.mm.default"``; ``has_flops``: the node has a flop count."""
    if _ATTENTION.search(target):
        return OpClass.ATTENTION, False
    if _MATMUL.match(target) or (has_flops and target not in _fusible_targets()):
        return OpClass.MATMUL, False
    fusible = target in _fusible_targets()
    if _REDUCTION.match(target):
        return OpClass.REDUCTION, fusible
    return OpClass.ELEMENTWISE, fusible


def generate_fusible_table() -> dict:
    """Build the fusible-target table from the installed torch (imports Inductor: seconds)."""
    import torch
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import fallbacks, lowerings
    from torch.utils.flop_counter import flop_registry

    def names(ops) -> set[str]:
        return {str(op) for op in ops if isinstance(op, torch._ops.OpOverload)}

    flop_packets = {str(p) for p in flop_registry}
    fusible = (names(lowerings) | names(select_decomp_table())) - names(fallbacks)
    fusible = {
        t for t in fusible if t.split(".", 1)[0] in ("aten", "prims") and t.rsplit(".", 1)[0] not in flop_packets
    }
    return {"torch": torch.__version__, "fusible": sorted(fusible)}


if __name__ == "__main__":  # regenerate the data file: python -m commsched.cost.opclass [out.json]
    from pathlib import Path

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data" / DATA_FILE
    out.write_text(json.dumps(generate_fusible_table(), indent=0) + "\n", encoding="utf-8")
    print(f"wrote {out}")
