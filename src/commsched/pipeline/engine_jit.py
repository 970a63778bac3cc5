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

Layout: the whole state and the inputs are one int64 array (``m``: a header of scalars and block offsets, then
blocks ``[field, id]``), the rates one float64 array (``f``) and the heap one (capacity, 4) array, so a handler call
passes three arrays (numba counts references of every array passed at each call: a tuple of 20 arrays made every
call cost as much as the work, and the first compile 60 s). The handlers are compiled functions of their own,
called, not inlined (:mod:`commsched.sim.engine_jit`). O(actions log actions).
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
_NONE, _KEY, _ITEM = 0, 1, 2  # what a blocked rank waits for: nothing, a transfer (key id), a stream item (item id)

# the header of m: scalars, sizes, then each block's offset (_BLOCKS order)
_NOW, _SEQ, _VERSION, _COMPUTING, _HEAPN, _NITEMS, _ERR, _FULLED, _P, _S, _M, _N, _ICAP, _SHARED, _PAIRED = range(15)
_BLOCKS = ("rows", "info", "s2r", "compute", "fsdp", "pair", "mem", "xfer", "ranks", "items", "keys", "streams",
           "batches", "done", "unshard", "times", "deps")  # fmt: skip
(_ROWS, _INFO, _S2R, _COMPUTE, _FSDP, _PAIR, _MEM, _XFER, _RANKS, _ITEMS, _KEYS, _STREAMS, _BATCHES, _DONE, _GATHERED,
 _TIMES, _DEPS) = range(15, 15 + len(_BLOCKS))  # fmt: skip
_HEADER = 15 + len(_BLOCKS)
# per-row facts (info): its transfer key, peer rank, side (0 send / 1 receive), batch id (-1 none), the end of the
# P2P rows posted with it (its run), whether that run is one coalesced NCCL group
_RKEY, _RPEER, _RSIDE, _RBATCH, _RRUN_END, _RCOALESCED = range(6)
# per rank (ranks); RUN: the local row of the running compute, -1 none
(_POS, _CURSOR, _BUSY, _EXPOSED, _ACT, _PEAK, _FLIGHT, _RUN, _RUN_START, _RUN_VERSION, _RUN_LAST, _BLOCK_TYPE,
 _BLOCK_ID, _ROW0, _NROWS) = range(15)  # fmt: skip
_RANK_FIELDS = 15
# per item (items); STREAM: its slot on its rank (a peer rank, then group, unshard, reduce); ROW: its first row
_IRANK, _ISTREAM, _IROW, _INROWS, _IFSDP, _IDUR, _ISTART, _IEND, _IPENDING, _INEXT, _IBNEXT = range(11)
_ITEM_FIELDS = 11
# per transfer (keys): its send / receive item, their ranks and rows (two fields each), its start and end
_SIDE, _WRANK, _WROW, _XSTART, _XEND = 0, 2, 4, 6, 7
_HEAD, _TAIL = 0, 1  # stream and batch lists
# f: the running computes' work left (ns at full rate), wall time per unit of work, then the factor table
_WORK, _FACTOR = 0, 1


class CompiledRun(NamedTuple):
    """What :func:`commsched.pipeline.simulate.simulate_program` reads of a finished run (the Engine's fields)."""

    cursor: list[int]
    busy: list[int]
    exposed: list[int]
    peak: list[int]
    start: list[np.ndarray]
    end: list[np.ndarray]


# ---------------------------------------------------------------------- where things are in m
@njit
def _rk(m, field, rank):
    return m[_RANKS] + field * m[_P] + rank


@njit
def _it(m, field, it):
    return m[_ITEMS] + field * m[_ICAP] + it


@njit
def _ky(m, field, key):
    return m[_KEYS] + field * (2 * m[_S] * m[_M]) + key


@njit
def _info(m, field, g):
    return m[_INFO] + field * m[_N] + g


