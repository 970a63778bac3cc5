"""Which collectives to merge: the bucket plan, computed on the IR for a given order.

Rules (one pass over the order, one open bucket per process group):

* Only functional out-of-place ``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``all_reduce`` with one
  input and at least one wait are bucketed; a bucket holds collectives of one kind, dtype and reduce op that are
  consecutive in their group's issue order (any other collective on the group closes it).
* The size cap is the smallest size at which that collective reaches ``saturation`` (default 90 %) of its
  asymptotic bus bandwidth on the group, from the cost model (:func:`bucket_cap_bytes`); a bucket whose next member
  would pass it is closed.
* The merged collective is issued where its last member was and completes where its first member's wait was, so a
  member may join only if no earlier member's result is needed before then ("early_use"; ``early_use=False``
  drops this rule, as torch's FSDP pre-bucketing does: the merged program is then rescheduled, and what the
  bucket's inputs need, e.g. parameter casts, moves earlier). Results that only flow to the graph's output
  (gradients) are not needed early. A member whose input depends on an earlier member's result
  would make a cycle ("cycle"); so would buckets of different groups that wait on each other, which a final check
  on the contracted graph dissolves ("cross_group_cycle").
* With ``overlap_aware`` (default), a one-compute-stream estimate along the order decides each merge ("exposes"):
  where the group's communication outlasts the remaining compute, a merge must not free the comm stream later;
  elsewhere it must not stall compute longer (a later issue, a bigger transfer before the first use) than two
  collectives would, counting the bucket's copy-in / copy-out. Bucketing everything up to the cap is
  ``overlap_aware=False``.

``plan_buckets(graph, costs, order)`` is what a scheduler calls; plan on the order the step will run in (the flagship
scheduler's order sees the prefetches it made, the traced order does not). :func:`commsched.rewrites.apply_bucket_plan`
applies a plan to the FX GraphModule the graph was imported from. O((N + E) * groups) plus the final check.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from commsched.cost.collectives import bus_factor, plan_collective
from commsched.hardware import Hardware
from commsched.ir import Graph, GraphError, OpKind
from commsched.ir.graph import csr
from commsched.ir.transform import kahn_order
from commsched.sim.jit import ENABLED as JIT_ENABLED

BUCKETABLE = {
    "_c10d_functional.all_gather_into_tensor.default": "all_gather",
    "_c10d_functional.reduce_scatter_tensor.default": "reduce_scatter",
    "_c10d_functional.all_reduce.default": "all_reduce",
}
KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketConfig:
    """Knobs of :func:`plan_buckets`."""

    saturation: float = 0.9  # the cap is where a collective reaches this fraction of its asymptotic bus bandwidth
    cap_bytes: int | None = None  # a fixed cap (nccl-tests bytes) instead of the cost-model one
    kinds: tuple[str, ...] = KINDS  # collective kinds to bucket
    overlap_aware: bool = True  # refuse merges that the one-stream estimate says expose more communication
    early_use: bool = True
    """refuse a member issued after an earlier member's result is first used in the planned order ("early_use");
    False keeps only the structural rules (kind, dtype, op, cap, cycles), as torch's FSDP pre-bucketing does: the
    bucketed program is then scheduled anew, and its inputs (e.g. parameter casts) can move earlier"""

    def __post_init__(self) -> None:
        if not 0.0 < self.saturation < 1.0:
            raise ValueError(f"BucketConfig.saturation={self.saturation}: expected a fraction in (0, 1)")
        if self.cap_bytes is not None and self.cap_bytes <= 0:
            raise ValueError(f"BucketConfig.cap_bytes={self.cap_bytes}: expected > 0")
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise ValueError(f"BucketConfig.kinds: unknown kind {bad[0]!r}; expected some of {', '.join(KINDS)}")


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One bucket: its members (collective node names, in issue order) and why it was closed."""

    group: str
    kind: str
    dtype: str
    reduce_op: str | None
    members: tuple[str, ...]
    member_bytes: tuple[int, ...]  # nccl-tests convention per member
    closed_by: str  # cap | dtype | reduce_op | other_collective | early_use | cycle | cross_group_cycle | end
    cap_bytes: int
    time_s: float  # the merged collective on the cost model
    members_time_s: float  # the members one by one

    @property
    def nbytes(self) -> int:
        return sum(self.member_bytes)

    @property
    def merged(self) -> bool:
        return len(self.members) > 1


