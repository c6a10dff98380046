"""bench/gpu_profile.py: kernels grouped by kind, and a profiled run's breakdown per step."""

from __future__ import annotations

from typing import Any

import pytest

from bench import gpu_profile

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("kernel", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "matmul"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
        ("triton_per_fused__to_copy_add_native_layer_norm_0", "fused (inductor)"),
        ("triton_red_fused_abs_amax_clamp_0", "amax"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("Memcpy DtoH (Device -> Pinned)", "copy"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "other"),
    ],
)
def test_kernels_are_grouped_by_kind(kernel: str, kind: str) -> None:
    assert gpu_profile.kind_of(kernel) == kind


def kernel(name: str, us: float, external: int, cat: str = "kernel") -> dict[str, Any]:
    return {"cat": cat, "name": name, "ts": 0, "dur": us, "args": {"External id": external}}


def op(name: str, external: int, types: list[str], ts: float = 0) -> dict[str, Any]:
    return {"cat": "cpu_op", "name": name, "ts": ts, "dur": 1, "args": {"External id": external, "Input type": types}}


FP8, BF16 = "c10::Float8_e4m3fn", "c10::BFloat16"


def test_a_cuda_trace_is_broken_down_per_step_with_fp8s_own_matmuls() -> None:
    trace = {
        "traceEvents": [
            op("aten::_scaled_mm", 1, [FP8, FP8, "float", "float"]),
            kernel("nvjet_qqtst_128x128_64x4_1x2_h_bz_coopB_TNT", 6000, 1),
            op("aten::mm", 2, [BF16, BF16]),
            kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", 2000, 2),
            op("aten::amax", 3, ["float"], ts=10999),
            kernel("triton_red_fused_abs_amax_0", 1000, 3),
            kernel("Memcpy DtoH (Device -> Pinned)", 1000, 4, cat="gpu_memcpy"),
            {"cat": "trace metadata", "name": "no duration"},
        ]
    }
    figures = gpu_profile.trace_breakdown(trace, steps=2, step_s=0.01, label="fp8")
    assert figures["device"] == "cuda" and figures["steps"] == 2
    assert figures["busySecondsPerStep"] == pytest.approx(0.005) and figures["busyShare"] == pytest.approx(0.5)
    assert figures["byKind"] == pytest.approx({"matmul": 0.8, "amax": 0.1, "copy": 0.1})
    assert figures["byKindSecondsPerStep"]["matmul"] == pytest.approx(0.004)
    assert figures["fp8MatmulShare"] == pytest.approx(0.6)
    # the copy launched no operator and is not counted; amax's fp32 is
    assert figures["lowPrecisionShare"] == pytest.approx(8000 / 9000)
    assert figures["capturedStepSeconds"] == pytest.approx(0.0055)  # the operators spanned 11 ms
    assert figures["top"][0] == ["nvjet_qqtst_128x128_64x4_1x2_h_bz_coopB_TNT", pytest.approx(0.003)]
    lines = gpu_profile.profile_lines(figures)
    assert lines[0] == "profile of 2 fp8 steps, kernels by kind (ms/step, share):"
    assert "  busy 5.00 ms of a 10.00 ms step: 50.0 %" in lines
    assert "  fp8 matmuls (aten::_scaled_mm) 60.0 % of the time" in lines


def test_a_cpu_trace_counts_operators_by_their_own_time() -> None:
    outer = {"cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 100, "pid": 1, "tid": 1, "args": {}}
    inner = {"cat": "cpu_op", "name": "aten::addmm", "ts": 10, "dur": 60, "pid": 1, "tid": 1, "args": {}}
    figures = gpu_profile.trace_breakdown({"traceEvents": [outer, inner]}, steps=1, step_s=None, label="bf16")
    assert figures["device"] == "cpu" and figures["busyShare"] is None and figures["fp8MatmulShare"] == 0
    top = {name: seconds for name, seconds in figures["top"]}
    assert top == pytest.approx({"aten::addmm": 60e-6, "aten::linear": 40e-6})


def test_a_profile_not_written_says_why() -> None:
    lines = gpu_profile.profile_lines({"precision": "fp8", "unavailable": "Failed: the trace has more than ..."})
    assert lines == ["profile of fp8 steps: none written (Failed: the trace has more than ...)"]
