"""The pipeline simulator's event loop, compiled (:mod:`commsched.sim.jit`).

:func:`run_compiled` is :class:`commsched.pipeline.engine.Engine`'s loop, handler for handler, on integer ids: the
rows of every rank one after another, transfers (direction, stage, mb), P2P batches and stream items; each stream's
FIFO and each batch's items a linked list of items; the heap an array whose key is the Engine's whole ordering
(time, event kind, issue number). The rates follow the same float operations in the same order (the work left is
booked at each change of rate; :func:`commsched.sim.model.kernel_end_rule`, compiled, rounds each end), so every
time is the same integer; the rate for each (collective in flight, ranks computing) is
:meth:`commsched.sim.model.StreamModel.kernel_factor` itself, tabulated before the loop.

Errors are not raised here: the loop stops with a status and :func:`run_compiled` returns None, so that the caller
runs the Python Engine, which raises its own :class:`~commsched.pipeline.engine.DeadlockError` (the same for a
program whose fields do not index the stage tables: the Python loop decides what those mean).
``tests/pipeline/test_pipeline_engine_jit.py`` checks that both loops give identical results and errors.

The inputs and state are one int64 array ``m`` (a header, then columns), the rates one float64 array ``f``, the
heap a third: numba counts references of each array at each call, and a tuple of 20 arrays made calls cost more
than the work (and the first compile 60 s). Handlers are called, not inlined (:mod:`commsched.sim.engine_jit`).
"""

from __future__ import annotations

import itertools
import weakref
from typing import NamedTuple

import numpy as np

from commsched.pipeline.actions import COMPUTE_KINDS, P2P_KINDS, ActionKind, PipelineProgram
from commsched.pipeline.costs import StageTimes
from commsched.pipeline.engine import BWD, FWD, boundary, row_facts
from commsched.sim import model as _model
from commsched.sim.jit import njit, njit_inline
from commsched.sim.model import StreamModel

_kernel_end_ns = njit(_model.kernel_end_rule)
_boundary = njit(boundary)

_F, _B, _I, _W, _FB = (int(k) for k in COMPUTE_KINDS)
_SEND_F, _RECV_F, _SEND_B, _RECV_B = (int(k) for k in P2P_KINDS)
_UNSHARD, _REDUCE, _WAIT = int(ActionKind.UNSHARD), int(ActionKind.REDUCE_GRAD), int(ActionKind.WAIT)
# the constants handlers take as arguments are numpy scalars: numba compiles a function once per literal int argument
_COMM_DONE, _COMPUTE_DONE = np.int64(0), np.int64(1)  # event kinds, in their order at equal times (the Engine's)
_KIND_SHIFT = 48  # a heap entry's second key: kind << _KIND_SHIFT | issue number
_OK, _ERROR, _FULL = 0, 1, 2  # statuses: done; the Python Engine raises; the heap needs more room
_NONE, _KEY, _ITEM = np.int64(0), np.int64(1), np.int64(2)  # a blocked rank waits for: nothing, a transfer, an item
_ZERO, _NO_ID = np.int64(0), np.int64(-1)

