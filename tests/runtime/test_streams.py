"""Stream anchors and the FX lowering of multi-stream schedules: the lowered graph lints, keeps its anchors through
dead-code elimination, gives the same outputs as the original on real inputs (CPU: the anchors are no-ops), and its
anchors order every cross-stream dependency (checked by replaying the CUDA stream/event semantics)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost import estimate_costs
from commsched.frontends.fake_pg import fake_process_group
from commsched.hardware import get as get_hardware
from commsched.ir import GraphError, OpKind
from commsched.passes import Schedule, schedule
from commsched.runtime.streams import OPS, lower_streams
from commsched.workloads import StepProgram, build, create_groups
from costs_helper import simple_costs
from orders import random_topo_order
from programs import trace_program

WORLD = 2
PROGRAMS = {
    "every_collective": {},
    "inplace": {},
    "fsdp_mlp": {"layers": 2, "dim": 32},
}


@functools.cache
def _program(kind: str):
    return trace_program(kind, WORLD, **PROGRAMS[kind])


def _random_inputs(gm: torch.fx.GraphModule, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return [torch.randn(v.shape, dtype=v.dtype, generator=gen) for v in vals]


def _run(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run on real tensors under the fake process group (collectives are deterministic stand-ins)."""
    with fake_process_group(WORLD):
        out = gm(*[x.clone() for x in inputs])
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _assert_same_outputs(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def replay_streams(lowered: torch.fx.GraphModule, graph, streams: np.ndarray) -> int:
    """Execute the anchors' CUDA semantics symbolically (vector clocks of streams, events as snapshots) and check
    that every node runs on its stream and every cross-stream dependency of ``graph`` is ordered by a wait on an
    event recorded after the producer. Returns the number of waits."""
    by_name = {name: i for i, name in enumerate(graph.names)}
    num = int(streams.max()) + 1
    clock = [[-1] * num for _ in range(num)]  # clock[s][a]: last program index of stream a that s has waited for
    prog_index = {}  # commsched node -> (stream, index in that stream's program)
    counts = [0] * num
    events = {}
    cur, begun, waits = 0, False, 0
    ptr, idx = graph.predecessors_csr()
    for node in lowered.graph.nodes:
        if node.target is OPS["stream_begin"]:
            begun = True
            continue
        if node.target is OPS["set_stream"]:
            assert begun
            cur = node.args[1]
            continue
        if node.target is OPS["stream_record"]:
            snap = list(clock[cur])
            snap[cur] = counts[cur] - 1
            events[node.args[1]] = (cur, snap)
            continue
        if node.target is OPS["stream_wait"]:
            src, snap = events[node.args[1]]  # a wait after its record
            assert src != cur
            clock[cur] = [max(x, y) for x, y in zip(clock[cur], snap, strict=True)]
            waits += 1
            continue
        if node.target is OPS["stream_join"]:
            for s in range(1, num):
                clock[0][s] = counts[s] - 1
            cur = 0
            continue
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        i = by_name[node.name]
        assert cur == streams[i], f"{node.name} runs on stream {cur}, scheduled on {streams[i]}"
        for p in idx[ptr[i] : ptr[i + 1]].tolist():
            if graph.kinds[p] == OpKind.INPUT:
                continue
            a, k = prog_index[p]
            assert a == cur or clock[cur][a] >= k, f"{node.name} (stream {cur}) may run before {graph.names[p]}"
        prog_index[i] = (cur, counts[cur])
        counts[cur] += 1
    out = int(np.flatnonzero(graph.kinds == OpKind.OUTPUT)[0])
    for p in idx[ptr[out] : ptr[out + 1]].tolist():  # the caller reads outputs on stream 0 after the join
        if graph.kinds[p] != OpKind.INPUT:
            a, k = prog_index[p]
            assert a == 0 or clock[0][a] >= k
    return waits


def test_ops_are_registered_no_ops_on_cpu_and_meta():
    x = torch.randn(3)
    for name, op in OPS.items():
        assert op.namespace == "commsched", name
    torch.ops.commsched.stream_begin(x, 3)
    torch.ops.commsched.set_stream(x, 2)
    torch.ops.commsched.stream_record([x], 0)
    torch.ops.commsched.stream_wait([x], 0)
    torch.ops.commsched.stream_join(x, [x])
    m = torch.empty(3, device="meta")
    torch.ops.commsched.stream_wait([m], 7)  # no event 7 anywhere: a no-op off CUDA
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        torch.ops.commsched.stream_record([torch.empty(2, 2)], 1)


@settings(max_examples=35)
@given(
    st.sampled_from(sorted(PROGRAMS)), st.integers(1, 4), st.integers(0, 2**31 - 1), st.randoms(use_true_random=False)
)
def test_random_schedules_lower_to_equivalent_graphs(kind, num_streams, seed, rnd):
    """Any valid order and stream assignment (collectives issued from one stream) lowers to a graph that lints,
    orders every cross-stream dependency, and computes the same outputs as the original."""
    gm, g = _program(kind)
    order = random_topo_order(g, rnd)
    streams = np.asarray([rnd.randrange(num_streams) for _ in range(len(g))], np.int64)
    streams[g.coll_type >= 0] = rnd.randrange(num_streams)
    low = lower_streams(gm, None, graph=g, order=order, streams=streams)
    low.graph.lint()
    replay_streams(low, g, streams)
    inputs = _random_inputs(gm, seed)
    _assert_same_outputs(_run(gm, inputs), _run(low, inputs))


def test_lowered_order_follows_the_schedule_and_anchors_survive_dce():
    gm, g = _program("fsdp_mlp")
    s = schedule(g, dataclasses.replace(simple_costs(g), stream_sync_s=1e-6), ["overlap"])
    streams = np.zeros(len(g), np.int64)
    streams[g.coll_type >= 0] = 1
    low = lower_streams(gm, Schedule(g, s.order, streams))
    kept = [n.name for n in low.graph.nodes if n.op == "call_function" and not str(n.target).startswith("commsched")]
    want = [g.names[i] for i in s.order.tolist() if g.kinds[i] not in (OpKind.INPUT, OpKind.OUTPUT)]
    assert kept == want
    anchors = sum(1 for n in low.graph.nodes if str(n.target).startswith("commsched"))
    assert anchors > 0
    low.graph.eliminate_dead_code()
    assert sum(1 for n in low.graph.nodes if str(n.target).startswith("commsched")) == anchors
    assert low.meta["commsched_streams"] == 2
    # without streams only the order changes: no anchors
    plain = lower_streams(gm, Schedule(g, s.order, None))
    assert not any(str(n.target).startswith("commsched") for n in plain.graph.nodes)


def test_waits_are_not_repeated_for_covered_dependencies():
    """A stream that already waited for a later point of the producer's stream needs no second wait."""
    gm, g = _program("fsdp_mlp")
    order = np.arange(len(g))
    streams = np.zeros(len(g), np.int64)
    kernels = np.flatnonzero(np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER)))
    streams[kernels[::2]] = 1  # alternate kernels between streams: many cross edges
    low = lower_streams(gm, None, graph=g, order=order, streams=streams)
    waits = replay_streams(low, g, streams)
    ptr, idx = g.predecessors_csr()
    dst = np.repeat(np.arange(len(g)), np.diff(ptr))
    cross = int(
        ((streams[idx] != streams[dst]) & (g.kinds[idx] != OpKind.INPUT) & (g.kinds[dst] != OpKind.OUTPUT)).sum()
    )
    assert 0 < waits < cross


