"""The pipeline simulator's event loop, compiled (:mod:`commsched.sim.jit`).

:func:`run_compiled` is :class:`commsched.pipeline.engine.Engine`'s loop, handler for handler, on arrays: the rows
of every rank one after another, transfers, P2P batches and stream items as integer ids, each stream's FIFO and
each batch's items as linked lists of items, the heap as an array whose key is the Engine's whole ordering (time,
event kind, issue number). The rates follow the same float operations in the same order (the work left is booked
at each change of rate; :func:`commsched.sim.model.kernel_end_rule` compiled rounds each end), so every time is the
same integer; the rate of each (collective in flight, ranks computing) is
:meth:`commsched.sim.model.StreamModel.kernel_factor` itself, tabulated before the loop.

Errors are not raised here: the loop stops with a status and :func:`run_compiled` returns None, so the caller runs
the Python Engine, which raises its own :class:`~commsched.pipeline.engine.DeadlockError` (and the same goes for
a program whose fields do not index the stage tables: the Python loop decides what those mean).
``tests/pipeline/test_pipeline_engine_jit.py`` checks both loops give identical results and errors.

The handlers are compiled functions of their own, called, not inlined (see :mod:`commsched.sim.engine_jit` on
compile times). O(actions log actions).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from commsched.pipeline.actions import COMPUTE_KINDS, P2P_KINDS, ActionKind, PipelineProgram, coalesced
from commsched.pipeline.costs import StageTimes
from commsched.pipeline.engine import BWD, FWD, TRANSFER, boundary
from commsched.sim import model as _model
from commsched.sim.jit import njit
from commsched.sim.model import StreamModel

_kernel_end_ns = njit(_model.kernel_end_rule)
_boundary = njit(boundary)

_F, _B, _I, _W, _FB = (int(k) for k in COMPUTE_KINDS)
_SEND_F, _RECV_F, _SEND_B, _RECV_B = (int(k) for k in P2P_KINDS)
_UNSHARD, _REDUCE, _WAIT = int(ActionKind.UNSHARD), int(ActionKind.REDUCE_GRAD), int(ActionKind.WAIT)
_COMM_DONE, _COMPUTE_DONE = 0, 1  # event kinds, in their order at equal times (the Engine's)
_KIND_SHIFT = 48  # a heap entry's second key: kind << _KIND_SHIFT | issue number
_OK, _ERROR, _FULL = 0, 1, 2  # statuses: done; the Python Engine raises; the heap needs more room

# what a blocked rank waits for: nothing, a transfer (key id) or a stream item (item id)
_NONE, _KEY, _ITEM = 0, 1, 2
# per-row facts (info rows): its transfer key, peer rank, side (0 send / 1 receive), batch id (-1: none), the end of
# the P2P rows posted with it (its run), whether that run is one coalesced NCCL group
_RKEY, _RPEER, _RSIDE, _RBATCH, _RRUN_END, _RCOALESCED = range(6)
# per-rank state (ranks rows); RUN: the local row of the running compute, -1 none
(_POS, _CURSOR, _BUSY, _EXPOSED, _ACT, _PEAK, _FLIGHT, _RUN, _RUN_START, _RUN_VERSION, _RUN_LAST, _BLOCK_TYPE,
 _BLOCK_ID, _ROW0, _NROWS) = range(15)  # fmt: skip
_WORK, _FACTOR = 0, 1  # per-rank floats of the running compute: work left (ns at full rate), wall time per unit
# per-item state (items rows); STREAM: the slot on its rank (a peer rank, then group, unshard, reduce)
_IRANK, _ISTREAM, _IROW, _INROWS, _IFSDP, _IDUR, _ISTART, _IEND, _IPENDING, _INEXT, _IBNEXT = range(11)
# per-transfer state (keys rows): its send / receive item, their ranks and rows, its start and end
_SIDE, _WRANK, _WROW, _XSTART, _XEND = 0, 2, 4, 6, 7  # SIDE, WRANK, WROW: two rows each (send, receive)
_HEAD, _TAIL = 0, 1  # rows of the stream and batch lists
# scalars
_NOW, _SEQ, _VERSION, _COMPUTING, _HEAPN, _NITEMS, _ERR, _FULLED = range(8)


class _Loop(NamedTuple):
    """The loop's inputs (read-only) and state (written), all arrays."""

    rows: np.ndarray  # (N, 6) every rank's action rows, rank after rank
    info: np.ndarray  # (6, N) per-row facts (_R* rows)
    s2r: np.ndarray  # (S,) stage -> rank
    compute_ns: np.ndarray  # (4, S, M) F, B, I, W
    fsdp_ns: np.ndarray  # (2, S) UNSHARD, REDUCE_GRAD
    pair_ns: np.ndarray  # (S, S) OVERLAP_F_B [forward stage, backward stage], or (0, 0): F + B
    mem_bytes: np.ndarray  # (2, S) activations held, backward transient
    xfer_ns: np.ndarray  # (S - 1,) per boundary
    factor: np.ndarray  # (2, P + 1) StreamModel.kernel_factor(comm in flight, ranks computing)
    shared: bool  # ranks share the host's cores: a change of ranks computing re-rates them all
    ranks: np.ndarray  # (15, P) int64
    rates: np.ndarray  # (2, P) float64
    items: np.ndarray  # (11, capacity)
    keys: np.ndarray  # (8, 2 S M) transfers (direction, stage, mb)
    streams: np.ndarray  # (2, P (P + 3)) head, tail item
    batches: np.ndarray  # (2, batches) head, tail item
    done: np.ndarray  # (2, S, M) end of each forward; of the B or I that made each input gradient
    unshard: np.ndarray  # (S,) the UNSHARD item of each stage, -1 none
    heap: np.ndarray  # (capacity, 4) time, kind << _KIND_SHIFT | issue number, payload a, payload b
    sc: np.ndarray  # scalars
    times: np.ndarray  # (2, N) start, end of each row
    deps: np.ndarray  # (8, 4) scratch: a compute's inputs (ready, wire, blocker type, blocker id)


