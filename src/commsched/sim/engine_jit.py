"""The single-stream simulation loop and its comm engine, compiled (:mod:`commsched.sim.jit`).

:func:`run_single_stream_jit` is :func:`commsched.sim.engine.run_single_stream` driving
:class:`commsched.sim.comm.CommEngine`, statement for statement, on arrays: per group a FIFO (a slice of one queue
array), the two phases, processor sharing per link class, the kernel-running rate; the float work counters see the
same operations in the same order, so every time is the same integer. The timing rules are
:mod:`commsched.sim.model`'s scalar functions, compiled. ``tests/sim/test_engine_jit.py`` checks it against the
event loop and the Python single-stream loop.

The handlers are compiled functions of their own, not inlined into the loop (:func:`commsched.sim.jit.njit_inline`):
numba's IR inlining of handlers that take the comm engine's tuple of arrays took 84 s of a fresh machine's first
compile, against 6 s as calls, for the same simulation time (1.0 ms a step of a 5.5k-node graph either way).
"""

from __future__ import annotations

import numpy as np

from commsched.sim import model as _model
from commsched.sim.jit import njit
from commsched.sim.model import EPS_NS, INF_NS

_comm_start = njit(_model.comm_start_rule)
_wait_release = njit(_model.wait_release_rule)
_kernel_end_ns = njit(_model.kernel_end_rule)
_kernel_work = njit(_model.kernel_work_rule)
_kernel_wall = njit(_model.kernel_wall_rule)
_comm_divisor = njit(_model.comm_divisor_rule)

_EPS, _INF = EPS_NS, INF_NS
# the comm engine's state travels as one tuple of arrays (built in run_single_stream_jit); its scalar slots:
_CLOCK, _INFLIGHT, _PENDING, _KRUN, _SMFLIGHT = 0, 1, 2, 3, 4  # _SMFLIGHT: in flight and taking SMs
_KERNEL, _COLL, _WAIT = 0, 1, 2  # node classes of the loop


@njit
def _next_event(ce):
    st, cur, in_bw, lat_end, rem, div, link, qhead, qlen, qoff, queue, ready_at = ce[:12]
    if not st[_PENDING]:
        return _INF
    best = _INF
    for g in range(len(cur)):
        c = cur[g]
        if c >= 0:
            # a phase ends: the latency phase at its end, the bandwidth phase when its work is done at this rate
            te = st[_CLOCK] + np.int64(np.ceil(rem[g] * div[st[_KRUN], link[c]] - _EPS)) if in_bw[g] else lat_end[g]
        elif qhead[g] < qlen[g]:
            te = max(st[_CLOCK], ready_at[queue[qoff[g] + qhead[g]]])
        else:
            continue
        if te < best:
            best = te
    return best


@njit
def _progress(ce, t):
    st, cur, in_bw, rem, div, link = ce[0], ce[1], ce[2], ce[4], ce[5], ce[6]
    dt = t - st[_CLOCK]
    if dt > 0 and st[_INFLIGHT]:
        for g in range(len(cur)):
            c = cur[g]
            if c >= 0 and in_bw[g]:
                rem[g] -= dt / div[st[_KRUN], link[c]]
    st[_CLOCK] = t


@njit
def _share(ce, ln, delta, comm_slowdown):
    sharing, div = ce[12], ce[5]
    k = sharing[ln] + delta
    sharing[ln] = k
    div[0, ln] = _comm_divisor(k, False, comm_slowdown)
    div[1, ln] = _comm_divisor(k, True, comm_slowdown)


@njit
def _finish_one(ce, g, c, t, comm_slowdown):
    """CommEngine._finish without starting the next one."""
    st, cur, in_bw, link, start, end, busy = ce[0], ce[1], ce[2], ce[6], ce[13], ce[14], ce[15]
    if in_bw[g]:
        _share(ce, link[c], -1, comm_slowdown)
        in_bw[g] = False
    end[c] = t
    busy[g] += t - start[c]
    cur[g] = -1
    st[_INFLIGHT] -= 1
    st[_SMFLIGHT] -= ce[16][c]
    st[_PENDING] -= 1


@njit
def _head_ready(ce, g, t):
    qhead, qlen, qoff, queue, ready_at = ce[7], ce[8], ce[9], ce[10], ce[11]
    return qhead[g] < qlen[g] and ready_at[queue[qoff[g] + qhead[g]]] <= t


