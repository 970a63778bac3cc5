"""Inductor's realization rule in the fusion regions' bytes (``cost/fusion.py``): a pointwise value another kernel
reads is recomputed there from what it reads, unless an extern kernel uses it or its body reads more than
REALIZE_READS_THRESHOLD buffers; and the GPU flash backward's rate per flop (``cost/compute.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from hypothesis import given, settings
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from benchmark_modules import benchmark
from commsched.cost import OpClass, graph_features
from commsched.cost.compute import FLASH_BACKWARD_RATE, backward_attention_rate
from commsched.cost.fusion import REALIZE_READS_THRESHOLD, region_boundary_bytes
from commsched.frontends.fx import from_fx
from strategies import graphs

ROOT = Path(__file__).resolve().parents[2]
N = 1 << 20


def _graph(fn, *shapes):
    with FakeTensorMode():
        args = [torch.randn(*s, dtype=torch.bfloat16) for s in shapes]
        return from_fx(make_fx(fn)(*args))


def _bytes(g, *, recompute: bool):
    f = graph_features(g)
    pointwise = f.cls == OpClass.ELEMENTWISE if recompute else None
    return f, *region_boundary_bytes(g, f.region, f.src, f.read_cap, pointwise)


def _region_of(g, f, target: str, nth: int = 0) -> int:
    return int(f.region[[i for i in range(len(g)) if g.targets[i] == target][nth]])


def scaled_cast(x):
    """A float8 tensorwise cast's shape: an upcast read by the amax kernel and by the scaling kernel after it."""
    y = x.float()
    amax = y.abs().amax()
    return (y * (448.0 / amax)).to(torch.bfloat16)


def test_an_upcast_read_by_two_kernels_is_recomputed_not_written():
    g = _graph(scaled_cast, (N,))
    f, read, written = _bytes(g, recompute=True)
    _, read_old, written_old = _bytes(g, recompute=False)
    first, second = _region_of(g, f, "aten.abs.default"), _region_of(g, f, "aten.mul.Tensor")
    assert first != second >= 0
    assert read_old[second] >= 4 * N  # before: the float32 copy (4 bytes an element), written and read back
    assert read[second] < 2 * N + 64  # now: the bfloat16 input (2 bytes an element) and a scalar
    assert written_old[first] >= 4 * N and written[first] < 64  # the first kernel writes only its amax


def test_a_value_an_extern_kernel_uses_is_written():
    def fn(x, w):
        y = x.float() * 2.0
        return (y / y.abs().amax()).sum(), (y @ w.float()).sum()

    g = _graph(fn, (1024, 1024), (1024, 64))
    f, _read, written = _bytes(g, recompute=True)
    first = _region_of(g, f, "aten.abs.default")
    assert written[first] >= 4 * 1024 * 1024  # the matmul reads the float32 value: written once


def test_a_body_reading_more_buffers_than_the_threshold_is_written_once():
    def fn(*xs):
        y = sum(x.float() for x in xs)
        return y * (1.0 / y.abs().amax())

    g = _graph(fn, *[(N,)] * (REALIZE_READS_THRESHOLD + 1))
    f, read, written = _bytes(g, recompute=True)
    first, second = _region_of(g, f, "aten.abs.default"), _region_of(g, f, "aten.mul.Tensor", -1)
    assert first != second
    assert written[first] >= 4 * N and read[second] < 4 * N + 64  # one float32 write, one read back


@settings(max_examples=80, deadline=None)
@given(graphs(max_nodes=60, p_collective=0.15))
def test_recomputing_never_writes_more(g):
    """Recompute only removes writes, keeps every byte count finite and >= 0, and with no pointwise node the rule
    is the old one exactly."""
    f, read, written = _bytes(g, recompute=True)
    _f, read_old, written_old = _bytes(g, recompute=False)
    assert np.all(written <= written_old + 1e-9)
    assert np.all(np.isfinite(read)) and np.all(read >= 0)
    none = region_boundary_bytes(g, f.region, f.src, f.read_cap, np.zeros(len(g), bool))
    assert np.array_equal(none[0], read_old) and np.array_equal(none[1], written_old)


def test_the_flash_backward_rate_is_a_gpu_kernels():
    rates = backward_attention_rate(["aten._scaled_dot_product_flash_attention_backward.default",
                                     "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"])  # fmt: skip
    assert rates.tolist() == [FLASH_BACKWARD_RATE, 1.0]


def test_the_backward_over_forward_per_flop_follows_the_h100_run():
    """Held out (the rate is the FA2 / FA3 papers'): on torch's flash kernel, 1 x 32 x 8192 full, the backward ran
    0.85 of its forward's rate per counted flop (benchmarks/data/gpu_attention_h100.csv); the model within 0.05."""
    bench = benchmark("bench_gpu")
    rows = {r["pass"]: r for r in bench.read_measured(ROOT / "benchmarks" / "data" / "gpu_attention_h100.csv")
            if (r["heads"], r["seq"], r["causal"]) == ("32", "8192", "False")}  # fmt: skip
    flops = {"forward": 1.0, "backward": 2.5}  # the backward counts 2.5 x the forward's flops

    def rate(times):
        return (flops["backward"] / times["backward"]) / (flops["forward"] / times["forward"])

    measured = rate({p: float(r["median_us"]) for p, r in rows.items()})
    model = rate({p: bench.attention_model_us(r, "h100-sxm") for p, r in rows.items()})
    assert abs(measured - 0.85) < 0.01 and abs(model - measured) < 0.05