@functools.cache
def _zoo(preset: str, parallel: str, mode: str):
    return build(
        preset, parallel=parallel, world_size=WORLD, layers=1, seq_len=16, batch=2, dtype="float32",
        attention="sdpa", mode=mode,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "parallel", "mode"),
    [("llama-tiny", "tp", "train"), ("llama-tiny", "fsdp", "train"), ("llama-tiny", "tp+sp", "decode")],
)
def test_zoo_step_runs_the_multi_stream_schedule_with_the_same_results(preset, parallel, mode):
    """A traced zoo step, scheduled by overlap + multi_stream (contention assumed away so that it applies), lowered
    and run on real inputs: the same loss / gradients / logits, bit for bit."""
    w = _zoo(preset, parallel, mode)
    g = w.graph
    # no memory budget: the point is running the streams, not whether a candidate fits 1.05x this order's peak
    costs = estimate_costs(g, get_hardware("h100-sxm"))
    s = schedule(g, costs, ["overlap", "multi_stream"], compute_interference=0.0, memory_budget=None)
    assert s.streams is not None, s.stats[-1].notes
    low = lower_streams(w.graph_module, s)
    low.graph.lint()
    assert replay_streams(low, g, s.streams) > 0
    with fake_process_group(WORLD):
        program = StepProgram(w.spec, create_groups(w.spec.plan, 0), 0)
        want = w.graph_module(*program.real_inputs(seed=1))
        got = low(*program.real_inputs(seed=1))
    _assert_same_outputs(list(want), list(got))


