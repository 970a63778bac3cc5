"""The pipeline simulator's event loop (the rules are :mod:`commsched.pipeline.simulate`'s docstring).

A heap of events keyed by (time ns, kind, issue number), so the run is deterministic: a communication that ends
(a P2P transfer, an FSDP collective) comes before a compute that ends at the same ns. Between events each rank runs
its program as far as it can: it posts P2P batches and FSDP collectives on their streams, passes WAITs whose batch
has ended, and starts its next compute once its inputs are there; a compute then runs until its end event. Every
stream is a FIFO of items (a single P2P op, a coalesced batch, an FSDP collective); its head starts when it is
posted and the item before it has ended; a P2P transfer starts once the items of both its ends have started.
O(actions log actions).
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from commsched.pipeline.actions import COMPUTE_KINDS, P2P_KINDS, ActionKind, PipelineProgram, coalesced
from commsched.pipeline.costs import StageTimes
from commsched.sim.model import StreamModel, kernel_end_rule

_COMPUTE = frozenset(int(k) for k in COMPUTE_KINDS)
_P2P = frozenset(int(k) for k in P2P_KINDS)
_FSDP = frozenset((int(ActionKind.UNSHARD), int(ActionKind.REDUCE_GRAD)))
FWD, BWD = 0, 1  # a transfer's direction: a forward activation to stage s, an output gradient to stage s
TRANSFER = {int(ActionKind.SEND_F): (FWD, 1, 1, 0), int(ActionKind.SEND_B): (BWD, -1, -1, 0),
            int(ActionKind.RECV_F): (FWD, 0, -1, 1), int(ActionKind.RECV_B): (BWD, 0, 1, 1)}  # fmt: skip
"""a SEND / RECV row's transfer: kind -> (direction, its key's stage minus the row's stage, the peer's stage minus
the row's stage, side: 0 send / 1 receive); the key is (direction, stage, microbatch)"""
_COMM_DONE, _COMPUTE_DONE = 0, 1  # event kinds, in their order at equal times
_GROUP = -1  # the stream key of coalesced batches (the pipeline group's own communicator); else the peer rank


def boundary(direction: int, stage: int) -> int:
    """The stage boundary (stage b to b + 1: the index of its P2P time) that transfer (direction, stage, mb) crosses."""
    return stage - 1 if direction == FWD else stage


