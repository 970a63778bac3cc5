"""Reading traces into replayable work: streams, launches, events, synchronising calls, collectives, CPU threads."""

from __future__ import annotations

import numpy as np
import pytest
from replay_helpers import DATA, NCCL_TRACE

from commsched.cost.trace_import import trace_collectives
from commsched.replay.kineto import read_trace
from commsched.replay.work import COMM, COMPUTE, HOST, MEMORY


def _preds(trace, i):
    return set(trace.edges[trace.edges[:, 1] == i, 0].tolist())


def test_cuda_sync_events_give_the_cross_stream_dependency():
    # HTA's cuda_event_sync_multi_stream: a kernel on stream 20, an event recorded after it, stream 24 waits on it
    t = read_trace(DATA / "hta_multi_stream.json.gz")
    assert t.mode == "gpu" and t.rank == 0
    names = {t.streams[s] for s in range(len(t.streams)) if t.device[s]}
    assert names == {"stream 20", "stream 24", "stream 28"}
    kernels = np.flatnonzero(t.role == COMPUTE)
    on = {t.streams[t.stream[i]]: i for i in kernels}
    waiter, recorded = on["stream 24"], on["stream 20"]
    ancestors, frontier = set(), {int(waiter)}
    while frontier:  # the waiter's ancestors (through gaps and host segments)
        frontier = {p for i in frontier for p in _preds(t, i)} - ancestors
        ancestors |= frontier
    assert int(recorded) in ancestors
    assert t.inferred_edges == 0  # cuda_sync events: nothing is guessed


def test_every_kernel_waits_for_its_launch():
    t = read_trace(DATA / "hta_alexnet.json.gz")
    work = np.flatnonzero(t.work)
    host = set(np.flatnonzero(t.role == HOST).tolist())
    launched = 0
    for i in work:
        preds = _preds(t, i)
        preds |= {q for p in preds if t.names[p] == "gap" for q in _preds(t, p)}
        launched += bool(preds & host)
    assert launched == len(work)  # alexnet: every kernel, memcpy and memset has its runtime call
    assert (t.role == MEMORY).sum() == 19  # 16 memcpys + 3 memsets


def test_nccl_kernels_are_collectives_with_their_sizes():
    t = read_trace(NCCL_TRACE)
    colls = list(t.collectives.values())
    assert len(colls) == 21 and all(t.role[i] == COMM for i in t.collectives)
    assert {c.kind for c in colls} == {"all_reduce", "broadcast"} and {c.group_size for c in colls} == {2}
    # the one trace reader: calibrate --trace sees the same collectives with the same sizes
    seen = trace_collectives(NCCL_TRACE)
    by_key = {(c.kind, c.group_size, c.nbytes, c.group) for c in colls}
    assert by_key == set(seen.occurrences_s)
    assert sum(len(v) for v in seen.occurrences_s.values()) == len(colls)


def test_comm_patterns_classify_other_communication():
    t = read_trace(DATA / "hta_sampled_rank0.json.gz")
    comm = [t.names[i] for i in np.flatnonzero(t.role == COMM)]
    assert comm and all("SendRecv" in n for n in comm)  # sendrecv kernels carry no Collective name here
    none = read_trace(DATA / "hta_sampled_rank0.json.gz", comm_patterns=())
    assert not (none.role == COMM).any()
    extra = read_trace(DATA / "hta_sampled_rank0.json.gz", comm_patterns=(r"^Memcpy DtoD",))
    dtod = [i for i, n in enumerate(extra.names) if n.startswith("Memcpy DtoD")]
    assert len(dtod) == 8 and np.flatnonzero(extra.role == COMM).tolist() == dtod


def test_cpu_trace_of_a_real_commsched_run():
    t = read_trace(DATA / "run_llama_tiny_fsdp_rank0.json.gz")
    assert t.mode == "cpu" and t.rank == 0
    threads = [t.streams[s] for s in range(len(t.streams)) if t.device[s]]  # besides them: latency lanes
    comm_threads = {t.streams[t.stream[i]] for i in np.flatnonzero(t.role == COMM)}
    assert len(threads) == 2 and len(comm_threads) == 1  # the step's thread and gloo's worker
    assert sum(n.startswith("gloo:") for n in np.asarray(t.names)[t.role == COMM]) == 34
    # each gloo annotation is a collective, read as calibrate --trace reads it (the one reader)
    assert len(t.collectives) == 34 and {c.kind for c in t.collectives.values()} == {"all_gather", "all_reduce"}
    seen = trace_collectives(DATA / "run_llama_tiny_fsdp_rank0.json.gz")
    assert {(c.kind, c.group_size, c.nbytes) for c in t.collectives.values()} == {k[:3] for k in seen.occurrences_s}
    waits = [i for i, n in enumerate(t.names) if n.endswith("wait_tensor")]
    assert len(waits) == 34 and all(t.role[i] == HOST for i in waits)  # a wait is host time, never work
    comm = set(np.flatnonzero(t.role == COMM).tolist())
    blocked = [i for i in waits if _preds(t, i) & comm]
    assert len(blocked) >= 3  # those that blocked (5 of 34 in this run) wait for their collective's end


