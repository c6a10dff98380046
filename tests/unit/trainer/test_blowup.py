"""The injected activation blow-up overflows fp16 compiled as it does eagerly (inductor's fused
pointwise chains compute in fp32 and would hide it), and stays finite in bf16."""

from __future__ import annotations

import pytest
import torch

from mpjob_trainer.tasks.blowup import ActivationBlowUp


def blown_up_module(step: int) -> ActivationBlowUp:
    module = ActivationBlowUp(at_step=10, gain=1e6)
    module.set_step(step)
    return module


@pytest.mark.parametrize("compiled", [False, True])
def test_the_blow_up_overflows_fp16_eager_and_compiled(compiled: bool) -> None:
    module = blown_up_module(step=10)
    forward = torch.compile(module) if compiled else module
    x = torch.linspace(-2, 2, 64, dtype=torch.float16)
    assert not torch.isfinite(forward(x)).all()


def test_before_its_step_and_in_bf16_the_block_stays_finite() -> None:
    x = torch.linspace(-2, 2, 64)
    assert torch.equal(blown_up_module(step=9)(x), torch.nn.functional.gelu(x))
    assert torch.isfinite(blown_up_module(step=10)(x.to(torch.bfloat16))).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_compiled_block_under_cuda_fp16_autocast_overflows() -> None:
    linear = torch.nn.Linear(64, 64).cuda()
    module = blown_up_module(step=10)
    block = torch.compile(lambda x: module(linear(x)))
    with torch.autocast("cuda", dtype=torch.float16):
        out = block(torch.randn(8, 64, device="cuda"))
    assert out.dtype == torch.float16 and not torch.isfinite(out).all()