class CompiledRun(NamedTuple):
    """What :func:`commsched.pipeline.simulate.simulate_program` reads of a finished run (the Engine's fields)."""

    cursor: list[int]
    busy: list[int]
    exposed: list[int]
    peak: list[int]
    start: list[np.ndarray]
    end: list[np.ndarray]


# ---------------------------------------------------------------------- the heap
@njit
def _push(e, t, kind, a, b):
    heap, sc = e.heap, e.sc
    n = sc[_HEAPN]
    if n == heap.shape[0]:
        sc[_FULLED] = 1
        return
    key = (kind << _KIND_SHIFT) | sc[_SEQ]
    sc[_SEQ] += 1
    i = n
    while i > 0:
        up = (i - 1) >> 1
        if heap[up, 0] < t or (heap[up, 0] == t and heap[up, 1] < key):
            break
        heap[i] = heap[up]
        i = up
    heap[i, 0], heap[i, 1], heap[i, 2], heap[i, 3] = t, key, a, b
    sc[_HEAPN] = n + 1


@njit
def _pop(e):
    heap, sc = e.heap, e.sc
    t, key, a, b = heap[0, 0], heap[0, 1], heap[0, 2], heap[0, 3]
    n = sc[_HEAPN] - 1
    sc[_HEAPN] = n
    lt, lk = heap[n, 0], heap[n, 1]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (heap[c + 1, 0] < heap[c, 0] or (heap[c + 1, 0] == heap[c, 0] and heap[c + 1, 1] < heap[c, 1])):
            c += 1
        if lt < heap[c, 0] or (lt == heap[c, 0] and lk < heap[c, 1]):
            break
        heap[i] = heap[c]
        i = c
    heap[i] = heap[n]
    return t, key >> _KIND_SHIFT, a, b


# ---------------------------------------------------------------------- rates
@njit
def _factor(e, rank):
    return e.factor[1 if e.ranks[_FLIGHT, rank] > 0 else 0, e.sc[_COMPUTING]]