@dataclasses.dataclass
class BucketPlan:
    """All buckets of a graph in issue order (singletons included, so every eligible collective is accounted for)."""

    buckets: list[Bucket]
    caps: dict[tuple[str, str], int]  # (group, kind) -> cap in nccl-tests bytes
    hardware: str
    config: BucketConfig
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # ineligible collectives by reason

    @property
    def merged(self) -> list[Bucket]:
        return [b for b in self.buckets if b.merged]

    @property
    def saved_s(self) -> float:
        """Collective time saved on the cost model (members one by one minus merged), before any overlap."""
        return sum(b.members_time_s - b.time_s for b in self.merged)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "bucket": k,
                "group": b.group,
                "kind": b.kind,
                "dtype": b.dtype,
                "members": len(b.members),
                "first": b.members[0],
                "last": b.members[-1],
                "bytes": b.nbytes,
                "cap_bytes": b.cap_bytes,
                "closed_by": b.closed_by,
                "time_s": b.time_s,
                "members_time_s": b.members_time_s,
            }
            for k, b in enumerate(self.buckets)
        ]

    def closed_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.buckets:
            out[b.closed_by] = out.get(b.closed_by, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "collectives": sum(len(b.members) for b in self.buckets),
            "buckets": len(self.buckets),
            "merged_buckets": len(self.merged),
            "collectives_merged": sum(len(b.members) for b in self.merged),
            "saved_s": self.saved_s,
            "closed_by": self.closed_counts(),
            "caps_bytes": {f"{g}/{k}": v for (g, k), v in sorted(self.caps.items())},
            "skipped": dict(self.skipped),
        }


# ---------------------------------------------------------------------------------------------------- the cap
def bucket_cap_bytes(
    kind: str, group_size: int, hardware: Hardware, *, stride: int = 1, saturation: float = 0.9
) -> int:
    """The smallest size (nccl-tests bytes) at which ``kind`` on ``group_size`` ranks reaches ``saturation`` of its
    asymptotic bus bandwidth on ``hardware`` (the cost model's busbw grows with size: a bisection on log2 bytes)."""
    return _cap(kind, int(group_size), hardware, int(stride), float(saturation))


@lru_cache(maxsize=1024)
def _cap(kind: str, n: int, hw: Hardware, stride: int, saturation: float) -> int:
    if n <= 1:
        return 1 << 62

    def busbw(nbytes: int) -> float:
        p = plan_collective(kind, nbytes, n, hw, stride=stride)
        return bus_factor(kind, n) * nbytes / p.time_s

    huge = 1 << 44  # 16 TiB: the latency part is negligible here
    target = saturation * busbw(huge)
    lo, hi = 10, 44  # 1 KiB .. huge, in log2 bytes
    if busbw(1 << lo) >= target:
        return 1 << lo
    for _ in range(40):  # bisection on log2(bytes) to ~1 % of the size
        mid = 0.5 * (lo + hi)
        if busbw(int(2**mid)) >= target:
            hi = mid
        else:
            lo = mid
        if hi - lo < 0.01:
            break
    return math.ceil(2**hi)


# ---------------------------------------------------------------------------------------------------- helpers
_TAILS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Graph -> its tail mask (graphs are immutable)


