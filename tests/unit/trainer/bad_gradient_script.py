"""An SDK loop whose sample $BAD has a finite loss and a non-finite gradient (the square root of
a difference that is 0: its derivative there is infinite): step i trains samples 4i..4i+3, each
the square of a linear model's output off its target, less those the run quarantined."""

from __future__ import annotations

import os

import torch
from torch import nn

from mpjob_trainer import session as mpjob

BAD = int(os.environ["BAD"])


def sample(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(index)
    return torch.randn(4, generator=gen), torch.randn(1, generator=gen)


def indices(step: int) -> list[int]:
    return list(range(4 * step, 4 * step + 4))


with mpjob.start() as run:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = run.resume(model=model, optimizer=optimizer)

    def one_step(step: int) -> None:
        kept = run.quarantined.keep(indices(step))
        if not kept:  # every sample of the step quarantined: it trains nothing
            return
        x, y = (torch.stack(parts) for parts in zip(*(sample(i) for i in kept), strict=True))
        with run.autocast():
            out = model(x).float()
        losses = (out - y).pow(2).squeeze(1)
        bad = [n for n, i in enumerate(kept) if i == BAD]
        for n in bad:  # sqrt(0) = 0 adds nothing to the loss; its gradient is inf
            losses[n] = losses[n] + torch.sqrt(out[n, 0] - out[n, 0].detach())
        run.backward(losses.mean())
        run.step(optimizer)

    run.register_step(one_step, samples=indices)
    for i in range(start, run.total_steps):
        one_step(i)
        run.end_step(i + 1, samples=4)
