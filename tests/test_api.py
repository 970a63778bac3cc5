"""The public API's one way in: the same hardware arguments for schedule / simulate / estimate_costs, pass and
preset names resolved in one place, and knobs checked (names, types, allowed values) before any work."""

from __future__ import annotations

import numpy as np
import pytest

import commsched
from commsched import hardware
from commsched.cost import estimate_costs
from programs import trace_program


@pytest.fixture(scope="module")
def graph16():
    _, g = trace_program("fsdp_mlp", 16, layers=2, dim=256)  # 16 ranks: two nodes of 8 GPUs
    return g


def test_same_hardware_arguments_everywhere(graph16):
    g = graph16
    explicit = estimate_costs(g, hardware.get("h100-sxm", num_nodes=2))
    inferred = estimate_costs(g, "h100-sxm")  # nodes from the world size
    assert inferred.meta["num_nodes"] == 2
    np.testing.assert_array_equal(explicit.node_s, inferred.node_s)
    s = commsched.schedule(g, "h100-sxm", "default", num_nodes=2)
    assert np.array_equal(s.order, commsched.schedule(g, explicit, "default").order)
    assert np.array_equal(s.order, commsched.schedule(g, "h100-sxm", "default").order)
    r = commsched.simulate(g, "h100-sxm", s.order, num_nodes=2)
    assert r.makespan_ns == commsched.simulate_costs(g, explicit, s.order).makespan_ns
    assert commsched.simulate(g, explicit, s.order).makespan_ns == r.makespan_ns  # a CostEstimate, as schedule
    four_per_node = estimate_costs(g, hardware.get("h100-sxm", num_nodes=4, gpus_per_node=4)).node_s
    np.testing.assert_array_equal(commsched.estimate(g, "h100-sxm", gpus_per_node=4), four_per_node)


def test_hardware_argument_errors(graph16):
    g = graph16
    with pytest.raises(ValueError, match="spans 2 nodes"):
        commsched.schedule(g, "h100-sxm", num_nodes=1)
    with pytest.raises(ValueError, match="a CostEstimate is already estimated"):
        commsched.schedule(g, estimate_costs(g, "h100-sxm"), num_nodes=2)
    with pytest.raises(FileNotFoundError, match="unknown hardware profile 'h900'"):
        commsched.simulate(g, "h900")


def test_pass_and_preset_resolution():
    from commsched.passes import PRESETS, resolve_passes

    assert resolve_passes("default") == ["overlap"] == resolve_passes(["default"])
    assert resolve_passes("torch") == resolve_passes(["torch"]) == PRESETS["torch"]  # a preset inside a list too
    assert resolve_passes("sink_waits, raise_comms") == ["sink_waits", "raise_comms"]
    assert resolve_passes(["decide_global_ordering_of_comms", "default"]) == [
        "decide_global_ordering_of_comms",
        "overlap",
    ]
    assert resolve_passes("none") == [] == resolve_passes("")
    custom = resolve_passes  # any callable is kept as is
    assert resolve_passes(["default", custom]) == ["overlap", custom]
    with pytest.raises(ValueError, match=r"unknown pass 'nope'; known passes: \[.*'overlap'.*presets: \[.*'torch'"):
        resolve_passes("overlap,nope")


def test_default_passes_are_ours(graph16):
    costs = estimate_costs(graph16, "h100-sxm")
    s = commsched.schedule(graph16, costs)
    assert s.passes == ["overlap"]
    assert np.array_equal(s.order, commsched.schedule(graph16, costs, "default").order)


# ------------------------------------------------------------------------------------------------------------ knobs
def test_flat_knobs_set_every_pass_that_has_the_field():
    from commsched.passes import MemoryBudget, check_knobs

    configs = check_knobs(["overlap", "multi_stream"], {"memory_budget": 1.1})
    assert configs["overlap"].memory_budget == MemoryBudget(ratio=1.1) == configs["multi_stream"].memory_budget
    assert check_knobs(["overlap", "exact"], {"memory_budget": "40GiB"})["exact"].memory_budget.bytes == 40 << 30


def test_a_pass_namespace_sets_one_pass_over_a_flat_knob():
    from commsched.passes import MemoryBudget, check_knobs

    knobs = {"memory_budget": 1.1, "multi_stream": {"memory_budget": None, "compute_streams": 3}}
    configs = check_knobs(["overlap", "multi_stream"], knobs)
    assert configs["overlap"].memory_budget == MemoryBudget(ratio=1.1)
    assert configs["multi_stream"].memory_budget.unlimited and configs["multi_stream"].compute_streams == 3


