"""Read a CPU-only profiler trace (e.g. ``commsched run`` on gloo, or any ``ProfilerActivity.CPU`` run) into
replayable work.

On a CPU there is no device: the threads are the streams and their **top-level ops** are the work (a ``cpu_op`` not
inside another one on its thread; the ops they call run inside them). Communication is the backend's own work:
``gloo:*`` (``nccl:*``, ...) annotations on the backend's threads, and any top-level op whose name matches a
communication pattern, except the calls that only issue a collective (``c10d::*``, ``record_param_comms``), which
are host work of the calling thread. Other user annotations (``record_function`` ranges) label the ops inside them.

Dependencies: the thread's program order; a communication item after the start of the latest issue call on another
thread that started before it (the call enqueues the work before it returns; the item carries the call's
collective, where ``record_param_comms`` describes it, unless its own args do: a ``gloo:*`` annotation records
its input's shape); a wait op (``wait_tensor``, ``c10d::wait``) that returned
after communication on another thread ended waits for it (host time, not work, as long as it took after that end);
and a thread that
sat idle until some communication ended (a ``wait()``, which the profiler does not record) waits for it: an item
whose start follows the end of communication on another thread within ``window_ns`` depends on it. The rest of an
idle time stays a gap (:func:`commsched.replay.work.finish`).
"""

from __future__ import annotations

import re
from pathlib import Path

from commsched.cost.trace_import import TraceEvents, collective_of
from commsched.replay.work import COMM, COMPUTE, HOST, Collective, EndIndex, Items, ReplayTrace, finish, trace_rank

_WAIT = re.compile(r"(wait_tensor$|^c10d::wait|^aten::wait$|::wait$)")
_ISSUE = re.compile(r"^(c10d::|record_param_comms$|c10d_functional::|_c10d_functional::)")
_SLACK_NS = 1000
_CATS = ("cpu_op", "user_annotation")


def _thread_events(ev: TraceEvents) -> tuple[dict[tuple, list[tuple[int, int, dict]]], float]:
    """Per (pid, tid) with integer ids: its cpu_op / user_annotation events as (start ns, end ns, event), sorted
    by start, longest first; and the origin (us)."""
    raw = []
    for e in ev.events:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in _CATS:
            pid, tid = e.get("pid"), e.get("tid")
            if type(pid) is int and type(tid) is int:
                ts = e.get("ts")
                if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts <= 1e18:
                    raise ev.fail(e, "ts", "a timestamp in microseconds in [0, 1e18]", ts)
                raw.append((float(ts), ev.us(e, e.get("dur", 0.0)), e))
    t0 = min((ts for ts, _, _ in raw), default=0.0)
    threads: dict[tuple, list[tuple[int, int, dict]]] = {}
    for ts, dur, e in raw:
        start = round((ts - t0) * 1000)
        threads.setdefault((e["pid"], e["tid"]), []).append((start, start + round(dur * 1000), e))
    for events in threads.values():
        events.sort(key=lambda x: (x[0], -x[1]))
    return threads, t0


