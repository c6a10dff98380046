"""The fp16 loss scale the trainer makes grows after precision.lossScale.growthInterval clean
steps in a row, at the update of step growthInterval - 1 (0-based): a growthInterval not below
training.steps never gives a step a grown scale, as mpjob_contract.spec_warnings warns."""

from __future__ import annotations

import pytest
import torch

from mpjob_contract.precision import PrecisionSpec
from mpjob_trainer.precision import PrecisionPolicy

pytestmark = pytest.mark.unit


def test_the_scale_first_grows_after_growth_interval_clean_steps() -> None:
    spec = PrecisionSpec.model_validate({"lossScale": {"init": 1024, "growthInterval": 3}})
    scaler = PrecisionPolicy("fp16", torch.device("cpu"), spec).make_scaler()
    assert scaler is not None
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    used = []  # the scale each step trains with
    for _ in range(4):
        used.append(scaler.get_scale())
        optimizer.zero_grad()
        scaler.scale((weight * 2).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    assert used == [1024, 1024, 1024, 2048]  # a 3-step run never trains with the grown scale


@pytest.mark.parametrize("precision", ["fp8", "fp16", "bf16", "fp32"])
def test_only_fp16_trains_with_a_grad_scaler(precision: str) -> None:
    """The guard's overflow and loss scale rules read the attempt's GradScaler: an fp8, bf16 or fp32
    attempt has none, so spec_warnings warns of a rule on them in a job whose ladder holds no fp16."""
    policy = PrecisionPolicy(precision, torch.device("cpu"), PrecisionSpec())  # type: ignore[arg-type]
    assert (policy.make_scaler() is not None) == (precision == "fp16") == policy.uses_scaler