def _tail_nodes(g: Graph) -> np.ndarray:
    """Nodes whose results only flow to the graph's output (gradients, logged values): delaying them is free.

    Collectives and nodes with side effects (other than waits) are never tails. Reverse topological sweep, O(N + E),
    once per graph (``optimize`` plans many buckets on one graph)."""
    cached = _TAILS.get(g)
    if cached is not None:
        return cached
    n = len(g)
    ptr, idx = (a.tolist() for a in g.successors_csr())
    kinds, side = g.kinds.tolist(), g.side_effect.tolist()
    never = {int(OpKind.OUTPUT), int(OpKind.COLLECTIVE), int(OpKind.INPUT)}
    k_wait, k_out = int(OpKind.WAIT), int(OpKind.OUTPUT)
    tail = [False] * n
    for i in range(n - 1, -1, -1):
        k = kinds[i]
        if k in never or (side[i] and k != k_wait):
            continue
        succ = idx[ptr[i] : ptr[i + 1]]
        tail[i] = bool(succ) and all(tail[s] or kinds[s] == k_out for s in succ)
    out = np.asarray(tail, bool)
    _TAILS[g] = out
    return out


def _first_uses(g: Graph, pos: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """Per node: for a collective, the earliest position of a non-tail node (not the output) reading one of its
    waits (inf if none); array operations over the waits' successors."""
    out = np.full(len(g), math.inf)
    waits = np.flatnonzero(g.wait_of >= 0)
    if not len(waits):
        return out
    ptr, idx = g.successors_csr()
    counts = (ptr[waits + 1] - ptr[waits]).astype(np.int64)
    start = np.repeat(ptr[waits].astype(np.int64), counts)
    users = idx[start + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)]
    coll = np.repeat(g.wait_of[waits].astype(np.int64), counts)
    real = ~tail[users] & (g.kinds[users] != OpKind.OUTPUT)
    np.minimum.at(out, coll[real], pos[users[real]].astype(np.float64))
    return out


def resolve_hardware(hardware: Any) -> Hardware:
    """A Hardware from a profile name, a Hardware, or a CostEstimate that names its profile in ``meta``."""
    from commsched import hardware as hwmod
    from commsched.cost.model import CostEstimate

    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str):
        return hwmod.get(hardware)
    if isinstance(hardware, CostEstimate):
        name, nodes = hardware.meta.get("hardware"), hardware.meta.get("num_nodes", 1)
        if not name:
            raise ValueError("the CostEstimate names no hardware in meta['hardware']: pass a Hardware instead")
        return hwmod.get(name, num_nodes=int(nodes))
    raise TypeError(f"hardware: expected a profile name, a Hardware or a CostEstimate, got {type(hardware).__name__}")


@dataclasses.dataclass
class _Open:
    gid: int
    kind: str
    dtype: str
    reduce_op: str | None
    cap: int
    members: list[int]
    nbytes: int
    first_use: float  # earliest position where a member's result is read (non-tail)
    issue_s: float = 0.0  # estimated issue time: compute before the last member's position
    need_s: float = math.inf  # estimated time the first member result is needed
    stream_free_s: float = 0.0  # when the group's comm stream frees, before this bucket


