"""The simulation loops: a fast one for a single compute stream and a general event loop for several.

The timing rules are the stream model's (:mod:`commsched.sim.model`); this module only walks a program through them:

* Every node sits on a compute stream, in program order (the order restricted to that stream). A node starts when
  its stream is free and its predecessors are available: a kernel (COMPUTE/OTHER) when it ends, an asynchronous
  collective as soon as it is *issued* (its data is only safe to use after its wait), a synchronous collective when
  it ends; one on another stream later by the model's sync.
* A collective is issued at its place in its stream's program and queued on its group's comm stream
  (:mod:`commsched.sim.comm` runs it). An asynchronous collective costs its issuing stream nothing; a synchronous one
  blocks it until the model releases it, as a wait would.
* A wait blocks its stream until the model releases it; it costs nothing once that time has passed.
* Kernels progress at the model's rate, which changes while collectives are in flight; a kernel only partly
  overlapped by communication is slowed only for that part. While a kernel runs, the comm engine is told so (the
  collectives' rate may depend on it).
* Inputs, views, waits and the output take no time.
* Collectives issued at the same instant from different streams enter their FIFO in stream order.

Both loops fill the same :class:`Timeline`: ``start``/``end`` (a collective's are its comm-stream interval; a
wait's are the instant it unblocks), ``issue`` (collectives) and ``blocked`` (how long a wait or a synchronous
collective held its stream). With one compute stream, issues only happen while that stream runs, so the comm engine
can be advanced lazily and no global event queue is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from commsched.ir.graph import GraphError, OpKind
from commsched.sim.comm import CommEngine
from commsched.sim.model import EPS_NS, INF_NS, StreamModel

_KERNELS = frozenset((int(OpKind.COMPUTE), int(OpKind.OTHER)))
_COLL, _WAIT, _INPUT = int(OpKind.COLLECTIVE), int(OpKind.WAIT), int(OpKind.INPUT)


@dataclass
class Timeline:
    """Per node, filled by the loops (lists for fast scalar access; a collective's ``end`` is -1 until it ends)."""

    start: list[int]
    end: list[int]
    issue: list[int]
    blocked: list[int]


@dataclass
class Step:
    """One step to simulate: the program's per-node facts, the model, the comm engine and the timeline to fill."""

    kinds: list[int]
    dur_ns: list[int]
    wait_of: list[int]
    sync: list[bool]  # a synchronous collective blocks its stream until it ends
    model: StreamModel
    comm: CommEngine
    out: Timeline


def run_single_stream(step: Step, order: list[int]) -> None:
    """Simulate ``order`` on compute stream 0; fills ``step.out``."""
    kinds, dur, wait_of, sync, model, comm = step.kinds, step.dur_ns, step.wait_of, step.sync, step.model, step.comm
    start, end, issue, blocked = step.out.start, step.out.end, step.out.issue, step.out.blocked
    t = 0
    for i in order:
        k = kinds[i]
        if k in _KERNELS:
            start[i] = t
            if dur[i]:
                if comm.pending and (model.kernels_see_comm or model.comm_sees_kernels):
                    t = _kernel_end(comm, model, t, dur[i])
                else:
                    t += dur[i]
            end[i] = t
        elif k == _COLL:
            issue[i] = t
            comm.issue(i, t)
            if sync[i]:
                resume = max(t, model.wait_release_ns(comm.run_until_done(i)))
                blocked[i] = resume - t
                t = resume
        elif k == _WAIT:
            c = wait_of[i]
            if end[c] < 0:
                comm.advance_to(t)
                if end[c] < 0:
                    comm.run_until_done(c)
            resume = max(t, model.wait_release_ns(end[c]))
            blocked[i] = resume - t
            t = resume
            start[i] = end[i] = t
        else:
            start[i] = end[i] = t


def _kernel_end(comm: CommEngine, model: StreamModel, t: int, work: int) -> int:
    """End of a kernel of ``work`` ns started at ``t`` while the comm engine may have collectives in flight; the
    engine runs at the kernel-running rate during it."""
    coupled = model.comm_sees_kernels
    if coupled:
        comm.advance_to(t)  # the engine runs at its own rate up to the kernel
        comm.set_kernel_running(True)
    rem = float(work)
    while True:
        comm.advance_to(t)
        te = comm.next_event()
        slow = comm.sm_inflight > 0
        fin = model.kernel_end_ns(t, rem, slow)
        if fin <= te:
            break
        rem -= model.kernel_work_ns(te - t, slow)
        t = te
    if coupled:
        comm.advance_to(fin)
        comm.set_kernel_running(False)
    return fin


class _EventLoop:
    """The several-stream loop's state: per stream its program, position, running kernel, held synchronous
    collective, work left and the time it became free; per node when successors may use it."""

    def __init__(self, step: Step, order: list[int], stream: list[int], num_streams: int, pred_ptr, pred_idx):
        self.step, self.stream, self.pred_ptr, self.pred_idx = step, stream, pred_ptr, pred_idx
        self.progs: list[list[int]] = [[] for _ in range(num_streams)]
        for i in order:
            self.progs[stream[i]].append(i)
        self.avail = [-1] * len(step.kinds)  # when successors may use a node; -1: not yet
        self.ptr = [0] * num_streams
        self.running = [-1] * num_streams  # kernel running on the stream
        self.held = [-1] * num_streams  # synchronous collective the stream is blocked on
        self.rem = [0.0] * num_streams
        self.free_at = [0] * num_streams
        self.left = len(order)
        self.t = 0
        self.timer = INF_NS  # the earliest time a blocked stream may proceed

    def advance(self, s: int) -> None:
        """Retire stream ``s``'s current node."""
        self.ptr[s] += 1
        self.left -= 1

    def release_held(self, s: int) -> bool:
        """Unblock stream ``s`` from its synchronous collective if the model releases it by now. Whether it did."""
        c, out, t = self.held[s], self.step.out, self.t
        if out.end[c] < 0:
            return False
        resume = self.step.model.wait_release_ns(out.end[c])
        if resume > t:
            self.timer = min(self.timer, resume)
            return False
        out.blocked[c] = resume - out.issue[c]
        self.avail[c] = out.end[c]
        self.held[s] = -1
        self.free_at[s] = t
        self.advance(s)
        return True

    def try_start(self, s: int) -> bool:
        """Start stream ``s``'s next node if it can start now. Whether the stream made progress."""
        step, t, avail, stream = self.step, self.t, self.avail, self.stream
        kinds, model = step.kinds, step.model
        i = self.progs[s][self.ptr[s]]
        ready = self.free_at[s]  # when its stream and its predecessors allow it
        for e in range(self.pred_ptr[i], self.pred_ptr[i + 1]):
            p = self.pred_idx[e]
            a = avail[p]
            if a < 0:
                return False
            if stream[p] != s and kinds[p] != _INPUT:  # graph inputs exist on every stream
                a = model.available_ns(a, True)
            if a > ready:
                ready = a
        k = kinds[i]
        if k == _WAIT:
            cend = step.out.end[step.wait_of[i]]
            if cend < 0:
                return False
            release = model.wait_release_ns(cend)
            if release > t:
                self.timer = min(self.timer, max(ready, release))
                return False
        if ready > t:
            self.timer = min(self.timer, ready)
            return False
        if k in _KERNELS and step.dur_ns[i]:
            step.out.start[i] = t
            self.running[s] = i
            self.rem[s] = float(step.dur_ns[i])
            return True
        if k == _COLL:
            step.out.issue[i] = t
            step.comm.issue(i, t)
            if step.sync[i]:
                self.held[s] = i
                return True
            avail[i] = t
        else:
            step.out.start[i] = step.out.end[i] = avail[i] = t
            if k == _WAIT:
                step.out.blocked[i] = t - max(ready, self.free_at[s])
        self.free_at[s] = t
        self.advance(s)
        return True

    def start_what_can(self) -> None:
        """Release, issue and start on every stream until nothing more can happen at the current time."""
        running, held, ptr, progs = self.running, self.held, self.ptr, self.progs
        streams = range(len(progs))
        progressed = True
        while progressed:
            progressed = False
            for s in streams:
                if running[s] >= 0:
                    continue
                if held[s] >= 0:
                    if not self.release_held(s):
                        continue
                    progressed = True
                if ptr[s] < len(progs[s]) and self.try_start(s):
                    progressed = True

    def advance_time(self, names: list[str]) -> None:
        """Move to the next event (a kernel ends, the comm engine changes state, a blocked stream may proceed):
        progress the running kernels and retire those that end, then the comm engine."""
        comm, model, running, rem, t = self.step.comm, self.step.model, self.running, self.rem, self.t
        slow = comm.sm_inflight > 0
        # the engine's clock is at t here; the running kernels stay the same until the next event
        comm.set_kernel_running(max(running) >= 0)
        te = min(self.timer, comm.next_event())
        for s, i in enumerate(running):
            if i >= 0:
                te = min(te, model.kernel_end_ns(t, rem[s], slow))
        if te >= INF_NS:
            stuck = [names[p[self.ptr[s]]] for s, p in enumerate(self.progs) if self.ptr[s] < len(p)]
            raise GraphError(
                f"the schedule deadlocks: streams are stuck at nodes {stuck} (check the stream assignment)"
            )
        done = model.kernel_work_ns(te - t, slow)
        for s, i in enumerate(running):
            if i >= 0:
                rem[s] -= done
                if rem[s] <= EPS_NS:
                    self.step.out.end[i] = self.avail[i] = self.free_at[s] = te
                    running[s] = -1
                    self.advance(s)
        comm.advance_to(te)
        self.t = te


def run_multi_stream(
    step: Step, order: list[int], stream: list[int], num_streams: int, pred_ptr: list[int], pred_idx: list[int],
    names: list[str],
) -> None:  # fmt: skip
    """Simulate ``order`` with node ``i`` on compute stream ``stream[i]`` (a global event loop); fills ``step.out``."""
    loop = _EventLoop(step, order, stream, num_streams, pred_ptr, pred_idx)
    while loop.left:
        loop.timer = INF_NS
        loop.start_what_can()
        if not loop.left:
            break
        loop.advance_time(names)
