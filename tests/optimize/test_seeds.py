"""``optimize(..., seeds=...)``: the orders the user runs today, judged like the other variants and the scheduler
started from the fastest. Never slower than any seed, never over the budget, a relative budget taken from the
largest seed peak; bad seeds are one-line errors naming the seed; without seeds nothing changes."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import commsched
from commsched.cost import estimate_costs
from commsched.hardware import for_graph
from commsched.passes import MemoryBudget, Schedule, check_schedule, schedule
from commsched.sim import simulate_costs
from commsched.workloads import build
from orders import random_topo_order
from strategies import graphs


def assert_seeded(o, g, seeds: dict) -> None:
    """The invariants of a seeded search: the kept order is valid and judged as returned, within the budget, and
    no slower than any seed simulated as given."""
    check_schedule(o.graph, o.schedule.order, allow_collective_reorder=True)
    assert simulate_costs(o.graph, o.costs, o.schedule.order).makespan_ns == o.after.makespan_ns
    assert o.after.peak_memory_bytes <= o.budget_bytes
    for label, order in seeds.items():
        seed = simulate_costs(g, o.costs, order)
        assert o.after.makespan_ns <= seed.makespan_ns, label
        assert next(t for t in o.tried if t.label == label).makespan_s == seed.makespan_s
    assert sum(t.verdict == "kept" for t in o.tried) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_nodes=50), st.integers(1, 3), st.sampled_from([1.0, 1.05, 1.5, None]),
       st.randoms(use_true_random=False))  # fmt: skip
def test_never_slower_than_any_seed_nor_over_the_budget(g, count: int, ratio: float | None, rnd) -> None:
    seeds = {f"seed {k}": random_topo_order(g, rnd) for k in range(count)}
    o = commsched.optimize(g, "h100-sxm", memory_budget=ratio, seeds=seeds)
    assert_seeded(o, g, seeds)
    seed_peak = max(simulate_costs(g, o.costs, s).peak_memory_bytes for s in seeds.values())
    assert o.budget_bytes == MemoryBudget.parse(ratio).limit_bytes(seed_peak)
    seed_ns = {k: simulate_costs(g, o.costs, order).makespan_ns for k, order in seeds.items()}
    started = [t.label.removesuffix(", scheduled") for t in o.tried[2:] if t.label.endswith(", scheduled")]
    assert [t.label for t in o.tried[: 2 + count]] == ["traced order", "traced program, scheduled", *seeds]
    assert len(started) == 1 and seed_ns[started[0]] == min(seed_ns.values())  # from the fastest seed


@given(graphs(max_nodes=40), st.randoms(use_true_random=False))
@settings(max_examples=15, deadline=None)
def test_an_absolute_budget_stays_absolute(g, rnd) -> None:
    seeds = {"mine": random_topo_order(g, rnd)}
    traced_peak = simulate_costs(g, estimate_costs(g, for_graph("h100-sxm", g))).peak_memory_bytes
    o = commsched.optimize(g, "h100-sxm", memory_budget=MemoryBudget(bytes=traced_peak), seeds=seeds)
    assert o.budget_bytes == traced_peak
    assert o.after.peak_memory_bytes <= traced_peak  # the traced order itself fits it


@pytest.fixture(scope="module")
def fsdp_deep():
    """llama3-8b FSDP on 8 ranks, 4 layers: where the budget binds, the framework's order is what the user runs."""
    w = build("llama3-8b", parallel="fsdp", world_size=8, layers=4, seq_len=2048)
    hw = for_graph("h100-sxm", w.graph)
    return w.graph, hw, schedule(w.graph, estimate_costs(w.graph, hw), "framework").order


@pytest.mark.parametrize("ratio", [1.0, 1.05])
def test_the_framework_order_as_seed_on_a_zoo_step(fsdp_deep, ratio: float) -> None:
    g, hw, framework = fsdp_deep
    seeds = {"FSDP2 order": framework}
    o = commsched.optimize(g, hw, memory_budget=ratio, seeds=seeds)
    assert_seeded(o, g, seeds)
    scheduled = next(t for t in o.tried if t.label == "FSDP2 order, scheduled")
    assert scheduled.makespan_s is not None  # the scheduler ran from the seed
    plain = commsched.optimize(g, hw, memory_budget=ratio)
    assert o.before.makespan_ns == plain.before.makespan_ns
    assert o.after.makespan_ns <= plain.after.makespan_ns or o.budget_bytes < plain.budget_bytes


