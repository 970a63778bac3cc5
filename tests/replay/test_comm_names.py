"""Communication is found by default under the names the libraries users run give their kernels, and a what-if
that matches nothing (or would take the step past the simulator's horizon) is a one-line error, never a no-op."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from replay_helpers import DATA, NCCL_TRACE

from commsched.replay.kineto import DEFAULT_COMM_PATTERNS, compile_patterns, read_trace
from commsched.replay.run import replay, replay_traces
from commsched.replay.whatif import parse_scale
from commsched.replay.work import COMM
from hostile import assert_user_error

# Real kernel names, each from where it was seen (Kineto demangles a kernel's name, template arguments included):
DPSK_EP = [  # DeepSeek-V3 training trace, deepseek-ai/profile-data train.json (DeepEP vendored as dpsk::ep)
    "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, "
    "dpsk::ep::internode::SourceMeta*, int4 const*, float const*, long const*, float const*, int*, int*, int*, int*, "
    "int const*, int const*, int const*, int const*, int, int, int, int, int, bool const*, void*, int, int, void**, "
    "int, int, int, int, int*)",
    "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*, "
    "int4 const*, float const*, int4 const*, int4 const*, int const*, int const*, int const*, int const*)",
    "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int, int const*, int*, int const*, int*, "
    "int, bool const*, int, int, int, int, int, int)",
    "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*, int const*, int*, "
    "void*, void**, int**, int, int, int, int*, bool)",
]
COMM_NAMES = [
    *DPSK_EP,
    # DeepEP as published (deepseek-ai/DeepEP csrc/kernels/{intranode,internode,internode_ll}.cu, and under
    # deep_ep::legacy:: since the elastic rewrite; deep_ep/include/deep_ep/impls/*.cuh for deep_ep::elastic)
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int, int*, int*, "
    "int, int, int, void**, int**, int)",
    "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int**, int)",
    "void deep_ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*, int const*, int*)",
    "void deep_ep::internode_ll::dispatch<false, false, 3, 10, 7168>(void*, float*, int*, long*, int*)",
    "void deep_ep::legacy::internode::combine<false, 8, 16, 24>(int4*, float*, bool const*, int4 const*)",
    "void deep_ep::elastic::hybrid_dispatch_impl<true, false, 132, 4, 8, 8, 2, 2, 7168, 56, 4096, 256, 8, 128, 4>()",
    # NCCL (HTA's test traces: tests/cost/data/kineto, tests/replay/data), NCCL >= 2.19 and RCCL (ncclDevKernel_*)
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    # NVSHMEM (NVIDIA nvshmem src: nvshmemi_proxy_quiet_entrypoint, nvshmemi_reduce_kernel)
    "nvshmemi_proxy_quiet_entrypoint()",
    "void nvshmemi_reduce_kernel<float, (rdxn_ops)4>(int, int, int, float*, float const*, unsigned long, float*)",
    # torch symmetric memory (torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemory{,Ops}.cu)
    "void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, c10::BFloat16*, "
    "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
    "void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long, unsigned int**, "
    "unsigned long, unsigned long)",
    "c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, unsigned long)",
    # copy-engine transfers between GPUs (Kineto's memcpy naming, pytorch/kineto libkineto/src/CuptiActivity.cpp)
    "Memcpy PtoP (Device -> Device)",
]
NOT_COMM = [
    # the same DeepSeek-V3 trace: DeepEP's layout kernel only counts tokens, the grouped GEMM computes
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
    "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>"
    "(dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel::Params)",
    "void deep_ep::legacy::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int)",
    "void deep_ep::elastic::dispatch_copy_epilogue_impl<128, 7168>(void*, void*, int*)",
    # a copy within one device (HTA's NCCL trace has 960 of them) and torch's own reductions
    "Memcpy DtoD (Device -> Device)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
    "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
    "unsigned int, float, 4>)",
    "void at::native::_scatter_gather_elementwise_kernel<128, 4>(int, at::native::_cuda_scatter_gather_internal)",
]


def _is_comm(name: str) -> bool:
    return any(p.search(name) for p in compile_patterns(DEFAULT_COMM_PATTERNS))


@pytest.mark.parametrize("name", COMM_NAMES, ids=lambda n: n[:48])
def test_the_libraries_kernels_are_communication_by_default(name):
    assert _is_comm(name)


@pytest.mark.parametrize("name", NOT_COMM, ids=lambda n: n[:48])
def test_local_work_is_not_communication(name):
    assert not _is_comm(name)


def test_peer_copies_are_told_from_copies_within_a_device_by_their_args():
    # Kineto's peer-copy record (CUpti_ActivityMemcpy2) names fromDevice / toDevice; a plain memcpy only "device"
    from commsched.replay.kineto import is_peer_copy

    assert is_peer_copy({"fromDevice": 0, "inDevice": 0, "toDevice": 1})
    assert not is_peer_copy({"fromDevice": 3, "inDevice": 3, "toDevice": 3})
    assert not is_peer_copy({"device": 0, "context": 1, "stream": 7, "bytes": 131072})


SENDRECV = DATA / "hta_sampled_rank1.json.gz"  # a real rank of a recommendation model: 10 NCCL SendRecv kernels
KEPT_ARGS = ("device", "stream", "correlation", "External id", "queued", "context")


def _deepep_trace(tmp_path: Path) -> Path:
    """HTA's sampled rank 1 with its NCCL kernels renamed to DeepEP's vendored names (in turn), any other args
    dropped: only the names say that they communicate."""
    data = json.loads(gzip.decompress(SENDRECV.read_bytes()))
    k = 0
    for e in data["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel"):
            e["name"] = DPSK_EP[k % len(DPSK_EP)]
            k += 1
            e["args"] = {key: v for key, v in e["args"].items() if key in KEPT_ARGS}
    assert k == 10
    path = tmp_path / "deepep_rank1.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Length of the intersection of two unions of disjoint sorted intervals."""
    total, j = 0.0, 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            total += max(0.0, min(b, ys[k][1]) - max(a, ys[k][0]))
            k += 1
    return total


