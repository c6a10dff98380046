"""On a GPU with fp8 tensor cores (compute capability >= 8.9): a converted linear trains on them,
and one given rows they cannot take (the weight gradient's matmul runs over the rows: multiples
of 16 only) runs as a plain linear instead of failing in the backward, as an `auto` attempt's fp8
probe of a micro-batch of 8 samples did on an H200 (skipped elsewhere; on a CPU test_fp8 tells
the same with torchao's emulation, which takes any rows)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mpjob_contract.fp8 import Fp8Spec, fp8_capable
from mpjob_trainer import float8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.unit,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not fp8_capable(float8.capability_of(torch.device("cuda"))),
        reason="needs a GPU with fp8 tensor cores",
    ),
]


@pytest.mark.parametrize("rows", [8, 24, 16, 64])
def test_a_converted_linear_trains_on_fp8_tensor_cores_whatever_its_rows(rows: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 32)).cuda()
    float8.convert(model, Fp8Spec())
    layer, plain = model[1], nn.Linear(64, 64).cuda()
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(rows, 64, device="cuda", requires_grad=True)
    with torch.autocast("cuda", torch.bfloat16):
        out = layer(x)
        same = torch.equal(out, plain(x))
    out.float().square().mean().backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    assert same is (rows % 16 != 0), "fp8 where the rows allow it, a plain linear where not"
