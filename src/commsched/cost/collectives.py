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
* ``tree`` (all_reduce): chain inside a node, binary tree across nodes: log2(nodes) network levels, each one network
  step up and one down; under a network profile with ``tree_two_children`` (:func:`tree_network_steps`), every level
  below the root counts two steps.
* ``nvls`` (all_reduce, one node, NVLink SHARP): the switch reduces and multicasts.
* ``nvls_tree`` (all_reduce, several nodes, NVLink SHARP): NVLS inside nodes, a tree over the NICs.
* ``hierarchical`` (all_reduce, all_gather, reduce_scatter across nodes): reduce_scatter on NVLink, the collective
  on 1/ranks_per_node of the data across nodes (each rank on its own NIC), all_gather on NVLink; phases add up.
* ``direct`` (all_to_all): every rank sends to every other at once; across nodes bounded by one NIC per rank.
* ``p2p`` (sendrecv, as nccl-tests' sendrecv_perf: each rank sends its buffer to the next rank and receives from the
  previous): one step over one NVLink link, or over one NIC when the group spans nodes.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import numpy as np

from commsched.cost.model import LinkClass
from commsched.hardware import Hardware, Protocol
from commsched.ir import CollType

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")
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


# A candidate is (algorithm, protocol, latency_s, factor, bandwidth): time = latency_s + factor * nbytes / bandwidth,
# written in that one order everywhere (scalar and vectorised) so both give the same bits.
Candidate = tuple[str, str, float, float, float]


def _ring(hw: Hardware, kind: str, n: int, g: int, nodes: int) -> list[Candidate]:
    """Ring candidates for every protocol."""
    if n <= 1:
        return [("ring", "simple", 0.0, 0.0, math.inf)]
    bus = hw.intra_node.link_bandwidth_bytes_per_s * hw.intra_node.ring_efficiency if g > 1 else math.inf
    if nodes > 1:
        bus = min(bus, _nic_bus(hw, g))
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    inter_steps = (2 * nodes if kind == "all_reduce" else nodes - 1) if nodes > 1 else 0
    out = []
    for p in hw.protocols:
        lat = p.base_latency_s + (steps - inter_steps) * p.intra_hop_latency_s + inter_steps * p.inter_hop_latency_s
        out.append(("ring", p.name, lat, bus_factor(kind, n), _bus(bus, p)))
    return out


@lru_cache(maxsize=4096)
def _candidates(hw: Hardware, kind: str, n: int, g: int, nodes: int) -> tuple[tuple[Candidate, ...], tuple]:
    """(the single-phase candidates sorted by (algorithm, protocol), the hierarchical one's phases or ()): every way
    to run the collective; independent of its size."""
    intra = hw.intra_node
    cands: list[Candidate] = []
    if kind == "all_to_all":
        bus = intra.link_bandwidth_bytes_per_s * intra.all_to_all_efficiency if g > 1 else math.inf
        if nodes > 1:
            bus = min(bus, _nic_bus(hw, 1))  # one NIC per rank: all_to_all cannot aggregate a node's NICs
        for p in hw.protocols:
            # every peer's send is posted at once: one network step, plus a small cost per peer to post it
            lat = p.base_latency_s + (n - 1) * p.intra_hop_latency_s + (p.inter_hop_latency_s if nodes > 1 else 0.0)
            cands.append(("direct", p.name, lat, bus_factor(kind, n), _bus(bus, p)))
        return tuple(sorted(cands, key=lambda c: (c[0], c[1]))), ()
    if kind == "sendrecv":
        bus = intra.link_bandwidth_bytes_per_s * intra.ring_efficiency if g > 1 else math.inf
        if nodes > 1:
            bus = min(bus, _nic_bus(hw, 1))  # the pair that crosses nodes has one NIC each
        for p in hw.protocols:
            hop = p.inter_hop_latency_s if nodes > 1 else p.intra_hop_latency_s
            cands.append(("p2p", p.name, p.base_latency_s + hop, 1.0, _bus(bus, p)))
        return tuple(sorted(cands, key=lambda c: (c[0], c[1]))), ()
    cands += _ring(hw, kind, n, g, nodes)
    if kind == "all_reduce":
        cands += _all_reduce_extra(hw, n, g, nodes)
    phases: tuple = ()
    if nodes > 1 and g > 1 and kind in ("all_reduce", "all_gather", "reduce_scatter"):
        phases = _hierarchical_phases(hw, kind, g, nodes)
    return tuple(sorted(cands, key=lambda c: (c[0], c[1]))), phases


def tree_network_steps(hw: Hardware, nodes: int) -> int:
    """Network steps one way through the tree across ``nodes`` nodes: log2(nodes) levels (NCCL's tuning model,
    tuning.cc: ``log2i(nNodes) * interLat``). With ``inter_node.tree_two_children``: NCCL's binary tree
    (src/graph/trees.cc, ncclGetBtree) gives the root one child and every other inner node two, whose chunks reach it
    in turn over its NICs, so each level below the root costs two steps: 2 log2(nodes) - 1 (1, 3, 5 at 2, 4, 8
    nodes). The public 2/4/8-node H100 logs (nccl-tests#309) need it: at 1-64 MB their network latency grows about
    3.5x from 2 to 4 nodes and 1.6x from 4 to 8, which log2 levels (2x, 1.5x) cannot give with one step cost
    (benchmarks/RESULTS.md, issue 17)."""
    if nodes <= 1:
        return 0
    levels = math.ceil(math.log2(nodes))
    return 2 * levels - 1 if hw.inter_node.tree_two_children else levels