def _from_timestamps(path: Path) -> tuple[float, float]:
    """(exposed communication s, overlap ratio) straight from the trace's kernel timestamps, as HTA defines them:
    communication kernels (here: the DeepEP ones) against every other kernel; memcpys and memsets count for
    neither."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "dpsk::ep::" in e["name"]])
    comp = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels if "dpsk::ep::" not in e["name"]])
    comm_us = sum(b - a for a, b in comm)
    both_us = _covered(comm, comp)
    return (comm_us - both_us) * 1e-6, both_us / comm_us


def test_a_deepep_trace_replays_with_its_communication_found(tmp_path):
    path = _deepep_trace(tmp_path)
    t = read_trace(path)
    comm = np.flatnonzero(t.role == COMM)
    assert len(comm) == 10 and all("dpsk::ep::internode::" in t.names[i] for i in comm)
    assert not t.collectives  # nothing but the names
    r = replay(t)
    exposed_s, overlap = _from_timestamps(path)
    assert exposed_s > 0.01 and 0 < overlap < 1
    for timing in (r.measured, r.replayed):
        assert timing.exposed_comm_s == pytest.approx(exposed_s, abs=1e-6)
        assert timing.overlap_ratio == pytest.approx(overlap, abs=1e-6)
    # the same numbers as the NCCL trace it was made from
    nccl = replay(read_trace(SENDRECV))
    assert (r.measured, r.replayed) == (nccl.measured, nccl.replayed)
    slower = replay(t, [parse_scale("comm=2")])
    assert slower.replayed.step_s > r.replayed.step_s * 1.05  # 1.231 s -> 1.320 s
    assert slower.replayed.exposed_comm_s > r.replayed.exposed_comm_s


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--scale", "comm=0.5"], "--scale comm=0.5: no communication was found in the trace"),
        (["--scale", "kernel:^nosuchkernel=2"], "--scale kernel:^nosuchkernel=2: no work item's name matches"),
        (["--hardware", "nosuch"], "--hardware nosuch: unknown hardware profile 'nosuch'"),
        (["--hardware", "h100-sxm"], "--hardware h100-sxm: the trace records no collective"),
    ],
)
def test_what_ifs_that_match_nothing_are_one_line_errors(args, fragment):
    # a trace of three matmuls on three streams: no communication, no collective
    assert_user_error(["replay", str(DATA / "hta_multi_stream.json.gz"), *args], fragment)


def test_an_unknown_hardware_profile_is_an_error_on_a_trace_with_collectives_too():
    with pytest.raises(ValueError, match=re.escape("--hardware nosuch: unknown hardware profile")):
        replay_traces([NCCL_TRACE], hardware="nosuch")


@pytest.mark.parametrize("factor", ["1e308", "1e12"])
def test_a_scale_past_the_simulators_horizon_is_a_one_line_error(factor):
    assert_user_error(["replay", str(NCCL_TRACE), "--scale", f"comm={factor}"],
                      "the scaled work adds up to", "the simulator's horizon")  # fmt: skip


def test_a_scale_inside_the_horizon_still_replays():
    t = read_trace(NCCL_TRACE)
    r = replay(t, [parse_scale("comm=1000")])  # about 47 s of communication: far inside 104 days
    assert r.replayed.step_s > 40 and (r.sim.end_ns >= r.sim.start_ns).all()