@njit
def _row(m, g, column):
    return m[_ROWS] + 6 * g + column


@njit
def _sm(m, block, table, stage, mb):
    """A (tables, S, M) block's entry: compute times (F, B, I, W), ends (forwards, input gradients)."""
    return m[block] + (table * m[_S] + stage) * m[_M] + mb


@njit
def _time(m, which, g):
    return m[_TIMES] + which * m[_N] + g


@njit
def _rate(m, field, rank):
    return field * m[_P] + rank


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
        for c in range(4):
            heap[i, c] = heap[up, c]
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
        for k in range(4):
            heap[i, k] = heap[c, k]
        i = c
    for k in range(4):
        heap[i, k] = heap[n, k]
    return t, key >> _KIND_SHIFT, a, b


# ---------------------------------------------------------------------- rates
@njit
def _factor(m, f, rank):
    comm = 1 if m[_rk(m, _FLIGHT, rank)] > 0 else 0
    return f[2 * m[_P] + comm * (m[_P] + 1) + m[_COMPUTING]]


@njit
def _rerate(m, f, heap, rank):
    """Engine.rerate."""
    now = m[_NOW]
    factor = _factor(m, f, rank)
    if factor == f[_rate(m, _FACTOR, rank)]:
        return
    f[_rate(m, _WORK, rank)] -= (now - m[_rk(m, _RUN_LAST, rank)]) / f[_rate(m, _FACTOR, rank)]
    m[_rk(m, _RUN_LAST, rank)] = now
    f[_rate(m, _FACTOR, rank)] = factor
    m[_VERSION] += 1
    m[_rk(m, _RUN_VERSION, rank)] = m[_VERSION]
    wall = max(f[_rate(m, _WORK, rank)], 0.0) * factor
    _push(m, heap, _kernel_end_ns(now, wall), _COMPUTE_DONE, rank, m[_VERSION])


@njit
def _rerate_all(m, f, heap):
    for rank in range(m[_P]):
        if m[_rk(m, _RUN, rank)] >= 0:
            _rerate(m, f, heap, rank)


@njit
def _flight(m, f, heap, rank, delta):
    if delta:
        m[_rk(m, _FLIGHT, rank)] += delta
        if m[_rk(m, _RUN, rank)] >= 0:
            _rerate(m, f, heap, rank)


# ---------------------------------------------------------------------- streams
@njit
def _new_item(m, rank, slot, row, nrows, fsdp, duration_ns):
    it = m[_NITEMS]
    m[_NITEMS] += 1
    m[_it(m, _IRANK, it)], m[_it(m, _ISTREAM, it)], m[_it(m, _IROW, it)] = rank, slot, row
    m[_it(m, _INROWS, it)], m[_it(m, _IFSDP, it)], m[_it(m, _IDUR, it)] = nrows, fsdp, duration_ns
    m[_it(m, _IPENDING, it)] = nrows
    for field in (_ISTART, _IEND, _INEXT, _IBNEXT):
        m[_it(m, field, it)] = -1
    return it


@njit
def _add_side(m, rank, it, key, row, side):
    """Engine.add_side; an error (posted twice, one end coalesced and the other not) flags the run."""
    group = m[_P]
    if m[_ky(m, _SIDE + side, key)] >= 0:
        m[_ERR] = 1
        return
    m[_ky(m, _SIDE + side, key)], m[_ky(m, _WRANK + side, key)], m[_ky(m, _WROW + side, key)] = it, rank, row
    other = m[_ky(m, _SIDE + 1 - side, key)]
    if other >= 0 and (m[_it(m, _ISTREAM, other)] == group) != (m[_it(m, _ISTREAM, it)] == group):
        m[_ERR] = 1


