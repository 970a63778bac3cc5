"""The simulation loops: a fast one for a single compute stream and a general event loop for several.

Semantics (times are int nanoseconds):

* Every node sits on a compute stream, in program order (the order restricted to that stream). A node starts when
  its stream is free and its predecessors are available: a kernel (COMPUTE/OTHER) when it ends, an asynchronous
  collective as soon as it is *issued* (its data is only safe to use after its wait), a synchronous collective when
  it ends. A predecessor on another stream costs ``sync_ns`` more (event record + wait).
* A collective is issued at its place in its stream's program and queued on its group's FIFO comm stream, where it
  starts no earlier than ``issue + sync_ns`` (see :mod:`commsched.sim.comm` for how it runs). An asynchronous
  collective costs its issuing stream nothing; a synchronous one blocks it until ``end + sync_ns``.
* A wait blocks its stream until ``end(collective) + sync_ns``; it costs nothing once that time has passed.
* Kernels run at rate 1, or ``1/slowdown`` while any collective is in flight (in either phase), integrated over
  time: a kernel only partly overlapped by communication is slowed only for that part.
* Symmetrically, while any kernel runs, collectives' bandwidth-bound parts progress ``comm_slowdown`` times slower
  (a CPU run: gloo's threads compete with compute for the cores).
* Inputs, views, waits and the output take no time.
* Collectives issued at the same instant from different streams enter their FIFO in stream order.

Both loops fill the same arrays: ``start``/``end`` (a collective's are its comm-stream interval; a wait's are the
instant it unblocks), ``issue`` (collectives) and ``blocked`` (how long a wait or a synchronous collective held its
stream). With one compute stream, issues only happen while that stream runs, so the comm engine can be advanced
lazily and no global event queue is needed.
"""

from __future__ import annotations

import math

from commsched.ir.graph import GraphError, OpKind
from commsched.sim.comm import _EPS, INF, CommEngine

_KERNELS = frozenset((int(OpKind.COMPUTE), int(OpKind.OTHER)))
_COLL, _WAIT, _INPUT = int(OpKind.COLLECTIVE), int(OpKind.WAIT), int(OpKind.INPUT)


def run_single_stream(
    order: list[int],
    kinds: list[int],
    dur: list[int],
    wait_of: list[int],
    sync: list[bool],
    comm: CommEngine,
    slowdown: float,
    sync_ns: int,
    start: list[int],
    end: list[int],
    issue: list[int],
    blocked: list[int],
    comm_slowdown: float = 1.0,
) -> None:
    """Simulate ``order`` on compute stream 0; fills the arrays in place."""
    t = 0
    plain = slowdown == 1.0
    coupled = comm_slowdown != 1.0
    for i in order:
        k = kinds[i]
        if k in _KERNELS:
            start[i] = t
            d = dur[i]
            if d:
                if coupled and comm.pending:
                    comm.advance_to(t)  # the engine runs at full speed up to the kernel, slowed during it
                    comm.scale = comm_slowdown
                    t = _slowed_end(comm, t, d, slowdown)
                    comm.advance_to(t)
                    comm.scale = 1.0
                else:
                    t = t + d if plain or not comm.pending else _slowed_end(comm, t, d, slowdown)
            end[i] = t
        elif k == _COLL:
            issue[i] = t
            comm.issue(i, t)
            if sync[i]:
                resume = max(t, comm.run_until_done(i) + sync_ns)
                blocked[i] = resume - t
                t = resume
        elif k == _WAIT:
            c = wait_of[i]
            if end[c] < 0:
                comm.advance_to(t)
                if end[c] < 0:
                    comm.run_until_done(c)
            resume = max(t, end[c] + sync_ns)
            blocked[i] = resume - t
            t = resume
            start[i] = end[i] = t
        else:
            start[i] = end[i] = t


def _slowed_end(comm: CommEngine, t: int, work: int, slowdown: float) -> int:
    """End of a kernel of ``work`` ns started at ``t`` while the comm engine may have collectives in flight."""
    rem = float(work)
    while True:
        comm.advance_to(t)
        te = comm.next_event()
        slow = comm.inflight > 0
        fin = t + math.ceil((rem * slowdown if slow else rem) - _EPS)
        if fin <= te:
            return fin
        rem -= (te - t) / slowdown if slow else te - t
        t = te