def test_user_annotations_label_the_work():
    cpu = read_trace(DATA / "run_llama_tiny_fsdp_rank0.json.gz")
    assert {"step:original"} <= set(cpu.labels)
    # on a GPU trace: the innermost annotation around the launch call (the NCCL kernels: their nccl:* range)
    gpu = read_trace(NCCL_TRACE)
    labels = np.asarray(gpu.labels, dtype=object)
    assert {"DistributedDataParallel.forward", "## backward ##", "Optimizer.step#SGD.step"} <= set(labels[gpu.work])
    assert set(labels[list(gpu.collectives)]) == {"nccl:all_reduce", "nccl:broadcast"}
    from commsched.replay.run import replay

    span = replay(gpu).to_dict()["labels"]["nccl:broadcast"]
    assert span["measured_span_s"] == pytest.approx(span["replayed_span_s"], abs=2e-6)


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json.gz")), ids=lambda p: p.name)
def test_items_are_in_topological_order(path):
    from commsched.replay.graph import to_graph

    t = read_trace(path)
    assert len(t.edges) and np.all(t.edges[:, 0] < t.edges[:, 1])
    assert np.all(t.dur_ns >= 0)
    g = to_graph(t).validate()  # the graph's own contract (ids topological, CSR well formed, names unique)
    assert len(g) == len(t) and g.predecessors_csr()[1].size == len({tuple(e) for e in t.edges.tolist()})


def test_only_blocking_memcpy_calls_wait_for_their_copy(tmp_path):
    """cudaMemcpyAsync to pageable host memory returns after its copy (the host waits for it); one from pinned
    memory does not, even when its small copy ended before the call returned."""
    import json

    def call(c, name, ts, dur):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"correlation": c}}  # fmt: skip

    def copy(c, name, ts, dur):
        return {"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": c, "stream": 7, "device": 0}}  # fmt: skip

    events = [call(1, "cudaMemcpyAsync", 0, 50), copy(1, "Memcpy DtoH (Device -> Pageable)", 10, 30),
              call(2, "cudaMemcpyAsync", 60, 10), copy(2, "Memcpy HtoD (Pinned -> Device)", 62, 2),
              call(3, "cudaLaunchKernel", 80, 5), {**copy(3, "k", 85, 5), "cat": "kernel"}]  # fmt: skip
    path = tmp_path / "copies.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = read_trace(path)
    work = {t.names[i]: i for i in np.flatnonzero(t.work)}
    waits = [i for i in np.flatnonzero(t.role == HOST) if work["Memcpy DtoH (Device -> Pageable)"] in _preds(t, i)]
    assert len(waits) == 1 and t.names[waits[0]] == "cudaMemcpyAsync"
    pinned = work["Memcpy HtoD (Pinned -> Device)"]
    assert not any(pinned in _preds(t, i) for i in np.flatnonzero(t.role == HOST))
    from commsched.replay.run import replay
    from commsched.replay.whatif import Scale

    slow = replay(t, [Scale("stream", "7", 10.0)])  # the pageable copy takes 300 us: the host waits for it
    launch = next(i for i in np.flatnonzero(t.role == HOST) if t.names[i] == "cudaLaunchKernel")
    assert slow.sim.start_ns[launch] >= slow.sim.end_ns[work["Memcpy DtoH (Device -> Pageable)"]] == 310_000


def test_flow_events_link_launches_without_correlation_args(tmp_path):
    """Kineto's ac2g flow events (s on the launch, f on the kernel) carry the correlation when args do not."""
    import gzip
    import json

    data = json.loads(gzip.decompress((DATA / "hta_multi_stream.json.gz").read_bytes()))
    for e in data["traceEvents"]:
        if isinstance(e, dict) and isinstance(e.get("args"), dict):
            e["args"].pop("correlation", None)
    path = tmp_path / "flows.json"
    path.write_text(json.dumps(data))
    with_args, with_flows = read_trace(DATA / "hta_multi_stream.json.gz"), read_trace(path)
    assert with_flows.edges.tolist() == with_args.edges.tolist()
    host = set(np.flatnonzero(with_flows.role == HOST).tolist())
    assert all(_preds(with_flows, i) & host or any(_preds(with_flows, p) & host for p in _preds(with_flows, i))
               for i in np.flatnonzero(with_flows.work))  # fmt: skip