def test_without_seeds_nothing_changes(fsdp_deep) -> None:
    g, hw, _ = fsdp_deep
    o = commsched.optimize(g, hw, seeds={})
    plain = commsched.optimize(g, hw)
    assert [str(t) for t in o.tried] == [str(t) for t in plain.tried]
    assert o.budget_bytes == int(o.before.peak_memory_bytes * 1.05)


def test_bad_seeds_name_the_seed(fsdp_deep) -> None:
    g, hw, framework = fsdp_deep
    backwards = framework[::-1].copy()
    with pytest.raises(ValueError, match=r"seeds\['FSDP2 order'\]: .*"):
        commsched.optimize(g, hw, seeds={"FSDP2 order": backwards})
    with pytest.raises(ValueError, match=r"seeds\['short'\]: .*expected one per node"):
        commsched.optimize(g, hw, seeds={"short": framework[:-1]})
    with pytest.raises(ValueError, match="seeds: label 'traced order'"):
        commsched.optimize(g, hw, seeds={"traced order": framework})
    streams = np.zeros(len(g), np.int32)
    with pytest.raises(ValueError, match=r"seeds\['two'\]: a multi-stream schedule"):
        commsched.optimize(g, hw, seeds={"two": Schedule(g, framework, streams=streams)})
    with pytest.raises(ValueError, match=r"seeds\['typo'\]: unknown pass 'framewrk'"):
        commsched.optimize(g, hw, seeds={"typo": "framewrk"})
    by_pass = commsched.optimize(g, hw, seeds={"FSDP2 order": "framework"})
    assert [str(t) for t in by_pass.tried] == [
        str(t) for t in commsched.optimize(g, hw, seeds={"FSDP2 order": framework}).tried
    ]
    o = commsched.optimize(g, hw, seeds={"as a Schedule": Schedule(g, framework)})
    assert any(t.label == "as a Schedule, scheduled" for t in o.tried)
    names = [g.names[i] for i in random_topo_order(g, random.Random(0)).tolist()]
    assert any(t.label == "by name" for t in commsched.optimize(g, hw, seeds={"by name": names}).tried)


def test_a_traced_module_with_a_seed_keeps_its_families(fsdp_module) -> None:
    """With the FX module the families run too, after the seeds (they read the traced program's variants first):
    the kept module is never slower than the seed, and every family still proposes its variants."""
    w = fsdp_module
    sizes = w.graph.group_sizes()
    o = commsched.optimize(w.graph_module, "h100-sxm", group_sizes=sizes, seeds={"FSDP2 order": "framework"})
    plain = commsched.optimize(w.graph_module, "h100-sxm", group_sizes=sizes)
    seed = next(t for t in o.tried if t.label == "FSDP2 order")
    assert o.after.makespan_s <= seed.makespan_s * (1 + 1e-3)  # as returned: fusion follows the module's order
    families = {t.label.split(" (")[0] for t in plain.tried[2:]}  # what each family built, e.g. "bucketed"
    assert families and families <= {t.label.split(" (")[0] for t in o.tried}
    assert [t.label for t in o.tried[:4]] == [
        *(t.label for t in plain.tried[:2]),
        "FSDP2 order",
        "FSDP2 order, scheduled",
    ]
    assert o.after.peak_memory_bytes <= o.budget_bytes == int(seed.peak_memory_bytes * 1.05)


@pytest.fixture(scope="module")
def fsdp_module():
    """llama-tiny FSDP on 4 ranks, 2 layers, with its GraphModule."""
    return build("llama-tiny", parallel="fsdp", world_size=4, layers=2)


def test_the_cli_seed_keeps_the_answer_no_slower_than_the_framework_order(tmp_path) -> None:
    """``commsched optimize --seed framework``: the framework's order is a variant, the answer is never slower than
    it (nor than its scheduled form); an unknown name exits 2 in one line before anything is traced."""
    import json

    from typer.testing import CliRunner

    from commsched.cli import app

    runner = CliRunner()
    out = tmp_path / "o.json"
    res = runner.invoke(app, ["optimize", "llama-tiny", "-w", "4", "-l", "2", "--no-references", "--seed", "framework",
                              "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    answer = json.loads(out.read_text())
    tried = {t["label"]: t for t in answer["tried"]}
    assert {"framework order", "framework order, scheduled"} <= set(tried)
    seeded = [t["makespan_s"] for label, t in tried.items() if label.startswith("framework order")]
    assert answer["step_s"] <= min(s for s in seeded if s is not None) * (1 + 1e-12)
    res = runner.invoke(app, ["optimize", "llama-tiny", "-w", "4", "-l", "2", "--seed", "nosuch"])
    assert res.exit_code == 2 and "--seed: unknown pass 'nosuch'" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "trace" not in res.output.lower().split("--seed")[0]
