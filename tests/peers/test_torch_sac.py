"""torch's ``sac_ilp`` on a zoo model (commsched.peers.torch_sac): the stand-in fit recovers a piecewise-linear curve,
the discard fractions map to the zoo's policies never discarding less, and the MILP answers as torch's own tests
expect: nothing checkpointed under a loose budget, the blocks checkpointed under a binding one, no plan under an
impossible one."""

from __future__ import annotations

import numpy as np
import pytest

from commsched.peers.torch_sac import PiecewiseLinFit, SacIlpPlan, as_block_policies


def test_the_fit_recovers_a_two_segment_curve():
    x = np.linspace(0.0, 1.0, 11)
    y = np.where(x < 0.4, 0.1 * x, 0.04 + 2.0 * (x - 0.4))
    fit = PiecewiseLinFit(x, y)
    fit.fit(n_segments=2)
    assert fit.fit_breaks.tolist() == pytest.approx([0.0, 0.4, 1.0])
    assert fit.calc_slopes().tolist() == pytest.approx([0.1, 2.0])
    assert fit.intercepts.tolist() == pytest.approx([0.0, 0.04 - 0.8])


def test_discard_fractions_map_to_no_less_recompute_than_asked():
    plan = SacIlpPlan((0.0, 0.3, 0.55, 0.9), 1.0, 1, 1, 1)
    assert as_block_policies(plan, 0.55) == ("none", "selective-op", "selective-op", "full")


def test_sac_milp_on_the_zoo_model_answers_as_torchs_tests_expect():
    """llama-tiny, 2 layers of 1024 tokens, FSDP over 4 ranks: budget 1.0 x its own no-AC peak: nothing discarded,
    recompute 0; 0.8: blocks checkpointed, a positive recompute time, a peak bound within the budget; 0.05: no
    solution (peak -1)."""
    pytest.importorskip("pulp")
    from commsched.hardware import get
    from commsched.peers.torch_sac import ilp_graph, sac_ilp_plan
    from commsched.workloads import resolve

    spec = resolve("llama-tiny", parallel="fsdp", world_size=4, layers=2, seq_len=1024)
    g = ilp_graph(spec, get("h100-sxm"))
    loose = sac_ilp_plan(g, 4, 1.0)
    assert loose.discard == (0.0, 0.0) and loose.recompute_ms == 0 and 0 < loose.peak_bytes <= loose.budget_bytes
    binding = sac_ilp_plan(g, 4, 0.8)
    assert any(r > 0 for r in binding.discard) and binding.recompute_ms > 0
    assert binding.peak_bytes <= binding.budget_bytes * 1.001  # sac_milp rounds its GiB figures
    assert sac_ilp_plan(g, 4, 0.05).peak_bytes == -1
