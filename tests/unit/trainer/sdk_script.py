"""A user's own training script on the SDK, as test_session.py runs it (`task.command`).

Plain PyTorch: a small MLP with LayerNorm (kept in fp32) and dropout (so torch's generator
matters for exact resume), AdamW, a LambdaLR driven by the session's applied steps, and a
custom stateful object (the data position). task.args:
  overflowAtStep  from this step on the loss is multiplied by 1e8: finite, but its gradients
                  overflow fp16, so GradScaler skips every step (MaxConsecutiveOverflows)
$SDK_SCRIPT_STEP_SECONDS slows each step (a test interrupts the run mid-way) without
changing the job's spec, so the run's checkpoints stay resumable by the unslowed spec.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from mpjob_trainer import session as mpjob

BATCH, FEATURES, HIDDEN = 8, 8, 32


class DataPosition:
    """Batches consumed so far: the data position a resume must restore."""

    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batches = int(state["batches"])


def batch(position: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch number `position`: a function of the position alone."""
    gen = torch.Generator().manual_seed(seed * 100_003 + position)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    return x, x.sum(1, keepdim=True).sin()


def main() -> None:
    pause = float(os.environ.get("SDK_SCRIPT_STEP_SECONDS", "0"))
    with mpjob.start(flops_per_sample=6.0 * (FEATURES * HIDDEN + HIDDEN)) as run:
        overflow_at = run.args.get("overflowAtStep")
        model = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.LayerNorm(HIDDEN), nn.GELU(), nn.Dropout(0.1), nn.Linear(HIDDEN, 1)
        ).to(run.device)
        run.keep_fp32(model)
        net = run.wrap(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 0.98**run.applied_steps)
        position = DataPosition()
        start = run.resume(model=model, optimizer=optimizer, scheduler=schedule, data=position)
        for step in range(start, run.total_steps):
            x, y = (t.to(run.device) for t in batch(position.batches, run.spec.training.seed))
            with run.autocast():
                loss = nn.functional.mse_loss(net(x).float(), y)
            if overflow_at is not None and step >= overflow_at:
                loss = loss * 1e8
            run.backward(loss)
            run.step(optimizer, clip_norm=1.0)
            schedule.step()
            position.batches += 1
            run.end_step(step + 1, loss=loss, samples=BATCH * run.world.size)
            time.sleep(pause)


if __name__ == "__main__":
    main()
