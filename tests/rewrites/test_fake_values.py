"""The rewrites' fake values by meta kernel (``fxutil._meta_ops``) are the ones FakeTensorMode's own dispatch gives:
same type, shape, strides, storage offset, dtype, device, and the same aliasing (which nodes share a storage), on
every node of bucketed and decomposed zoo steps."""

from __future__ import annotations

import pytest
import torch

from commsched.rewrites import fxutil


def _describe(gm: torch.fx.GraphModule) -> dict[str, object]:
    """Every node's value as comparable data; a tensor's storage is named by the first node that holds it."""
    owner: dict[int, str] = {}

    def one(name: str, v: object) -> object:
        if isinstance(v, (list, tuple)):
            return [one(name, x) for x in v]
        if not isinstance(v, torch.Tensor):
            return repr(v)
        storage = owner.setdefault(v.untyped_storage()._cdata, name)
        return (type(v).__name__, tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, str(v.device), storage)

    return {n.name: one(n.name, n.meta.get("val")) for n in gm.graph.nodes}


def _both_ways(monkeypatch, rewrite) -> None:
    fast_calls = []
    meta_val = fxutil._meta_val

    def counted(*args):
        out = meta_val(*args)
        fast_calls.append(out is not fxutil._NO_FAST)
        return out

    monkeypatch.setattr(fxutil, "_meta_val", counted)
    fast = _describe(rewrite())
    assert sum(fast_calls) > 10, "the meta-kernel path was not taken"
    monkeypatch.setattr(fxutil, "_meta_ops", frozenset)  # every value through FakeTensorMode's dispatch
    slow = _describe(rewrite())
    assert fast.keys() == slow.keys()
    diff = [name for name in fast if fast[name] != slow[name]]
    assert not diff, f"{diff[0]}: {fast[diff[0]]} != {slow[diff[0]]}"


@pytest.mark.parametrize("early_use", [True, False])
def test_bucketed_fsdp_step_values_match_fake_dispatch(monkeypatch, early_use):
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.rewrites import BucketConfig, apply_bucket_plan, plan_buckets
    from commsched.workloads import build

    w = build("llama-tiny", parallel="fsdp", world_size=4, layers=2, seq_len=16, batch=2)
    hw = get("h100-sxm", num_nodes=1)
    cfg = BucketConfig(overlap_aware=False, cap_bytes=1 << 30, early_use=early_use)
    plan = plan_buckets(w.graph, estimate_costs(w.graph, hw), None, hardware=hw, config=cfg)
    assert any(b.merged for b in plan.buckets)
    _both_ways(monkeypatch, lambda: apply_bucket_plan(w.graph_module, w.graph, plan, None, recompile=False).gm)


@pytest.mark.parametrize(("parallel", "dim"), [("tp+sp", "m"), ("tp+sp", "n"), ("fsdp+tp", "n")])
def test_decomposed_tp_step_values_match_fake_dispatch(monkeypatch, parallel, dim):
    from commsched.rewrites.decompose_tp import TPSplit, decompose_tp, find_tp_sites
    from commsched.workloads import build

    w = build("llama-tiny", parallel=parallel, world_size=4, layers=1, seq_len=16, batch=2)
    sites = find_tp_sites(w.graph_module)
    splits = [TPSplit(x.collective, "m" if x.pattern == "ag_mm" else dim, 2) for x in sites]
    _both_ways(monkeypatch, lambda: decompose_tp(w.graph_module, splits, graph=w.graph).gm)
