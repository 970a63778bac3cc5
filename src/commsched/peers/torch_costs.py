"""Our per-node costs, in the shapes torch's overlap scheduler asks for them.

Torch's ``OverlapScheduler`` takes every time in **milliseconds** and asks for it through a few seams:
``custom_runtime_estimation(node, override_size)`` (the documented hook), ``estimate_roofline_runtime_ms(node)``,
``comm_analysis.estimate_nccl_collective_runtime_from_fx_node(node, override_size)``, and, under those, the
device queries ``get_device_tflops`` / ``get_gpu_dram_gbps`` / ``get_gpu_type``. :class:`TorchCostInjector` answers
all of them from one :class:`~commsched.cost.model.CostEstimate`, keyed by FX node name (our node names are the FX
names), and counts every question it could not answer from our costs.

``override_size`` is torch's question "what would this collective cost at that many bytes" (bytes in torch's own
size convention, inputs + outputs, :func:`torch._inductor.comm_analysis.estimate_fx_collective_size`; 0 asks for the
pure latency). We answer with our latency plus our bandwidth-bound time scaled linearly by size. Collectives that
bucketing creates (not in our graph) get the same linear model with the bandwidth and latency of our collectives of
the same process group and type.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind

# Device numbers torch's analytic path reads when it has no GPU. They are only consulted for nodes our costs do not
# cover (counted in ``TorchCostInjector.questions['device_query']``); H100 SXM datasheet values (dense BF16
# 989 TFLOP/s, HBM3 3.35 TB/s), see /work/shared/reference/README.md.
FALLBACK_DEVICE_TFLOPS = 989.0
FALLBACK_DRAM_GB_PER_S = 3350.0


@dataclass(frozen=True)
class _LinearComm:
    latency_ms: float
    ms_per_byte: float  # bandwidth-bound time per byte of torch's collective size (inputs + outputs)

    def at(self, size_bytes: int) -> float:
        return self.latency_ms + self.ms_per_byte * max(0, int(size_bytes))


def torch_collective_kind(node: fx.Node) -> str | None:
    """Torch's collective classification of a node (``NCCL_COLL`` name), None when torch does not track it."""
    from torch._inductor.comm_analysis import NCCL_COLL, get_collective_type_from_kernel_name

    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    kind = get_collective_type_from_kernel_name(target.name())
    return None if kind == NCCL_COLL.UNSUPPORTED else kind.name


def torch_collective_size(node: fx.Node) -> int:
    from torch._inductor.comm_analysis import estimate_fx_collective_size

    return int(estimate_fx_collective_size(node))