# ---------------------------------------------------------------------------------------------------- planning
def plan_buckets(
    graph: Graph,
    costs: Any,
    order: Sequence[int] | np.ndarray | None = None,
    *,
    hardware: Any = None,
    config: BucketConfig | None = None,
) -> BucketPlan:
    """Bucket the collectives of ``graph`` as they are issued in ``order`` (node ids; default: the graph's order).

    ``costs``: a ``CostEstimate`` of ``graph`` (its compute times drive the overlap estimate; its profile, looked up
    by name unless ``hardware`` is given, drives the caps), or a profile name / :class:`Hardware` to estimate with.
    Returns every eligible collective in exactly one bucket; see the module docstring for the rules.
    """
    from commsched.cost import estimate_costs
    from commsched.cost.model import CostEstimate

    g, cfg = graph, config or BucketConfig()
    hw = resolve_hardware(hardware if hardware is not None else costs)
    est = costs if isinstance(costs, CostEstimate) else estimate_costs(g, hw)
    n = len(g)
    if len(est.node_s) != n:
        raise GraphError(f"the CostEstimate has {len(est.node_s)} entries; the graph has {n} nodes")
    order_arr = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, np.int64)
    if len(order_arr) != n or len(np.unique(order_arr)) != n:
        raise GraphError(f"order has {len(order_arr)} entries ({len(np.unique(order_arr))} distinct): expected {n}")
    pos = np.empty(n, np.int64)
    pos[order_arr] = np.arange(n)
    # compute time before each position on one compute stream: the clock the overlap estimate runs on
    work = np.where((g.kinds == OpKind.COMPUTE) | (g.kinds == OpKind.OTHER), est.node_s, 0.0)
    clock = np.concatenate([[0.0], np.cumsum(work[order_arr])])
    tail = _tail_nodes(g)
    first_use = _first_uses(g, pos, tail)
    # per collective: the collectives it depends on (a bitset); per group: the open bucket and its members' bits
    depends_on, bit = _collective_ancestors(g)
    caps: dict[tuple[str, str], int] = {}
    skipped: dict[str, int] = {}
    open_: dict[int, _Open | None] = {}
    open_bits: dict[int, int] = {}
    stream_free: dict[int, float] = {}
    closed: list[tuple[_Open, str]] = []

    def coll_s(gid: int, kind: str, nbytes: int) -> float:
        grp = g.groups[gid]
        return plan_collective(kind, nbytes, grp.size, hw, stride=grp.stride).time_s

    def cap_of(gid: int, kind: str) -> int:
        grp = g.groups[gid]
        key = (grp.name, kind)
        if key not in caps:
            caps[key] = cfg.cap_bytes or bucket_cap_bytes(
                kind, grp.size, hw, stride=grp.stride, saturation=cfg.saturation
            )
        return caps[key]

    def close(gid: int, reason: str) -> None:
        ob = open_.get(gid)
        if ob is not None:
            closed.append((ob, reason))
            open_[gid] = None
            start = max(ob.issue_s, ob.stream_free_s)
            stream_free[gid] = start + coll_s(gid, ob.kind, ob.nbytes)

    copy_bw = hw.compute.hbm_bandwidth_bytes_per_s * hw.compute.efficiency.elementwise

    def copy_s(c: int) -> float:
        # bytes the copy-in (cat) and copy-out (all_gather only: the rank-major split) read and write
        moved = 2 * int(g.coll_in_bytes[c]) + (
            2 * int(g.coll_out_bytes[c]) if BUCKETABLE[g.targets[c]] == "all_gather" else 0
        )
        return moved / copy_bw

    def worse_merged(ob: _Open, v: int, gid: int, nbytes: int, issue_s: float, need_s: float) -> bool:
        """Does merging ``v`` into ``ob`` lose against two collectives on the one-stream estimate?

        Comm-critical (the group's backlog plus its remaining collectives outlast the remaining compute): compare
        when the comm stream frees. Compute-critical: compare the compute stalls plus the bucket's copies.
        """
        t_b, t_c = coll_s(gid, ob.kind, ob.nbytes), coll_s(gid, ob.kind, nbytes)
        end_b = max(ob.issue_s, ob.stream_free_s) + t_b
        end_sep = max(issue_s, end_b) + t_c
        end_merged = max(issue_s, ob.stream_free_s) + coll_s(gid, ob.kind, ob.nbytes + nbytes)
        backlog = max(0.0, ob.stream_free_s - issue_s)
        if backlog + comm_after[v] > clock[-1] - issue_s:
            return end_merged > end_sep + 1e-12
        stall_b = max(0.0, end_b - ob.need_s)
        exposed_sep = stall_b + max(0.0, end_sep - (need_s + stall_b))
        exposed_merged = max(0.0, end_merged - min(ob.need_s, need_s))
        copies = copy_s(v) + (copy_s(ob.members[0]) if len(ob.members) == 1 else 0.0)
        return exposed_merged + copies > exposed_sep + 1e-12

    # per collective: the time of the collectives issued after it on its group (unmerged), for the regime test
    comm_after = np.zeros(n)
    alone_s = _alone_s(g, hw)
    for gid in np.unique(g.coll_group[g.collectives]).tolist():
        members = [c for c in g.collectives.tolist() if g.coll_group[c] == gid]
        members.sort(key=lambda c: pos[c])
        times = [alone_s[c] for c in members]
        suffix = np.concatenate([np.cumsum(times[::-1])[::-1][1:], [0.0]])
        comm_after[members] = suffix

    for v in sorted(bit, key=lambda c: pos[c]):  # the collectives in the planned order
        gid = int(g.coll_group[v])
        kind = BUCKETABLE.get(g.targets[v])
        if kind is None or kind not in cfg.kinds or len(g.inputs(v)) != 1 or not len(g.waits_of(v)):
            reason = "unsupported" if kind is None else ("kind_disabled" if kind not in cfg.kinds else "shape")
            skipped[reason] = skipped.get(reason, 0) + 1
            close(gid, "other_collective")
            continue
        dtype = g.buf_dtype[int(g.buf_ptr[v])]
        rop = g.coll_reduce_op.get(v)
        nbytes = int(g.comm_bytes[v])
        use = float(first_use[v])
        issue_s = float(clock[pos[v]])
        need_s = float(clock[int(use)]) if math.isfinite(use) else float(clock[-1])
        ob = open_.get(gid)
        reason = None
        if ob is not None:
            if ob.kind != kind:
                reason = "other_collective"
            elif ob.dtype != dtype:
                reason = "dtype"
            elif ob.reduce_op != rop:
                reason = "reduce_op"
            elif depends_on[v] & open_bits[gid]:  # a member's result flows into this one's input
                reason = "cycle"
            elif cfg.early_use and ob.first_use <= pos[v]:
                reason = "early_use"
            elif ob.nbytes + nbytes > ob.cap:
                reason = "cap"
            elif cfg.overlap_aware and worse_merged(ob, v, gid, nbytes, issue_s, need_s):
                reason = "exposes"
        if ob is None or reason is not None:
            if ob is not None:
                close(gid, reason)
            open_bits[gid] = 0
            ob = open_[gid] = _Open(gid, kind, dtype, rop, cap_of(gid, kind), [], 0, math.inf)
            ob.stream_free_s = stream_free.get(gid, 0.0)
        ob.members.append(v)
        ob.nbytes += nbytes
        ob.first_use = min(ob.first_use, use)
        ob.issue_s = issue_s
        ob.need_s = min(ob.need_s, need_s)
        open_bits[gid] |= bit[v]
    for gid in list(open_):
        close(gid, "end")

    closed = _break_cross_group_cycles(g, closed)
    closed.sort(key=lambda c: pos[c[0].members[0]])
    buckets = [_bucket(g, hw, ob, reason, alone_s) for ob, reason in closed]
    return BucketPlan(buckets=buckets, caps=caps, hardware=hw.name, config=cfg, skipped=skipped)


