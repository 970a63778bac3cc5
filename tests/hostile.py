"""Helpers for the hostile-input tests (issue 20): a small valid graph, profiles to mutate, and the check that a
CLI run failed the way the project promises (exit 2, one line naming the input, no traceback)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import graph_to_dict
from commsched.hardware import get, hardware_to_dict
from commsched.hardware.toml_write import dump_toml
from commsched.ir import CollType, Graph, GraphBuilder, OpKind

runner = CliRunner()


def small_graph(*, flops: float = 2e9, nbytes: int = 1 << 20, world: int = 8) -> Graph:
    """in -> mm -> all_reduce -> wait -> add -> output, plus a weight input; one process group of ``world``."""
    b = GraphBuilder({"source": "hostile", "world_size": world})
    grp = b.group("dp", world)
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[((256, 256), "float32", nbytes, None)])
    w = b.add_node("w", "placeholder", OpKind.INPUT, buffers=[((256, 256), "float32", nbytes, None)])
    mm = b.add_node("mm", "aten.mm.default", OpKind.COMPUTE, [x, w], buffers=[((256, 256), "float32", nbytes, None)],
                    flops=flops)  # fmt: skip
    ar = b.add_node("ar", "_c10d_functional.all_reduce.default", OpKind.COLLECTIVE, [mm],
                    buffers=[((256, 256), "float32", nbytes, None)], side_effect=True)  # fmt: skip
    b.set_collective(ar, CollType.ALL_REDUCE, grp, "sum", nbytes, nbytes)
    shape, dtype, size, storage = b.node_buffer(ar, 0)
    wt = b.add_node("wait", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [ar],
                    buffers=[(shape, dtype, size, storage)], side_effect=True)  # fmt: skip
    b.set_wait(wt, ar)
    add = b.add_node("add", "aten.add.Tensor", OpKind.OTHER, [wt, x], buffers=[((256, 256), "float32", nbytes, None)])
    b.add_node("output", "output", OpKind.OUTPUT, [add], side_effect=True)
    return b.build()


def small_graph_dict(**kw: Any) -> dict[str, Any]:
    return graph_to_dict(small_graph(**kw))


def profile_dict(name: str = "h100-sxm") -> dict[str, Any]:
    """A shipped profile in its file's form (a deep copy: mutate freely)."""
    return copy.deepcopy(hardware_to_dict(get(name)))


def write_profile(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(dump_toml(data))
    return path


def assert_user_error(args: list[str], *fragments: str) -> str:
    """Run the CLI; assert exit 2 with a one-line message containing ``fragments`` and no traceback; return it."""
    res = runner.invoke(app, args)
    out = res.output.strip()
    assert res.exit_code == 2, (res.exit_code, out, res.exception)
    assert "Traceback" not in out and out.startswith("error:"), out
    assert len(out.splitlines()) <= 3, out  # one message; rich wraps it at 140 columns
    for f in fragments:
        assert f in " ".join(out.split()), (f, out)
    return out
