"""Shared helpers of the workload-zoo tests: cached traces and collective lookups by mesh role."""

from __future__ import annotations

import functools
import math

import numpy as np

from commsched.ir import CollType, Graph, OpKind
from commsched.workloads import Workload, build

BF16, FP32 = 2, 4


@functools.cache
def _traced(preset: str, parallel: str, world: int, layers: int, items: tuple) -> Workload:
    return build(preset, parallel=parallel, world_size=world, layers=layers, **dict(items))


def traced(preset: str, parallel: str, world: int, layers: int = 2, **kw) -> Workload:
    """A traced workload, shared by every test that asks for the same one."""
    return _traced(preset, parallel, world, layers, tuple(sorted(kw.items())))


def colls(w: Workload, ctype: CollType, role: str | None = None) -> list[int]:
    """Ids of the collectives of one type on the process group of a mesh role ("fsdp", "tp", "dp", "ep", "edp",
    "world"; roles of the same size as the world share its group), in graph order."""
    g = w.graph
    name = None if role is None else w.meta["groups"][role]["name"]
    return [
        c
        for c in g.collectives.tolist()
        if g.coll_type[c] == ctype and (name is None or g.groups[g.coll_group[c]].name == name)
    ]


def loss_node(g: Graph) -> int:
    """The node the step returns first (the loss in training)."""
    out = int(np.flatnonzero(g.kinds == OpKind.OUTPUT)[0])
    return int(g.inputs(out)[0])


def numel(shape) -> int:
    return math.prod(shape)


def check_ir(w: Workload) -> None:
    """What every traced workload must satisfy: a valid graph whose collectives sit on the mesh's groups."""
    g = w.graph
    g.validate()
    assert "flop_errors" not in g.meta, g.meta.get("flop_errors")
    assert g.names[: len(w.meta["inputs"])] == [n.replace(".", "_") for n in w.meta["inputs"]]
    mesh_groups = {info["name"]: (info["size"], info["stride"]) for info in w.meta["groups"].values()}
    for pg in g.groups:
        assert (pg.size, pg.stride) == mesh_groups[pg.name], pg
    for c in g.collectives.tolist():
        assert len(g.waits_of(c)) >= 1
        assert g.comm_bytes[c] > 0


def assert_same_trace(a: Workload, b: Workload) -> None:
    """``a`` and ``b`` are node for node the same step: the same FX nodes and code, the same IR names, targets and
    flops (an option at its default must change no graph)."""
    nodes = [[(n.op, n.name, str(n.target), str(n.args), str(n.kwargs)) for n in w.graph_module.graph.nodes]
             for w in (a, b)]  # fmt: skip
    assert nodes[0] == nodes[1] and a.graph_module.code == b.graph_module.code
    assert a.graph.names == b.graph.names and a.graph.targets == b.graph.targets
    assert np.array_equal(a.graph.flops, b.graph.flops)


def specs_traced_by(monkeypatch, commands: tuple[str, ...], args: list[str]) -> list:
    """The spec each of ``commands`` (zoo commands: ``commsched COMMAND llama3-8b -l 1 *args``) asks the zoo to
    trace, stopped at the trace (each command then exits 2 with the stop's line)."""
    from typer.testing import CliRunner

    import commsched.workloads
    import commsched.workloads.trace
    from commsched.cli import app

    asked: list = []

    def stop(spec, progress=None):
        asked.append(spec)
        raise ValueError("stopped at the trace")

    monkeypatch.setattr(commsched.workloads, "trace_spec", stop)
    monkeypatch.setattr(commsched.workloads.trace, "trace_spec", stop)
    for command in commands:
        res = CliRunner().invoke(app, [command, "llama3-8b", "-l", "1", *args])
        assert res.exit_code == 2 and "stopped at the trace" in res.stderr, (command, res.output)
    return asked
