"""Calibration on the live process group, run by every rank together (SPMD): the graph's own collectives on the
link as it is (shaped or not), how much compute slows while communication is in flight, and every op of the graph.

Everything here issues collectives, so all ranks must call the same functions in the same order.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.fx

from commsched.cost.collectives import normalize_kind
from commsched.ir import CollType, Graph, OpKind
from commsched.report.run_report import InterferenceProbe

c10d = torch.ops._c10d_functional


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _materialise(arg: Any, device: torch.device) -> Any:
    """A zero tensor shaped like an FX node's value (lists recursively); other arguments as they are."""
    if isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            return torch.zeros(tuple(int(s) for s in val.shape), dtype=val.dtype, device=device)
        raise ValueError(f"FX node {arg.name!r} has no tensor meta['val']; cannot build a calibration input")
    if isinstance(arg, (list, tuple)):
        return type(arg)(_materialise(a, device) for a in arg)
    return arg


def _wait_all(out: Any) -> None:
    for t in out if isinstance(out, (list, tuple)) else [out]:
        c10d.wait_tensor(t)


def collective_key(graph: Graph, c: int) -> tuple[str, int, int]:
    """(kind, group size, bytes in the nccl-tests convention) of collective node ``c``."""
    grp = graph.groups[int(graph.coll_group[c])]
    return normalize_kind(CollType(int(graph.coll_type[c]))), grp.size, int(graph.comm_bytes[c])


def collective_keys(graph: Graph) -> dict[tuple[str, int, int], int]:
    """Each distinct :func:`collective_key` of ``graph`` -> the first collective node with it."""
    keys: dict[tuple[str, int, int], int] = {}
    for c in graph.collectives.tolist():
        keys.setdefault(collective_key(graph, c), c)
    return keys


def step_comm_s(graph: Graph, rows: list[tuple[str, int, int, float]]) -> float:
    """Seconds the step's collectives take one after another, from :func:`measure_graph_collectives`' rows."""
    per_key = {(k, s, b): t for k, s, b, t in rows}
    return float(sum(per_key.get(collective_key(graph, c), 0.0) for c in graph.collectives.tolist()))


def measure_graph_collectives(
    gm: torch.fx.GraphModule,
    graph: Graph,
    *,
    reps: int = 5,
    rounds: int = 3,
    device: torch.device | None = None,
    skip: Collection[tuple[str, int, int]] = (),
) -> list[tuple[str, int, int, float]]:
    """Time each distinct collective of ``graph`` by running its FX node's op on zero tensors of the same shapes:
    ``reps`` back-to-back calls (issue, wait, issue, ...) after one barrier, per round; returns (kind, group size,
    bytes, seconds per call) rows: the median round per rank (like the op times), then the slowest rank's.
    Back to back, as nccl-tests times its iterations, not one call after a barrier: inside a step the ranks reach
    each collective at slightly different moments (each has just woken from the previous wait), and the later rank
    sets the pace; a barrier before every call would line the ranks up and time a collective no step runs.
    ``skip``: keys (:func:`collective_key`) already measured, left out."""
    device = device or torch.device("cpu")
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    rows = []
    for (kind, size, nbytes), c in sorted(collective_keys(graph).items()):
        if (kind, size, nbytes) in skip:
            continue
        node = fx_nodes[graph.names[c]]
        args = _materialise(node.args, device)
        kwargs = {k: _materialise(v, device) for k, v in node.kwargs.items()}
        _wait_all(node.target(*args, **kwargs))  # the first call sets up connections and buffers
        samples = []
        for _ in range(rounds):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                _wait_all(node.target(*args, **kwargs))
            _sync(device)
            samples.append((time.perf_counter() - t0) / reps)
        rows.append((kind, size, nbytes, statistics.median(samples)))
    times = torch.tensor([r[3] for r in rows], dtype=torch.float64)
    if dist.get_world_size() > 1 and len(rows):
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return [(k, s, b, float(t)) for (k, s, b, _), t in zip(rows, times.tolist(), strict=True)]