# m's header: scalars, then the offset in m of each column (column X of id i is m[m[X] + i])
_NOW, _SEQ, _VERSION, _COMPUTING, _HEAPN, _NITEMS, _ERR, _FULLED, _P, _S, _M, _N, _SHARED, _PAIRED = range(14)
_SCALARS = 14
(
    _KIND, _STAGE, _MB, _KIND2, _STAGE2, _MB2,  # per row (global: rank after rank): the program's columns
    # ... and its facts: transfer key, peer rank, side (0 send / 1 receive), batch id (-1 none), the end of the P2P
    # rows posted with it (its run), whether that run is one coalesced NCCL group
    _KEY_OF, _PEER_OF, _SIDE_OF, _BATCH_OF, _RUN_END, _COALESCED,
    _S2R, _COMPUTE_NS, _FSDP_NS, _PAIR_NS, _HELD, _TRANSIENT, _XFER_NS,  # inputs: (4, S, M) F B I W, (2, S), (S, S)
    # per rank; RUN: the local row of the running compute (-1 none), BLOCK_*: what it waits for
    _POS, _CURSOR, _BUSY, _EXPOSED, _ACT, _PEAK, _FLIGHT, _RUN, _RUN_START, _RUN_VERSION, _RUN_LAST, _BLOCK_TYPE,
    _BLOCK_ID, _ROW0, _NROWS,
    # per stream item; SLOT: its stream on its rank (a peer rank, then group, unshard, reduce); ROW: its first row;
    # NEXT: the next item of its stream, BNEXT of its batch
    _IRANK, _ISLOT, _IROW, _INROWS, _IFSDP, _IDUR, _ISTART, _IEND, _IPENDING, _INEXT, _IBNEXT,
    # per transfer (direction, stage, mb): its send / receive item, their ranks and rows (+ side), start, end
    _XITEM, _XITEM1, _XRANK, _XRANK1, _XROW, _XROW1, _XSTART, _XEND,
    _QHEAD, _QTAIL, _BHEAD, _BTAIL,  # per stream, per batch: first and last item
    _FWD_END, _BWD_END,  # per (stage, mb): end of its forward; of the B or I that made its input gradient
    _GATHERED, _START, _END,  # per stage: its UNSHARD item; per row: start and end
    _DREADY, _DWIRE, _DTYPE, _DID,  # scratch: a compute's inputs
) = range(_SCALARS, _SCALARS + 66)  # fmt: skip
_HEADER = _SCALARS + 66
_WORK, _FACTOR = 0, 1  # f: per rank work left (ns at full rate), wall time per unit; then kernel_factor's table


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
def _before(heap, i, t, key):
    """Whether entry i comes before (t, key)."""
    return heap[i, 0] < t or (heap[i, 0] == t and heap[i, 1] < key)


@njit
def _push(m, heap, t, kind, a, b):
    n = m[_HEAPN]
    if n == heap.shape[0]:
        m[_FULLED] = 1
        return
    key = (kind << _KIND_SHIFT) | m[_SEQ]
    m[_SEQ] += 1
    i = n
    while i > 0:
        up = (i - 1) >> 1
        if _before(heap, up, t, key):
            break
        heap[i] = heap[up]
        i = up
    heap[i, 0], heap[i, 1], heap[i, 2], heap[i, 3] = t, key, a, b
    m[_HEAPN] = n + 1


@njit
def _pop(m, heap):
    t, key, a, b = heap[0, 0], heap[0, 1], heap[0, 2], heap[0, 3]
    n = m[_HEAPN] - 1
    m[_HEAPN] = n
    last_t, last_key = heap[n, 0], heap[n, 1]
    i = 0
    while 2 * i + 1 < n:
        c = 2 * i + 1
        if c + 1 < n and _before(heap, c + 1, heap[c, 0], heap[c, 1]):
            c += 1
        if not _before(heap, c, last_t, last_key):
            break
        heap[i] = heap[c]
        i = c
    heap[i] = heap[n]
    return t, key >> _KIND_SHIFT, a, b


# ---------------------------------------------------------------------- rates
@njit
def _factor(m, f, rank):
    comm = 1 if m[m[_FLIGHT] + rank] > 0 else 0
    return f[2 * m[_P] + comm * (m[_P] + 1) + m[_COMPUTING]]


@njit
def _rerate(m, f, heap, rank):
    """Engine.rerate."""
    now, p = m[_NOW], m[_P]
    factor = _factor(m, f, rank)
    if factor == f[_FACTOR * p + rank]:
        return
    f[_WORK * p + rank] -= (now - m[m[_RUN_LAST] + rank]) / f[_FACTOR * p + rank]
    m[m[_RUN_LAST] + rank] = now
    f[_FACTOR * p + rank] = factor
    m[_VERSION] += 1
    m[m[_RUN_VERSION] + rank] = m[_VERSION]
    wall = max(f[_WORK * p + rank], 0.0) * factor
    _push(m, heap, _kernel_end_ns(now, wall), _COMPUTE_DONE, rank, m[_VERSION])


