"""The zoo's step functions on real tensors and a real gloo process group of 4 ranks match the unsharded model:
same loss, gradient shards of the replica-averaged gradient, same logits, for every parallelism and mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from commsched.workloads import PRESETS, StepProgram, resolve
from commsched.workloads.real import expected_rank_outputs, reference_outputs, run_on_gloo

ODD = dataclasses.replace(PRESETS["llama-tiny"], vocab_size=1001, name="llama-tiny-odd-vocab")  # forces padding
# one expert a rank under EP 2, FSDP over the other 2 ranks: fewer experts than FSDP ranks, so dim 1 is sharded
TWO_EXPERTS = dataclasses.replace(PRESETS["mixtral-tiny"], n_experts=2, name="mixtral-tiny-2-experts")
CASES = [
    ("llama-tiny", dict(parallel="fsdp")),
    (ODD, dict(parallel="fsdp", fsdp_bucket="block")),
    ("llama-tiny", dict(parallel="ddp")),
    (ODD, dict(parallel="tp")),
    ("llama-tiny", dict(parallel="tp+sp")),
    ("llama-tiny", dict(parallel="tp", tp_size=2)),
    (ODD, dict(parallel="fsdp+tp", tp_size=2)),
    ("llama-tiny", dict(parallel="fsdp+tp+sp", tp_size=2)),
    ("llama-tiny", dict(parallel="fsdp+tp+sp", tp_size=2, float8="tensorwise")),  # float8 TP styles (test_float8_tp)
    ("mixtral-tiny", dict(parallel="ep")),
    ("mixtral-tiny", dict(parallel="ep", ep_size=2)),
    ("mixtral-tiny", dict(parallel="fsdp")),
    ("mixtral-tiny", dict(parallel="fsdp+ep")),  # 4 experts' ranks: experts unsharded, dense FSDP over 4
    ("mixtral-tiny", dict(parallel="fsdp+ep", ep_size=2)),  # experts FSDP over 2 on dim 0 (4 experts a rank)
    ("mixtral-tiny", dict(parallel="fsdp+ep", ep_size=2, fsdp_bucket="block")),  # one flat collective per group
    (TWO_EXPERTS, dict(parallel="fsdp+ep")),
    (TWO_EXPERTS, dict(parallel="fsdp+ep", fsdp_bucket="block")),
    (ODD, dict(parallel="tp", mode="prefill")),
    ("llama-tiny", dict(parallel="tp+sp", mode="decode", batch=4)),
    ("mixtral-tiny", dict(parallel="ep", mode="decode", batch=4)),
]


def p_name(preset) -> str:
    return getattr(preset, "name", preset)


def _spec(preset, kw):
    return resolve(preset, world_size=4, seq_len=16, batch=kw.pop("batch", 2), dtype="float32", attention="sdpa", **kw)


@pytest.mark.slow
def test_parallel_steps_match_the_unsharded_model():
    specs = [_spec(p, dict(kw)) for p, kw in CASES]
    results = run_on_gloo(specs, seed=3)
    for (preset, kw), spec, per_rank in zip(CASES, specs, results, strict=True):
        reference = reference_outputs(spec, seed=3)
        for rank, outputs in enumerate(per_rank):
            expected = expected_rank_outputs(spec, rank, reference)
            assert len(outputs) == len(expected)
            for got, want in zip(outputs, expected, strict=True):
                scale = want.abs().max().item()
                if scale == 0:  # a shard of FSDP padding alone (the 2-row router over 4 ranks): zeros, exactly
                    assert p_name(preset) == TWO_EXPERTS.name and got.abs().max().item() == 0
                    continue
                err = (got - want).abs().max().item() / scale
                assert err < 1e-4, f"{p_name(preset)} {kw} rank {rank}: relative error {err:.2e}"


def test_reference_step_learns_and_is_deterministic():
    """The single-rank step is the model the parallel runs are checked against: its loss starts near ln(vocab)
    and one SGD step on its gradients lowers it."""
    spec = resolve("llama-tiny", parallel="none", world_size=1, seq_len=16, batch=2, dtype="float32", attention="sdpa")
    program = StepProgram(spec, groups={}, rank=0)
    inputs = program.real_inputs(seed=1)
    loss, *grads = program.step(*inputs)
    assert abs(loss.item() - torch.log(torch.tensor(1024.0)).item()) < 0.5
    again = program.step(*program.real_inputs(seed=1))[0]
    assert again.item() == loss.item()
    with torch.no_grad():
        for p, g in zip(inputs[: len(grads)], grads, strict=True):
            p -= 1.0 * g
    assert program.step(*inputs)[0].item() < loss.item()