class _Cpu:
    def __init__(self, ev: TraceEvents, world: int, patterns: list[re.Pattern], info: dict) -> None:
        self.ev, self.world, self.patterns = ev, world, patterns
        self.items = Items()
        self.issues: list[tuple[int, int]] = []  # (start, item) of issue calls
        self.coll_of: dict[int, Collective] = {}  # issue item -> its collective
        self.comm: list[int] = []
        self.waits: list[int] = []
        self.direct: dict[int, Collective] = {}  # comm item -> its collective, from its own args
        self.default_pg = "0"

    def add_thread(self, key: tuple, events: list[tuple[int, int, dict]]) -> None:
        """The thread's top-level ops (and communication annotations) in order, labelled by enclosing ranges."""
        s = self.items.stream_id(("cpu", *key), f"thread {key[1]}", True)
        op_end, ranges, top = -1, [], -1
        for start, end, e in events:
            name = self.ev.name(e)
            while ranges and ranges[-1][0] <= start:
                ranges.pop()
            inside = start < op_end
            if e.get("cat") == "user_annotation" and not any(p.search(name) for p in self.patterns):
                ranges.append((end, name))
                continue
            if inside:
                coll = collective_of(self.ev, e, self.world) if name == "record_param_comms" else None
                if coll is not None and top >= 0:
                    pg = str(self.ev.args(e).get("Process Group Name", self.default_pg))
                    self.coll_of[top] = Collective(*coll, pg)
                continue
            wait = bool(_WAIT.search(name))
            issue = not wait and bool(_ISSUE.match(name))
            comm = not issue and not wait and any(p.search(name) for p in self.patterns)
            top = self.items.add(name, COMM if comm else COMPUTE, s, start, end - start,
                                 label=ranges[-1][1] if ranges else "")  # fmt: skip
            op_end = end
            if issue:
                self.issues.append((start, top))
            if comm:
                self.comm.append(top)
                coll = collective_of(self.ev, e, self.world)  # a gloo:* annotation with its input's shape
                if coll is not None:
                    pg = str(self.ev.args(e).get("Process Group Name", self.default_pg))
                    self.direct[top] = Collective(*coll, pg)
            if wait:
                self.waits.append(top)

    def link(self, window_ns: int) -> int:
        """Communication after its issue call; waits inferred; how many were inferred."""
        self.issues.sort()
        starts = [t for t, _ in self.issues]
        colls: dict[int, Collective] = dict(self.direct)
        for c in self.comm:
            k = _last_before(starts, self.items.start[c])
            while k >= 0 and self.items.stream[self.issues[k][1]] == self.items.stream[c]:
                k -= 1
            if k >= 0:
                issue = self.issues[k][1]
                before = self.items.preds[issue][:1]  # the item before the call on its thread, if any
                self.items.preds[c].extend(before)  # the call enqueues the work before it returns
                if issue in self.coll_of:
                    colls.setdefault(c, self.coll_of[issue])
        self.coll_of = colls
        index = EndIndex(self.items, self.comm)
        for w in self.waits:
            self.wait_for(w, index)
        return sum(self.items.infer(i, index, window_ns) for i in range(len(self.items.names)))

    def wait_for(self, w: int, index: EndIndex) -> None:
        """A wait op that blocked until communication on another thread ended waits for it: it becomes host time
        (not work) after that communication, as long as it took after it ended; one that did not block stays as it
        was measured, as host time."""
        items = self.items
        items.role[w] = HOST  # a wait is never work, blocked or not
        start, end = items.start[w], items.end(w)
        c = index.latest_before(end + _SLACK_NS, start, exclude_stream=items.stream[w])
        if c < 0:
            return  # its collective had ended before it was called
        items.preds[w].append(c)
        tail = max(0, end - max(start, items.end(c)))
        items.role[w], items.start[w], items.dur[w] = HOST, end - tail, tail


def _last_before(sorted_starts: list[int], t: int) -> int:
    from bisect import bisect_right

    return bisect_right(sorted_starts, t) - 1


def read_cpu_trace(
    path: Path, ev: TraceEvents, info: dict, world: int, patterns: list[re.Pattern], window_us: float
) -> ReplayTrace | None:
    """A CPU-only trace as replayable work (see the module docstring); None when it has no CPU ops."""
    threads, _ = _thread_events(ev)
    if not threads:
        return None
    cpu = _Cpu(ev, world, patterns, info)
    for key in sorted(threads):
        cpu.add_thread(key, threads[key])
    inferred = cpu.link(round(window_us * 1000))
    return finish(cpu.items, path, trace_rank(path, info), "cpu", collectives=cpu.coll_of, inferred_edges=inferred,
                  events=len(ev.events))  # fmt: skip
