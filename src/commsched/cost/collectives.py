"""NCCL-like collective times: for each collective pick the fastest (algorithm, protocol) on the group's placement.

time = latency(algorithm, protocol, hops) + wire_bytes / bus_bandwidth(algorithm, protocol, placement), the shape of
NCCL's own tuning model (src/graph/tuning.cc), with every constant taken from the hardware profile.

Sizes follow nccl-tests: all_reduce / all_to_all / broadcast the buffer, all_gather the whole gathered output,
reduce_scatter the whole input. ``wire_bytes = factor * nbytes`` with the nccl-tests bus factors
(2(n-1)/n all_reduce, (n-1)/n all_gather, reduce_scatter, all_to_all, 1 broadcast), so ``bus_bandwidth`` is what
nccl-tests reports as busbw.

Algorithms:
* ``ring``: one ring over all ranks; across nodes its bandwidth is the smaller of the NVLink ring and the NICs the
  group's ranks own in each node; latency counts intra- and inter-node steps separately.
* ``tree`` (all_reduce): chain inside a node, binary tree across nodes: log2(nodes) network levels.
* ``nvls`` (all_reduce, one node, NVLink SHARP): the switch reduces and multicasts.
* ``nvls_tree`` (all_reduce, several nodes, NVLink SHARP): NVLS inside nodes, a tree over the NICs.
* ``hierarchical`` (all_reduce, all_gather, reduce_scatter across nodes): reduce_scatter on NVLink, the collective
  on 1/ranks_per_node of the data across nodes (each rank on its own NIC), all_gather on NVLink; phases add up.
* ``direct`` (all_to_all): every rank sends to every other at once; across nodes bounded by one NIC per rank.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

from commsched.cost.model import LinkClass
from commsched.hardware import Hardware, Protocol
from commsched.ir import CollType

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
_KIND_BY_TYPE = {CollType.ALL_REDUCE: "all_reduce", CollType.ALL_GATHER: "all_gather",
                 CollType.REDUCE_SCATTER: "reduce_scatter", CollType.ALL_TO_ALL: "all_to_all",
                 CollType.BROADCAST: "broadcast"}  # fmt: skip

# NCCL's tree reaches 0.92 of the ring's bus bandwidth (tuning.cc: "busBw*.92" for NCCL_ALGO_TREE)
TREE_BANDWIDTH_FACTOR = 0.92


@dataclasses.dataclass(frozen=True)
class CollectivePlan:
    """The chosen way to run one collective, and its time split into latency and bandwidth parts."""

    kind: str
    nbytes: int  # nccl-tests convention
    group_size: int
    ranks_per_node: int
    nodes: int
    algorithm: str
    protocol: str
    time_s: float
    latency_s: float  # the part that does not scale with bytes
    link: LinkClass  # the fabric the bandwidth part runs over

    @property
    def bus_bandwidth_bytes_per_s(self) -> float:
        """nccl-tests busbw implied by this plan."""
        return bus_factor(self.kind, self.group_size) * self.nbytes / self.time_s if self.time_s > 0 else math.inf


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests busbw / algbw for a collective of ``n`` ranks."""
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def normalize_kind(kind: str | CollType) -> str:
    if isinstance(kind, CollType):
        return _KIND_BY_TYPE[kind]
    k = str(kind).lower().replace("-", "_")
    aliases = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "alltoall": "all_to_all", "all_to_all_single": "all_to_all", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter"}  # fmt: skip
    k = aliases.get(k, k)
    if k not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}: expected one of {', '.join(KINDS)}")
    return k


def _bus(bus: float, p: Protocol) -> float:
    return min(bus * p.bandwidth_fraction, p.max_bus_bandwidth_bytes_per_s)


def _nic_bus(hw: Hardware, ranks_per_node: int) -> float:
    # each rank owns its share of the node's NICs: parallel groups (e.g. the other FSDP groups) use the rest
    share = ranks_per_node * hw.inter_node.nics_per_node / hw.gpus_per_node
    return share * hw.inter_node.nic_bandwidth_bytes_per_s * hw.inter_node.nic_efficiency


def _ring(hw: Hardware, kind: str, nbytes: float, n: int, g: int, nodes: int) -> list[tuple[str, str, float, float]]:
    """Ring times (algorithm, protocol, time, latency) for every protocol."""
    if n <= 1:
        return [("ring", "simple", 0.0, 0.0)]
    bus = hw.intra_node.link_bandwidth_bytes_per_s * hw.intra_node.ring_efficiency if g > 1 else math.inf
    if nodes > 1:
        bus = min(bus, _nic_bus(hw, g))
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    inter_steps = (2 * nodes if kind == "all_reduce" else nodes - 1) if nodes > 1 else 0
    out = []
    for p in hw.protocols:
        lat = p.base_latency_s + (steps - inter_steps) * p.intra_hop_latency_s + inter_steps * p.inter_hop_latency_s
        out.append(("ring", p.name, lat + bus_factor(kind, n) * nbytes / _bus(bus, p), lat))
    return out