@njit
def _post_batch(m, f, heap, rank, g):
    """Engine.post_batch at global row ``g``; returns the global row after the batch."""
    end = m[_info(m, _RRUN_END, g)]
    first = m[_NITEMS]
    if end - g > 1 and m[_info(m, _RCOALESCED, g)]:  # one NCCL group on the pipeline group's communicator
        it = _new_item(m, rank, m[_P], g, end - g, 0, 0)
        for k in range(g, end):
            _add_side(m, rank, it, m[_info(m, _RKEY, k)], k, m[_info(m, _RSIDE, k)])
    else:  # single ops, each on the two-rank communicator of its peer pair
        for k in range(g, end):
            _new_item(m, rank, m[_info(m, _RPEER, k)], k, 1, 0, 0)
        for k in range(g, end):
            _add_side(m, rank, first + k - g, m[_info(m, _RKEY, k)], k, m[_info(m, _RSIDE, k)])
    if m[_ERR]:
        return end
    batch = m[_info(m, _RBATCH, g)]
    for it in range(first, m[_NITEMS]):
        if batch >= 0:
            tail = m[_BATCHES] + 2 * batch + _TAIL
            if m[tail] < 0:
                m[tail - _TAIL + _HEAD] = it
            else:
                m[_it(m, _IBNEXT, m[tail])] = it
            m[tail] = it
    for it in range(first, m[_NITEMS]):
        _enqueue(m, f, heap, it)
    return end


@njit
def _post_fsdp(m, f, heap, rank, g, kind, stage):
    """Engine.post_fsdp."""
    which = 0 if kind == _UNSHARD else 1
    it = _new_item(m, rank, m[_P] + 1 + which, g, 1, 1, m[m[_FSDP] + which * m[_S] + stage])
    if kind == _UNSHARD:
        m[m[_GATHERED] + stage] = it
    _enqueue(m, f, heap, it)


@njit
def _stream(m, it):
    """The (head, tail) slot of ``it``'s stream."""
    return m[_STREAMS] + 2 * (m[_it(m, _IRANK, it)] * (m[_P] + 3) + m[_it(m, _ISTREAM, it)])


@njit
def _enqueue(m, f, heap, it):
    s = _stream(m, it)
    if m[s + _TAIL] < 0:
        m[s + _HEAD] = m[s + _TAIL] = it
        _start_item(m, f, heap, it)
    else:
        m[_it(m, _INEXT, m[s + _TAIL])] = it
        m[s + _TAIL] = it


@njit
def _start_item(m, f, heap, it):
    """Engine.start_item."""
    now = m[_NOW]
    m[_it(m, _ISTART, it)] = now
    row = m[_it(m, _IROW, it)]
    if m[_it(m, _IFSDP, it)]:
        duration = m[_it(m, _IDUR, it)]
        m[_time(m, 0, row)] = now
        _push(m, heap, now + duration, _COMM_DONE, -1 - it, 0)
        _flight(m, f, heap, m[_it(m, _IRANK, it)], 1 if duration else 0)
        return
    for k in range(row, row + m[_it(m, _INROWS, it)]):
        key = m[_info(m, _RKEY, k)]
        send, recv = m[_ky(m, _SIDE, key)], m[_ky(m, _SIDE + 1, key)]
        if send >= 0 and recv >= 0 and m[_it(m, _ISTART, send)] >= 0 and m[_it(m, _ISTART, recv)] >= 0:
            _start_transfer(m, f, heap, key)


