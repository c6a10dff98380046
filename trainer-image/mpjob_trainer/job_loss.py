"""The job's loss: what a step reports is the mean over every rank's samples, not rank 0's share.

Each rank reports the loss of its own samples (the mean over its micro-batches, each weighed by
its samples: mpjob_trainer.loop). At an interval every rank's (loss x samples, samples) rides in
the guard's one gather (NumericGuard.read) and the job's loss is their sum's quotient: the same
weights and samples report the same loss on any number of processes, and under DDP the curve is
the job's, not one rank's noisier share.
"""

from __future__ import annotations

import torch

Reported = torch.Tensor | float | None


def loss_share(reported: Reported, weight: float, device: torch.device) -> torch.Tensor:
    """A rank's part of the job's loss, (loss x weight, weight) in float64 on the device (no sync);
    (0, 0) for a rank that reported none (its step trained no sample)."""
    if reported is None:
        return torch.zeros(2, dtype=torch.float64, device=device)
    loss = torch.as_tensor(reported, device=device).detach().to(torch.float64).reshape(())
    return torch.stack([loss * weight, torch.tensor(float(weight), dtype=torch.float64, device=device)])


def job_loss(summed: list[float]) -> float | None:
    """The job's loss from the ranks' shares summed: their mean weighed by samples. A non-finite
    loss on any rank stays non-finite (it spreads through the sum)."""
    weighted, weights = summed
    return weighted / weights if weights > 0 else None