def _candidates(
    hw: Hardware, kind: str, nbytes: float, n: int, g: int, nodes: int
) -> list[tuple[str, str, float, float]]:
    intra = hw.intra_node
    cands: list[tuple[str, str, float, float]] = []
    if kind == "all_to_all":
        bus = intra.link_bandwidth_bytes_per_s * intra.all_to_all_efficiency if g > 1 else math.inf
        if nodes > 1:
            bus = min(bus, _nic_bus(hw, 1))  # one NIC per rank: all_to_all cannot aggregate a node's NICs
        for p in hw.protocols:
            hop = p.inter_hop_latency_s if nodes > 1 else p.intra_hop_latency_s
            lat = p.base_latency_s + (n - 1) * hop
            cands.append(("direct", p.name, lat + bus_factor(kind, n) * nbytes / _bus(bus, p), lat))
        return cands

    cands += _ring(hw, kind, nbytes, n, g, nodes)
    simple = next(p for p in hw.protocols if p.name == "simple")
    if kind == "all_reduce":
        bus = intra.link_bandwidth_bytes_per_s * intra.ring_efficiency if g > 1 else math.inf
        if nodes > 1:
            bus = min(bus, _nic_bus(hw, g))
        levels = math.ceil(math.log2(nodes)) if nodes > 1 else 0
        for p in hw.protocols:
            lat = p.base_latency_s + 2 * ((g - 1) * p.intra_hop_latency_s + levels * p.inter_hop_latency_s)
            cands.append(("tree", p.name, lat + 2 * nbytes / _bus(bus * TREE_BANDWIDTH_FACTOR, p), lat))
        if intra.nvls and g > 1:
            nvls_alg = intra.link_bandwidth_bytes_per_s * intra.nvls_efficiency
            if nodes == 1:
                lat = intra.nvls_latency_s
                cands.append(("nvls", "simple", lat + nbytes / nvls_alg, lat))
            else:
                # each node sends and receives the whole buffer over its NICs, twice for a tree deeper than 2
                inter_alg = _nic_bus(hw, g) / (2.0 if nodes > 2 else 1.0)
                lat = intra.nvls_latency_s + 2 * levels * simple.inter_hop_latency_s
                tree_nvls_alg = nvls_alg * intra.nvls_tree_efficiency  # the NVLS phase paced by the network phase
                cands.append(("nvls_tree", "simple", lat + nbytes / min(tree_nvls_alg, inter_alg), lat))
    if nodes > 1 and g > 1 and kind in ("all_reduce", "all_gather", "reduce_scatter"):
        cands.append(_hierarchical(hw, kind, nbytes, g, nodes))
    return cands


def _best(options: list[tuple[str, str, float, float]]) -> tuple[str, str, float, float]:
    return min(options, key=lambda c: (c[2], c[0], c[1]))


def _hierarchical(hw: Hardware, kind: str, nbytes: float, g: int, nodes: int) -> tuple[str, str, float, float]:
    """NVLink phase(s) plus the collective on 1/g of the data across nodes, one rank per node (sequential)."""
    intra_rs = _best(_ring(hw, "reduce_scatter", nbytes, g, g, 1))
    intra_ag = _best(_ring(hw, "all_gather", nbytes, g, g, 1))
    inter = _best(_ring(hw, kind, nbytes / g, nodes, 1, nodes))
    phases = {"all_reduce": (intra_rs, inter, intra_ag), "all_gather": (inter, intra_ag),
              "reduce_scatter": (intra_rs, inter)}[kind]  # fmt: skip
    return ("hierarchical", "+".join(p[1] for p in phases), sum(p[2] for p in phases), sum(p[3] for p in phases))


def plan_collective(
    kind: str | CollType, nbytes: int, group_size: int, hardware: Hardware, *, stride: int = 1
) -> CollectivePlan:
    """The fastest (algorithm, protocol) for one collective of ``nbytes`` (nccl-tests convention) on ``group_size``
    ranks at ``stride`` (placement rule: :class:`commsched.hardware.Hardware`)."""
    return _plan_cached(normalize_kind(kind), int(nbytes), int(group_size), hardware, int(stride))


@lru_cache(maxsize=65536)
def _plan_cached(kind: str, nbytes: int, n: int, hw: Hardware, stride: int) -> CollectivePlan:
    if nbytes < 0:
        raise ValueError(f"collective {kind}: nbytes={nbytes} must be >= 0")
    g, nodes = hw.placement(n, stride)
    if nodes > hw.num_nodes:
        raise ValueError(
            f"a {kind} on a process group of {n} ranks at stride {stride} spans {nodes} nodes of "
            f"{hw.gpus_per_node} GPUs, but hardware {hw.name!r} has num_nodes={hw.num_nodes}: "
            f"pass num_nodes >= {nodes} (e.g. --num-nodes {nodes})"
        )
    link = LinkClass.INTER_NODE if nodes > 1 else LinkClass.INTRA_NODE
    if n <= 1 or nbytes == 0:
        return CollectivePlan(kind, nbytes, n, g, nodes, "none", "none", 0.0, 0.0, link)
    algo, proto, t, lat = _best(_candidates(hw, kind, float(nbytes), n, g, nodes))
    return CollectivePlan(kind, nbytes, n, g, nodes, algo, proto, t, lat, link)


def collective_time_s(kind: str | CollType, nbytes: int, group_size: int, hardware: Hardware) -> float:
    """Seconds for one collective on ``group_size`` contiguous ranks (stride 1); ``nbytes`` in the nccl-tests
    convention (all_gather: the whole output; reduce_scatter: the whole input)."""
    return plan_collective(kind, nbytes, group_size, hardware).time_s