@njit
def _start_transfer(m, f, heap, key):
    now = m[_NOW]
    duration = m[m[_XFER] + _boundary(key // (m[_S] * m[_M]), (key // m[_M]) % m[_S])]
    m[_ky(m, _XSTART, key)] = now
    for side in range(2):
        m[_time(m, 0, m[_ky(m, _WROW + side, key)])] = now
        _flight(m, f, heap, m[_ky(m, _WRANK + side, key)], 1 if duration else 0)
    _push(m, heap, now + duration, _COMM_DONE, key, 0)


@njit
def _finish_item(m, f, heap, it):
    m[_it(m, _IEND, it)] = m[_NOW]
    s = _stream(m, it)
    head = m[_it(m, _INEXT, m[s + _HEAD])]  # only a stream's head runs, so the item that ends is its head
    m[s + _HEAD] = head
    if head < 0:
        m[s + _TAIL] = -1
    else:
        _start_item(m, f, heap, head)


@njit
def _comm_done(m, f, heap, payload):
    """Engine.comm_done: ``payload`` a transfer key, or -1 - an FSDP item."""
    now = m[_NOW]
    if payload < 0:
        it = -1 - payload
        rank = m[_it(m, _IRANK, it)]
        _flight(m, f, heap, rank, -1 if m[_it(m, _IDUR, it)] else 0)
        m[_time(m, 1, m[_it(m, _IROW, it)])] = now
        _finish_item(m, f, heap, it)
        _wake(m, f, heap, rank, _ITEM, it, _NONE, 0)
        return
    key = payload
    m[_ky(m, _XEND, key)] = now
    moved = now > m[_ky(m, _XSTART, key)]
    for side in range(2):
        m[_time(m, 1, m[_ky(m, _WROW + side, key)])] = now
        _flight(m, f, heap, m[_ky(m, _WRANK + side, key)], -1 if moved else 0)
    for side in range(2):
        it = m[_ky(m, _SIDE + side, key)]
        m[_it(m, _IPENDING, it)] -= 1
        if m[_it(m, _IPENDING, it)] == 0:
            _finish_item(m, f, heap, it)
    for side in range(2):
        it = m[_ky(m, _SIDE + side, key)]
        ended = _ITEM if m[_it(m, _IEND, it)] >= 0 else _NONE
        _wake(m, f, heap, m[_ky(m, _WRANK + side, key)], _KEY, key, ended, it)


@njit
def _wake(m, f, heap, rank, type1, id1, type2, id2):
    """Advance ``rank`` if what it waits for is (type1, id1) or (type2, id2)."""
    blocker, which = m[_rk(m, _BLOCK_TYPE, rank)], m[_rk(m, _BLOCK_ID, rank)]
    if blocker != _NONE and ((blocker == type1 and which == id1) or (blocker == type2 and which == id2)):
        m[_rk(m, _BLOCK_TYPE, rank)] = _NONE
        _advance(m, f, heap, rank)


@njit
def _wait(m, rank, g):
    """Engine.wait at global row ``g``."""
    batch = m[_info(m, _RBATCH, g)]
    if batch < 0 or m[m[_BATCHES] + 2 * batch + _HEAD] < 0:
        m[_ERR] = 1  # no batch posted before it
        return False
    head = m[m[_BATCHES] + 2 * batch + _HEAD]
    done = cursor = m[_rk(m, _CURSOR, rank)]
    it = head
    while it >= 0:
        if m[_it(m, _IEND, it)] < 0:
            m[_rk(m, _BLOCK_TYPE, rank)], m[_rk(m, _BLOCK_ID, rank)] = _ITEM, it
            return False
        done = max(done, m[_it(m, _IEND, it)])
        it = m[_it(m, _IBNEXT, it)]
    exposed = 0  # the rank idles while a transfer of the batch is on the wire
    it = head
    while it >= 0:
        row = m[_it(m, _IROW, it)]
        wire = m[_ky(m, _XSTART, m[_info(m, _RKEY, row)])]
        for k in range(row + 1, row + m[_it(m, _INROWS, it)]):
            wire = min(wire, m[_ky(m, _XSTART, m[_info(m, _RKEY, k)])])
        exposed = max(exposed, min(m[_it(m, _IEND, it)], done) - max(cursor, wire))
        it = m[_it(m, _IBNEXT, it)]
    m[_rk(m, _EXPOSED, rank)] += exposed
    m[_rk(m, _CURSOR, rank)] = done
    return True


# ---------------------------------------------------------------------- compute
@njit
def _dep(m, n, ready, wire, blocker, which):
    d = m[_DEPS] + 4 * n
    m[d], m[d + 1], m[d + 2], m[d + 3] = ready, wire, blocker, which
    return n + 1


@njit
def _inputs(m, rank, kind, stage, mb, n):
    """Engine.inputs, written to the deps block from entry ``n``; returns the next entry."""
    gathered = m[m[_GATHERED] + stage]
    if gathered >= 0:
        n = _dep(m, n, m[_it(m, _IEND, gathered)], m[_it(m, _ISTART, gathered)], _ITEM, gathered)
    if kind == _F:
        if stage == 0:
            return n
        if m[m[_S2R] + stage - 1] == rank:
            return _dep(m, n, m[_sm(m, _DONE, 0, stage - 1, mb)], -1, _NONE, 0)
        key = (FWD * m[_S] + stage) * m[_M] + mb
        return _dep(m, n, m[_ky(m, _XEND, key)], m[_ky(m, _XSTART, key)], _KEY, key)
    if kind == _W:
        return _dep(m, n, m[_sm(m, _DONE, 1, stage, mb)], -1, _NONE, 0)
    n = _dep(m, n, m[_sm(m, _DONE, 0, stage, mb)], -1, _NONE, 0)
    if stage == m[_S] - 1:
        return n
    if m[m[_S2R] + stage + 1] == rank:
        return _dep(m, n, m[_sm(m, _DONE, 1, stage + 1, mb)], -1, _NONE, 0)
    key = (BWD * m[_S] + stage) * m[_M] + mb
    return _dep(m, n, m[_ky(m, _XEND, key)], m[_ky(m, _XSTART, key)], _KEY, key)


@njit
def _duration(m, g):
    kind, stage, mb = m[_row(m, g, 0)], m[_row(m, g, 1)], m[_row(m, g, 2)]
    if kind != _FB:
        return m[_sm(m, _COMPUTE, kind, stage, mb)]
    kind2, stage2, mb2 = m[_row(m, g, 3)], m[_row(m, g, 4)], m[_row(m, g, 5)]
    if m[_PAIRED]:
        return m[m[_PAIR] + stage * m[_S] + stage2]
    return m[_sm(m, _COMPUTE, _F, stage, mb)] + m[_sm(m, _COMPUTE, kind2, stage2, mb2)]


@njit
def _take_memory(m, rank, kind, stage):
    """A forward takes its activations, a backward its transient."""
    if kind == _F:
        m[_rk(m, _ACT, rank)] += m[m[_MEM] + stage]
    transient = m[m[_MEM] + m[_S] + stage] if kind == _B or kind == _I else 0
    m[_rk(m, _PEAK, rank)] = max(m[_rk(m, _PEAK, rank)], m[_rk(m, _ACT, rank)] + transient)


@njit
def _start_compute(m, f, heap, rank, g):
    """Engine.start_compute at global row ``g``."""
    kind, stage = m[_row(m, g, 0)], m[_row(m, g, 1)]
    if kind == _FB:
        n = _inputs(m, rank, _F, stage, m[_row(m, g, 2)], 0)
        n = _inputs(m, rank, m[_row(m, g, 3)], m[_row(m, g, 4)], m[_row(m, g, 5)], n)
    else:
        n = _inputs(m, rank, kind, stage, m[_row(m, g, 2)], 0)
    cursor = start = m[_rk(m, _CURSOR, rank)]
    exposed = 0
    for d in range(m[_DEPS], m[_DEPS] + 4 * n, 4):
        ready, wire, blocker = m[d], m[d + 1], m[d + 2]
        if ready < 0:
            if blocker == _NONE:
                m[_ERR] = 1  # an input it needs from its own rank runs later in its order
            m[_rk(m, _BLOCK_TYPE, rank)], m[_rk(m, _BLOCK_ID, rank)] = blocker, m[d + 3]
            return False
        start = max(start, ready)
        if blocker != _NONE:  # the rank idled while this input was on the wire
            exposed = max(exposed, ready - max(cursor, wire))
    m[_rk(m, _EXPOSED, rank)] += exposed
    work = _duration(m, g)
    m[_VERSION] += 1
    m[_COMPUTING] += 1
    factor = _factor(m, f, rank)
    m[_rk(m, _RUN, rank)], m[_rk(m, _RUN_START, rank)] = g - m[_rk(m, _ROW0, rank)], start
    m[_rk(m, _RUN_LAST, rank)], m[_rk(m, _RUN_VERSION, rank)] = start, m[_VERSION]
    f[_rate(m, _WORK, rank)], f[_rate(m, _FACTOR, rank)] = float(work), factor
    _push(m, heap, _kernel_end_ns(start, work * factor), _COMPUTE_DONE, rank, m[_VERSION])
    if m[_SHARED]:
        _rerate_all(m, f, heap)
    if kind == _FB:
        _take_memory(m, rank, _F, stage)
        _take_memory(m, rank, m[_row(m, g, 3)], m[_row(m, g, 4)])
    else:
        _take_memory(m, rank, kind, stage)
    return True


@njit
def _compute_ended(m, rank, kind, stage, mb, end):
    if kind == _F:
        m[_sm(m, _DONE, 0, stage, mb)] = end
    elif kind == _B or kind == _I:
        m[_sm(m, _DONE, 1, stage, mb)] = end
    if kind == _B or kind == _W:
        m[_rk(m, _ACT, rank)] -= m[m[_MEM] + stage]


@njit
def _compute_done(m, f, heap, rank, version):
    """Engine.compute_done."""
    i = m[_rk(m, _RUN, rank)]
    if i < 0 or m[_rk(m, _RUN_VERSION, rank)] != version:
        return  # superseded: its rate changed since this end was computed
    end, start = m[_NOW], m[_rk(m, _RUN_START, rank)]
    g = m[_rk(m, _ROW0, rank)] + i
    m[_time(m, 0, g)], m[_time(m, 1, g)] = start, end
    m[_rk(m, _BUSY, rank)] += end - start
    m[_rk(m, _CURSOR, rank)] = end
    if m[_row(m, g, 0)] == _FB:
        _compute_ended(m, rank, _F, m[_row(m, g, 1)], m[_row(m, g, 2)], end)
        _compute_ended(m, rank, m[_row(m, g, 3)], m[_row(m, g, 4)], m[_row(m, g, 5)], end)
    else:
        _compute_ended(m, rank, m[_row(m, g, 0)], m[_row(m, g, 1)], m[_row(m, g, 2)], end)
    m[_rk(m, _RUN, rank)] = -1
    m[_COMPUTING] -= 1
    m[_rk(m, _POS, rank)] = i + 1
    _advance(m, f, heap, rank)
    if m[_SHARED]:
        _rerate_all(m, f, heap)


# ---------------------------------------------------------------------- the loop
@njit
def _advance(m, f, heap, rank):
    """Engine.advance: run rank's program until a row must wait, a compute is running or an error is flagged."""
    first, n = m[_rk(m, _ROW0, rank)], m[_rk(m, _NROWS, rank)]
    pos = _rk(m, _POS, rank)
    while m[_rk(m, _RUN, rank)] < 0 and m[pos] < n:
        i = m[pos]
        g = first + i
        kind = m[_row(m, g, 0)]
        if _SEND_F <= kind <= _RECV_B:
            m[pos] = _post_batch(m, f, heap, rank, g) - first
            if m[_ERR]:
                return
            continue
        if kind == _UNSHARD or kind == _REDUCE:
            _post_fsdp(m, f, heap, rank, g, kind, m[_row(m, g, 1)])
        if kind == _WAIT:
            if not _wait(m, rank, g):
                return
        elif _F <= kind <= _FB and not _start_compute(m, f, heap, rank, g):
            return
        if m[_rk(m, _RUN, rank)] < 0:
            m[pos] = i + 1


@njit
def run_pipeline_jit(m, f, heap):
    """Engine.run on ``m`` (:func:`_arena`), ``f`` and an empty ``heap``; returns a status (``_OK``: ``m``'s
    blocks hold the result)."""
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
        if m[_rk(m, _POS, rank)] < m[_rk(m, _NROWS, rank)]:
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
    p = program.pp_size
    factor = [model.kernel_factor(bool(comm) and model.kernels_see_comm, k) for comm in (0, 1) for k in range(p + 1)]
    capacity = 2 * int(arena[_N]) + 64
    while True:
        m, f = arena.copy(), np.array([0.0] * (2 * p) + factor, np.float64)
        status = run_pipeline_jit(m, f, np.zeros((capacity, 4), np.int64))
        if status != _FULL:
            break
        capacity *= 4  # superseded compute ends filled the heap: again with more room
    if status != _OK:
        return None
    ranks = m[m[_RANKS] : m[_RANKS] + _RANK_FIELDS * p].reshape(_RANK_FIELDS, p)
    row_times = m[m[_TIMES] : m[_TIMES] + 2 * m[_N]].reshape(2, -1)
    bounds = np.concatenate([ranks[_ROW0], [m[_N]]]).tolist()
    starts = [row_times[0, a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    ends = [row_times[1, a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return CompiledRun(ranks[_CURSOR].tolist(), ranks[_BUSY].tolist(), ranks[_EXPOSED].tolist(),
                       ranks[_PEAK].tolist(), starts, ends)  # fmt: skip


def _arena(program: PipelineProgram, times: StageTimes, xfer_ns: np.ndarray, shared: bool) -> np.ndarray | None:
    """The loop's ``m``: header, inputs and the state at its start (``shared``: ranks share the host's cores);
    None when a row's fields do not index the
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
    n, kinds = len(rows), rows[:, 0]
    capacity = int(((kinds >= _SEND_F) & (kinds <= _RECV_B)).sum() + ((kinds == _UNSHARD) | (kinds == _REDUCE)).sum())
    ranks = np.zeros((_RANK_FIELDS, p), np.int64)
    ranks[_RUN], ranks[_ROW0], ranks[_NROWS] = -1, row0[:-1], np.diff(row0)
    pair = times.overlap_f_b_ns
    blocks = {"rows": rows, "info": info, "s2r": s2r,
              "compute": np.stack([times.forward_ns, times.backward_ns, times.backward_input_ns,
                                   times.backward_weight_ns]),
              "fsdp": np.stack([times.unshard_ns, times.reduce_grad_ns]), "pair": () if pair is None else pair,
              "mem": np.stack([times.activation_bytes, times.backward_peak_bytes]), "xfer": xfer_ns, "ranks": ranks,
              "items": np.full((_ITEM_FIELDS, capacity), -1), "keys": np.full((8, 2 * stages * mbs), -1),
              "streams": np.full(2 * p * (p + 3), -1), "batches": np.full(2 * (int(info[_RBATCH].max(initial=-1)) + 1), -1),
              "done": np.full(2 * stages * mbs, -1), "unshard": np.full(stages, -1), "times": np.full(2 * n, -1),
              "deps": np.zeros(8 * 4)}  # fmt: skip
    parts = [np.asarray(blocks[name], np.int64).ravel() for name in _BLOCKS]
    header = np.zeros(_HEADER, np.int64)
    header[_P], header[_S], header[_M], header[_N], header[_ICAP] = p, stages, mbs, n, capacity
    header[_SHARED], header[_PAIRED] = shared, pair is not None
    header[_ROWS:] = _HEADER + np.cumsum([0] + [len(part) for part in parts[:-1]])
    return np.concatenate([header, *parts])
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
