"""Causal attention in the cost model: the importer marks it, the JSON format keeps it, and a causal pass costs what
its blocks cost (the forward of a TP rank's few heads nearly as much as a full one, many heads about half)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from commsched.cost import estimate_costs
from commsched.cost.compute import causal_fraction, flash_num_splits, forward_attention_efficiency
from commsched.frontends.json_io import graph_from_dict, graph_to_dict
from commsched.ir import CAUSAL_META
from commsched.workloads import build


def _attention_times(g, hardware="h100-sxm"):
    idx = [i for i, t in enumerate(g.targets) if "flash_attention" in t]
    return idx, estimate_costs(g, hardware).node_s[idx]


def _round_trip(g):
    return graph_from_dict(json.loads(json.dumps(graph_to_dict(g))))


def _without_causal(g):
    g2 = _round_trip(g)
    g2.meta.pop(CAUSAL_META)
    return g2


def test_the_importer_marks_causal_passes_and_json_keeps_them():
    g = build("llama-tiny", parallel="fsdp", world_size=2, layers=1, seq_len=16).graph
    marked = g.meta[CAUSAL_META]
    assert sorted(marked) == sorted(n for n in g.names if "flash_attention" in n)  # forward and backward
    assert build("llama-tiny", parallel="tp", world_size=2, layers=1, mode="decode").graph.meta.get(CAUSAL_META) is None
    g2 = _round_trip(g)
    assert g2.meta[CAUSAL_META] == marked
    assert np.array_equal(estimate_costs(g2, "h100-sxm").node_s, estimate_costs(g, "h100-sxm").node_s)


@pytest.mark.parametrize(
    ("parallel", "forward", "backward"), [("tp", (0.95, 0.99), (0.6, 0.9)), ("fsdp", (0.5, 0.7), (0.45, 0.65))]
)
def test_a_causal_pass_costs_its_blocks(parallel, forward, backward):
    """llama3-8b at 8192 tokens, one layer: TP 8 leaves 4 heads a rank (the forward's CTAs fit in one wave: the mask
    saves only where a short CTA leaves its SM's other one alone; 0.97 measured on one H100), FSDP all 32 (many
    waves: a mask saves about half)."""
    g = build("llama3-8b", parallel=parallel, world_size=8, layers=1, seq_len=8192).graph
    idx, causal_s = _attention_times(g)
    _, full_s = _attention_times(_without_causal(g))
    for i, c, f in zip(idx, causal_s, full_s):
        lo, hi = backward if "backward" in g.targets[i] else forward
        assert lo <= c / f <= hi, (g.targets[i], c / f)


def test_causal_fraction_edges():
    """The backward's block schedule (one CTA per SM, longest first)."""
    assert causal_fraction(1, 1, 1, 132) == 1.0  # one block: nothing masked
    assert 0.5 < causal_fraction(4096, 64, 64, 132) < 0.52  # many waves: half, plus the diagonal blocks
    assert causal_fraction(64, 8, 64, 132) > causal_fraction(64, 64, 64, 132)  # a chunk after a prefix


def test_forward_efficiency_edges():
    """The forward's schedule: about 1 for a large full pass and 2 for a large causal one (per counted flop); a CTA
    alone on its SM runs faster, but a grid of one CTA per SM uses the SMs' shared throughput less well."""
    assert 0.95 < forward_attention_efficiency(256, 8192, 8192, False, 132, 128) <= 1.0
    assert 1.9 < forward_attention_efficiency(256, 8192, 8192, True, 132, 128) <= 2.0
    lone = 4 * 32 * 32 / (2 * 132) / (32 / 1.8)  # 128 CTAs of 32 blocks, each alone on its SM
    assert forward_attention_efficiency(4, 4096, 4096, False, 132, 128) == pytest.approx(lone)


def test_split_kv_follows_flash_attention_2s_heuristic():
    """flash_api.cpp's num_splits_heuristic: 4 heads of 2048 queries (128 blocks of 64 rows, under 0.8 x 264 places)
    against 8192 keys run in 2 KV splits; 4096 queries (256 blocks) fill the places and run unsplit."""
    assert flash_num_splits(4 * 32, 2 * 132, 64) == 2
    assert flash_num_splits(4 * 64, 2 * 132, 64) == 1
    assert flash_num_splits(1, 2 * 132, 64) == 64  # one query block, decode-like: the split per KV block
