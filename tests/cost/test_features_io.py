"""The trace cache's copy of a graph's cost analysis (``cost/features_io.py``, ``execute/cache.py``): read back, it
gives the costs computed without it to the bit, on traced steps and random graphs; one of another graph, format or
cost model is never taken; plan's warm path reads it instead of analysing the graph again."""

from __future__ import annotations

import collections
import dataclasses
import sys

import numpy as np
import pytest
from hypothesis import given, settings

from commsched.cost.estimate import estimate_costs, fusion_boundary_bytes, graph_features
from commsched.cost.features_io import features_npz_bytes, remember_npz
from commsched.execute import cache as trace_cache
from commsched.frontends.json_io import graph_from_dict, graph_to_dict
from commsched.hardware import get
from commsched.plan import PlanRequest, traced
from commsched.plan.layout import Layout, step_config
from strategies import graphs

estimate_module = sys.modules["commsched.cost.estimate"]  # the package's ``estimate`` is the function
H100 = get("h100-sxm")
CLUSTER = H100.with_nodes(128, 8)  # the random graphs' groups span up to 1024 ranks


def _copy(g):
    """An equal graph, another object: nothing this process computed for ``g`` is found for it."""
    return graph_from_dict(graph_to_dict(g))


def _same_costs(a, b) -> None:
    for field in ("node_s", "coll_latency_s", "coll_link", "fusion_region"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def _same_features(g, h) -> None:
    f, e = graph_features(g), graph_features(h)
    for field in dataclasses.fields(f):
        x, y = getattr(f, field.name), getattr(e, field.name)
        assert (x is None and y is None) or np.array_equal(x, y), field.name
    for x, y in zip(fusion_boundary_bytes(g), fusion_boundary_bytes(h), strict=True):
        assert np.array_equal(x, y)


@pytest.fixture(scope="module")
def step():
    """llama-tiny's training step under FSDP 2 x TP 2 with full AC, as plan traces it (2 layers)."""
    req = PlanRequest(preset="llama-tiny", gpus=4)
    config = step_config(req, Layout(dp_shard=2, tp=2, ac="full"), 2)
    return traced.traced(config, cache=False)


@pytest.mark.parametrize("fusion", [True, False])
def test_read_back_the_costs_are_the_same_to_the_bit(step, fusion) -> None:
    computed = estimate_costs(step, H100, fusion=fusion)
    again = _copy(step)
    assert remember_npz(again, features_npz_bytes(step))
    _same_features(step, again)
    _same_costs(computed, estimate_costs(again, H100, fusion=fusion))


@settings(max_examples=60, deadline=None)
@given(graphs(max_nodes=30))
def test_random_graphs_round_trip(g) -> None:
    again = _copy(g)
    assert remember_npz(again, features_npz_bytes(g))
    _same_features(g, again)
    _same_costs(estimate_costs(g, CLUSTER), estimate_costs(again, CLUSTER))


def test_an_analysis_of_another_graph_or_format_is_not_taken(step) -> None:
    data = features_npz_bytes(step)
    assert not remember_npz(_smaller(), data)
    assert not remember_npz(_copy(step), b"not an npz")
    assert not remember_npz(_copy(step), data[: len(data) // 2])


def _smaller():
    """A graph with fewer nodes than ``g`` (llama-tiny at 1 layer)."""
    req = PlanRequest(preset="llama-tiny", gpus=4)
    return traced.traced(step_config(req, Layout(dp_shard=2, tp=2, ac="full"), 1), cache=False)


def test_plan_reads_the_analysis_back_and_a_new_cost_model_misses(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(traced, "_MEMORY", collections.OrderedDict())
    req = PlanRequest(preset="llama-tiny", gpus=2)
    config = step_config(req, Layout(dp_shard=2, ac="none"), 2)
    first = traced.traced(config, cache=True)
    key = traced.trace_key_of(config)
    assert trace_cache.features_path(key).is_file()
    computed = estimate_costs(first, H100)

    monkeypatch.setattr(traced, "_MEMORY", collections.OrderedDict())
    analysed = []
    real = estimate_module.fusion_regions

    def counting(g, *args):
        analysed.append(g)
        return real(g, *args)

    monkeypatch.setattr(estimate_module, "fusion_regions", counting)  # the analysis (graph_features) calls it once
    second = traced.traced(config, cache=True)
    assert second is not first
    _same_costs(computed, estimate_costs(second, H100))
    assert analysed == []  # read back, not analysed again

    monkeypatch.setattr(traced, "_MEMORY", collections.OrderedDict())
    monkeypatch.setattr(trace_cache, "cost_digest", lambda: "another cost model")
    third = traced.traced(config, cache=True)
    assert analysed == [third]  # no analysis of another cost model is read: computed, then kept under its digest
    assert trace_cache.features_path(key).is_file()
