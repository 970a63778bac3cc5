"""HSDP (issue 38): FSDP2's ``fully_shard`` on a (replicate, shard) mesh, torchtitan's
``data_parallel_replicate_degree``. Parameters are sharded over the shard group; each unit's gradient is
reduce-scattered over it, then all-reduced across the replicate group (torch 2.13,
``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, ``foreach_reduce``); on real gloo ranks the step is the
unsharded model's."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner
from zoo_helpers import FP32, assert_same_trace, check_ir, colls, numel, traced

from commsched.ir import CollType
from commsched.workloads import build, make_plan, param_layout, resolve
from commsched.workloads.presets import get_preset
from commsched.workloads.real import expected_rank_outputs, reference_outputs, run_on_gloo

KW = dict(layers=1, seq_len=256)
AG, RS, AR = CollType.ALL_GATHER, CollType.REDUCE_SCATTER, CollType.ALL_REDUCE


# ---------------------------------------------------------------- plans
def test_replicate_is_the_outer_dimension_around_the_shards():
    plan = make_plan("fsdp", 16, dp_replicate=2)
    assert plan.mesh == (("dp_replicate", 2), ("fsdp", 8)) and (plan.fsdp, plan.replicate, plan.tp) == (8, 2, 1)
    assert plan.data_parallel_degree == 16
    assert plan.group_ranks("fsdp", 9) == list(range(8, 16)) and plan.group_ranks("dp_replicate", 9) == [1, 9]
    assert plan.fsdp_index(9, expert=False) == 1 and plan.to_meta()["dp_replicate"] == 2
    cfg = get_preset("llama3-8b")
    assert [p.shard_shape for p in param_layout(cfg, plan)] == [p.shard_shape for p in
                                                                param_layout(cfg, make_plan("fsdp", 8))]  # fmt: skip
    two_d = make_plan("fsdp+tp+sp", 32, tp_size=4, dp_replicate=2)
    assert two_d.mesh == (("dp_replicate", 2), ("fsdp", 4), ("tp", 4)) and two_d.data_parallel_degree == 8
    assert two_d.group_ranks("dp_replicate", 5) == [5, 21] and two_d.group_ranks("fsdp", 5) == [1, 5, 9, 13]
    assert "dp_replicate" not in make_plan("fsdp", 16).to_meta() and make_plan("fsdp", 16, dp_replicate=1).mesh == (
        ("fsdp", 16),
    )


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(parallel="ddp", world_size=8, dp_replicate=2), ["dp_replicate=2", "fsdp", "not 'ddp'"]),
        (dict(parallel="tp", world_size=8, dp_replicate=2), ["needs parallel in"]),
        (dict(parallel="fsdp", world_size=12, dp_replicate=8), ["divide world_size=12"]),
        (dict(parallel="fsdp", world_size=8, dp_replicate=8), ["one rank", "parallel='ddp'"]),
        (dict(parallel="fsdp", world_size=8, dp_replicate=0), ["dp_replicate=0"]),
    ],
)
def test_impossible_hsdp_is_a_one_line_error(kw, words):
    with pytest.raises(ValueError) as err:
        resolve("llama3-8b", **kw)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


# ---------------------------------------------------------------- traced
def test_defaults_change_no_graph():
    """``dp_replicate=1`` and ``optimizer="none"``: node for node the graph traced without the options."""
    kw = dict(parallel="fsdp", world_size=8, layers=1, seq_len=256)
    plain, given = build("llama3-8b", **kw), build("llama3-8b", dp_replicate=1, optimizer="none", **kw)
    assert_same_trace(plain, given)
    assert plain.meta["mesh"] == {"fsdp": 8} and "dp_replicate" not in plain.meta["groups"]
    assert plain.meta["optimizer"] == "none" and "optimizer_state_bytes" not in plain.meta
    assert not any("foreach" in t or "fused_adam" in t for t in plain.graph.targets)


@pytest.mark.parametrize("bucket", ["param", "block"])
def test_each_reduce_scatter_is_all_reduced_across_the_replicas(bucket):
    """World 16 = 2 replicas x 8 shards: the all_gathers and reduce_scatters of FSDP over 8 ranks (same bytes, on the
    stride-1 group of 8), and after each reduce_scatter one all_reduce of its output shard (fp32) on the stride-8
    group of 2 (FSDP2: one per unit with ``fully_shard``'s flat buffers, here per parameter with ``param``)."""
    hsdp = traced("llama3-8b", "fsdp", 16, dp_replicate=2, fsdp_bucket=bucket, **KW)
    fsdp8 = traced("llama3-8b", "fsdp", 8, fsdp_bucket=bucket, **KW)
    check_ir(hsdp)
    g, groups = hsdp.graph, hsdp.meta["groups"]
    assert (groups["fsdp"]["size"], groups["fsdp"]["stride"]) == (8, 1)
    assert (groups["dp_replicate"]["size"], groups["dp_replicate"]["stride"]) == (2, 8)
    for ctype in (AG, RS):
        assert [g.comm_bytes[c] for c in colls(hsdp, ctype, "fsdp")] == [
            fsdp8.graph.comm_bytes[c] for c in colls(fsdp8, ctype, "fsdp")
        ]
    scatters, reduces = colls(hsdp, RS, "fsdp"), colls(hsdp, AR, "dp_replicate")
    units = 3 if bucket == "block" else len(hsdp.spec.layout)  # embed, the block, final
    assert len(scatters) == len(reduces) == units and not colls(hsdp, AR, "fsdp")
    for rs, ar in zip(scatters, reduces, strict=True):
        assert g.coll_out_bytes[rs] == g.coll_in_bytes[ar] == g.comm_bytes[ar]
        assert g.waits_of(rs)[0] in _ancestors(g, ar, depth=3), "the all_reduce reads the reduce-scattered shard"
    shards = sum(numel(p.shard_shape) for p in hsdp.spec.layout) * FP32
    assert sum(g.comm_bytes[c] for c in reduces) >= shards  # every gradient shard (and the block buckets' padding)


def test_hsdp_with_cp_shards_over_dp_shard_x_cp_inside_each_replica():
    """torchtitan's mesh for HSDP with CP: ``dp_replicate`` outside, ``dp_shard_cp`` = dp_shard x cp (FSDP's shard
    group) inside, the CP ranks its innermost factor. World 16 = 2 x (4 x 2): FSDP gathers over 8 ranks, ring
    attention rotates K/V over 2, the gradient shards are all-reduced across the 2 replicas; 8 data-parallel
    batches."""
    plan = make_plan("fsdp", 16, dp_replicate=2)
    from commsched.workloads.mesh import with_cp

    cp = with_cp(plan, 2)
    assert cp.mesh == (("dp_replicate", 2), ("fsdp", 8)) and cp.data_parallel_degree == 8
    assert cp.group_ranks("cp", 11) == [10, 11] and cp.group_ranks("fsdp", 11) == list(range(8, 16))
    assert cp.group_ranks("dp_replicate", 11) == [3, 11]
    w = traced("llama-tiny", "fsdp", 16, 1, dp_replicate=2, cp_size=2, seq_len=64)
    check_ir(w)
    sizes = {role: (info["size"], info["stride"]) for role, info in w.meta["groups"].items()}
    assert sizes["fsdp"] == (8, 1) and sizes["cp"] == (2, 1) and sizes["dp_replicate"] == (2, 8)
    assert w.meta["context_parallel"]["tokens_per_rank"] == 32 and w.meta["tokens_per_step"] == 8 * 64
    assert colls(w, AG, "cp") and len(colls(w, AR, "dp_replicate")) == len(colls(w, RS, "fsdp")) > 0


def _ancestors(g, node: int, depth: int) -> set[int]:
    seen, frontier = set(), {node}
    for _ in range(depth):
        frontier = {int(p) for f in frontier for p in g.inputs(f)} - seen
        seen |= frontier
    return seen


def test_framework_waits_the_all_reduces_at_the_end_of_the_backward():
    """FSDP2 runs HSDP's all_reduces on its all_reduce stream and waits them in ``finalize_backward``: in the
    framework order every all_reduce is waited after the backward's last reduce_scatter; predict names the
    order."""
    from commsched.cost import estimate_costs
    from commsched.passes import schedule
    from commsched.passes.baselines.framework import framework_label

    w = traced("llama3-8b", "fsdp", 16, dp_replicate=2, fsdp_bucket="block", **KW)
    g = w.graph
    costs = estimate_costs(g, "h100-sxm", fusion=False)
    order = schedule(g, costs, "framework").order
    pos = {int(v): k for k, v in enumerate(order)}
    reduces, last_scatter = colls(w, AR, "dp_replicate"), max(colls(w, RS, "fsdp"))
    waits = [int(wt) for c in reduces for wt in g.waits_of(c)]
    assert min(waits) < last_scatter  # traced: each all_reduce waited where its gradient is returned
    assert all(pos[wt] > pos[last_scatter] for wt in waits)  # FSDP2: after the backward's last reduce_scatter
    assert framework_label(g) == "FSDP2 (HSDP) eager"


def test_hsdp_gathers_inside_a_node_and_all_reduces_across():
    """llama3-8b, 1 layer, world 16 on two h100-sxm nodes: HSDP 2 x 8 gathers and scatters inside each node (each
    collective cheaper than FSDP's over the 16 ranks of both nodes) and all-reduces the gradient shards across the
    nodes; the last unit's reduce_scatter and all_reduce run one after the other at the end of the backward, so the
    predicted steps come within a few percent of each other (both compute-bound), HSDP's peak higher (shards of 1/8,
    not 1/16, and their AdamW states)."""
    from commsched.cost import estimate_costs
    from commsched.experiments.predict import StepConfig, predict_workload

    step = dict(layers=1, seq_len=8192, batch=1, ac="selective-op", fsdp_bucket="block", optimizer="adamw-fused")
    config = dict(preset="llama3-8b", parallel="fsdp", world_size=16, layers=1, seq_len=8192, batch=1,
                  ac="selective-op")  # fmt: skip
    hsdp_w, fsdp_w = traced("llama3-8b", "fsdp", 16, dp_replicate=2, **step), traced("llama3-8b", "fsdp", 16, **step)
    hsdp_c, fsdp_c = (estimate_costs(w.graph, "h100-sxm", fusion=False).node_s for w in (hsdp_w, fsdp_w))
    for ctype in (AG, RS):
        pairs = zip(colls(hsdp_w, ctype, "fsdp"), colls(fsdp_w, ctype, "fsdp"), strict=True)
        assert all(hsdp_c[h] < fsdp_c[f] for h, f in pairs), ctype
    assert hsdp_w.meta["groups"]["dp_replicate"]["stride"] == 8  # one rank of each node
    hsdp = predict_workload(hsdp_w, StepConfig(dp_replicate=2, **config))
    fsdp = predict_workload(fsdp_w, StepConfig(**config))
    assert hsdp.order == "FSDP2 (HSDP) eager" and fsdp.order == "FSDP2 eager"
    assert abs(hsdp.step_s / fsdp.step_s - 1) < 0.1
    assert hsdp.peak_memory_bytes > fsdp.peak_memory_bytes
    assert "dp_replicate 2 x fsdp 8" in hsdp.configuration_line()


# ---------------------------------------------------------------- real gloo ranks
@pytest.mark.slow
def test_hsdp_step_is_the_unsharded_models_on_gloo():
    """4 ranks, 2 replicas x 2 shards (one collective per parameter; one per unit: test_optimizer.py's gloo run): the
    loss of each rank's batch and its gradient shards of the gradient averaged over all 4 batches, as the unsharded
    model gives them. With context parallelism, 2 replicas x (dp_shard 1 x cp 2): each rank's loss is that of its
    own head-tail tokens and its gradient shards the unsharded model's (FSDP shards over the CP ranks)."""
    common = dict(parallel="fsdp", world_size=4, dp_replicate=2, seq_len=16, batch=2, dtype="float32",
                  attention="sdpa")  # fmt: skip
    specs = [resolve("llama-tiny", **common), resolve("llama-tiny", cp_size=2, **common)]
    assert (specs[1].plan.replicate, specs[1].plan.fsdp, specs[1].plan.cp) == (2, 2, 2)
    for spec, per_rank in zip(specs, run_on_gloo(specs, seed=5), strict=True):
        reference = reference_outputs(spec, seed=5)
        for rank, outputs in enumerate(per_rank):
            expected = expected_rank_outputs(spec, rank, reference)
            cp_group = spec.plan.group_ranks("cp", rank) if spec.plan.cp > 1 else [rank]
            mean_loss = sum(per_rank[r][0].item() for r in cp_group) / len(cp_group)
            assert abs(mean_loss - reference["losses"][rank // spec.plan.cp].item()) < 1e-5  # the replica's loss
            assert len(outputs) == len(expected) == 1 + len(spec.layout)
            for got, want in zip(outputs, expected, strict=True):
                err = (got - want).abs().max().item() / want.abs().max().item()
                assert err < 1e-4, f"cp {spec.plan.cp} rank {rank}: relative error {err:.2e}"
        assert not torch.equal(per_rank[0][0], per_rank[1][0])  # each rank its own batch (cp: its own tokens)


# ---------------------------------------------------------------- options and configs
def test_cli_dp_replicate_reaches_the_spec(monkeypatch):
    import commsched.workloads
    import commsched.workloads.trace
    from commsched.cli import app

    asked: list = []

    def stop(spec, progress=None):
        asked.append(spec.plan.mesh)
        raise ValueError("stopped at the trace")

    monkeypatch.setattr(commsched.workloads, "trace_spec", stop)
    monkeypatch.setattr(commsched.workloads.trace, "trace_spec", stop)
    runner = CliRunner()
    res = runner.invoke(app, ["trace", "llama3-8b", "-l", "1", "-w", "16", "--dp-replicate", "2"])
    assert res.exit_code == 2 and "stopped at the trace" in res.stderr, res.output
    assert asked == [(("dp_replicate", 2), ("fsdp", 8))]
    res = runner.invoke(app, ["trace", "llama3-8b", "-p", "ddp", "--dp-replicate", "2"])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "dp_replicate=2" in lines[0], lines


def test_torchtitan_replicate_and_shard_degrees_are_hsdp(tmp_path):
    from pathlib import Path

    from commsched.experiments.torchtitan import from_torchtitan_config

    source = Path(__file__).resolve().parents[1] / "data" / "torchtitan" / "llama3_8b.toml"
    text = source.read_text()
    assert "data_parallel_replicate_degree = 1" in text
    path = tmp_path / "hsdp.toml"
    path.write_text(text.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2"))
    step = from_torchtitan_config(path, world_size=16)
    assert (step.parallel, step.world_size, step.dp_replicate) == ("fsdp", 16, 2)
    assert step.resolve().plan.mesh == (("dp_replicate", 2), ("fsdp", 8))
    assert step.build_kwargs()["dp_replicate"] == 2


def test_torchtitan_replicate_with_context_parallel_is_hsdp_with_cp(tmp_path):
    """``data_parallel_replicate_degree`` 2 with ``context_parallel_degree`` 2 (refused before): HSDP whose shard
    group is dp_shard x cp, as torchtitan's ``dp_shard_cp`` mesh dimension."""
    from pathlib import Path

    from commsched.experiments.torchtitan import from_torchtitan_config

    text = (Path(__file__).resolve().parents[1] / "data" / "torchtitan" / "llama3_8b.toml").read_text()
    path = tmp_path / "hsdp_cp.toml"
    path.write_text(text.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2")
                    .replace("context_parallel_degree = 1", "context_parallel_degree = 2"))  # fmt: skip
    step = from_torchtitan_config(path, world_size=16)
    assert (step.parallel, step.dp_replicate, dict(step.extra)["cp_size"]) == ("fsdp", 2, 2)
    plan = step.resolve().plan
    assert plan.mesh == (("dp_replicate", 2), ("fsdp", 8)) and (plan.cp, plan.data_parallel_degree) == (2, 8)
