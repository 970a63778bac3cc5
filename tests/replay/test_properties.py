"""What-if properties (hypothesis): on the stored traces, and on random Kineto-shaped traces whose true timeline
under any scaling is known.

* scale 1 is the replay; scaling a stream by 0 leaves a step >= every other stream's busy time; by k, a step >=
  k x its busy time; every dependency and every stream's order hold in every replay.
* a random trace (CPU thread launching kernels on 3 streams, events between them, device synchronisations) is
  generated from a timing model; replaying it with a stream scaled by k reproduces the model's own timeline with
  that stream's kernels k x longer, to the nanosecond: the replay follows durations and dependencies, never the
  recorded timestamps.
"""

from __future__ import annotations

import gzip
import json
from functools import cache

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import DATA, NCCL_TRACE, assert_replay_valid

from commsched.replay.kineto import read_trace
from commsched.replay.run import replay
from commsched.replay.whatif import Scale

TRACES = [
    DATA / "hta_multi_stream.json.gz", DATA / "hta_alexnet.json.gz", DATA / "hta_amd_mi250.json.gz",
    DATA / "hta_sampled_rank1.json.gz", DATA / "run_llama_tiny_fsdp_rank1.json.gz", NCCL_TRACE,
]  # fmt: skip


@cache
def _trace(k: int):
    return read_trace(TRACES[k])


@settings(max_examples=25)
@given(k=st.integers(0, len(TRACES) - 1), pick=st.integers(0, 9), factor=st.floats(0, 4))
def test_stream_scale_properties_on_stored_traces(k, pick, factor):
    t = _trace(k)
    streams = [t.streams[s].split()[-1] for s in range(len(t.streams)) if t.device[s]]
    name = streams[pick % len(streams)]
    base = replay(t)
    same = replay(t, [Scale("stream", name, 1.0)])
    assert np.array_equal(same.sim.start_ns, base.sim.start_ns) and same.replayed == base.replayed
    zero = replay(t, [Scale("stream", name, 0.0)])
    others = [b for s, b in zero.replayed.stream_busy_s.items() if s.split()[-1] != name]
    assert zero.replayed.step_s >= max(others, default=0.0) - 1e-9
    scaled = replay(t, [Scale("stream", name, factor)])
    busy = next(b for s, b in base.replayed.stream_busy_s.items() if s.split()[-1] == name)
    assert scaled.replayed.step_s >= factor * busy * (1 - 1e-6) - 1e-9
    assert_replay_valid(t, scaled.sim, scaled.sim.end_ns - scaled.sim.start_ns)


# ---------------------------------------------------------------- random traces with a known timeline
STREAMS = (7, 20, 24)
CALL_US, SYNC_TAIL_US = 5, 3


@st.composite
def programs(draw):
    """A host program: launches (stream, kernel us, host gap us), event pairs and device synchronisations."""
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(("launch", "launch", "launch", "event", "sync")))
        gap = draw(st.integers(0, 30))
        if kind == "launch":
            ops.append(("launch", draw(st.sampled_from(STREAMS)), draw(st.integers(1, 200)), gap))
        elif kind == "event":
            a, b = draw(st.sampled_from(STREAMS)), draw(st.sampled_from(STREAMS))
            ops.append(("event", a, b, draw(st.integers(1, 200)), draw(st.integers(1, 200)), gap))
        else:
            ops.append(("sync", gap))
    return ops


def timeline(ops, scale: dict[int, float], sync_events: bool) -> tuple[list[dict], int]:
    """Run the host program through the model (a kernel starts when its launch call returns, its stream is free and
    the events it waits for were reached; a device sync returns 3 us after all work ends) with each stream's
    kernels scaled. Returns (Kineto events in ns-resolution us, the step in ns: first kernel start to last end)."""
    t, corr, events = 0, 0, []
    free = dict.fromkeys(STREAMS, 0)
    dep = dict.fromkeys(STREAMS, 0)
    kernels = []

    def call(name, at):
        nonlocal corr
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": at / 1000,
                       "dur": CALL_US, "args": {"correlation": corr}})  # fmt: skip
        return corr

    def launch(stream, dur_us):
        nonlocal t
        c = call("cudaLaunchKernel", t)
        t += CALL_US * 1000
        start = max(t, free[stream], dep[stream])
        end = start + round(dur_us * 1000 * scale.get(stream, 1.0))
        free[stream] = end
        events.append({"ph": "X", "cat": "kernel", "name": f"k{len(kernels)}", "pid": 0, "tid": stream,
                       "ts": start / 1000, "dur": (end - start) / 1000,
                       "args": {"correlation": c, "stream": stream, "device": 0}})  # fmt: skip
        kernels.append((start, end))

    for op in ops:
        t += op[-1] * 1000
        if op[0] == "launch":
            launch(op[1], op[2])
        elif op[0] == "event":
            _, a, b, dur_a, dur_b, _ = op
            launch(a, dur_a)
            rec = call("cudaEventRecord", t)
            reached, t = free[a], t + CALL_US * 1000
            w = call("cudaStreamWaitEvent", t)
            if sync_events:
                events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": b,
                               "ts": t / 1000, "dur": 0, "args": {"cuda_sync_kind": "Stream Wait Event",
                               "wait_on_stream": a, "wait_on_cuda_event_record_corr_id": rec, "stream": b,
                               "correlation": w, "device": 0}})  # fmt: skip
            t += CALL_US * 1000
            dep[b] = max(dep[b], reached)
            launch(b, dur_b)
        else:
            c = call("cudaDeviceSynchronize", t)
            end = max(t, *free.values()) + SYNC_TAIL_US * 1000
            events[-1]["dur"] = (end - t) / 1000
            del c
            t = end
    step = max(e for _, e in kernels) - min(s for s, _ in kernels)
    return events, step


@settings(max_examples=60)
@given(ops=programs(), stream=st.sampled_from(STREAMS), factor=st.sampled_from((0.0, 0.5, 1.0, 2.0, 3.0)),
       sync_events=st.booleans())  # fmt: skip
def test_replay_follows_durations_not_timestamps(tmp_path_factory, ops, stream, factor, sync_events):
    if not any(op[0] in ("launch", "event") for op in ops):
        ops = [*ops, ("launch", stream, 10, 0)]
    events, step_ns = timeline(ops, {}, sync_events)
    path = tmp_path_factory.mktemp("synthetic") / "trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    t = read_trace(path)
    base = replay(t)
    assert abs(base.measured.step_s * 1e9 - step_ns) < 2 and abs(base.replayed.step_s * 1e9 - step_ns) < 2
    if not any(t.streams[s] == f"stream {stream}" for s in range(len(t.streams))):
        return  # the drawn stream ran nothing
    _, truth_ns = timeline(ops, {stream: factor}, sync_events)
    r = replay(t, [Scale("stream", str(stream), factor)])
    assert abs(r.replayed.step_s * 1e9 - truth_ns) <= 2, (r.replayed.step_s * 1e9, truth_ns)
    assert_replay_valid(t, r.sim, r.sim.end_ns - r.sim.start_ns)
