"""Read a PyTorch profiler (Kineto) trace into replayable work (:class:`~commsched.replay.work.ReplayTrace`).

The events are read through the one trace reader, :class:`commsched.cost.trace_import.TraceEvents` (the same that
``calibrate --trace`` uses), so a bad value is a one-line ValueError naming the file, the event and the field.

A GPU trace (it has kernels, memcpys or memsets) becomes:

* **device work** per stream (``args.device``, ``args.stream``; else ``pid``, ``tid``), in its start order;
  NCCL kernels that carry ``Collective name`` are collectives (kind, size, group from their args), and any item
  whose name matches a communication pattern (:data:`DEFAULT_COMM_PATTERNS`), or a copy between two devices, is
  communication;
* **the launch side**: per CPU thread, its runtime calls (``cuda_runtime`` / ``cuda_driver``) in time order as host
  segments; a segment ends where a launch call puts its work on the device (the work's measured start, within the
  call), so a kernel cannot start before its launch and host time between calls stays;
* **synchronising calls** (``*Synchronize``; a synchronous memcpy call, or an async one to pageable host memory,
  that returned after its copy ended) wait for the device work they cover: the last work launched before them on
  the stream they name (Kineto's ``cuda_sync`` events) or on every stream; only work that had ended when the call
  returned counts;
* **cross-stream dependencies** from ``cudaEventRecord`` / ``cudaStreamWaitEvent``: where Kineto's ``cuda_sync``
  event describes the wait (``wait_on_stream``, ``wait_on_cuda_event_record_corr_id``) exactly; for other waits
  (older traces) the event is taken as recorded on the stream of the thread's previous launch and waited on by the
  stream of its next one (the ProcessGroupNCCL pattern), kept only where the timestamps agree. Without
  ``cuda_sync`` events a work item that started late is also linked to the work on another stream that ended just
  before it (``infer_window_us``).

Correlation ids come from ``args.correlation``, else from the ``ac2g`` / flow events' ids. A CPU-only trace is read
by :mod:`commsched.replay.cpu_trace`.
"""

from __future__ import annotations

import math
import os
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from pathlib import Path
from typing import Any

from commsched.cost.trace_import import TraceEvents, collective_of, load_trace
from commsched.replay.work import (
    COMM,
    COMPUTE,
    HOST,
    MEMORY,
    Collective,
    EndIndex,
    Items,
    ReplayTrace,
    finish,
    trace_rank,
)

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
DEFAULT_COMM_PATTERNS = (
    # NCCL and RCCL (RCCL keeps NCCL's kernel names): ncclDevKernel_<Coll>_... (NCCL >= 2.19), ncclKernel_<Coll>_...
    # (older; HTA's NCCL test traces), ncclSymk... (symmetric kernels); all named from NVIDIA/nccl src/device
    r"(?i)nccl", r"(?i)rccl",
    # DeepEP: the kernels of its communication namespaces, as published (deepseek-ai/DeepEP csrc/kernels:
    # deep_ep::[legacy::]intranode::{notify_dispatch, cached_notify_dispatch, dispatch, cached_notify_combine,
    # combine, barrier}, deep_ep::[legacy::]internode::{notify_dispatch, dispatch, cached_notify, combine},
    # deep_ep::[legacy::]internode_ll::{dispatch, combine, clean_low_latency_buffer}) and as vendored in DeepSeek's
    # own framework (deepseek-ai/profile-data train.json: dpsk::ep::internode::{dispatch, combine, notify_dispatch,
    # cached_notify}); get_dispatch_layout (namespace layout / dpsk::ep::cuda) only counts tokens: not communication
    r"\b(deep_ep|dpsk::ep)::(legacy::)?(intranode|internode|internode_ll)::",
    # DeepEP's elastic kernels (deep_ep/include/deep_ep/impls: deep_ep::elastic::*_impl); the copy and reduce
    # epilogues run on local buffers
    r"\bdeep_ep::elastic::(hybrid_)?(dispatch|combine|barrier|pp_send|pp_recv|engram_fetch|engram_fetch_wait)_impl",
    # NVSHMEM's host-launched kernels (NVIDIA nvshmem: nvshmemi_proxy_quiet_entrypoint, nvshmemi_reduce_kernel, ...)
    r"(?i)nvshmem",
    # torch symmetric memory: c10d::symmetric_memory::{barrier, put_signal, wait_signal}_kernel
    # (torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemory.cu); its collectives (CUDASymmetricMemoryOps.cu:
    # one_shot_all_reduce_kernel, two_shot_all_reduce_kernel, multimem_all_gather_kernel, ...) match the names below
    r"\bsymmetric_memory::",
    # collective names of other libraries: torch symmetric memory, MSCCL++, vLLM's cross_device_reduce_{1,2}stage,
    # flashinfer's trtllm_allreduce_fusion
    r"(?i)all_?to_?all", r"(?i)all_?gather", r"(?i)reduce_?scatter", r"(?i)all_?reduce", r"(?i)sendrecv",
    r"(?i)mscclpp", r"(?i)cross_device_reduce",
    # copy-engine transfers between devices: Kineto names a CUPTI peer copy "Memcpy PtoP (Device -> Device)"
    # (pytorch/kineto libkineto/src/CuptiActivity.cpp memcpyName); "Memcpy DtoD" is a copy within one device
    # (see also :func:`is_peer_copy`)
    r"^Memcpy PtoP",
    # CPU backends' annotations
    r"^(gloo|mpi|ucc|xccl):",
)  # fmt: skip
"""names of communication work (``re.search``), the one list every replay classifies by (``--comm-pattern`` adds
to it). pplx-kernels' ``dispatchKernel`` / ``combineKernel`` sit at global scope, too generic to name here."""


