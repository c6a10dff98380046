"""The built-in `mlp` workload: a small regression on synthetic data.

Args (all optional): inputs, hidden, layers, samples, overflowAtStep, overflowGain, overflowUntilStep, and the
faults of mpjob_trainer.tasks.faults: nonFiniteSamples, outOfMemoryAbove, stepDelay.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from mpjob_trainer.tasks import Task, arg, check_args
from mpjob_trainer.tasks.blowup import ActivationBlowUp
from mpjob_trainer.tasks.faults import MemoryCeiling, PoisonedSamples, PrecisionDelay, poisoned_indices, step_delays

KNOWN = {
    "inputs",
    "hidden",
    "layers",
    "samples",
    "overflowAtStep",
    "overflowGain",
    "overflowUntilStep",
    "nonFiniteSamples",
    "outOfMemoryAbove",
    "stepDelay",
}


def make_task(args: dict[str, Any]) -> Task:
    check_args(args, KNOWN, "mlp")
    inputs = arg(args, "inputs", 32, int)
    hidden = arg(args, "hidden", 64, int)
    layers = arg(args, "layers", 2, int)
    samples = arg(args, "samples", 4096, int)
    if min(inputs, hidden, layers, samples) < 1:
        raise ValueError("task.args: inputs, hidden, layers and samples must be >= 1")
    gen = torch.Generator().manual_seed(4321)
    x = torch.randn(samples, inputs, generator=gen)
    w = torch.randn(inputs, 1, generator=gen) / inputs**0.5
    y = torch.sin(x @ w) + 0.1 * torch.cos(3 * x[:, :1])
    blowup = ActivationBlowUp(
        arg(args, "overflowAtStep", None, int),
        arg(args, "overflowGain", 1e6, float),
        arg(args, "overflowUntilStep", None, int),
    )
    ceiling = MemoryCeiling(arg(args, "outOfMemoryAbove", None, int))
    mods: list[nn.Module] = [
        ceiling,
        PrecisionDelay(step_delays(args.get("stepDelay"))),
        nn.Linear(inputs, hidden),
        blowup,
    ]
    for _ in range(layers - 1):
        mods += [nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU()]
    mods.append(nn.Linear(hidden, 1))
    model = nn.Sequential(*mods)
    n_params = sum(p.numel() for p in model.parameters())
    dataset: Dataset[Any] = TensorDataset(x, y)
    poisoned = poisoned_indices(args.get("nonFiniteSamples"), samples)
    if poisoned:
        dataset = PoisonedSamples(dataset, poisoned)
    return Task(
        model=model,
        dataset=dataset,
        loss=lambda out, target: F.mse_loss(out.float(), target),
        flops_per_sample=float(6 * n_params),
        set_step=blowup.set_step,
    )