def run_multi_stream(
    order: list[int],
    stream: list[int],
    num_streams: int,
    pred_ptr: list[int],
    pred_idx: list[int],
    kinds: list[int],
    dur: list[int],
    wait_of: list[int],
    sync: list[bool],
    comm: CommEngine,
    slowdown: float,
    sync_ns: int,
    start: list[int],
    end: list[int],
    issue: list[int],
    blocked: list[int],
    names: list[str],
    comm_slowdown: float = 1.0,
) -> None:
    """Simulate ``order`` with node ``i`` on compute stream ``stream[i]`` (a global event loop)."""
    progs: list[list[int]] = [[] for _ in range(num_streams)]
    for i in order:
        progs[stream[i]].append(i)
    avail = [-1] * len(kinds)  # when successors may use a node; -1: not yet
    ptr = [0] * num_streams
    running = [-1] * num_streams  # kernel running on the stream
    held = [-1] * num_streams  # synchronous collective the stream is blocked on
    rem = [0.0] * num_streams
    free_at = [0] * num_streams
    left = sum(len(p) for p in progs)
    t = 0
    while left:
        timer = INF
        progressed = True
        while progressed:
            progressed = False
            for s in range(num_streams):
                if running[s] >= 0:
                    continue
                c = held[s]
                if c >= 0:
                    if end[c] < 0:
                        continue
                    resume = end[c] + sync_ns
                    if resume > t:
                        timer = min(timer, resume)
                        continue
                    blocked[c] = resume - issue[c]
                    avail[c] = end[c]
                    held[s] = -1
                    free_at[s] = t
                    ptr[s] += 1
                    left -= 1
                    progressed = True
                if ptr[s] == len(progs[s]):
                    continue
                i = progs[s][ptr[s]]
                ready = free_at[s]
                for e in range(pred_ptr[i], pred_ptr[i + 1]):
                    p = pred_idx[e]
                    a = avail[p]
                    if a < 0:
                        ready = -1
                        break
                    if stream[p] != s and kinds[p] != _INPUT:  # graph inputs exist on every stream
                        a += sync_ns
                    if a > ready:
                        ready = a
                if ready < 0:
                    continue
                k = kinds[i]
                if k == _WAIT:
                    cend = end[wait_of[i]]
                    if cend < 0:
                        continue
                    if cend + sync_ns > t:
                        timer = min(timer, max(ready, cend + sync_ns))
                        continue
                if ready > t:
                    timer = min(timer, ready)
                    continue
                progressed = True
                if k in _KERNELS and dur[i]:
                    start[i] = t
                    running[s] = i
                    rem[s] = float(dur[i])
                    continue
                if k == _COLL:
                    issue[i] = t
                    comm.issue(i, t)
                    if sync[i]:
                        held[s] = i
                        continue
                    avail[i] = t
                else:
                    start[i] = end[i] = avail[i] = t
                    if k == _WAIT:
                        blocked[i] = t - max(ready, free_at[s])
                free_at[s] = t
                ptr[s] += 1
                left -= 1
        if not left:
            break
        slow = comm.inflight > 0
        # the engine's clock is at t here; the running kernels stay the same until te
        comm.scale = comm_slowdown if any(r >= 0 for r in running) else 1.0
        te = min(timer, comm.next_event())
        for s in range(num_streams):
            if running[s] >= 0:
                fin = t + math.ceil((rem[s] * slowdown if slow else rem[s]) - _EPS)
                te = min(te, fin)
        if te >= INF:
            stuck = [names[progs[s][ptr[s]]] for s in range(num_streams) if ptr[s] < len(progs[s])]
            raise GraphError(
                f"the schedule deadlocks: streams are stuck at nodes {stuck} (check the stream assignment)"
            )
        dt = te - t
        for s in range(num_streams):
            i = running[s]
            if i >= 0:
                rem[s] -= dt / slowdown if slow else dt
                if rem[s] <= _EPS:
                    end[i] = avail[i] = free_at[s] = te
                    running[s] = -1
                    ptr[s] += 1
                    left -= 1
        comm.advance_to(te)
        t = te