def is_peer_copy(args: dict) -> bool:
    """Whether a memcpy's args name two devices (Kineto's peer-copy record: ``fromDevice`` != ``toDevice``): a
    transfer between GPUs on the copy engines, communication whatever its name; a copy within one device is not."""
    src, dst = scalar(args.get("fromDevice")), scalar(args.get("toDevice"))
    return src is not None and dst is not None and src != dst


SLACK_NS = 1000  # timestamps of two clocks (host, device) agree to about a microsecond


class _Ev:
    """One X event's fields in ns relative to the trace's origin."""

    __slots__ = ("args", "corr", "e", "end", "name", "start")

    def __init__(self, e: dict, name: str, start: int, end: int, args: dict, corr: Any) -> None:
        self.e, self.name, self.start, self.end, self.args, self.corr = e, name, start, end, args, corr


def compile_patterns(patterns: tuple[str, ...] | list[str]) -> list[re.Pattern]:
    """The communication name patterns as regexes; ValueError naming a bad one."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise ValueError(f"communication pattern {p!r}: {exc}: expected a Python regular expression") from None
    return out


def _ts(ev: TraceEvents, e: dict) -> float:
    ts = e.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts <= 1e18 or not math.isfinite(ts):
        raise ev.fail(e, "ts", "a timestamp in microseconds in [0, 1e18]", ts)
    return float(ts)


def _key(ev: TraceEvents, e: dict, field: str) -> int | str:
    v = e.get(field)
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ev.fail(e, field, "an integer or a string", v)
    return v


def scalar(v: Any) -> int | float | str | None:
    """``v`` where it can name something (a number or a string), else None: odd values link nothing."""
    return v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None


def _flows(ev: TraceEvents) -> dict[tuple, Any]:
    """(pid, tid, ts) of a flow event's end point -> its id: the correlation of events without ``args.correlation``."""
    out = {}
    for e in ev.events:
        if isinstance(e, dict) and e.get("ph") in ("s", "f") and e.get("cat") in ("ac2g", "async_cpu_to_gpu"):
            key = (scalar(e.get("pid")), scalar(e.get("tid")), scalar(e.get("ts")))
            if None not in key and scalar(e.get("id")) is not None:
                out[key] = e.get("id")
    return out


_KIND_OF_CAT = {**dict.fromkeys(DEVICE_CATS, "dev"), **dict.fromkeys(RUNTIME_CATS, "rt"), "cuda_sync": "sync",
                "user_annotation": "note"}  # fmt: skip


