"""bench/gpu_profile.py: kernels grouped by kind, and a profiled run's breakdown per step."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bench import gpu_profile

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("kernel", "kind"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "matmul"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
        ("triton_per_fused__to_copy_add_native_layer_norm_0", "fused (inductor)"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("Memcpy DtoH (Device -> Pinned)", "copy"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "other"),
    ],
)
def test_kernels_are_grouped_by_kind(kernel: str, kind: str) -> None:
    assert gpu_profile.kind_of(kernel) == kind


def test_a_profiled_run_is_broken_down_per_step() -> None:
    def run() -> list[dict[str, Any]]:
        a = torch.randn(64, 64)
        for _ in range(20):
            a = torch.tanh(a @ a)
        return [{"event": "step", "step": s, "stepSeconds": 0.01, "samplesPerSecond": 1.0} for s in (5, 10, 15, 20)]

    figures = gpu_profile.step_profile(run, warmup=5, cuda=False)
    assert figures["steps"] == 20 and figures["stepSeconds"] == pytest.approx(0.01)
    assert sum(figures["byKind"].values()) == pytest.approx(1.0) and "matmul" in figures["byKind"]
    assert figures["busySecondsPerStep"] > 0 and figures["busyShare"] == pytest.approx(
        figures["busySecondsPerStep"] / 0.01
    )
    assert 0 < len(figures["top"]) <= gpu_profile.TOP
    lines = gpu_profile.profile_lines(figures)
    assert lines[0].startswith("profile of 20 bf16 steps") and any("matmul" in line for line in lines)