@njit
def _rerate_all(m, f, heap):
    for rank in range(m[_P]):
        if m[m[_RUN] + rank] >= 0:
            _rerate(m, f, heap, rank)


@njit
def _flight(m, f, heap, rank, delta):
    if delta:
        m[m[_FLIGHT] + rank] += delta
        if m[m[_RUN] + rank] >= 0:
            _rerate(m, f, heap, rank)


# ---------------------------------------------------------------------- streams
@njit_inline
def _new_item(m, rank, slot, row, nrows, fsdp, duration_ns):
    it = m[_NITEMS]
    m[_NITEMS] += 1
    m[m[_IRANK] + it], m[m[_ISLOT] + it], m[m[_IROW] + it], m[m[_INROWS] + it] = rank, slot, row, nrows
    m[m[_IFSDP] + it], m[m[_IDUR] + it], m[m[_IPENDING] + it] = fsdp, duration_ns, nrows
    m[m[_ISTART] + it] = m[m[_IEND] + it] = m[m[_INEXT] + it] = m[m[_IBNEXT] + it] = -1
    return it


@njit
def _add_side(m, rank, it, key, row, side):
    """Engine.add_side; an error (posted twice, one end coalesced and the other not) flags the run."""
    group = m[_P]
    if m[m[_XITEM + side] + key] >= 0:
        m[_ERR] = 1
        return
    m[m[_XITEM + side] + key], m[m[_XRANK + side] + key], m[m[_XROW + side] + key] = it, rank, row
    other = m[m[_XITEM + 1 - side] + key]
    if other >= 0 and (m[m[_ISLOT] + other] == group) != (m[m[_ISLOT] + it] == group):
        m[_ERR] = 1


@njit
def _post_batch(m, f, heap, rank, g):
    """Engine.post_batch at global row ``g``; returns the global row after the batch."""
    end = m[m[_RUN_END] + g]
    first = m[_NITEMS]
    if end - g > 1 and m[m[_COALESCED] + g]:  # one NCCL group on the pipeline group's communicator
        it = _new_item(m, rank, m[_P], g, end - g, 0, 0)
        for k in range(g, end):
            _add_side(m, rank, it, m[m[_KEY_OF] + k], k, m[m[_SIDE_OF] + k])
    else:  # single ops, each on the two-rank communicator of its peer pair
        for k in range(g, end):
            _new_item(m, rank, m[m[_PEER_OF] + k], k, 1, 0, 0)
        for k in range(g, end):
            _add_side(m, rank, first + k - g, m[m[_KEY_OF] + k], k, m[m[_SIDE_OF] + k])
    if m[_ERR]:
        return end
    batch = m[m[_BATCH_OF] + g]
    for it in range(first, m[_NITEMS]):
        if batch >= 0:
            tail = m[m[_BTAIL] + batch]
            if tail < 0:
                m[m[_BHEAD] + batch] = it
            else:
                m[m[_IBNEXT] + tail] = it
            m[m[_BTAIL] + batch] = it
    for it in range(first, m[_NITEMS]):
        _enqueue(m, f, heap, it)
    return end


@njit
def _post_fsdp(m, f, heap, rank, g):
    """Engine.post_fsdp."""
    kind, stage = m[m[_KIND] + g], m[m[_STAGE] + g]
    which = 0 if kind == _UNSHARD else 1
    it = _new_item(m, rank, m[_P] + 1 + which, g, 1, 1, m[m[_FSDP_NS] + which * m[_S] + stage])
    if kind == _UNSHARD:
        m[m[_GATHERED] + stage] = it
    _enqueue(m, f, heap, it)