def test_knob_values_are_converted_to_the_field_types():
    from commsched.passes import MemoryBudget, check_knobs

    cfg = check_knobs("default", {"memory_budget": 1, "variants": [["input", True]], "reorder_collectives": "true"})
    assert cfg["overlap"].memory_budget == MemoryBudget(ratio=1.0)  # an int where a ratio goes
    assert cfg["overlap"].variants == (("input", True),)  # JSON lists become the tuples the field holds
    assert cfg["overlap"].reorder_collectives is True
    ms = check_knobs(["multi_stream"], {"role_streams": {"comm": [0]}, "compute_interference": 0})["multi_stream"]
    assert ms.role_streams == {"comm": (0,)} and ms.compute_interference == 0.0
    assert isinstance(ms.compute_interference, float)


@pytest.mark.parametrize(
    ("passes", "knobs", "message"),
    [
        ("default", {"colour": 1}, r"unknown knob\(s\) \['colour'\] for passes \['overlap'\]: known knobs are "),
        ("default", {"overlap": {"colour": 1}}, r"unknown knob\(s\) \['overlap.colour'\]: overlap's knobs are "),
        ("default", {"exact": {"max_nodes": 9}}, r"knob namespace 'exact' .* not in the pipeline \['overlap'\]"),
        ("default", {"overlap": 3}, "knob overlap=3: a pass namespace takes a dict"),
        ("default", {"waits": "middle"}, r"knob waits='middle': expected one of 'early', 'late'"),
        ("default", {"overlap": {"waits": 1}}, r"knob overlap.waits=1: expected one of 'early', 'late'"),
        ("default", {"reorder_collectives": 2}, r"knob reorder_collectives=2: expected bool \(true or false\)"),
        ("default", {"jackson_rounds": 2.5}, r"knob jackson_rounds=2.5: expected int"),
        (
            "default",
            {"variants": [["fast", True]]},
            r"expected a tuple of \(one of 'feeds', 'feeders', 'input', 'nearest'; bool",
        ),
        ("default", {"memory_budget": 0.5}, r"knob memory_budget=0.5: memory budget ratio=0.5 must be >= 1"),
        ("default", {"memory_budget": "lots"}, r"knob memory_budget='lots': expected a memory budget"),
        (["multi_stream"], {"stream_sync_s": "x"}, r"knob stream_sync_s='x': expected float or None"),
        (["exact"], {"max_nodes": None}, r"knob max_nodes=None: expected int"),
        ("nope", {}, r"unknown pass 'nope'"),
    ],
)
def test_bad_knobs_fail_before_any_work(graph16, monkeypatch, passes, knobs, message):
    from commsched.passes import pipeline

    def no_costs(*args, **kwargs):
        raise AssertionError("costs were estimated before the knobs were checked")

    monkeypatch.setattr(pipeline, "resolve_costs", no_costs)
    with pytest.raises(ValueError, match=message):
        commsched.schedule(graph16, "h100-sxm", passes, **knobs)


def test_cli_knobs_flat_and_per_pass(tmp_path, graph16):
    from typer.testing import CliRunner

    from commsched.cli import app
    from commsched.cli.common import parse_knobs

    assert parse_knobs(["overlap.waits=late", "memory_budget=1.1", "reorder_collectives=true", "x=a b"]) == {
        "overlap": {"waits": "late"},
        "memory_budget": 1.1,
        "reorder_collectives": True,
        "x": "a b",
    }
    path = tmp_path / "g.json"
    commsched.save_graph(graph16, path)
    runner = CliRunner()
    args = ["schedule", str(path), "-s", "overlap,multi_stream", "-k", "memory_budget=40GiB"]
    res = runner.invoke(app, [*args, "-k", "multi_stream.memory_budget=null", "-k", "overlap.waits=late"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, [*args, "-k", "overlap.waits=middle"])
    assert res.exit_code == 2 and "knob overlap.waits='middle': expected one of 'early', 'late'" in res.output


def test_commsched_optimize_is_the_call_however_the_package_was_imported():
    """``import commsched`` loads names lazily; ``commsched.optimize(...)`` must stay the one call a user makes, also
    after something imported ``commsched.optimize.search`` first (the import binds the package to that name)."""
    import subprocess
    import sys

    code = ("import commsched.optimize.search, commsched\n"
            "from commsched.optimize.search import optimize\n"
            "from commsched.workloads import build\n"
            "g = build('llama-tiny', parallel='fsdp', world_size=2, layers=1).graph\n"
            "a, b = commsched.optimize(g, 'h100-sxm'), optimize(g, 'h100-sxm')\n"
            "print(a.after.makespan_s == b.after.makespan_s)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
    fresh = subprocess.run([sys.executable, "-c", "import commsched; print(commsched.optimize.__name__)"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert fresh.stdout.strip() == "optimize", fresh.stderr[-2000:]