def _bucket(g: Graph, hw: Hardware, ob: _Open, reason: str, alone_s: dict[int, float]) -> Bucket:
    grp = g.groups[ob.gid]
    member_bytes = tuple(int(g.comm_bytes[m]) for m in ob.members)

    def t(nbytes: int) -> float:
        return plan_collective(ob.kind, nbytes, grp.size, hw, stride=grp.stride).time_s

    return Bucket(
        group=grp.name,
        kind=ob.kind,
        dtype=ob.dtype,
        reduce_op=ob.reduce_op,
        members=tuple(g.names[m] for m in ob.members),
        member_bytes=member_bytes,
        closed_by=reason,
        cap_bytes=ob.cap,
        time_s=t(sum(member_bytes)),
        members_time_s=sum(alone_s[m] for m in ob.members),
    )


_ANCESTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Graph -> (_collective_ancestors's pair)


def _collective_ancestors(g: Graph) -> tuple[dict[int, int], dict[int, int]]:
    """(per collective: the collectives it depends on, directly or not, as a bitset; per collective: its bit), once
    per graph. One sweep over the nodes in id (topological) order, O((N + E) * C / 64)."""
    cached = _ANCESTORS.get(g)
    if cached is not None:
        return cached
    colls = g.collectives.tolist()
    bit = {c: 1 << k for k, c in enumerate(colls)}
    ptr, idx = (a.tolist() for a in g.predecessors_csr())
    anc = [0] * len(g)
    for v in range(len(g)):
        bits = 0
        for p in idx[ptr[v] : ptr[v + 1]]:
            bits |= anc[p] | bit.get(p, 0)
        anc[v] = bits
    out = ({c: anc[c] for c in colls}, bit)
    _ANCESTORS[g] = out
    return out


_ALONE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Graph -> {Hardware: per-collective seconds}


def _alone_s(g: Graph, hw: Hardware) -> dict[int, float]:
    """Each collective's time on its own (cost model; kind by target, all_reduce for other collectives), once per
    graph and hardware (``optimize`` plans many buckets on one graph)."""
    per_hw = _ALONE.setdefault(g, {})
    if hw not in per_hw:
        out = {}
        for c in g.collectives.tolist():
            grp = g.groups[int(g.coll_group[c])]
            kind = BUCKETABLE.get(g.targets[c]) or "all_reduce"
            out[c] = plan_collective(kind, int(g.comm_bytes[c]), grp.size, hw, stride=grp.stride).time_s
        per_hw[hw] = out
    return per_hw[hw]


def _break_cross_group_cycles(g: Graph, closed: list[tuple[_Open, str]]) -> list[tuple[_Open, str]]:
    """Dissolve buckets (newest first) until the graph with every bucket contracted to one collective and one wait
    is acyclic. Within a group the taint check already rules cycles out; across groups two buckets can wait on
    each other."""
    while True:
        merged = [k for k, (ob, _) in enumerate(closed) if len(ob.members) > 1]
        stuck = _contracted_cycle(g, [closed[k][0] for k in merged])
        if stuck is None:
            return closed
        k = merged[stuck]
        ob, _ = closed.pop(k)
        # the members go back to singletons (their relative order is kept by the final sort)
        for m in ob.members:
            closed.append((_Open(ob.gid, ob.kind, ob.dtype, ob.reduce_op, ob.cap, [m], 0, math.inf),
                           "cross_group_cycle"))  # fmt: skip


def _contracted_cycle(g: Graph, buckets: list[_Open]) -> int | None:
    """Index (into ``buckets``) of the newest bucket left on a cycle of the contracted graph, or None if acyclic."""
    if not buckets:
        return None
    n = len(g)
    rep = np.arange(n, dtype=np.int64)
    owner = np.full(n, -1, np.int64)
    for k, ob in enumerate(buckets):
        c0 = ob.members[0]
        w0 = int(g.waits_of(c0)[0])
        for m in ob.members:
            rep[m] = c0
            owner[m] = k
            for w in g.waits_of(m).tolist():
                rep[w] = w0
                owner[w] = k
    ptr, idx = g.predecessors_csr()
    dst = np.repeat(np.arange(n), np.diff(ptr))
    src, dst = rep[idx], rep[dst]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if len(src):
        key = np.unique(src * n + dst)
        src, dst = key // n, key % n
    live = np.unique(rep)
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    succ_ptr, succ_idx = csr(n, dst, src)
    rank = np.zeros(n, np.float64)  # which sort: the nodes a topological sort reaches are the same for any
    if JIT_ENABLED:
        from commsched.passes.overlap_jit import kahn_jit

        reached = kahn_jit(succ_ptr.astype(np.int64), succ_idx.astype(np.int64), indeg, rank)
    else:
        reached = np.asarray(kahn_order(succ_ptr, succ_idx, indeg, rank), np.int64)
    stuck = np.ones(n, bool)
    stuck[reached] = False
    left = owner[live[stuck[live]]]
    left = left[left >= 0]
    return int(left.max()) if len(left) else None


__all__ = ["BUCKETABLE", "Bucket", "BucketConfig", "BucketPlan", "bucket_cap_bytes", "plan_buckets"]
