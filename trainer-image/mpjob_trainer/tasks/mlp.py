"""The built-in `mlp` workload: a small regression on synthetic data.

Args (all optional): inputs, hidden, layers, samples, overflowAtStep, overflowGain, overflowUntilStep, and the
faults of mpjob_trainer.tasks.faults: nonFiniteSamples, batchScale, outOfMemoryAbove (outOfMemoryFromStep), stepDelay,
cancellationOffset, fp8OutlierAtStep, fp8OutlierUntilStep; evalSamples (held-out samples for the quality gate,
default 256).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from mpjob_contract.builtin_args import arg, mlp_shape, poisoned_indices, step_delays
from mpjob_trainer.tasks import Task, task_args
from mpjob_trainer.tasks.blowup import ActivationBlowUp
from mpjob_trainer.tasks.faults import (
    BatchScale,
    Cancellation,
    MemoryCeiling,
    OutlierRow,
    PoisonedSamples,
    PrecisionDelay,
    batch_scale,
)


def make_task(args: dict[str, Any]) -> Task:
    shape = mlp_shape(task_args("mlp", args))
    inputs, samples = shape.inputs, shape.samples
    gen = torch.Generator().manual_seed(4321)
    x = torch.randn(samples, inputs, generator=gen)
    w = torch.randn(inputs, 1, generator=gen) / inputs**0.5
    dataset: Dataset[Any] = _regression(x, w)
    poisoned = poisoned_indices(args.get("nonFiniteSamples"), samples)
    if poisoned:
        dataset = PoisonedSamples(dataset, poisoned)
    model, blowup, outlier = _model(args, inputs, shape.hidden, shape.layers)
    ceiling = next(m for m in model.modules() if isinstance(m, MemoryCeiling))
    spike = batch_scale(args.get("batchScale"))
    held_out = torch.Generator().manual_seed(8642)
    n_params = sum(p.numel() for p in model.parameters())
    return Task(
        model=model,
        dataset=dataset,
        eval_dataset=_regression(torch.randn(shape.eval_samples, inputs, generator=held_out), w),
        loss=lambda out, target: F.mse_loss(out.float(), spike(target)),
        flops_per_sample=float(6 * n_params),
        set_step=_stepped(blowup, outlier, spike, ceiling),
    )


def _stepped(*faults: ActivationBlowUp | OutlierRow | BatchScale | MemoryCeiling) -> Callable[[int], None]:
    """One set_step for the faults that switch on and off by step."""

    def set_step(step: int) -> None:
        for fault in faults:
            fault.set_step(step)

    return set_step


def _regression(x: torch.Tensor, w: torch.Tensor) -> TensorDataset:
    """Inputs `x` and their targets, y = sin(x w) + 0.1 cos(3 x_0)."""
    return TensorDataset(x, torch.sin(x @ w) + 0.1 * torch.cos(3 * x[:, :1]))


def _model(
    args: dict[str, Any], inputs: int, hidden: int, layers: int
) -> tuple[nn.Module, ActivationBlowUp, OutlierRow]:
    """The network, with the faults task.args asks for in its first block."""
    blowup = ActivationBlowUp(
        arg(args, "overflowAtStep", None, int),
        arg(args, "overflowGain", 1e6, float),
        arg(args, "overflowUntilStep", None, int),
    )
    mods: list[nn.Module] = [
        MemoryCeiling(arg(args, "outOfMemoryAbove", None, int), arg(args, "outOfMemoryFromStep", None, int)),
        PrecisionDelay(step_delays(args.get("stepDelay"))),
        nn.Linear(inputs, hidden),
        Cancellation(arg(args, "cancellationOffset", None, float)),
        blowup,
    ]
    at, until = arg(args, "fp8OutlierAtStep", None, int), arg(args, "fp8OutlierUntilStep", None, int)
    outlier = OutlierRow(nn.Identity(), at, until)
    for i in range(layers - 1):
        inner: nn.Module = nn.Linear(hidden, hidden)
        if i == 0 and at is not None:  # the first inner linear (the one fp8 converts) meets the outlier
            inner = outlier = OutlierRow(inner, at, until)
        mods += [nn.LayerNorm(hidden), inner, nn.GELU()]
    mods.append(nn.Linear(hidden, 1))
    return nn.Sequential(*mods), blowup, outlier
