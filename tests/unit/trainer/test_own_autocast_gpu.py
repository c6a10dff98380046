"""On a CUDA machine: the per-step checks of a script's own precision code on a model compiled as
run.compile() compiles it there (inductor). The forward check (session.own_autocast) costs the
compiled forward no graph break and no recompile from step to step, and still refuses a script's
own CUDA autocast, of the attempt's dtype or another; the fp16 step check (session.steps) passes
run.step() on a fused AdamW and refuses the optimizer stepped outside it (skipped without CUDA;
on a CPU test_own_autocast and test_own_grad_scaler tell the same with the eager backend)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mpjob_contract.api import Guard, PrecisionSpec
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.own_autocast import check_forwards
from mpjob_trainer.session.steps import StepNumerics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.unit,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CUDA = torch.device("cuda")
OTHER = {"fp16": torch.bfloat16, "bf16": torch.float16}


def numerics(precision: str) -> tuple[nn.Module, StepNumerics]:
    amp = AttemptPrecision(
        precision, CUDA, PrecisionSpec.model_validate({"mode": precision, "lossScale": {"init": 1024.0}})
    )  # type: ignore[arg-type]
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)).to(CUDA)
    check_forwards([model], amp)
    return model, StepNumerics(amp, NumericGuard(Guard(), CUDA, World(rank=0, size=1, local_rank=0)))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_forward_check_compiles_whole_and_once_and_refuses_a_scripts_own_autocast(precision: str) -> None:
    torch._dynamo.reset()
    model, steps = numerics(precision)
    amp, x = steps.precision, torch.randn(8, 64, device=CUDA)
    compiled = torch.compile(model, fullgraph=True)  # a graph break in the hook would raise
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def train(step: int) -> None:  # run.autocast(), run.backward(), run.step(), run.end_step()
        with amp.autocast():
            loss = compiled(x).float().square().mean()
        steps.backward(loss)
        steps.step(optimizer, clip_norm=1.0)
        assert steps.close(step, None) is None

    train(1)  # compiles
    with torch._dynamo.config.patch(error_on_recompile=True):  # every later step runs the same graph
        train(2)
        train(3)
    assert steps.applied.count == 3
    for dtype, told in ((amp.policy.dtype, "the script entered itself"), (OTHER[precision], f"trains in {precision}")):
        with pytest.raises(ConfigError, match=told), torch.autocast("cuda", dtype=dtype):
            torch.compile(model)(x)


def test_an_fp16_step_outside_run_step_is_refused_on_a_fused_adamw() -> None:
    model, steps = numerics("fp16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    with steps.precision.autocast():
        steps.backward(model(torch.randn(8, 64, device=CUDA)).float().square().mean())
    steps.step(optimizer, clip_norm=None)  # the session's own step: hooked from here on
    assert steps.close(1, None) is None
    with steps.precision.autocast():
        steps.backward(model(torch.randn(8, 64, device=CUDA)).float().square().mean())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=r"AdamW was stepped outside run.step\(\)"):
        optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))  # refused before it applied