@njit
def _enqueue(m, f, heap, it):
    s = m[m[_IRANK] + it] * (m[_P] + 3) + m[m[_ISLOT] + it]  # its stream
    tail = m[m[_QTAIL] + s]
    m[m[_QTAIL] + s] = it
    if tail < 0:
        m[m[_QHEAD] + s] = it
        _start_item(m, f, heap, it)
    else:
        m[m[_INEXT] + tail] = it


@njit
def _start_item(m, f, heap, it):
    """Engine.start_item."""
    now = m[_NOW]
    m[m[_ISTART] + it] = now
    row = m[m[_IROW] + it]
    if m[m[_IFSDP] + it]:
        duration = m[m[_IDUR] + it]
        m[m[_START] + row] = now
        _push(m, heap, now + duration, _COMM_DONE, -1 - it, _ZERO)
        _flight(m, f, heap, m[m[_IRANK] + it], 1 if duration else 0)
        return
    for k in range(row, row + m[m[_INROWS] + it]):
        key = m[m[_KEY_OF] + k]
        send, recv = m[m[_XITEM] + key], m[m[_XITEM1] + key]
        if send >= 0 and recv >= 0 and m[m[_ISTART] + send] >= 0 and m[m[_ISTART] + recv] >= 0:
            _start_transfer(m, f, heap, key)