def measure_interference(
    gm: torch.fx.GraphModule,
    graph: Graph,
    *,
    reps: int = 5,
    max_bytes: int = 256 << 20,
    device: torch.device | None = None,
    compute_calls: list[tuple[Any, Any, Any]] | None = None,
) -> InterferenceProbe:
    """How compute and communication slow each other down when they overlap, from three timings: the graph's own
    collectives (in graph order, up to ``max_bytes`` of inputs) issued together and then waited (M), compute
    sized to about half of M (C), and both: the collectives issued, the compute (ending at T1), the waits (ending at
    O). The compute is the step's own kernels, replayed from ``compute_calls`` (see :func:`measure_op_times`),
    else 384x384 matmuls: on the shaped CPU harness collectives were slowed more while the step's kernels ran than
    while matmuls did, and only the former predicted real steps (benchmarks/RESULTS.md, real execution).
    While the collectives are still in flight when the compute ends, compute ran ``f = T1 / C`` times slower the
    whole time; and if communication progressed ``g`` times slower while compute ran, ``O = T1 + M - T1 / g``, so
    ``g = T1 / (M + T1 - O)``. Both are clipped to [1, 4]. If the collectives finished first (O close to T1),
    compute was slowed only while they ran and ``f = M / (C + M - O)``; that round says nothing of ``g`` (the
    median is over the rounds that do, 1 if none does) and the next round's compute is halved. The graph's mix
    matters: each collective also costs the CPU a fixed amount (gloo's steps, the socket calls), which a single
    large probe would hide. ``reps`` interleaved rounds, each timed on the slowest rank and giving both factors;
    the median factors and median times are returned as an :class:`InterferenceProbe`: the times (``comm_s``,
    ``compute_s``, ``compute_end_s``, ``overlapped_s``), ``serial_s`` (M + C), ``comm_bytes``, ``comm_cpu_s`` (the
    CPU time a rank spent on one M: gloo's threads and the kernel's socket work, which on a CPU run competes with
    compute), ``compute_slowdown`` (f), ``comm_slowdown`` (g) and ``replayed_calls`` (how many recorded kernel
    calls the compute phase cycles through; 0 with matmuls)."""
    device = device or torch.device("cpu")
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    calls = []
    comm_bytes = 0
    for c in graph.collectives.tolist():
        if comm_bytes >= max_bytes:
            break
        node = fx_nodes[graph.names[c]]
        args = _materialise(node.args, device)
        kwargs = {k: _materialise(v, device) for k, v in node.kwargs.items()}
        calls.append((node.target, args, kwargs))
        comm_bytes += int(graph.comm_bytes[c])
    if compute_calls:
        calls_c = list(compute_calls)

        def compute(n: int) -> None:  # the step's own kernels, in step order, from the start again when needed
            with torch.no_grad():
                for i in range(n):
                    target, args, kwargs = calls_c[i % len(calls_c)]
                    target(*args, **kwargs)

        def calls_for(seconds: float) -> int:
            # by the replay's average call (best of three whole passes): sizing the phase call by call from each
            # call's best time gave worse predictions (benchmarks/RESULTS.md, real execution, runs K-N)
            t = min(timed(lambda: compute(len(calls_c)))[0] for _ in range(3))
            return int(seconds / max(t / len(calls_c), 1e-9))

    else:
        a = torch.randn(384, 384, device=device)

        def compute(n: int) -> None:
            for _ in range(n):
                torch.mm(a, a)

        def calls_for(seconds: float) -> int:
            t = min(timed(lambda: compute(32))[0] for _ in range(3))  # best of three: a burst of load would shrink it
            return int(seconds / max(t / 32, 1e-9))

    def issue() -> list[Any]:
        return [target(*args, **kwargs) for target, args, kwargs in calls]

    def wait(works: list[Any]) -> None:
        for w in works:
            _wait_all(w)

    def timed(fn: Callable[[], float | None]) -> tuple[float, float]:
        """(wall time of fn, the time since the start that fn reports, or the wall time)."""
        dist.barrier()
        _sync(device)
        t = time.perf_counter()
        mark = fn()
        _sync(device)
        total = time.perf_counter() - t
        return total, (mark - t if mark is not None else total)

    wait(issue())  # warm-up
    cpu0 = time.process_time()
    comm = timed(lambda: wait(issue()))[0]
    comm_cpu = time.process_time() - cpu0  # this process's CPU (all threads): the communication's own CPU cost
    # the compute phase lasts about half the collectives' time; every rank must do the same work
    count = torch.tensor([max(1, calls_for(0.5 * comm))], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    n = int(count.item())

    def both(k: int) -> float:
        works = issue()
        compute(k)
        _sync(device)
        mark = time.perf_counter()
        wait(works)
        return mark

    rounds = []  # per round, the slowest rank's: comm, compute, overlapped, compute end within the overlapped run
    factors = []
    for _ in range(reps):  # interleaved, so that a burst of load elsewhere spoils one round, not one quantity
        comm_r = timed(lambda: wait(issue()))[0]
        compute_r = timed(lambda k=n: compute(k))[0]
        total, mark = timed(lambda k=n: both(k))
        row = torch.tensor([comm_r, compute_r, total, mark], dtype=torch.float64)
        dist.all_reduce(row, op=dist.ReduceOp.MAX)  # every rank decides alike from the same times
        c, k, o, e = row.tolist()
        rounds.append([c, k, o, e])
        factors.append(interference_factors(c, k, e, o))
        if factors[-1][1] is None and n > 1:
            n //= 2  # the compute outlasted the collectives (load slowed them): a shorter phase shows g next round
    cpu = torch.tensor([comm_cpu], dtype=torch.float64)
    dist.all_reduce(cpu, op=dist.ReduceOp.MAX)
    comm_cpu = float(cpu.item())
    # each round gives both factors; the median round resists the bursts of load a shared machine has
    compute_slowdown = statistics.median(f for f, _ in factors)
    seen = [g for _, g in factors if g is not None]  # rounds whose compute outlasted the collectives do not show g
    comm_slowdown = statistics.median(seen) if seen else 1.0
    comm, compute, overlapped, compute_end = (statistics.median(r[k] for r in rounds) for k in range(4))
    return InterferenceProbe(
        comm_s=comm,
        compute_s=compute,
        compute_end_s=compute_end,
        overlapped_s=overlapped,
        serial_s=comm + compute,
        comm_bytes=float(comm_bytes),
        collectives=float(len(calls)),
        comm_cpu_s=comm_cpu,
        compute_slowdown=compute_slowdown,
        comm_slowdown=comm_slowdown,
        replayed_calls=float(len(compute_calls or ())),
    )


def interference_factors(
    comm_s: float, compute_s: float, compute_end_s: float, overlapped_s: float
) -> tuple[float, float | None]:
    """(compute slowdown f, comm slowdown g) from the probe's times (see :func:`measure_interference`); g is None
    when the compute outlasted the collectives (a loaded machine slowed it), which hides it."""

    def clip(x: float) -> float:
        return min(max(x, 1.0), 4.0)

    if overlapped_s - compute_end_s > 0.05 * comm_s:  # the collectives outlasted the compute: both factors show
        f = clip(compute_end_s / max(compute_s, 1e-9))
        progressed = comm_s + compute_end_s - overlapped_s  # comm work done while compute ran
        g = 4.0 if progressed <= compute_end_s / 4.0 else clip(compute_end_s / progressed)
        return f, g
    hidden = compute_s + comm_s - overlapped_s  # compute time that ran while the collectives were in flight, slowed
    return (4.0 if hidden <= comm_s / 4.0 else clip(comm_s / hidden)), None


def _mutates(target: Any) -> bool:
    """True for an ATen op whose schema writes into an argument (``add_``, ``copy_``, out= variants)."""
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


class _OpTimer(torch.fx.Interpreter):
    """Runs a graph op by op, timing each compute op; collectives and waits run untimed (they are calibrated on
    their own), so the times are the ops' own, as the simulator's compute stream charges them. With ``record``,
    also keeps each timed call (target and its real arguments) until the recorded calls add up to ``record_s``."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        skip: set[str],
        device: torch.device,
        record: list[tuple[Any, Any, Any]] | None = None,
        record_s: float = 0.0,
    ) -> None:
        super().__init__(gm)
        self.skip, self.device = skip, device
        self.times: dict[str, float] = {}
        self.current = ""
        self.record, self.record_left_s = record, record_s

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current = n.name
        return super().run_node(n)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if self.current in self.skip:
            return target(*args, **kwargs)
        _sync(self.device)
        t0 = time.perf_counter()
        out = target(*args, **kwargs)
        _sync(self.device)
        self.times[self.current] = dt = time.perf_counter() - t0
        # an op that writes into its arguments is not replayed: they may be the step's real inputs
        if self.record is not None and self.record_left_s > 0 and not _mutates(target):
            self.record.append((target, args, kwargs))
            self.record_left_s -= dt
        return out


def measure_op_times(
    gm: torch.fx.GraphModule,
    graph: Graph,
    inputs: list[torch.Tensor],
    *,
    reps: int = 3,
    device: torch.device | None = None,
    record: list[tuple[Any, Any, Any]] | None = None,
    record_s: float = 0.0,
) -> dict[str, float]:
    """Seconds of every compute node of ``graph`` on this rank: the median of ``reps`` op-by-op runs of ``gm``
    after a warm-up run (the median, like the step times it predicts: on a shared machine the best run is faster
    than what the steps see). Runs the graph's collectives: call on every rank. ``record``: a list that receives
    the step's first compute calls (target, real arguments), about ``record_s`` seconds of them, for
    :func:`measure_interference` to replay (they hold their arguments alive), from one more, untimed run."""
    device = device or torch.device("cpu")
    comm = (graph.coll_type >= 0) | (graph.kinds == OpKind.WAIT)
    skip = {graph.names[i] for i in np.flatnonzero(comm).tolist()}
    runs: dict[str, list[float]] = {}
    # a warm-up run (caches, allocator pools), the timed runs, and a last untimed one that records: the recorded
    # arguments stay alive, which would change what a timed run's ops allocate
    last = reps + (1 if record is not None else 0)
    for r in range(last + 1):
        timer = _OpTimer(gm, skip, device, record if r > reps else None, record_s)
        dist.barrier()
        with torch.no_grad():
            timer.run(*inputs)
        if 0 < r <= reps:
            for k, v in timer.times.items():
                runs.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in runs.items()}