def read_events(ev: TraceEvents) -> dict[str, list[_Ev]]:
    """Device work ("dev"), runtime calls ("rt"), cuda_sync events ("sync") and user annotations ("note"), each
    sorted by start, with times in ns from the origin (the earliest device work, runtime call or sync event)."""
    raw: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    for e in ev.events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        kind = _KIND_OF_CAT.get(e.get("cat"), "") if isinstance(e.get("cat"), str) else ""
        if kind:
            raw[kind].append((e, _ts(ev, e)))
    stamps = [ts for kind in ("dev", "rt", "sync") for _, ts in raw[kind]]
    t0 = min(stamps, default=0.0)
    flows: dict[tuple, Any] | None = None  # built on the first event without args.correlation
    out: dict[str, list[_Ev]] = {}
    for kind in ("dev", "rt", "sync", "note"):
        items = []
        for e, ts in raw[kind]:
            args = ev.args(e)
            start = round((ts - t0) * 1000)
            dur = ev.us(e, e.get("dur", 0.0))
            corr = args.get("correlation")
            if corr is None and kind != "note" and raw["dev"]:
                flows = _flows(ev) if flows is None else flows
                corr = flows.get((scalar(e.get("pid")), scalar(e.get("tid")), scalar(e.get("ts"))))
            if corr is not None and (isinstance(corr, bool) or not isinstance(corr, (int, str))):
                raise ev.fail(e, "args.correlation", "an integer", corr)
            items.append(_Ev(e, ev.name(e), start, start + round(dur * 1000), args, corr))
        items.sort(key=lambda x: (x.start, -x.end))
        out[kind] = items
    return out