def _all_reduce_extra(hw: Hardware, n: int, g: int, nodes: int) -> list[Candidate]:
    """Tree, and NVLS / NVLS-tree where the switch reduces."""
    intra = hw.intra_node
    simple = next(p for p in hw.protocols if p.name == "simple")
    bus = intra.link_bandwidth_bytes_per_s * intra.ring_efficiency if g > 1 else math.inf
    if nodes > 1:
        bus = min(bus, _nic_bus(hw, g))
    levels = tree_network_steps(hw, nodes)
    out: list[Candidate] = []
    for p in hw.protocols:
        lat = p.base_latency_s + 2 * ((g - 1) * p.intra_hop_latency_s + levels * p.inter_hop_latency_s)
        out.append(("tree", p.name, lat, 2.0, _bus(bus * TREE_BANDWIDTH_FACTOR, p)))
    if intra.nvls and g > 1:
        nvls_alg = intra.link_bandwidth_bytes_per_s * intra.nvls_efficiency
        if nodes == 1:
            out.append(("nvls", "simple", intra.nvls_latency_s, 1.0, nvls_alg))
        else:
            # each node sends and receives the whole buffer over its NICs, twice for a tree deeper than 2
            inter_alg = _nic_bus(hw, g) / (2.0 if nodes > 2 else 1.0)
            lat = intra.nvls_latency_s + 2 * levels * simple.inter_hop_latency_s
            tree_nvls_alg = nvls_alg * intra.nvls_tree_efficiency  # the NVLS phase paced by the network phase
            out.append(("nvls_tree", "simple", lat, 1.0, min(tree_nvls_alg, inter_alg)))
    return out


def _hierarchical_phases(hw: Hardware, kind: str, g: int, nodes: int) -> tuple:
    """NVLink phase(s) plus the collective on 1/g of the data across nodes, one rank per node (sequential): per
    phase, (what divides the bytes it moves, its ring candidates sorted by protocol)."""

    def ring(k: str, n: int, gg: int, nn: int) -> tuple[Candidate, ...]:
        return tuple(sorted(_ring(hw, k, n, gg, nn), key=lambda c: (c[0], c[1])))

    rs, ag, inter = ring("reduce_scatter", g, g, 1), ring("all_gather", g, g, 1), ring(kind, nodes, 1, nodes)
    return {"all_reduce": ((1, rs), (g, inter), (1, ag)), "all_gather": ((g, inter), (1, ag)),
            "reduce_scatter": ((1, rs), (g, inter))}[kind]  # fmt: skip


def _time(c: Candidate, nbytes: float) -> float:
    return c[2] + c[3] * nbytes / c[4]


def _best(cands: tuple[Candidate, ...], nbytes: float) -> tuple[Candidate, float]:
    """The fastest candidate (ties: the first by (algorithm, protocol)) and its time."""
    best, best_t = cands[0], _time(cands[0], nbytes)
    for c in cands[1:]:
        t = _time(c, nbytes)
        if t < best_t:
            best, best_t = c, t
    return best, best_t


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
    cands, phases = _candidates(hw, kind, n, g, nodes)
    best, t = _best(cands, float(nbytes))
    algo, proto, lat = best[0], best[1], best[2]
    if phases:
        chosen = [_best(ring, nbytes / div) for div, ring in phases]
        h_t = sum(ct for _, ct in chosen)
        # the same order as the single-phase candidates: (time, algorithm, protocol), "hierarchical" sorts first
        if h_t < t or (h_t == t and algo > "hierarchical"):
            algo, proto, t = "hierarchical", "+".join(c[1] for c, _ in chosen), h_t
            lat = sum(c[2] for c, _ in chosen)
    return CollectivePlan(kind, nbytes, n, g, nodes, algo, proto, t, lat, link)


def collective_times_s(
    kind: str | CollType, nbytes: np.ndarray, group_size: int, hardware: Hardware, *, stride: int = 1
) -> np.ndarray:
    """Seconds of one collective for each of many sizes (nccl-tests convention) on one group: the same numbers as
    ``plan_collective(...).time_s``, bit for bit, vectorised over ``nbytes`` (a plan search costs many sizes)."""
    k, n, s = normalize_kind(kind), int(group_size), int(stride)
    x = np.asarray(nbytes, dtype=np.float64)
    if (x < 0).any():
        raise ValueError(f"collective {k}: nbytes must be >= 0")
    g, nodes = hardware.placement(n, s)
    if n <= 1:
        return np.zeros_like(x)
    cands, phases = _candidates(hardware, k, n, g, nodes)
    t = _min_time(cands, x)
    if phases:
        t = np.minimum(t, sum(_min_time(ring, x / div) for div, ring in phases))
    return np.where(x == 0, 0.0, t)


def _min_time(cands: tuple[Candidate, ...], x: np.ndarray) -> np.ndarray:
    out = cands[0][2] + cands[0][3] * x / cands[0][4]
    for c in cands[1:]:
        np.minimum(out, c[2] + c[3] * x / c[4], out=out)
    return out


def collective_time_s(kind: str | CollType, nbytes: int, group_size: int, hardware: Hardware) -> float:
    """Seconds for one collective on ``group_size`` contiguous ranks (stride 1); ``nbytes`` in the nccl-tests
    convention (all_gather: the whole output; reduce_scatter: the whole input)."""
    return plan_collective(kind, nbytes, group_size, hardware).time_s