@njit
def _rerate(e, rank):
    """Engine.rerate."""
    ranks, rates, now = e.ranks, e.rates, e.sc[_NOW]
    factor = _factor(e, rank)
    if factor == rates[_FACTOR, rank]:
        return
    rates[_WORK, rank] -= (now - ranks[_RUN_LAST, rank]) / rates[_FACTOR, rank]
    ranks[_RUN_LAST, rank] = now
    rates[_FACTOR, rank] = factor
    e.sc[_VERSION] += 1
    ranks[_RUN_VERSION, rank] = e.sc[_VERSION]
    _push(e, _kernel_end_ns(now, max(rates[_WORK, rank], 0.0) * factor), _COMPUTE_DONE, rank, e.sc[_VERSION])


@njit
def _rerate_all(e):
    for rank in range(e.ranks.shape[1]):
        if e.ranks[_RUN, rank] >= 0:
            _rerate(e, rank)


@njit
def _flight(e, rank, delta):
    if delta:
        e.ranks[_FLIGHT, rank] += delta
        if e.ranks[_RUN, rank] >= 0:
            _rerate(e, rank)


# ---------------------------------------------------------------------- streams
@njit
def _new_item(e, rank, slot, row, nrows, fsdp, duration_ns):
    items, sc = e.items, e.sc
    it = sc[_NITEMS]
    sc[_NITEMS] += 1
    items[_IRANK, it], items[_ISTREAM, it], items[_IROW, it], items[_INROWS, it] = rank, slot, row, nrows
    items[_IFSDP, it], items[_IDUR, it], items[_ISTART, it], items[_IEND, it] = fsdp, duration_ns, -1, -1
    items[_IPENDING, it], items[_INEXT, it], items[_IBNEXT, it] = nrows, -1, -1
    return it


@njit
def _add_side(e, rank, it, key, row, side):
    """Engine.add_side; an error (posted twice, one end coalesced and the other not) flags the run."""
    keys, items, group = e.keys, e.items, e.ranks.shape[1]
    if keys[_SIDE + side, key] >= 0:
        e.sc[_ERR] = 1
        return
    keys[_SIDE + side, key], keys[_WRANK + side, key], keys[_WROW + side, key] = it, rank, row
    other = keys[_SIDE + 1 - side, key]
    if other >= 0 and (items[_ISTREAM, other] == group) != (items[_ISTREAM, it] == group):
        e.sc[_ERR] = 1


@njit
def _post_batch(e, rank, g):
    """Engine.post_batch at global row ``g``; returns the global row after the batch."""
    info, batches, items = e.info, e.batches, e.items
    end = info[_RRUN_END, g]
    first = e.sc[_NITEMS]
    if end - g > 1 and info[_RCOALESCED, g]:  # one NCCL group on the pipeline group's communicator
        it = _new_item(e, rank, e.ranks.shape[1], g, end - g, 0, 0)
        for k in range(g, end):
            _add_side(e, rank, it, info[_RKEY, k], k, info[_RSIDE, k])
    else:  # single ops, each on the two-rank communicator of its peer pair
        for k in range(g, end):
            _new_item(e, rank, info[_RPEER, k], k, 1, 0, 0)
        for k in range(g, end):
            _add_side(e, rank, first + k - g, info[_RKEY, k], k, info[_RSIDE, k])
    if e.sc[_ERR]:
        return end
    last = e.sc[_NITEMS]
    batch = info[_RBATCH, g]
    if batch >= 0:
        for it in range(first, last):
            if batches[_TAIL, batch] < 0:
                batches[_HEAD, batch] = it
            else:
                items[_IBNEXT, batches[_TAIL, batch]] = it
            batches[_TAIL, batch] = it
    for it in range(first, last):
        _enqueue(e, it)
    return end


@njit
def _post_fsdp(e, rank, g, kind, stage):
    """Engine.post_fsdp."""
    p = e.ranks.shape[1]
    fsdp = 0 if kind == _UNSHARD else 1
    it = _new_item(e, rank, p + 1 + fsdp, g, 1, 1, e.fsdp_ns[fsdp, stage])
    if kind == _UNSHARD:
        e.unshard[stage] = it
    _enqueue(e, it)


@njit
def _stream_of(e, it):
    return e.items[_IRANK, it] * (e.ranks.shape[1] + 3) + e.items[_ISTREAM, it]