class _Gpu:
    """The state of reading one GPU trace (see the module docstring)."""

    def __init__(self, ev: TraceEvents, world: int, patterns: list[re.Pattern], info: dict) -> None:
        self.ev, self.world, self.patterns = ev, world, patterns
        self.items = Items()
        events = read_events(ev)
        self.dev, self.rt, self.sync, self.notes = events["dev"], events["rt"], events["sync"], events["note"]
        self.label = ""  # the innermost user annotation around the runtime call being read
        self.comm_names: dict[str, bool] = {}
        self.item_of: dict[int, int] = {}  # id(_Ev) of device work -> item
        self.launched: dict[int, list[_Ev]] = defaultdict(list)  # id(runtime call) -> the device work it launched
        self.collectives: dict[int, Collective] = {}
        configs = info.get("pg_config", [])
        configs = [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []
        self.default_pg = next((str(c.get("pg_name")) for c in configs if c.get("pg_desc") == "default_pg"), "0")
        self.per_stream: dict[int, list[int]] = defaultdict(list)  # stream -> its work items in order
        self.launch_ns: dict[int, list[int]] = {}  # stream -> launch time of each work item, in order
        self.sync_by_corr = {s.corr: s for s in self.sync if s.corr is not None}

    def is_comm(self, name: str) -> bool:
        """Whether a work item's name matches a communication pattern (cached: names repeat)."""
        hit = self.comm_names.get(name)
        if hit is None:
            hit = self.comm_names[name] = any(p.search(name) for p in self.patterns)
        return hit

    def stream_of(self, d: _Ev) -> int:
        e = d.e
        dev = d.args.get("device", _key(self.ev, e, "pid"))
        st = d.args.get("stream", _key(self.ev, e, "tid"))
        return self.items.stream_id(("gpu", str(dev), str(st)), f"stream {st}" if dev in (0, "0") else
                                    f"gpu {dev} stream {st}", True)  # fmt: skip

    def add_work(self) -> None:
        """Every kernel, memcpy and memset on its stream, with its role and collective."""
        by_corr = {}
        for r in self.rt:
            if r.corr is not None:
                by_corr[r.corr] = r
        for d in self.dev:
            s = self.stream_of(d)
            coll = collective_of(self.ev, d.e, self.world, kernels=True) if "Collective name" in d.args else None
            comm = coll is not None or self.is_comm(d.name) or (d.e.get("cat") == "gpu_memcpy" and is_peer_copy(d.args))
            role = COMM if comm else COMPUTE if d.e.get("cat") == "kernel" else MEMORY
            i = self.items.add(d.name, role, s, d.start, d.end - d.start)
            if coll is not None:
                pg = str(d.args.get("Process Group Name", self.default_pg))
                self.collectives[i] = Collective(coll[0], coll[1], coll[2], pg)
            self.item_of[id(d)] = i
            self.per_stream[s].append(i)
            launcher = by_corr.get(d.corr) if d.corr is not None else None
            if launcher is not None:
                self.launched[id(launcher)].append(d)
            launches = self.launch_ns.setdefault(s, [])
            t = launcher.start if launcher is not None else d.start
            launches.append(max(t, launches[-1]) if launches else t)  # sorted for bisect: a stream runs in order

    def last_launched(self, stream: int, t_ns: int) -> int:
        """The work item of ``stream`` launched last at or before ``t_ns``; -1 if none."""
        k = bisect_right(self.launch_ns.get(stream, []), t_ns) - 1
        return self.per_stream[stream][k] if k >= 0 else -1

    def first_launched(self, stream: int, t_ns: int) -> int:
        """The first work item of ``stream`` launched at or after ``t_ns``; -1 if none."""
        launches = self.launch_ns.get(stream, [])
        k = bisect_left(launches, t_ns)
        return self.per_stream[stream][k] if k < len(launches) else -1

    def gpu_stream(self, args: dict, field: str) -> int | None:
        v = args.get(field)
        if isinstance(v, bool) or not isinstance(v, (int, str)) or v in (-1, "-1"):
            return None
        return self.items.streams.get(("gpu", str(args.get("device", 0)), str(v)))

    def awaited(self, r: _Ev) -> list[int]:
        """The work a synchronising call waits for (see the module docstring); empty if it is not one."""
        launched = self.launched.get(id(r), [])
        if "Memcpy" in r.name and launched:
            # CUDA: a synchronous memcpy call returns after its copy, an async one only when it copies to
            # pageable host memory (it cannot return before the data is there)
            blocking = "Async" not in r.name
            cands = [self.item_of[id(d)] for d in launched if blocking or ("DtoH" in d.name and "Pageable" in d.name)]
        elif "Synchronize" in r.name:
            s = self.sync_by_corr.get(r.corr)
            streams = list(self.per_stream)
            if s is not None and s.args.get("cuda_sync_kind") == "Stream Sync":
                one = self.gpu_stream(s.args, "stream")
                streams = [one] if one is not None else streams
            cands = [self.last_launched(st, r.start) for st in streams]
        else:
            return []
        return [i for i in cands if i >= 0 and self.items.end(i) <= r.end + SLACK_NS]

    def add_host(self) -> None:
        """Each thread's runtime calls as host segments (see :meth:`_host_call`)."""
        threads: dict[tuple, list[_Ev]] = defaultdict(list)
        for r in self.rt:
            threads[(str(_key(self.ev, r.e, "pid")), str(_key(self.ev, r.e, "tid")))].append(r)
        notes: dict[tuple, list[_Ev]] = defaultdict(list)
        for a in self.notes:
            notes[(str(a.e.get("pid")), str(a.e.get("tid")))].append(a)
        for (pid, tid), calls in sorted(threads.items()):
            s = self.items.stream_id(("cpu", pid, tid), f"thread {tid}", False)
            state = [0, 0]  # [end of the host time accounted for, host ns not yet in a segment]
            around, k, open_notes = notes.get((pid, tid), []), 0, []
            for r in calls:
                while k < len(around) and around[k].start <= r.start:  # annotations open at the call, innermost last
                    open_notes.append(around[k])
                    k += 1
                open_notes = [a for a in open_notes if a.end > r.start]
                self.label = open_notes[-1].name if open_notes else ""
                self._host_call(s, r, state)

    def _host_call(self, s: int, r: _Ev, state: list[int]) -> None:
        items, (prev_end, pending) = self.items, state
        launched = self.launched.get(id(r), [])
        awaited = self.awaited(r)
        if launched:
            p = min(max(min(d.start for d in launched), r.start), r.end)  # where the call put work on the device
            seg = items.add(r.name, HOST, s, p - pending - max(0, p - prev_end), pending + max(0, p - prev_end),
                            label=self.label)  # fmt: skip
            for d in launched:
                items.preds[self.item_of[id(d)]].append(seg)
                items.labels[self.item_of[id(d)]] = self.label
            prev_end, pending = max(prev_end, p), max(0, r.end - max(p, prev_end))
        if awaited:
            last = max(items.end(i) for i in awaited)
            if not launched:
                pending += max(0, r.start - prev_end)
                items.add("host", HOST, s, r.start - pending, pending, label=self.label)
                prev_end, pending = max(prev_end, r.start), 0
            tail = max(0, min(r.end - last, r.end - prev_end))
            items.add(r.name, HOST, s, r.end - tail, tail, preds=awaited, label=self.label)
            pending = 0
        elif not launched:
            pending += max(0, r.end - prev_end)
        state[0], state[1] = max(prev_end, r.end), pending

    def add_event_deps(self) -> int:
        """Edges from the work an event recorded to the first work launched after a wait on it; how many."""
        exact, described = self._exact_pairs()
        pairs = exact + self._pattern_pairs(skip=described)
        added = 0
        for rec_stream, rec_ns, wait_stream, wait_ns in pairs:
            if rec_stream is None or wait_stream is None or rec_stream == wait_stream:
                continue
            src, dst = self.last_launched(rec_stream, rec_ns), self.first_launched(wait_stream, wait_ns)
            if src < 0 or dst < 0 or self.items.end(src) > self.items.start[dst] + SLACK_NS:
                continue  # the timestamps disagree: not the dependency this pairing guessed
            self.items.preds[dst].append(src)
            added += 1
        return added

    def _exact_pairs(self) -> tuple[list[tuple], set]:
        """(record stream, record time, waiting stream, wait time) of each wait a ``cuda_sync`` event describes,
        and the correlations of those waits."""
        records = {r.corr: r for r in self.rt if "EventRecord" in r.name and r.corr is not None}
        calls = {r.corr: r for r in self.rt if r.corr is not None}
        pairs, described = [], set()
        for s in self.sync:
            if s.args.get("cuda_sync_kind") != "Stream Wait Event":
                continue
            described.add(s.corr)
            rec, wait = records.get(scalar(s.args.get("wait_on_cuda_event_record_corr_id"))), calls.get(s.corr)
            if rec is not None and wait is not None:
                pairs.append((self.gpu_stream(s.args, "wait_on_stream"), rec.start, self.gpu_stream(s.args, "stream"),
                              wait.start))  # fmt: skip
        return pairs, described

    def _pattern_pairs(self, skip: set) -> list[tuple]:
        """The same for the other waits, by the ProcessGroupNCCL pattern: the event was recorded on the stream of
        the thread's previous launch, and the stream of its next launch waits."""
        threads: dict[tuple, list[_Ev]] = defaultdict(list)
        for r in self.rt:
            threads[(str(r.e.get("pid")), str(r.e.get("tid")))].append(r)
        pairs = []
        for calls in threads.values():
            last_stream, record, waiting = None, None, []
            for r in calls:
                launched = self.launched.get(id(r), [])
                if "EventRecord" in r.name:
                    record = (last_stream, r.start)
                elif "StreamWaitEvent" in r.name and record is not None and r.corr not in skip:
                    waiting.append((record, r.start))
                if launched:
                    last_stream = self.items.stream[self.item_of[id(launched[0])]]
                    pairs += [(rs, rt, last_stream, wt) for (rs, rt), wt in waiting]
                    waiting = []
        return pairs

    def infer(self, window_ns: int) -> int:
        work = [i for ids in self.per_stream.values() for i in ids]
        index = EndIndex(self.items, work)
        return sum(self.items.infer(i, index, window_ns) for i in work)


def read_gpu_trace(
    path: Path, ev: TraceEvents, info: dict, world: int, patterns: list[re.Pattern], infer_window_us: float
) -> ReplayTrace:
    """A GPU trace as replayable work (see the module docstring)."""
    gpu = _Gpu(ev, world, patterns, info)
    gpu.add_work()
    gpu.add_host()
    linked = gpu.add_event_deps()
    inferred = 0 if gpu.sync else gpu.infer(round(infer_window_us * 1000))
    return finish(gpu.items, path, trace_rank(path, info), "gpu", collectives=gpu.collectives, inferred_edges=inferred,
                  event_edges=linked, events=len(ev.events))  # fmt: skip


def read_trace(
    path: str | os.PathLike[str],
    comm_patterns: tuple[str, ...] | list[str] = DEFAULT_COMM_PATTERNS,
    *,
    infer_window_us: float | None = None,
) -> ReplayTrace:
    """One profiler trace (JSON, optionally gzip) as replayable work: a GPU trace by this module, a CPU-only one
    by :mod:`commsched.replay.cpu_trace`. ``infer_window_us``: how long before a late start a dependency is looked
    for (default 10 us on a GPU, 2000 us on a CPU-only trace, where a thread wakes up slowly). ValueError (one
    line, naming the file) for anything that is not a trace or has no work."""
    from commsched.replay.cpu_trace import read_cpu_trace

    path = Path(path)
    try:
        ev, info, world = load_trace(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file: expected a profiler trace (.json or .json.gz)") from None
    patterns = compile_patterns(comm_patterns)
    has_device = any(isinstance(e, dict) and e.get("cat") in DEVICE_CATS and e.get("ph") == "X" for e in ev.events)
    if has_device:
        out = read_gpu_trace(path, ev, info, world, patterns, 10.0 if infer_window_us is None else infer_window_us)
    else:
        window = 2000.0 if infer_window_us is None else infer_window_us
        out = read_cpu_trace(path, ev, info, world, patterns, window)
    if out is None or not out.work.any():
        raise ValueError(f"{path}: no device work (kernels, memcpys, memsets) and no CPU ops: expected a PyTorch "
                         "profiler trace of a training or inference step")  # fmt: skip
    return out
