"""benchmarks/gpu/train_step_kernels.py proven on a CPU: a llama-tiny training step traced, run on real tensors under
the fake process group, profiled, and every costed compute node aligned to what it ran (issue 38's GPU check, ready
for a device); and ``bench_gpu.py train`` reading what it wrote."""

from __future__ import annotations

import csv
import json

import pytest

from benchmark_modules import ROOT, benchmark

torch = pytest.importorskip("torch")

CASE = {"name": "tiny-fsdp", "split": "fit", "preset": "llama-tiny", "parallel": "fsdp", "world_size": 8,
        "layers": 1, "seq_len": 128, "ac": "none", "float8": "none", "compile": False}  # fmt: skip


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The script's CPU path on one llama-tiny layer: (its output folder, the case's traced and costed graph)."""
    script = benchmark("gpu/train_step_kernels")
    out = tmp_path_factory.mktemp("train_kernels")
    cases = out / "cases.json"
    cases.write_text(json.dumps({"cases": [CASE, {**CASE, "name": "tiny-tp", "parallel": "tp", "split": "heldout"}]}))
    assert script.main([str(cases), str(out), "--device", "cpu", "--warmup", "1", "--iters", "1"]) == 0
    return out


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_every_costed_compute_node_is_matched_or_says_why(cpu_run):
    from commsched.cost import estimate_costs
    from commsched.cost.estimate import graph_features
    from commsched.cost.opclass import OpClass
    from commsched.workloads import build

    rows = [r for r in _rows(cpu_run / "kernels.csv") if r["case"] == "tiny-fsdp"]
    g = build("llama-tiny", parallel="fsdp", world_size=8, layers=1, seq_len=128, attention="sdpa").graph
    est, cls = estimate_costs(g, "h200-sxm", fusion=False), graph_features(g).cls
    costed = {
        g.names[i] for i in range(len(g)) if est.node_s[i] > 0 and cls[i] not in (OpClass.FREE, OpClass.COLLECTIVE)
    }
    by_node = {r["node"]: r for r in rows if r["node"]}
    assert costed <= set(by_node), f"costed nodes with no row: {sorted(costed - set(by_node))[:5]}"
    for r in rows:
        assert r["status"] in ("matched", "unmatched", "unattributed"), r
        if r["status"] == "matched":
            assert float(r["measured_us"]) > 0 and r["kernel_names"] and r["kernel_class"], r
            assert float(r["model_us"]) > 0, r
        else:
            assert r["reason"], f"{r['node']}: {r['status']} without a reason"
    matched = [r for r in rows if r["status"] == "matched"]
    assert len(matched) >= 0.9 * len(costed)  # on a CPU the aten ops stand in for kernels: nearly every node ran one
    # the CPU fallback classifies by the cost model's own classifier: a matmul node's ops are matmuls
    mm = [r for r in matched if r["model_class"] == "matmul"]
    assert mm and all(r["kernel_class"] == "matmul" for r in mm)


def test_steps_and_trace_written(cpu_run):
    steps = {r["case"]: r for r in _rows(cpu_run / "steps.csv")}
    assert set(steps) == {"tiny-fsdp", "tiny-tp"}
    for name, s in steps.items():
        assert (cpu_run / "traces" / f"{name}.json.gz").stat().st_size > 0
        assert float(s["step_us"]) > 0 and float(s["kernel_us"]) > 0 and float(s["model_compute_us"]) > 0
        assert int(s["nodes_matched"]) + int(s["nodes_unmatched"]) == int(s["nodes_costed"]) > 0


def test_report_fits_on_fit_cases_and_reports_held_out(cpu_run):
    table = benchmark("bench_gpu").train_table(str(cpu_run / "kernels.csv"))
    assert "| tiny-fsdp | eager | fit |" in table and "| tiny-tp | eager | heldout |" in table
    fitted = [line for line in table.splitlines() if line.startswith("| eager | matmul |")]
    assert len(fitted) == 1 and "| 1 |" in fitted[0]  # the factor from tiny-fsdp, the error on the one held-out case
    assert "measured on: cpu" in table


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "matmul"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN", "matmul"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "attention"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "reduction"),
        ("triton_poi_fused_mul_silu_1", "elementwise"),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", "elementwise"),
        ("aten::mm", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("some_unknown_kernel", "other"),
    ],
)
def test_kernel_class(name, expected):
    cls, how = benchmark("gpu/train_step_kernels").kernel_class(name)
    assert cls == expected
    assert ("aten op" in how) == name.startswith("aten::")


def test_cases_file_resolves():
    script = benchmark("gpu/train_step_kernels")
    cases = script.read_cases(ROOT / "benchmarks" / "data" / "gpu_train_cases.json", [])
    assert {c["split"] for c in cases} == {"fit", "heldout"}
    assert {c["compile"] for c in cases} == {True, False}
    for c in cases:
        script.case_spec(c, torch.device("cuda"))  # resolves (ValueError for an impossible configuration)
