"""Issue 20 item 8: every CLI knob is type- and range-checked before any work; a bad one is a one-line error naming
the knob (exit 2), never taken as true, multiplied into a MemoryError, or raised as a TypeError / OverflowError."""

from __future__ import annotations

import pytest
import torch

from commsched.frontends.json_io import save_graph
from commsched.passes import schedule
from commsched.passes.budget import MemoryBudget
from hostile import assert_user_error, small_graph


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("knobs") / "g.json"
    save_graph(small_graph(), path)
    return str(path)


@pytest.mark.parametrize(
    ("knob", "message"),
    [
        ("reorder_collectives=maybe", "knob reorder_collectives='maybe': expected bool"),
        ("reorder_collectives=2", "knob reorder_collectives=2"),
        ("memory_budget=abc", "knob memory_budget='abc': expected a memory budget"),
        ("memory_budget=[1]", "knob memory_budget=[1]"),
        ("memory_budget={}", "knob memory_budget={}"),
        ("memory_budget=1e308", "ratio=1e+308: expected at most 1e+06"),
        ("memory_budget=1e400GiB", "expected at most 2**62 bytes"),
        ("memory_budget=-1", "must be >= 1"),
        ("overlap.waits=7", "knob overlap.waits=7: expected one of"),
        ("overlap=3", "knob overlap=3"),
        ("multi_stream.compute_streams=4611686018427387904", "compute_streams=4611686018427387904: expected 1..64"),
        ("multi_stream.stream_sync_s=1e308", "stream_sync_s=1e+308: expected seconds in [0, 1]"),
        ("multi_stream.compute_interference=-0.5", "compute_interference=-0.5"),
        ("nonsense=1", "nonsense"),
    ],
)
def test_bad_knobs_exit_2_naming_the_knob(graph_file, knob, message):
    passes = ["--passes", "multi_stream"] if knob.startswith("multi_stream") else []
    assert_user_error(["schedule", graph_file, *passes, "-k", knob], message)


@pytest.mark.parametrize("value", [object(), b"1.05", [1.05], {"ratio": 2}, float("inf"), 1e300, True])
def test_library_knobs_raise_value_errors(value):
    with pytest.raises(ValueError, match="memory_budget"):
        schedule(small_graph(), "h100-sxm", memory_budget=value)


def test_a_huge_ratio_cannot_overflow_the_limit():
    assert MemoryBudget(ratio=1e6).limit_bytes(1 << 60) == 1 << 62
    with pytest.raises(ValueError, match=r"bytes=4611686018427387905: expected an integer in \[0, 2\*\*62\]"):
        MemoryBudget(bytes=(1 << 62) + 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_calibrate_cuda_without_cuda_is_a_user_error(tmp_path):
    assert_user_error(["calibrate", "--device", "cuda", "-o", str(tmp_path / "p.toml")], "--device cuda", "no CUDA")
    assert not (tmp_path / "p.toml").exists()


def test_overlap_raises_only_when_even_the_input_order_breaks_a_byte_budget(graph_file):
    """Item 10: the documented contract of the ``overlap`` pass (its module docstring)."""
    import commsched.passes.overlap as overlap_module
    from commsched.ir.order import ScheduleError

    assert "ScheduleError raised if even that breaks a byte budget" in overlap_module.__doc__
    g = small_graph()
    sched = schedule(g, "h100-sxm", passes="overlap", memory_budget=1.0)  # a ratio: the input order always fits
    assert len(sched.order) == len(g)
    with pytest.raises(ScheduleError, match=r"no order found within the memory budget of 1 bytes"):
        schedule(g, "h100-sxm", passes="overlap", memory_budget="1B")
    assert_user_error(["schedule", graph_file, "-k", "memory_budget=1B"], "no order found within the memory budget")