@njit
def _start_next(ce, g, t, lat, bw, comm_slowdown):
    """CommEngine._start_next, with the chain _enter_bw -> _finish -> _start_next of instant collectives unrolled
    into a loop (same effects, same order)."""
    st, cur, in_bw, lat_end, rem, link, qhead, qoff, queue, start = (ce[0], ce[1], ce[2], ce[3], ce[4], ce[6], ce[7],
                                                                      ce[9], ce[10], ce[13])  # fmt: skip
    while True:
        c = queue[qoff[g] + qhead[g]]
        qhead[g] += 1
        cur[g] = c
        start[c] = t
        st[_INFLIGHT] += 1
        st[_SMFLIGHT] += ce[16][c]
        in_bw[g] = False
        lat_end[g] = t + lat[c]
        if lat[c] != 0:
            return
        if bw[c] != 0:  # _enter_bw
            in_bw[g] = True
            rem[g] = float(bw[c])
            _share(ce, link[c], 1, comm_slowdown)
            return
        _finish_one(ce, g, c, t, comm_slowdown)
        if not _head_ready(ce, g, t):
            return


@njit
def _fire(ce, t, lat, bw, comm_slowdown):
    cur, in_bw, lat_end, rem = ce[1], ce[2], ce[3], ce[4]
    changed = True
    while changed:
        changed = False
        for g in range(len(cur)):
            c = cur[g]
            if c >= 0:
                if not in_bw[g]:
                    if lat_end[g] <= t:
                        if bw[c] == 0:  # _enter_bw of an instant bandwidth phase: _finish
                            _finish_one(ce, g, c, t, comm_slowdown)
                            if _head_ready(ce, g, t):
                                _start_next(ce, g, t, lat, bw, comm_slowdown)
                        else:
                            in_bw[g] = True
                            rem[g] = float(bw[c])
                            _share(ce, ce[6][c], 1, comm_slowdown)
                        changed = True
                elif rem[g] <= _EPS:
                    _finish_one(ce, g, c, t, comm_slowdown)
                    if _head_ready(ce, g, t):
                        _start_next(ce, g, t, lat, bw, comm_slowdown)
                    changed = True
            elif _head_ready(ce, g, t):
                _start_next(ce, g, t, lat, bw, comm_slowdown)
                changed = True


@njit
def _advance_to(ce, t_end, lat, bw, comm_slowdown):
    st = ce[0]
    while st[_PENDING]:
        te = _next_event(ce)
        if te > t_end:
            break
        _progress(ce, te)
        _fire(ce, te, lat, bw, comm_slowdown)
    if t_end > st[_CLOCK]:
        _progress(ce, t_end)


@njit
def _run_until_done(ce, c, lat, bw, comm_slowdown):
    """CommEngine.run_until_done; -1 when ``c`` can never finish."""
    end = ce[14]
    while end[c] < 0:
        te = _next_event(ce)
        if te >= _INF:
            return -1
        _progress(ce, te)
        _fire(ce, te, lat, bw, comm_slowdown)
    return end[c]


@njit
def _issue(ce, c, t, group, sync_ns, lat, bw, comm_slowdown):
    st, cur, qhead, qlen, qoff, queue, ready_at = ce[0], ce[1], ce[7], ce[8], ce[9], ce[10], ce[11]
    if t > st[_CLOCK]:
        _advance_to(ce, t, lat, bw, comm_slowdown)
    g = group[c]
    ready_at[c] = _comm_start(t, 0, sync_ns)  # the FIFO part of the rule is the queue itself
    queue[qoff[g] + qlen[g]] = c
    qlen[g] += 1
    st[_PENDING] += 1
    if cur[g] < 0 and qhead[g] == qlen[g] - 1 and ready_at[c] <= st[_CLOCK]:
        _start_next(ce, g, st[_CLOCK], lat, bw, comm_slowdown)