def row_facts(
    rows: np.ndarray, rank: np.ndarray, s2r: np.ndarray, stages: int, mbs: int
) -> tuple[np.ndarray, ...] | None:
    """What :meth:`Engine.transfer` and :meth:`Engine.post_batch` make of each of ``rows`` (every rank's action
    rows, rank after rank; ``rank``: each row's rank), as int64 arrays, -1 where they do not apply: the transfer's id
    ``(direction * stages + stage) * mbs + mb``, the peer rank, the side, the batch (an id of (rank, batch), also
    for a WAIT), and at the first P2P row of each post (a batch, or a row posted alone) the row after the post and
    whether it is one coalesced group (for the compiled loop, :mod:`commsched.pipeline.engine_jit`). None when a
    row's stage or micro-batch does not index the stage tables, or a SEND / RECV's transfer is outside them (the
    Engine's lists then decide what they mean)."""
    kind, stage, mb, kind2, stage2, mb2 = rows.T
    fits, fits2 = (stage >= 0) & (stage < stages), (stage2 >= 0) & (stage2 < stages)
    bad = np.isin(kind, tuple(_COMPUTE)) & ~(fits & (mb >= 0) & (mb < mbs))
    bad |= (kind == ActionKind.OVERLAP_F_B) & ~((kind2 >= 0) & (kind2 <= ActionKind.BACKWARD_WEIGHT) & fits2
                                               & (mb2 >= 0) & (mb2 < mbs))  # fmt: skip
    bad |= np.isin(kind, tuple(_FSDP)) & ~fits
    n, batch = len(rows), stage2
    p2p = np.isin(kind, tuple(_P2P))
    table = np.array([TRANSFER.get(k, (0, 0, 0, 0)) for k in range(max(_P2P) + 1)], np.int64)
    direction, key_step, peer_step, side = table[np.where(p2p, kind, 0)].T
    key_stage = stage + key_step
    lowest = np.where(direction == FWD, 1, 0)  # a forward goes to stage >= 1, a gradient to stage <= S - 2
    bad |= p2p & ~((key_stage >= lowest) & (key_stage <= lowest + stages - 2) & (mb >= 0) & (mb < mbs))
    if bad.any():
        return None
    key = np.where(p2p, (direction * stages + key_stage) * mbs + mb, -1)
    peer = np.where(p2p, s2r[np.clip(stage + peer_step, 0, stages - 1)], -1)
    batched = (p2p | (kind == ActionKind.WAIT)) & (batch >= 0)
    batch_id = np.full(n, -1, np.int64)
    batch_id[batched] = np.unique(rank[batched] << 32 | batch[batched], return_inverse=True)[1].ravel()
    # a P2P row joins the post of the row before it when that is a P2P row of the same rank and batch >= 0
    joins = np.zeros(n, np.bool_)
    joins[1:] = p2p[1:] & p2p[:-1] & (rank[1:] == rank[:-1]) & (batch[:-1] >= 0) & (batch[1:] == batch[:-1])
    breaks, starts = np.flatnonzero(~joins), np.flatnonzero(p2p & ~joins)
    after = np.searchsorted(breaks, starts, side="right")
    ends = np.where(after < len(breaks), breaks[np.minimum(after, len(breaks) - 1)], n)
    run_end, group = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    run_end[starts], group[starts] = ends, 0
    for start, end in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist(), strict=True):
        group[start] = coalesced(kind[start:end].tolist())
    return key, peer, np.where(p2p, side, -1), batch_id, run_end, group


class DeadlockError(ValueError):
    """No rank can move: each waits for a transfer whose send or receive is never posted, or is queued behind one
    that cannot start."""


class _Item:
    """One entry of a stream: a single P2P op, a coalesced batch of them, or an FSDP collective (no keys)."""

    __slots__ = ("duration_ns", "end_ns", "keys", "pending", "rank", "rows", "start_ns", "stream")

    def __init__(self, rank: int, stream: int, keys: list, rows: list[int], duration_ns: int = 0) -> None:
        self.rank, self.stream, self.keys, self.rows, self.duration_ns = rank, stream, keys, rows, duration_ns
        self.start_ns = self.end_ns = -1
        self.pending = max(len(keys), 1)  # transfers (or the collective) not yet ended


class _Running:
    """A rank's compute in progress: its row, start, work left (ns at full rate), when that was last updated and the
    wall time per unit of work since then."""

    __slots__ = ("factor", "index", "last_ns", "start_ns", "version", "work_ns")

    def __init__(self, index: int, start_ns: int, work_ns: float, version: int, factor: float) -> None:
        self.index, self.start_ns, self.work_ns, self.version = index, start_ns, work_ns, version
        self.last_ns, self.factor = start_ns, factor