class TorchCostInjector:
    """Answers torch's runtime questions from ``costs`` (seconds) in torch's unit (ms).

    Build it on the FX graph *before* torch rewrites it (bucketing erases the original collectives), with ``graph``
    imported from that same GraphModule. ``questions`` counts how each question was answered:
    ``ours`` (a node of our graph), ``ours_scaled`` (one of our collectives at another size), ``bucket_model`` (a new
    collective, per-group linear model), ``new_node_zero`` (a new non-collective node: no cost, as torch itself
    gives a node it has no estimate for), ``untracked_collective_zero`` (a collective torch does not track, e.g.
    broadcast: its comm time must not count as compute that hides other collectives), ``device_query`` (torch's own
    device-number path was reached; 0 when every node is covered).
    """

    def __init__(self, gm: fx.GraphModule, graph: Graph, costs: CostEstimate) -> None:
        if len(costs.node_s) != len(graph):
            raise ValueError(f"costs cover {len(costs.node_s)} nodes but the graph has {len(graph)}")
        self.graph = graph
        self.node_ms: dict[str, float] = dict(zip(graph.names, (np.asarray(costs.node_s, np.float64) * 1e3).tolist()))
        self.latency_ms = np.asarray(costs.coll_latency_s, np.float64) * 1e3
        self.questions: Counter[str] = Counter()
        self._scaled: dict[str, _LinearComm] = {}
        self._untracked: set[str] = set()
        per_key: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
        for node in gm.graph.nodes:
            i = graph.index.get(node.name)
            if i is None or graph.kinds[i] != OpKind.COLLECTIVE:
                continue
            kind = torch_collective_kind(node)
            if kind is None or not graph.waits_of(i).size:
                # torch only tracks collectives it can classify and that end in a wait_tensor
                self._untracked.add(node.name)
                continue
            total_ms, lat_ms = self.node_ms[node.name], float(min(self.latency_ms[i], self.node_ms[node.name]))
            size = torch_collective_size(node)
            bw_ms = total_ms - lat_ms
            self._scaled[node.name] = _LinearComm(lat_ms, bw_ms / size if size > 0 else 0.0)
            per_key[(graph.groups[int(graph.coll_group[i])].name, kind)].append((lat_ms, bw_ms, float(size)))
        self._by_key = {key: _pooled(rows) for key, rows in per_key.items()}
        all_rows = [r for rows in per_key.values() for r in rows]
        self._pooled_all = _pooled(all_rows) if all_rows else _LinearComm(0.0, 0.0)

    # ------------------------------------------------------------------ torch's seams
    def custom_runtime_estimation(self, node: fx.Node, override_size: int | None) -> float | None:
        """The ``custom_runtime_estimation`` hook: ms, or None to let torch decide (never for our nodes)."""
        name = node.name
        if name in self._untracked:
            self.questions["untracked_collective_zero"] += 1
            return 0.0
        if override_size is not None:
            return self.collective_ms(node, override_size)
        ms = self.node_ms.get(name)
        if ms is not None:
            self.questions["ours"] += 1
            return ms
        if torch_collective_kind(node) is not None:
            return self.collective_ms(node, None)
        self.questions["new_node_zero"] += 1
        return None

    def collective_ms(self, node: fx.Node, override_size: int | None) -> float:
        """A collective's time at ``override_size`` bytes (torch's size convention), default its own size."""
        model = self._scaled.get(node.name)
        if model is not None:
            if override_size is None:
                self.questions["ours"] += 1
                return self.node_ms[node.name]
            self.questions["ours_scaled"] += 1
            return model.at(override_size)
        self.questions["bucket_model"] += 1
        size = torch_collective_size(node) if override_size is None else override_size
        return self._model_for(node).at(size)

    def roofline_ms(self, node: fx.Node) -> float:
        """Replacement for ``estimate_roofline_runtime_ms``: our time for our nodes, 0 for nodes we do not know."""
        ms = self.node_ms.get(node.name)
        if ms is None:
            self.questions["new_node_zero"] += 1
            return 0.0
        self.questions["ours"] += 1
        return 0.0 if node.name in self._untracked else ms

    def nccl_ms(self, node: fx.Node, override_size: int | None = None, use_nccl_estimator: bool = True) -> float:
        """Replacement for ``comm_analysis.estimate_nccl_collective_runtime_from_fx_node``."""
        del use_nccl_estimator
        return self.collective_ms(node, override_size)

    def device_tflops(self, *args: object, **kwargs: object) -> float:
        self.questions["device_query"] += 1
        return FALLBACK_DEVICE_TFLOPS

    def dram_gbps(self, *args: object, **kwargs: object) -> float:
        self.questions["device_query"] += 1
        return FALLBACK_DRAM_GB_PER_S

    def gpu_type(self):
        from torch._inductor.comm_analysis import NVIDIA_GPU_TYPE

        self.questions["device_query"] += 1
        return NVIDIA_GPU_TYPE.HOPPER

    # ------------------------------------------------------------------ helpers
    def _model_for(self, node: fx.Node) -> _LinearComm:
        from torch._inductor.fx_passes.overlap_scheduling import get_group_name

        kind = torch_collective_kind(node)
        try:
            group = get_group_name(node)
        except (AssertionError, KeyError, TypeError, RuntimeError):
            group = None
        return self._by_key.get((group, kind)) or self._pooled_all

    def saturation_bucket_cap_mb(self, floor_mb: float, ceil_mb: float, target_efficiency: float = 0.9) -> float:
        """Bucket cap for torch's FSDP pre-bucketing, from our costs: the all_gather size at which latency is
        ``1 - target_efficiency`` of the time (torch derives the same quantity from its NCCL profiles), clamped
        to torch's configured floor and ceiling. Size in the bucketing convention (the larger of in/out bytes)."""
        g = self.graph
        ag = [
            i
            for i in g.collectives.tolist()
            if g.names[i] in self._scaled and "all_gather" in g.targets[i] and g.comm_bytes[i] > 0
        ]
        if not ag:
            return floor_mb
        lat_ms = float(np.median([self._scaled[g.names[i]].latency_ms for i in ag]))
        bw_ms = sum(self.node_ms[g.names[i]] - self._scaled[g.names[i]].latency_ms for i in ag)
        nbytes = float(sum(int(g.comm_bytes[i]) for i in ag))
        if bw_ms <= 0 or lat_ms <= 0:
            return floor_mb
        cap_bytes = target_efficiency / (1 - target_efficiency) * lat_ms / (bw_ms / nbytes)
        return float(min(ceil_mb, max(floor_mb, cap_bytes / 2**20)))


def _pooled(rows: list[tuple[float, float, float]]) -> _LinearComm:
    lat = float(np.median([r[0] for r in rows]))
    nbytes = sum(r[2] for r in rows)
    per_byte = sum(r[1] for r in rows) / nbytes if nbytes > 0 else 0.0
    return _LinearComm(lat if math.isfinite(lat) else 0.0, per_byte)