@njit
def _enqueue(e, it):
    streams, s = e.streams, _stream_of(e, it)
    if streams[_TAIL, s] < 0:
        streams[_HEAD, s] = streams[_TAIL, s] = it
        _start_item(e, it)
    else:
        e.items[_INEXT, streams[_TAIL, s]] = it
        streams[_TAIL, s] = it


@njit
def _start_item(e, it):
    """Engine.start_item."""
    items, keys, info, now = e.items, e.keys, e.info, e.sc[_NOW]
    items[_ISTART, it] = now
    if items[_IFSDP, it]:
        duration = items[_IDUR, it]
        e.times[0, items[_IROW, it]] = now
        _push(e, now + duration, _COMM_DONE, -1 - it, 0)
        _flight(e, items[_IRANK, it], 1 if duration else 0)
        return
    for k in range(items[_IROW, it], items[_IROW, it] + items[_INROWS, it]):
        key = info[_RKEY, k]
        send, recv = keys[_SIDE, key], keys[_SIDE + 1, key]
        if send >= 0 and recv >= 0 and items[_ISTART, send] >= 0 and items[_ISTART, recv] >= 0:
            _start_transfer(e, key)


@njit
def _start_transfer(e, key):
    keys, now = e.keys, e.sc[_NOW]
    stages, mbs = e.done.shape[1], e.done.shape[2]
    duration = e.xfer_ns[_boundary(key // (stages * mbs), (key // mbs) % stages)]
    keys[_XSTART, key] = now
    for side in range(2):
        e.times[0, keys[_WROW + side, key]] = now
        _flight(e, keys[_WRANK + side, key], 1 if duration else 0)
    _push(e, now + duration, _COMM_DONE, key, 0)


@njit
def _finish_item(e, it):
    streams, items = e.streams, e.items
    items[_IEND, it] = e.sc[_NOW]
    s = _stream_of(e, it)
    head = items[_INEXT, streams[_HEAD, s]]  # only a stream's head runs, so the item that ends is its head
    streams[_HEAD, s] = head
    if head < 0:
        streams[_TAIL, s] = -1
    else:
        _start_item(e, head)


@njit
def _comm_done(e, payload):
    """Engine.comm_done: ``payload`` a transfer key, or -1 - an FSDP item."""
    items, keys, now = e.items, e.keys, e.sc[_NOW]
    if payload < 0:
        it = -1 - payload
        rank = items[_IRANK, it]
        _flight(e, rank, -1 if items[_IDUR, it] else 0)
        e.times[1, items[_IROW, it]] = now
        _finish_item(e, it)
        _wake(e, rank, _ITEM, it, _NONE, 0)
        return
    key = payload
    keys[_XEND, key] = now
    moved = now > keys[_XSTART, key]
    for side in range(2):
        e.times[1, keys[_WROW + side, key]] = now
        _flight(e, keys[_WRANK + side, key], -1 if moved else 0)
    for side in range(2):
        it = keys[_SIDE + side, key]
        items[_IPENDING, it] -= 1
        if items[_IPENDING, it] == 0:
            _finish_item(e, it)
    for side in range(2):
        it = keys[_SIDE + side, key]
        _wake(e, keys[_WRANK + side, key], _KEY, key, _ITEM if items[_IEND, it] >= 0 else _NONE, it)


@njit
def _wake(e, rank, type1, id1, type2, id2):
    """Advance ``rank`` if what it waits for is (type1, id1) or (type2, id2)."""
    ranks = e.ranks
    blocker, which = ranks[_BLOCK_TYPE, rank], ranks[_BLOCK_ID, rank]
    if blocker != _NONE and ((blocker == type1 and which == id1) or (blocker == type2 and which == id2)):
        ranks[_BLOCK_TYPE, rank] = _NONE
        _advance(e, rank)


@njit
def _wait(e, rank, g):
    """Engine.wait at global row ``g``."""
    ranks, items, keys, info = e.ranks, e.items, e.keys, e.info
    batch = info[_RBATCH, g]
    if batch < 0 or e.batches[_HEAD, batch] < 0:
        e.sc[_ERR] = 1  # no batch posted before it
        return False
    it = e.batches[_HEAD, batch]
    done = cursor = ranks[_CURSOR, rank]
    while it >= 0:
        if items[_IEND, it] < 0:
            ranks[_BLOCK_TYPE, rank], ranks[_BLOCK_ID, rank] = _ITEM, it
            return False
        done = max(done, items[_IEND, it])
        it = items[_IBNEXT, it]
    exposed = 0  # the rank idles while a transfer of the batch is on the wire
    it = e.batches[_HEAD, batch]
    while it >= 0:
        row = items[_IROW, it]
        wire = keys[_XSTART, info[_RKEY, row]]
        for k in range(row + 1, row + items[_INROWS, it]):
            wire = min(wire, keys[_XSTART, info[_RKEY, k]])
        exposed = max(exposed, min(items[_IEND, it], done) - max(cursor, wire))
        it = items[_IBNEXT, it]
    ranks[_EXPOSED, rank] += exposed
    ranks[_CURSOR, rank] = done
    return True


# ---------------------------------------------------------------------- compute
@njit
def _dep(e, n, ready, wire, blocker, which):
    e.deps[n, 0], e.deps[n, 1], e.deps[n, 2], e.deps[n, 3] = ready, wire, blocker, which
    return n + 1


@njit
def _inputs(e, rank, kind, stage, mb, n):
    """Engine.inputs, written to ``e.deps`` from row ``n``; returns the next row."""
    keys, done, s2r = e.keys, e.done, e.s2r
    stages, mbs = done.shape[1], done.shape[2]
    gathered = e.unshard[stage]
    if gathered >= 0:
        n = _dep(e, n, e.items[_IEND, gathered], e.items[_ISTART, gathered], _ITEM, gathered)
    if kind == _F:
        if stage == 0:
            return n
        if s2r[stage - 1] == rank:
            return _dep(e, n, done[0, stage - 1, mb], -1, _NONE, 0)
        key = (FWD * stages + stage) * mbs + mb
        return _dep(e, n, keys[_XEND, key], keys[_XSTART, key], _KEY, key)
    if kind == _W:
        return _dep(e, n, done[1, stage, mb], -1, _NONE, 0)
    n = _dep(e, n, done[0, stage, mb], -1, _NONE, 0)
    if stage == stages - 1:
        return n
    if s2r[stage + 1] == rank:
        return _dep(e, n, done[1, stage + 1, mb], -1, _NONE, 0)
    key = (BWD * stages + stage) * mbs + mb
    return _dep(e, n, keys[_XEND, key], keys[_XSTART, key], _KEY, key)


@njit
def _duration(e, row):
    kind, stage, mb, kind2, stage2, mb2 = row[0], row[1], row[2], row[3], row[4], row[5]
    if kind != _FB:
        return e.compute_ns[kind, stage, mb]
    if e.pair_ns.shape[0]:
        return e.pair_ns[stage, stage2]
    return e.compute_ns[_F, stage, mb] + e.compute_ns[kind2, stage2, mb2]


@njit
def _take_memory(e, rank, kind, stage):
    """A forward takes its activations, a backward its transient."""
    ranks = e.ranks
    if kind == _F:
        ranks[_ACT, rank] += e.mem_bytes[0, stage]
    transient = e.mem_bytes[1, stage] if kind == _B or kind == _I else 0
    ranks[_PEAK, rank] = max(ranks[_PEAK, rank], ranks[_ACT, rank] + transient)


@njit
def _start_compute(e, rank, g):
    """Engine.start_compute at global row ``g``."""
    ranks, rates, row, deps, sc = e.ranks, e.rates, e.rows[g], e.deps, e.sc
    kind = row[0]
    if kind == _FB:
        n = _inputs(e, rank, _F, row[1], row[2], 0)
        n = _inputs(e, rank, row[3], row[4], row[5], n)
    else:
        n = _inputs(e, rank, kind, row[1], row[2], 0)
    cursor = start = ranks[_CURSOR, rank]
    exposed = 0
    for d in range(n):
        ready, wire, blocker = deps[d, 0], deps[d, 1], deps[d, 2]
        if ready < 0:
            if blocker == _NONE:
                sc[_ERR] = 1  # an input it needs from its own rank runs later in its order
            ranks[_BLOCK_TYPE, rank], ranks[_BLOCK_ID, rank] = blocker, deps[d, 3]
            return False
        start = max(start, ready)
        if blocker != _NONE:  # the rank idled while this input was on the wire
            exposed = max(exposed, ready - max(cursor, wire))
    ranks[_EXPOSED, rank] += exposed
    work = _duration(e, row)
    sc[_VERSION] += 1
    sc[_COMPUTING] += 1
    factor = _factor(e, rank)
    ranks[_RUN, rank], ranks[_RUN_START, rank], ranks[_RUN_LAST, rank] = g - ranks[_ROW0, rank], start, start
    ranks[_RUN_VERSION, rank] = sc[_VERSION]
    rates[_WORK, rank], rates[_FACTOR, rank] = float(work), factor
    _push(e, _kernel_end_ns(start, work * factor), _COMPUTE_DONE, rank, sc[_VERSION])
    if e.shared:
        _rerate_all(e)
    if kind == _FB:
        _take_memory(e, rank, _F, row[1])
        _take_memory(e, rank, row[3], row[4])
    else:
        _take_memory(e, rank, kind, row[1])
    return True


@njit
def _compute_ended(e, rank, kind, stage, mb, end):
    if kind == _F:
        e.done[0, stage, mb] = end
    elif kind == _B or kind == _I:
        e.done[1, stage, mb] = end
    if kind == _B or kind == _W:
        e.ranks[_ACT, rank] -= e.mem_bytes[0, stage]


@njit
def _compute_done(e, rank, version):
    """Engine.compute_done."""
    ranks = e.ranks
    if ranks[_RUN, rank] < 0 or ranks[_RUN_VERSION, rank] != version:
        return  # superseded: its rate changed since this end was computed
    i, end = ranks[_RUN, rank], e.sc[_NOW]
    g = ranks[_ROW0, rank] + i
    e.times[0, g], e.times[1, g] = ranks[_RUN_START, rank], end
    ranks[_BUSY, rank] += end - ranks[_RUN_START, rank]
    ranks[_CURSOR, rank] = end
    row = e.rows[g]
    if row[0] == _FB:
        _compute_ended(e, rank, _F, row[1], row[2], end)
        _compute_ended(e, rank, row[3], row[4], row[5], end)
    else:
        _compute_ended(e, rank, row[0], row[1], row[2], end)
    ranks[_RUN, rank] = -1
    e.sc[_COMPUTING] -= 1
    ranks[_POS, rank] = i + 1
    _advance(e, rank)
    if e.shared:
        _rerate_all(e)


# ---------------------------------------------------------------------- the loop
@njit
def _advance(e, rank):
    """Engine.advance: run rank's program until a row must wait, a compute is running or an error is flagged."""
    ranks, rows = e.ranks, e.rows
    first, n = ranks[_ROW0, rank], ranks[_NROWS, rank]
    while ranks[_RUN, rank] < 0 and ranks[_POS, rank] < n:
        i = ranks[_POS, rank]
        g = first + i
        kind = rows[g, 0]
        if _SEND_F <= kind <= _RECV_B:
            ranks[_POS, rank] = _post_batch(e, rank, g) - first
            if e.sc[_ERR]:
                return
            continue
        if kind == _UNSHARD or kind == _REDUCE:
            _post_fsdp(e, rank, g, kind, rows[g, 1])
        if kind == _WAIT:
            if not _wait(e, rank, g):
                return
        elif _F <= kind <= _FB and not _start_compute(e, rank, g):
            return
        if ranks[_RUN, rank] < 0:
            ranks[_POS, rank] = i + 1


@njit
def _run(e):
    """Engine.run; returns a status."""
    sc, ranks = e.sc, e.ranks
    for rank in range(ranks.shape[1]):
        _advance(e, rank)
    while sc[_HEAPN] and not sc[_ERR] and not sc[_FULLED]:
        t, kind, a, b = _pop(e)
        sc[_NOW] = t
        if kind == _COMM_DONE:
            _comm_done(e, a)
        else:
            _compute_done(e, a, b)
    if sc[_FULLED]:
        return _FULL
    if sc[_ERR]:
        return _ERROR
    for rank in range(ranks.shape[1]):
        if ranks[_POS, rank] < ranks[_NROWS, rank]:
            return _ERROR  # a deadlock
    return _OK


@njit
def run_pipeline_jit(rows, info, s2r, compute_ns, fsdp_ns, pair_ns, mem_bytes, xfer_ns, factor, shared, row0,
                     num_items, num_batches, heap_capacity):  # fmt: skip
    """Play one pipeline step (the arguments: :class:`_Loop`'s inputs; ``row0``: each rank's first row and after it
    the number of rows). Returns (status, (2, N) start / end of each row, the (15, P) per-rank state)."""
    p = len(row0) - 1
    stages, mbs = compute_ns.shape[1], compute_ns.shape[2]
    ranks = np.zeros((15, p), np.int64)
    ranks[_RUN] = -1
    ranks[_ROW0] = row0[:-1]
    ranks[_NROWS] = row0[1:] - row0[:-1]
    e = _Loop(rows, info, s2r, compute_ns, fsdp_ns, pair_ns, mem_bytes, xfer_ns, factor, shared, ranks,
              np.zeros((2, p), np.float64), np.zeros((11, max(num_items, 1)), np.int64),
              np.full((8, 2 * stages * mbs), -1, np.int64), np.full((2, p * (p + 3)), -1, np.int64),
              np.full((2, max(num_batches, 1)), -1, np.int64), np.full((2, stages, mbs), -1, np.int64),
              np.full(stages, -1, np.int64), np.zeros((heap_capacity, 4), np.int64), np.zeros(8, np.int64),
              np.full((2, len(rows)), -1, np.int64), np.zeros((8, 4), np.int64))  # fmt: skip
    status = _run(e)
    return status, e.times, ranks


# ---------------------------------------------------------------------- from Python
def run_compiled(program: PipelineProgram, times: StageTimes, xfer_ns: np.ndarray,
                 model: StreamModel) -> CompiledRun | None:  # fmt: skip
    """The step :class:`commsched.pipeline.engine.Engine` plays, compiled; None when the Python loop must run
    instead: the program cannot finish (it raises the error) or has fields outside the stage tables."""
    args = _arguments(program, times, xfer_ns, model)
    if args is None:
        return None
    capacity = 2 * len(args[0]) + 64
    while True:
        status, row_times, ranks = run_pipeline_jit(*args, capacity)
        if status != _FULL:
            break
        capacity *= 4  # superseded compute ends filled the heap: again with more room
    if status != _OK:
        return None
    row0 = args[10]
    starts = [row_times[0, a:b] for a, b in zip(row0[:-1], row0[1:], strict=True)]
    ends = [row_times[1, a:b] for a, b in zip(row0[:-1], row0[1:], strict=True)]
    return CompiledRun(ranks[_CURSOR].tolist(), ranks[_BUSY].tolist(), ranks[_EXPOSED].tolist(),
                       ranks[_PEAK].tolist(), starts, ends)  # fmt: skip


def _arguments(program: PipelineProgram, times: StageTimes, xfer_ns: np.ndarray, model: StreamModel) -> tuple | None:
    """:func:`run_pipeline_jit`'s arguments but the heap's capacity; None when a row's fields do not index the
    stage tables (the Python loop then decides what they mean)."""
    p, stages, mbs = program.pp_size, program.num_stages, program.microbatches
    s2r = np.asarray(program.stage_to_rank, np.int64)
    if len(program.actions) != p or stages < 2 or ((s2r < 0) | (s2r >= p)).any():
        return None
    row0 = np.zeros(p + 1, np.int64)
    row0[1:] = np.cumsum([len(a) for a in program.actions])
    rows = np.concatenate([np.asarray(a, np.int64).reshape(-1, 6) for a in program.actions])
    info = _row_facts(rows, row0, s2r, stages, mbs)
    if info is None:
        return None
    pair = np.zeros((0, 0), np.int64) if times.overlap_f_b_ns is None else np.asarray(times.overlap_f_b_ns, np.int64)
    factor = np.array([[model.kernel_factor(bool(c) and model.kernels_see_comm, k) for k in range(p + 1)]
                       for c in (0, 1)], np.float64)  # fmt: skip
    compute = np.stack([times.forward_ns, times.backward_ns, times.backward_input_ns, times.backward_weight_ns])
    kinds = rows[:, 0]
    num_items = int(((kinds >= _SEND_F) & (kinds <= _RECV_B)).sum() + ((kinds == _UNSHARD) | (kinds == _REDUCE)).sum())
    return (rows, info, s2r, compute.astype(np.int64), np.stack([times.unshard_ns, times.reduce_grad_ns]),
            pair, np.stack([times.activation_bytes, times.backward_peak_bytes]).astype(np.int64),
            np.asarray(xfer_ns, np.int64), factor, bool(model.host_cores), row0, num_items,
            int(info[_RBATCH].max(initial=-1)) + 1)  # fmt: skip


def _row_facts(rows: np.ndarray, row0: np.ndarray, s2r: np.ndarray, stages: int, mbs: int) -> np.ndarray | None:
    """The (6, N) per-row facts (``_R*``), or None when a row's stage or micro-batch is out of range."""
    n = len(rows)
    kind, stage, mb, kind2, stage2, mb2 = rows.T
    p2p = (kind >= _SEND_F) & (kind <= _RECV_B)
    compute = (kind >= _F) & (kind <= _FB)
    fb = kind == _FB
    in_range = ((stage >= 0) & (stage < stages) & (mb >= 0) & (mb < mbs))
    bad = compute & ~in_range
    bad |= fb & ~((kind2 >= _F) & (kind2 <= _W) & (stage2 >= 0) & (stage2 < stages) & (mb2 >= 0) & (mb2 < mbs))
    bad |= ((kind == _UNSHARD) | (kind == _REDUCE)) & ~((stage >= 0) & (stage < stages))
    info = np.full((6, n), -1, np.int64)
    table = np.array([TRANSFER.get(k, (0, 0, 0, 0)) for k in range(_RECV_B + 1)], np.int64)
    direction, key_step, peer_step, side = table[np.where(p2p, kind, 0)].T
    key_stage = stage + key_step
    lowest = np.where(direction == FWD, 1, 0)  # a forward goes to stage >= 1, a gradient to stage <= S - 2
    bad |= p2p & ~((key_stage >= lowest) & (key_stage <= lowest + stages - 2) & (mb >= 0) & (mb < mbs))
    if bad.any():
        return None
    info[_RKEY] = np.where(p2p, (direction * stages + key_stage) * mbs + mb, -1)
    info[_RPEER] = np.where(p2p, s2r[np.clip(stage + peer_step, 0, stages - 1)], -1)
    info[_RSIDE] = np.where(p2p, side, -1)
    rank = np.repeat(np.arange(len(row0) - 1), np.diff(row0))
    batched = (p2p | (kind == _WAIT)) & (stage2 >= 0)
    _, batch_ids = np.unique(rank[batched] << 32 | stage2[batched], return_inverse=True)
    info[_RBATCH, batched] = batch_ids.ravel()
    # a P2P row continues the batch of the row before it (Engine.post_batch) when that one is a P2P row of the same
    # rank and batch >= 0
    more = np.zeros(n, np.bool_)
    more[1:] = p2p[1:] & p2p[:-1] & (rank[1:] == rank[:-1]) & (stage2[:-1] >= 0) & (stage2[1:] == stage2[:-1])
    breaks = np.flatnonzero(~more)
    starts = np.flatnonzero(p2p & ~more)
    nxt = np.searchsorted(breaks, starts, side="right")
    ends = np.where(nxt < len(breaks), breaks[np.minimum(nxt, len(breaks) - 1)], n)
    info[_RRUN_END, starts] = ends
    info[_RCOALESCED, starts] = 0
    for start, end in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist(), strict=True):
        info[_RCOALESCED, start] = coalesced(kind[start:end].tolist())
    return info