class Engine:
    """One simulation's state; :meth:`run` plays it to the end."""

    def __init__(self, program: PipelineProgram, times: StageTimes, xfer_ns: np.ndarray, model: StreamModel) -> None:
        p = program.pp_size
        self.p, self.model, self.xfer_ns = program, model, [int(x) for x in xfer_ns]
        self.s2r = [int(r) for r in program.stage_to_rank]
        self.rows = [acts.tolist() for acts in program.actions]  # plain ints: the loop touches each row once
        self.table = {ActionKind.FORWARD: times.forward_ns.tolist(),
                      ActionKind.FULL_BACKWARD: times.backward_ns.tolist(),
                      ActionKind.BACKWARD_INPUT: times.backward_input_ns.tolist(),
                      ActionKind.BACKWARD_WEIGHT: times.backward_weight_ns.tolist(),
                      ActionKind.UNSHARD: times.unshard_ns.tolist(),
                      ActionKind.REDUCE_GRAD: times.reduce_grad_ns.tolist()}  # fmt: skip
        self.pair = None if times.overlap_f_b_ns is None else times.overlap_f_b_ns.tolist()
        self.held = [int(b) for b in times.activation_bytes]
        self.transient = [int(b) for b in times.backward_peak_bytes]
        self.pos, self.cursor, self.busy, self.exposed = [0] * p, [0] * p, [0] * p, [0] * p
        self.act, self.peak, self.in_flight = [0] * p, [0] * p, [0] * p
        self.running: list[_Running | None] = [None] * p
        self.computing = 0  # ranks with a compute running (they share the host's cores, StreamModel.host_cores)
        self.shared = bool(model.host_cores)
        self.blocker: list[object] = [None] * p  # what a blocked rank waits for: a transfer key or an item
        self.version = 0
        self.fwd_end: dict[tuple[int, int], int] = {}  # (stage, mb) -> end of its forward
        self.bwd_end: dict[tuple[int, int], int] = {}  # (stage, mb) -> end of the B or I that made its input gradient
        self.sides: dict[tuple, list] = {}  # transfer (direction, stage, mb) -> [send item, receive item]
        self.where: dict[tuple, list] = {}  # transfer -> [(rank, row) of its send, of its receive]
        self.x_start: dict[tuple, int] = {}
        self.x_end: dict[tuple, int] = {}
        self.streams: dict[tuple[int, int], deque] = {}  # (rank, peer or _GROUP or FSDP kind) -> FIFO of items
        self.batches: dict[tuple[int, int], list[_Item]] = {}  # (rank, batch) -> its items
        self.unshard: dict[int, _Item] = {}  # stage -> its UNSHARD
        self.start = [np.full(len(a), -1, np.int64) for a in program.actions]
        self.end = [np.full(len(a), -1, np.int64) for a in program.actions]
        self.heap: list[tuple] = []
        self.seq, self.now = 0, 0

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        for rank in range(self.p.pp_size):
            self.advance(rank)
        while self.heap:
            self.now, kind, _, payload = heapq.heappop(self.heap)
            if kind == _COMM_DONE:
                self.comm_done(payload)
            else:
                self.compute_done(*payload)
        stuck = [r for r in range(self.p.pp_size) if self.pos[r] < len(self.rows[r])]
        if stuck:
            where = "; ".join(f"rank {r} at {self.p.action_str(r, self.pos[r])}" for r in stuck[:4])
            raise DeadlockError(f"pipeline {self.p.schedule} deadlocks: {where} (each waits for a transfer whose "
                                "send or receive is never posted, or is queued behind one that cannot "
                                "start)")  # fmt: skip

    def push(self, t_ns: int, kind: int, payload: object) -> None:
        heapq.heappush(self.heap, (t_ns, kind, self.seq, payload))
        self.seq += 1

    def advance(self, rank: int) -> None:
        """Run rank's program from its position until a row must wait or a compute is running."""
        rows = self.rows[rank]
        while self.running[rank] is None and self.pos[rank] < len(rows):
            i = self.pos[rank]
            row = rows[i]
            kind = row[0]
            if kind in _P2P:
                self.pos[rank] = self.post_batch(rank, i)
                continue
            if kind in _FSDP:
                self.post_fsdp(rank, i, kind, row[1])
            blocked = (kind == ActionKind.WAIT and not self.wait(rank, i, row[4])) or (
                kind in _COMPUTE and not self.start_compute(rank, i, row))  # fmt: skip
            if blocked:
                return  # the event that ends its blocker wakes it
            if self.running[rank] is None:
                self.pos[rank] = i + 1

    # ------------------------------------------------------------------ streams
    def post_batch(self, rank: int, i: int) -> int:
        """Post the P2P rows of one batch (one row if posted alone) at rank's cursor; returns the next row."""
        rows, batch = self.rows[rank], self.rows[rank][i][4]
        j = i + 1
        while batch >= 0 and j < len(rows) and rows[j][0] in _P2P and rows[j][4] == batch:
            j += 1
        ops = [(k, *self.transfer(rows[k])) for k in range(i, j)]  # (row, key, peer, side)
        if j - i > 1 and coalesced([rows[k][0] for k in range(i, j)]):  # one NCCL group on the group's communicator
            group = _Item(rank, _GROUP, [op[1] for op in ops], list(range(i, j)))
            items = [(group, op) for op in ops]
        else:  # single ops, each on the two-rank communicator of its peer pair
            items = [(_Item(rank, op[2], [op[1]], [op[0]]), op) for op in ops]
        for item, (k, key, _, side) in items:
            self.add_side(rank, item, key, k, side)
        unique = list(dict.fromkeys(item for item, _ in items))
        if batch >= 0:
            self.batches.setdefault((rank, batch), []).extend(unique)
        for item in unique:
            self.enqueue(item)
        return j

    def transfer(self, row: list[int]) -> tuple[tuple, int, int]:
        """(transfer key, peer rank, side: 0 send / 1 receive) of a SEND / RECV row."""
        direction, key_step, peer_step, side = TRANSFER[row[0]]
        return (direction, row[1] + key_step, row[2]), self.s2r[row[1] + peer_step], side

    def add_side(self, rank: int, item: _Item, key: tuple, row: int, side: int) -> None:
        sides = self.sides.get(key)
        if sides is None:
            sides = self.sides[key] = [None, None]
            self.where[key] = [None, None]
        if sides[side] is not None:
            raise DeadlockError(f"rank {rank} action {self.p.action_str(rank, row)}: posted twice")
        sides[side] = item
        self.where[key][side] = (rank, row)
        other = sides[1 - side]
        if other is not None and (other.stream == _GROUP) != (item.stream == _GROUP):
            raise DeadlockError(f"rank {rank} action {self.p.action_str(rank, row)}: one end is in a coalesced "
                                "batch and the other alone; NCCL matches P2P only within one communicator")  # fmt: skip

    def post_fsdp(self, rank: int, i: int, kind: int, stage: int) -> None:
        """An UNSHARD / REDUCE_GRAD at rank's cursor, on its own FIFO stream (FSDP2's all_gather / reduce-scatter)."""
        item = _Item(rank, -2 - kind, [], [i], self.table[kind][stage])
        if kind == ActionKind.UNSHARD:
            self.unshard[stage] = item
        self.enqueue(item)

    def enqueue(self, item: _Item) -> None:
        queue = self.streams.setdefault((item.rank, item.stream), deque())
        queue.append(item)
        if len(queue) == 1:
            self.start_item(item)

    def start_item(self, item: _Item) -> None:
        """The head of its stream starts now: an FSDP collective runs; a P2P op's transfer starts once the other
        end has started too."""
        item.start_ns = self.now
        if not item.keys:
            for i in item.rows:
                self.start[item.rank][i] = self.now
            self.push(self.now + item.duration_ns, _COMM_DONE, item)
            self.flight(item.rank, +1 if item.duration_ns else 0)
            return
        for key in item.keys:
            sides = self.sides[key]
            if sides[0] is not None and sides[1] is not None and sides[0].start_ns >= 0 and sides[1].start_ns >= 0:
                self.start_transfer(key)

    def start_transfer(self, key: tuple) -> None:
        duration = self.xfer_ns[boundary(key[0], key[1])]
        self.x_start[key] = self.now
        for rank, i in self.where[key]:
            self.start[rank][i] = self.now
            self.flight(rank, +1 if duration else 0)
        self.push(self.now + duration, _COMM_DONE, key)

    def comm_done(self, payload: _Item | tuple) -> None:
        if isinstance(payload, _Item):  # an FSDP collective
            self.flight(payload.rank, -1 if payload.duration_ns else 0)
            for i in payload.rows:
                self.end[payload.rank][i] = self.now
            self.finish_item(payload)
            self.wake(payload.rank, payload)
            return
        key = payload
        self.x_end[key] = self.now
        moved = self.now > self.x_start[key]
        for rank, i in self.where[key]:
            self.end[rank][i] = self.now
            self.flight(rank, -1 if moved else 0)
        for item in self.sides[key]:
            item.pending -= 1
            if item.pending == 0:
                self.finish_item(item)
        for (rank, _), item in zip(self.where[key], self.sides[key], strict=True):
            self.wake(rank, key, item if item.end_ns >= 0 else None)

    def wake(self, rank: int, *ended: object) -> None:
        """Advance ``rank`` if what it waits for is among ``ended`` (a transfer key, or an item that has ended)."""
        blocker = self.blocker[rank]
        if blocker is not None and any(blocker is x or blocker == x for x in ended):
            self.blocker[rank] = None
            self.advance(rank)

    def finish_item(self, item: _Item) -> None:
        item.end_ns = self.now
        queue = self.streams[item.rank, item.stream]
        queue.popleft()  # only a stream's head runs, so the item that ends is its head
        if queue:
            self.start_item(queue[0])

    def wait(self, rank: int, i: int, batch: int) -> bool:
        """A WAIT: the compute stream waits until every op of ``batch`` has ended."""
        items = self.batches.get((rank, batch))
        if items is None:
            raise DeadlockError(f"rank {rank} action {self.p.action_str(rank, i)}: no batch {batch} posted before it")
        for item in items:
            if item.end_ns < 0:
                self.blocker[rank] = item
                return False
        cursor = self.cursor[rank]
        done = max(cursor, *(item.end_ns for item in items))
        # exposed: the rank idles while a transfer of the batch is on the wire (not while its peer has yet to post)
        wire = [min(self.x_start[key] for key in it.keys) if it.keys else it.start_ns for it in items]
        self.exposed[rank] += max(0, *(min(it.end_ns, done) - max(cursor, x) for it, x in zip(items, wire)))
        self.cursor[rank] = done
        return True

    def flight(self, rank: int, delta: int) -> None:
        """One more (or fewer) collective in flight on ``rank``: its running compute's rate follows the stream
        model's interference rule (every NCCL kernel takes SMs, ``commsched.sim.model.takes_sms``)."""
        if delta:
            self.in_flight[rank] += delta
            if self.running[rank] is not None:
                self.rerate(rank)

    def factor(self, rank: int) -> float:
        """Wall time per unit of work of ``rank``'s compute now (:meth:`StreamModel.kernel_factor`)."""
        return self.model.kernel_factor(self.in_flight[rank] > 0 and self.model.kernels_see_comm, self.computing)

    def rerate(self, rank: int) -> None:
        """``rank``'s running compute continues at the rate of now: its work so far is booked and its end pushed
        again (the earlier end event is superseded by the version)."""
        run, factor = self.running[rank], self.factor(rank)
        if factor == run.factor:
            return
        run.work_ns -= (self.now - run.last_ns) / run.factor
        run.last_ns, run.factor = self.now, factor
        self.version += 1
        run.version = self.version
        self.push(kernel_end_rule(self.now, max(run.work_ns, 0.0) * factor), _COMPUTE_DONE, (rank, run.version))

    def rerate_all(self) -> None:
        """Every running compute at the rate of now (the number of ranks computing changed)."""
        for rank, run in enumerate(self.running):
            if run is not None:
                self.rerate(rank)

    # ------------------------------------------------------------------ compute
    def inputs(self, rank: int, kind: int, stage: int, mb: int) -> list[tuple[int, int, object]]:
        """(ready ns or -1, in-flight start ns or -1, the communication that brings it or None) of each input of
        one compute: the stage's parameters gathered by its UNSHARD, the activation or gradient it reads."""
        gathered = self.unshard.get(stage)
        own: list[tuple[int, int, object]] = [] if gathered is None else [(gathered.end_ns, gathered.start_ns,
                                                                            gathered)]  # fmt: skip
        last = self.p.num_stages - 1
        if kind == ActionKind.FORWARD:
            if stage == 0:
                return own
            if self.s2r[stage - 1] == rank:
                return [*own, (self.fwd_end.get((stage - 1, mb), -1), -1, None)]
            key = (FWD, stage, mb)
            return [*own, (self.x_end.get(key, -1), self.x_start.get(key, -1), key)]
        if kind == ActionKind.BACKWARD_WEIGHT:
            return [*own, (self.bwd_end.get((stage, mb), -1), -1, None)]
        own.append((self.fwd_end.get((stage, mb), -1), -1, None))
        if stage == last:
            return own
        if self.s2r[stage + 1] == rank:
            return [*own, (self.bwd_end.get((stage + 1, mb), -1), -1, None)]
        key = (BWD, stage, mb)
        return [*own, (self.x_end.get(key, -1), self.x_start.get(key, -1), key)]

    @staticmethod
    def parts(row: list[int]) -> tuple[tuple[int, int, int], ...]:
        if row[0] != ActionKind.OVERLAP_F_B:
            return ((row[0], row[1], row[2]),)
        return ((int(ActionKind.FORWARD), row[1], row[2]), (row[3], row[4], row[5]))

    def duration(self, row: list[int]) -> int:
        kind, stage, mb, kind2, stage2, mb2 = row
        if kind != ActionKind.OVERLAP_F_B:
            return self.table[kind][stage][mb]
        if self.pair is not None:
            return self.pair[stage][stage2]
        return self.table[ActionKind.FORWARD][stage][mb] + self.table[kind2][stage2][mb2]

    def start_compute(self, rank: int, i: int, row: list[int]) -> bool:
        """Start one compute now, or return False while an input is missing (the rank is woken when it comes)."""
        if row[0] == ActionKind.OVERLAP_F_B:
            deps = [d for k, s, m in self.parts(row) for d in self.inputs(rank, k, s, m)]
        else:
            deps = self.inputs(rank, row[0], row[1], row[2])
        cursor = start = self.cursor[rank]
        exposed = 0
        for ready, wire, comm in deps:
            if ready < 0:
                if comm is None:
                    raise DeadlockError(f"rank {rank} action {self.p.action_str(rank, i)}: an input it needs from "
                                        "its own rank runs later in its order")  # fmt: skip
                self.blocker[rank] = comm
                return False
            start = max(start, ready)
            if comm is not None:  # the rank idled while this input was on the wire
                exposed = max(exposed, ready - max(cursor, wire))
        self.exposed[rank] += exposed
        work = self.duration(row)
        self.version += 1
        self.computing += 1
        factor = self.factor(rank)
        self.running[rank] = _Running(i, start, float(work), self.version, factor)
        self.push(kernel_end_rule(start, work * factor), _COMPUTE_DONE, (rank, self.version))
        if self.shared:
            self.rerate_all()
        for kind, stage, _ in self.parts(row):  # memory: a forward takes its activations, a backward its transient
            if kind == ActionKind.FORWARD:
                self.act[rank] += self.held[stage]
            transient = self.transient[stage] if kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT) else 0
            self.peak[rank] = max(self.peak[rank], self.act[rank] + transient)
        return True

    def compute_done(self, rank: int, version: int) -> None:
        run = self.running[rank]
        if run is None or run.version != version:
            return  # superseded: its rate changed since this end was computed
        i, end = run.index, self.now
        self.start[rank][i], self.end[rank][i] = run.start_ns, end
        self.busy[rank] += end - run.start_ns
        self.cursor[rank] = end
        for kind, stage, mb in self.parts(self.rows[rank][i]):
            if kind == ActionKind.FORWARD:
                self.fwd_end[stage, mb] = end
            elif kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT):
                self.bwd_end[stage, mb] = end
            if kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT):
                self.act[rank] -= self.held[stage]
        self.running[rank] = None
        self.computing -= 1
        self.pos[rank] = i + 1
        self.advance(rank)
        if self.shared:
            self.rerate_all()