@njit
def _kernel_end(ce, t, work, lat, bw, model):
    """engine._kernel_end."""
    compute_slowdown, comm_slowdown, coupled = model
    st = ce[0]
    if coupled:
        _advance_to(ce, t, lat, bw, comm_slowdown)
        st[_KRUN] = 1
    rem = float(work)
    while True:
        _advance_to(ce, t, lat, bw, comm_slowdown)
        te = _next_event(ce)
        slow = st[_SMFLIGHT] > 0
        fin = _kernel_end_ns(t, _kernel_wall(rem, slow, compute_slowdown))
        if fin <= te:
            break
        rem -= _kernel_work(te - t, slow, compute_slowdown)
        t = te
    if coupled:
        _advance_to(ce, fin, lat, bw, comm_slowdown)
        st[_KRUN] = 0
    return fin


@njit
def _comm_state(node_class, group, link, sms, num_groups, start, end):
    """The comm engine's state (CommEngine.__init__) as a tuple of arrays; marks collectives unfinished in ``end``.
    ``sms``: per node 1 where its transfer takes SMs (``sim.model.takes_sms``)."""
    n = len(node_class)
    qcount = np.zeros(num_groups, np.int64)
    for i in range(n):
        if node_class[i] == _COLL:
            end[i] = -1
            qcount[group[i]] += 1
    qoff = np.zeros(num_groups, np.int64)
    for g in range(1, num_groups):
        qoff[g] = qoff[g - 1] + qcount[g - 1]
    num_links = 2
    for i in range(n):
        if node_class[i] == _COLL and link[i] + 2 > num_links:
            num_links = link[i] + 2
    return (
        np.zeros(5, np.int64),  # 0 scalars
        np.full(num_groups, -1, np.int64),  # 1 cur
        np.zeros(num_groups, np.bool_),  # 2 in_bw
        np.zeros(num_groups, np.int64),  # 3 lat_end
        np.zeros(num_groups, np.float64),  # 4 rem
        np.ones((2, num_links), np.float64),  # 5 divisor per (kernel running, link)
        link,  # 6
        np.zeros(num_groups, np.int64),  # 7 qhead
        np.zeros(num_groups, np.int64),  # 8 qlen
        qoff,  # 9
        np.zeros(max(qcount.sum(), 1), np.int64),  # 10 queue
        np.zeros(n, np.int64),  # 11 ready_at
        np.zeros(num_links, np.int64),  # 12 sharing
        start,  # 13
        end,  # 14
        np.zeros(num_groups, np.int64),  # 15 busy
        sms,  # 16
    )


@njit
def run_single_stream_jit(order, node_class, dur, wait_of, sync, group, lat, bw, link, sms, num_groups, sync_ns,
                          compute_slowdown, comm_slowdown):  # fmt: skip
    """Simulate ``order`` on one compute stream. ``node_class``: 0 kernel, 1 collective, 2 wait, 3 instantaneous.
    Returns (start, end, issue, blocked, ok); ``ok`` False when a collective can never finish."""
    n = len(dur)
    start = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    issue = np.full(n, -1, np.int64)
    blocked = np.zeros(n, np.int64)
    ce = _comm_state(node_class, group, link, sms, num_groups, start, end)
    st = ce[0]
    sees = compute_slowdown != 1.0 or comm_slowdown != 1.0
    model = (compute_slowdown, comm_slowdown, comm_slowdown != 1.0)
    t = np.int64(0)
    for i in order:
        k = node_class[i]
        if k == _KERNEL:
            start[i] = t
            if dur[i]:
                if st[_PENDING] and sees:
                    t = _kernel_end(ce, t, dur[i], lat, bw, model)
                else:
                    t += dur[i]
            end[i] = t
        elif k == _COLL:
            issue[i] = t
            _issue(ce, i, t, group, sync_ns, lat, bw, comm_slowdown)
            if sync[i]:
                done = _run_until_done(ce, i, lat, bw, comm_slowdown)
                if done < 0:
                    return start, end, issue, blocked, False
                resume = max(t, _wait_release(done, sync_ns))
                blocked[i] = resume - t
                t = resume
        elif k == _WAIT:
            c = wait_of[i]
            if end[c] < 0:
                _advance_to(ce, t, lat, bw, comm_slowdown)
                if end[c] < 0 and _run_until_done(ce, c, lat, bw, comm_slowdown) < 0:
                    return start, end, issue, blocked, False
            resume = max(t, _wait_release(end[c], sync_ns))
            blocked[i] = resume - t
            t = resume
            start[i] = t
            end[i] = t
        else:
            start[i] = t
            end[i] = t
    return start, end, issue, blocked, True