def test_mismatched_graph_and_bad_schedule_are_clear_errors():
    gm, g = _program("fsdp_mlp")
    _, other = _program("inplace")
    with pytest.raises(GraphError, match=r"GraphModule has .* nodes but the commsched graph has"):
        lower_streams(gm, None, graph=other, order=np.arange(len(other)))
    with pytest.raises(GraphError, match="before its predecessor"):
        lower_streams(gm, None, graph=g, order=np.arange(len(g))[::-1].copy())
    with pytest.raises(ValueError, match="one per node"):
        lower_streams(gm, None, graph=g, order=np.arange(len(g)), streams=np.zeros(3, np.int64))
    streams = np.zeros(len(g), np.int64)
    colls = np.flatnonzero(g.coll_type >= 0)
    streams[colls[1::2]] = 1  # collectives issued from two streams, nothing orders them: could hang
    with pytest.raises(GraphError, match="may be issued before"):
        lower_streams(gm, None, graph=g, order=np.arange(len(g)), streams=streams)


class _FakeCuda:
    """Stand-ins for torch.cuda's streams and events that log what the CUDA kernels of the anchors do."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.current = self.Stream(self, "entry")

    class Stream:
        def __init__(self, cuda, name="side", device=None) -> None:
            self.cuda, self.name = cuda, name

        def wait_stream(self, other) -> None:
            self.cuda.log.append(("wait_stream", self.name, other.name))

        def wait_event(self, ev) -> None:
            self.cuda.log.append(("wait_event", self.name, ev.stream))

    class Event:
        def record(self, stream) -> None:
            self.stream = stream.name


def test_cuda_kernels_switch_record_and_wait(monkeypatch):
    """The CUDA implementations, run against logging stand-ins (this machine has no GPU): side streams wait for
    the caller's stream first, a wait waits for the event recorded on the producer's stream, and the join returns
    to the caller's stream after waiting for every side stream."""
    from commsched.runtime import streams as rt

    fake = _FakeCuda()
    names = iter(["s1", "s2"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake.current)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _FakeCuda.Stream(fake, next(names)))
    monkeypatch.setattr(torch.cuda, "Event", _FakeCuda.Event)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: setattr(fake, "current", s))
    monkeypatch.setattr(rt, "_POOL", {})
    x = torch.zeros(1)
    rt._begin_cuda(x, 3)
    assert fake.log == [("wait_stream", "s1", "entry"), ("wait_stream", "s2", "entry")]
    rt._set_stream_cuda(x, 2)
    assert fake.current.name == "s2"
    rt._record_cuda([x], 0)
    rt._set_stream_cuda(x, 1)
    rt._wait_cuda([x], 0)
    assert fake.log[-1] == ("wait_event", "s1", "s2")
    with pytest.raises(RuntimeError, match="event 5 was never recorded"):
        rt._wait_cuda([x], 5)
    with pytest.raises(RuntimeError, match="stream 3 is not one of the 3 begun"):
        rt._set_stream_cuda(x, 3)
    rt._join_cuda(x, [x])
    assert fake.current.name == "entry"
    assert fake.log[-2:] == [("wait_stream", "entry", "s1"), ("wait_stream", "entry", "s2")]
    with pytest.raises(RuntimeError, match="no stream_begin ran"):
        rt._set_stream_cuda(x, 1)