@njit
def _start_transfer(m, f, heap, key):
    now = m[_NOW]
    duration = m[m[_XFER_NS] + _boundary(key // (m[_S] * m[_M]), (key // m[_M]) % m[_S])]
    m[m[_XSTART] + key] = now
    for side in range(2):
        m[m[_START] + m[m[_XROW + side] + key]] = now
        _flight(m, f, heap, m[m[_XRANK + side] + key], 1 if duration else 0)
    _push(m, heap, now + duration, _COMM_DONE, key, _ZERO)


@njit
def _finish_item(m, f, heap, it):
    m[m[_IEND] + it] = m[_NOW]
    s = m[m[_IRANK] + it] * (m[_P] + 3) + m[m[_ISLOT] + it]  # its stream
    head = m[m[_INEXT] + m[m[_QHEAD] + s]]  # only a stream's head runs, so the item that ends is its head
    m[m[_QHEAD] + s] = head
    if head < 0:
        m[m[_QTAIL] + s] = -1
    else:
        _start_item(m, f, heap, head)


@njit
def _comm_done(m, f, heap, payload):
    """Engine.comm_done: ``payload`` a transfer key, or -1 - an FSDP item."""
    now = m[_NOW]
    if payload < 0:
        it = -1 - payload
        rank = m[m[_IRANK] + it]
        _flight(m, f, heap, rank, -1 if m[m[_IDUR] + it] else 0)
        m[m[_END] + m[m[_IROW] + it]] = now
        _finish_item(m, f, heap, it)
        _wake(m, f, heap, rank, _ITEM, it, _NONE, _NO_ID)
        return
    key = payload
    m[m[_XEND] + key] = now
    moved = now > m[m[_XSTART] + key]
    for side in range(2):
        m[m[_END] + m[m[_XROW + side] + key]] = now
        _flight(m, f, heap, m[m[_XRANK + side] + key], -1 if moved else 0)
    for side in range(2):
        it = m[m[_XITEM + side] + key]
        m[m[_IPENDING] + it] -= 1
        if m[m[_IPENDING] + it] == 0:
            _finish_item(m, f, heap, it)
    for side in range(2):
        it = m[m[_XITEM + side] + key]
        ended = _ITEM if m[m[_IEND] + it] >= 0 else _NONE
        _wake(m, f, heap, m[m[_XRANK + side] + key], _KEY, key, ended, it)


@njit
def _wake(m, f, heap, rank, type1, id1, type2, id2):
    """Advance ``rank`` if what it waits for is (type1, id1) or (type2, id2)."""
    blocker, which = m[m[_BLOCK_TYPE] + rank], m[m[_BLOCK_ID] + rank]
    if blocker != _NONE and ((blocker == type1 and which == id1) or (blocker == type2 and which == id2)):
        m[m[_BLOCK_TYPE] + rank] = _NONE
        _advance(m, f, heap, rank)


@njit
def _wait(m, rank, g):
    """Engine.wait at global row ``g``."""
    batch = m[m[_BATCH_OF] + g]
    head = m[m[_BHEAD] + batch] if batch >= 0 else -1
    if head < 0:
        m[_ERR] = 1  # no batch posted before it
        return False
    done = cursor = m[m[_CURSOR] + rank]
    it = head
    while it >= 0:
        if m[m[_IEND] + it] < 0:
            m[m[_BLOCK_TYPE] + rank], m[m[_BLOCK_ID] + rank] = _ITEM, it
            return False
        done = max(done, m[m[_IEND] + it])
        it = m[m[_IBNEXT] + it]
    exposed = 0  # the rank idles while a transfer of the batch is on the wire
    it = head
    while it >= 0:
        row = m[m[_IROW] + it]
        wire = m[m[_XSTART] + m[m[_KEY_OF] + row]]
        for k in range(row + 1, row + m[m[_INROWS] + it]):
            wire = min(wire, m[m[_XSTART] + m[m[_KEY_OF] + k]])
        exposed = max(exposed, min(m[m[_IEND] + it], done) - max(cursor, wire))
        it = m[m[_IBNEXT] + it]
    m[m[_EXPOSED] + rank] += exposed
    m[m[_CURSOR] + rank] = done
    return True


# ---------------------------------------------------------------------- compute
@njit
def _part(m, g, part):
    """(kind, stage, mb) of row ``g``'s compute part 0, or of an OVERLAP_F_B's part 1 (Engine.parts)."""
    if m[m[_KIND] + g] != _FB:
        return m[m[_KIND] + g], m[m[_STAGE] + g], m[m[_MB] + g]
    if part == 0:
        return np.int64(_F), m[m[_STAGE] + g], m[m[_MB] + g]
    return m[m[_KIND2] + g], m[m[_STAGE2] + g], m[m[_MB2] + g]


@njit_inline
def _dep(m, n, ready, wire, blocker, which):
    m[m[_DREADY] + n], m[m[_DWIRE] + n], m[m[_DTYPE] + n], m[m[_DID] + n] = ready, wire, blocker, which
    return n + 1


@njit
def _inputs(m, rank, kind, stage, mb, n):
    """Engine.inputs, written to the scratch columns from entry ``n``; returns the next entry."""
    gathered = m[m[_GATHERED] + stage]
    if gathered >= 0:
        n = _dep(m, n, m[m[_IEND] + gathered], m[m[_ISTART] + gathered], _ITEM, gathered)
    if kind == _F:
        if stage == 0:
            return n
        if m[m[_S2R] + stage - 1] == rank:
            return _dep(m, n, m[m[_FWD_END] + (stage - 1) * m[_M] + mb], -1, _NONE, _NO_ID)
        key = (FWD * m[_S] + stage) * m[_M] + mb
        return _dep(m, n, m[m[_XEND] + key], m[m[_XSTART] + key], _KEY, key)
    if kind == _W:
        return _dep(m, n, m[m[_BWD_END] + stage * m[_M] + mb], -1, _NONE, _NO_ID)
    n = _dep(m, n, m[m[_FWD_END] + stage * m[_M] + mb], -1, _NONE, _NO_ID)
    if stage == m[_S] - 1:
        return n
    if m[m[_S2R] + stage + 1] == rank:
        return _dep(m, n, m[m[_BWD_END] + (stage + 1) * m[_M] + mb], -1, _NONE, _NO_ID)
    key = (BWD * m[_S] + stage) * m[_M] + mb
    return _dep(m, n, m[m[_XEND] + key], m[m[_XSTART] + key], _KEY, key)


@njit
def _duration(m, g):
    kind, stage, mb = m[m[_KIND] + g], m[m[_STAGE] + g], m[m[_MB] + g]
    if kind != _FB:
        return m[m[_COMPUTE_NS] + (kind * m[_S] + stage) * m[_M] + mb]
    kind2, stage2, mb2 = m[m[_KIND2] + g], m[m[_STAGE2] + g], m[m[_MB2] + g]
    if m[_PAIRED]:
        return m[m[_PAIR_NS] + stage * m[_S] + stage2]
    table = m[_COMPUTE_NS]
    return m[table + (_F * m[_S] + stage) * m[_M] + mb] + m[table + (kind2 * m[_S] + stage2) * m[_M] + mb2]


@njit
def _start_compute(m, f, heap, rank, g):
    """Engine.start_compute at global row ``g``."""
    parts = 2 if m[m[_KIND] + g] == _FB else 1
    n = _ZERO
    for part in range(parts):
        kind, stage, mb = _part(m, g, part)
        n = _inputs(m, rank, kind, stage, mb, n)
    cursor = start = m[m[_CURSOR] + rank]
    exposed = 0
    for d in range(n):
        ready, wire, blocker = m[m[_DREADY] + d], m[m[_DWIRE] + d], m[m[_DTYPE] + d]
        if ready < 0:
            if blocker == _NONE:
                m[_ERR] = 1  # an input it needs from its own rank runs later in its order
            m[m[_BLOCK_TYPE] + rank], m[m[_BLOCK_ID] + rank] = blocker, m[m[_DID] + d]
            return False
        start = max(start, ready)
        if blocker != _NONE:  # the rank idled while this input was on the wire
            exposed = max(exposed, ready - max(cursor, wire))
    m[m[_EXPOSED] + rank] += exposed
    work = _duration(m, g)
    m[_VERSION] += 1
    m[_COMPUTING] += 1
    factor, p = _factor(m, f, rank), m[_P]
    m[m[_RUN] + rank], m[m[_RUN_START] + rank] = g - m[m[_ROW0] + rank], start
    m[m[_RUN_LAST] + rank], m[m[_RUN_VERSION] + rank] = start, m[_VERSION]
    f[_WORK * p + rank], f[_FACTOR * p + rank] = float(work), factor
    _push(m, heap, _kernel_end_ns(start, work * factor), _COMPUTE_DONE, rank, m[_VERSION])
    if m[_SHARED]:
        _rerate_all(m, f, heap)
    for part in range(parts):  # memory: a forward takes its activations, a backward its transient
        kind, stage, _ = _part(m, g, part)
        if kind == _F:
            m[m[_ACT] + rank] += m[m[_HELD] + stage]
        transient = m[m[_TRANSIENT] + stage] if kind in (_B, _I) else 0
        m[m[_PEAK] + rank] = max(m[m[_PEAK] + rank], m[m[_ACT] + rank] + transient)
    return True


@njit
def _compute_done(m, f, heap, rank, version):
    """Engine.compute_done."""
    i = m[m[_RUN] + rank]
    if i < 0 or m[m[_RUN_VERSION] + rank] != version:
        return  # superseded: its rate changed since this end was computed
    end, start = m[_NOW], m[m[_RUN_START] + rank]
    g = m[m[_ROW0] + rank] + i
    m[m[_START] + g], m[m[_END] + g] = start, end
    m[m[_BUSY] + rank] += end - start
    m[m[_CURSOR] + rank] = end
    for part in range(2 if m[m[_KIND] + g] == _FB else 1):
        kind, stage, mb = _part(m, g, part)
        if kind == _F:
            m[m[_FWD_END] + stage * m[_M] + mb] = end
        elif kind in (_B, _I):
            m[m[_BWD_END] + stage * m[_M] + mb] = end
        if kind in (_B, _W):
            m[m[_ACT] + rank] -= m[m[_HELD] + stage]
    m[m[_RUN] + rank] = -1
    m[_COMPUTING] -= 1
    m[m[_POS] + rank] = i + 1
    _advance(m, f, heap, rank)
    if m[_SHARED]:
        _rerate_all(m, f, heap)


# ---------------------------------------------------------------------- the loop
@njit
def _advance(m, f, heap, rank):
    """Engine.advance: run rank's program until a row must wait, a compute is running or an error is flagged."""
    first, n, pos = m[m[_ROW0] + rank], m[m[_NROWS] + rank], m[_POS] + rank
    while m[m[_RUN] + rank] < 0 and m[pos] < n:
        i = m[pos]
        g = first + i
        kind = m[m[_KIND] + g]
        if _SEND_F <= kind <= _RECV_B:
            m[pos] = _post_batch(m, f, heap, rank, g) - first
            if m[_ERR]:
                return
            continue
        if kind in (_UNSHARD, _REDUCE):
            _post_fsdp(m, f, heap, rank, g)
        if kind == _WAIT:
            if not _wait(m, rank, g):
                return
        elif _F <= kind <= _FB and not _start_compute(m, f, heap, rank, g):
            return
        if m[m[_RUN] + rank] < 0:
            m[pos] = i + 1


@njit
def run_pipeline_jit(m, f, heap):
    """Engine.run on ``m`` (:func:`_arena`), ``f`` (rates, then the factor table) and an empty ``heap``; returns a
    status (``_OK``: ``m``'s columns hold the result)."""
    for rank in range(m[_P]):
        _advance(m, f, heap, rank)
    while m[_HEAPN] and not m[_ERR] and not m[_FULLED]:
        t, kind, a, b = _pop(m, heap)
        m[_NOW] = t
        if kind == _COMM_DONE:
            _comm_done(m, f, heap, a)
        else:
            _compute_done(m, f, heap, a, b)
    if m[_FULLED]:
        return _FULL
    if m[_ERR]:
        return _ERROR
    for rank in range(m[_P]):
        if m[m[_POS] + rank] < m[m[_NROWS] + rank]:
            return _ERROR  # a deadlock
    return _OK


# ---------------------------------------------------------------------- from Python
def run_compiled(program: PipelineProgram, times: StageTimes, xfer_ns: np.ndarray,
                 model: StreamModel) -> CompiledRun | None:  # fmt: skip
    """The step :class:`commsched.pipeline.engine.Engine` plays, compiled; None when the Python loop must run
    instead: the program cannot finish (the Engine raises its error) or has fields outside the stage tables."""
    arena = _arena(program, times, xfer_ns, bool(model.host_cores))
    if arena is None:
        return None
    p, n = program.pp_size, int(arena[_N])
    factor = [model.kernel_factor(bool(comm) and model.kernels_see_comm, k) for comm in (0, 1) for k in range(p + 1)]
    capacity = 2 * n + 64
    while True:
        m, f = arena.copy(), np.array([0.0] * (2 * p) + factor, np.float64)
        status = run_pipeline_jit(m, f, np.zeros((capacity, 4), np.int64))
        if status != _FULL:
            break
        capacity *= 4  # superseded compute ends filled the heap: again with more room
    if status != _OK:
        return None
    cursor, busy, exposed, peak = (m[m[c] : m[c] + p].tolist() for c in (_CURSOR, _BUSY, _EXPOSED, _PEAK))
    bounds = [*m[m[_ROW0] : m[_ROW0] + p].tolist(), n]
    start, end = m[m[_START] : m[_START] + n], m[m[_END] : m[_END] + n]
    ranks = list(itertools.pairwise(bounds))
    return CompiledRun(cursor, busy, exposed, peak, [start[a:b] for a, b in ranks], [end[a:b] for a, b in ranks])


def _arena(program: PipelineProgram, times: StageTimes, xfer_ns: np.ndarray, shared: bool) -> np.ndarray | None:
    """The loop's ``m``: header, inputs and the state at its start (``shared``: ranks share the host's cores);
    None when a row's fields do not index the stage tables (the Python loop then decides what they mean)."""
    of_program = _program_columns(program)
    if of_program is None:
        return None
    program_columns, row0, items, batches = of_program
    p, stages, mbs, n = program.pp_size, program.num_stages, program.microbatches, int(row0[-1])
    ranks = np.zeros((_NROWS - _POS + 1, p), np.int64)
    ranks[_RUN - _POS], ranks[_ROW0 - _POS], ranks[_NROWS - _POS] = -1, row0[:-1], np.diff(row0)
    pair = times.overlap_f_b_ns
    compute = np.stack([times.forward_ns, times.backward_ns, times.backward_input_ns, times.backward_weight_ns])
    fsdp = np.stack([times.unshard_ns, times.reduce_grad_ns])
    none = np.full(max(items, 2 * stages * mbs, p * (p + 3), n, 8), -1, np.int64)  # "none yet" for the state
    columns = [*program_columns, compute.ravel(), fsdp.ravel(), np.zeros(0, np.int64) if pair is None else
               np.ravel(pair), times.activation_bytes, times.backward_peak_bytes, xfer_ns, *ranks,
               *[none[:items]] * 11, *[none[: 2 * stages * mbs]] * 8, *[none[: p * (p + 3)]] * 2,
               *[none[:batches]] * 2, *[none[: stages * mbs]] * 2, none[:stages], none[:n], none[:n],
               *[none[:8]] * 4]  # fmt: skip
    assert len(columns) == _HEADER - _SCALARS  # one per column constant
    header = np.zeros(_HEADER, np.int64)
    header[_P], header[_S], header[_M], header[_N], header[_SHARED], header[_PAIRED] = (p, stages, mbs, n, shared,
                                                                                       pair is not None)  # fmt: skip
    header[_SCALARS:] = _HEADER + np.cumsum([0] + [len(c) for c in columns[:-1]])
    return np.concatenate([header, *columns], dtype=np.int64)


_PROGRAM_COLUMNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _program_columns(program: PipelineProgram) -> tuple[list[np.ndarray], np.ndarray, int, int] | None:
    """(the columns that only depend on the program: rows, their facts, ``_S2R``; each rank's first row and after
    them the number of rows; the number of stream items at most; of batches), kept for the program's next
    simulation (lowered programs are cached and read-only); None when a row's fields do not index the tables."""
    if program in _PROGRAM_COLUMNS:
        return _PROGRAM_COLUMNS[program]
    p, stages, mbs = program.pp_size, program.num_stages, program.microbatches
    s2r = np.asarray(program.stage_to_rank, np.int64)
    out = None
    if len(program.actions) == p and stages >= 2 and ((s2r >= 0) & (s2r < p)).all():
        row0 = np.zeros(p + 1, np.int64)
        row0[1:] = np.cumsum([len(a) for a in program.actions])
        rows = np.concatenate([np.asarray(a, np.int64).reshape(-1, 6) for a in program.actions])
        facts = row_facts(rows, np.repeat(np.arange(p), np.diff(row0)), s2r, stages, mbs)
        if facts is not None:
            kinds = rows[:, 0]
            items = ((kinds >= _SEND_F) & (kinds <= _RECV_B)).sum() + ((kinds == _UNSHARD) | (kinds == _REDUCE)).sum()
            batches = int(facts[_BATCH_OF - _KEY_OF].max(initial=-1)) + 1
            out = [*np.ascontiguousarray(rows.T), *facts, s2r], row0, int(items), batches
    _PROGRAM_COLUMNS[program] = out
    return out
