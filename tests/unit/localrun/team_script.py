"""A team's own loop brought to the SDK: streaming data (an IterableDataset: no len, no sampler),
a BatchNorm model, OneCycleLR, an EMA copy (AveragedModel over buffers too) and an evaluation of
the EMA every 5 steps printed on stdout. task.args: overflowAt / overflowUntil (an fp16 forward
overflow in [at, until)). `--own-amp`: the script keeps its own torch.autocast(fp16) and
GradScaler instead of run.autocast() / run.backward() / run.step().

Each step writes `DATA step=N ids=[...]` on stderr and every 5th `EVAL step=N ...` on stdout."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, IterableDataset

from mpjob_trainer import session as mpjob
from mpjob_trainer.tasks.blowup import amplified

BATCH = 8


class Stream(IterableDataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """This rank's share of an endless stream, from its `start`-th sample on (sample i: a seed)."""

    def __init__(self, seed: int, rank: int, world: int, start: int) -> None:
        self.seed, self.rank, self.world, self.start = seed, rank, world, start

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        i = self.start * self.world + self.rank
        while True:
            x = torch.randn(8, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + i))
            yield i, x, x.sum().sin().unsqueeze(0)
            i += self.world


class Net(nn.Module):
    def __init__(self, at: int | None, until: int | None) -> None:
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(8, 32), nn.BatchNorm1d(32), nn.Linear(32, 1)
        self.at, self.until, self.gain = at, until, 1.0

    def set_step(self, step: int) -> None:
        on = self.at is not None and step >= self.at and (self.until is None or step < self.until)
        self.gain = 1e6 if on else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.bn(amplified(self.a(x), self.gain))))


def main() -> None:
    own_amp = "--own-amp" in sys.argv
    with mpjob.start() as run:
        model = Net(run.args.get("overflowAt"), run.args.get("overflowUntil")).to(run.device)
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
        net = run.wrap(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=run.total_steps)
        scaler = torch.amp.GradScaler("cpu")
        start = run.resume(model=model, optimizer=optimizer, scheduler=schedule, ema=ema)
        # The stream goes on at the first sample no checkpointed step trained on.
        stream = Stream(run.spec.training.seed, run.world.rank, run.world.size, run.samples_seen // run.world.size)
        batches = iter(DataLoader(stream, batch_size=BATCH))
        xe = torch.randn(64, 8, generator=torch.Generator().manual_seed(7))
        for step in range(start, run.total_steps):
            model.set_step(step)
            ids, x, y = next(batches)
            sys.stderr.write(f"DATA step={step + 1} ids={ids.tolist()}\n")  # one write: whole lines in the log
            if own_amp:
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = nn.functional.mse_loss(net(x).float(), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
            else:
                with run.autocast():
                    loss = nn.functional.mse_loss(net(x).float(), y)
                run.backward(loss)
                run.step(optimizer, clip_norm=1.0)
            schedule.step()
            ema.update_parameters(model)
            if (step + 1) % 5 == 0 and run.world.is_main:
                ema.eval()
                with torch.no_grad():
                    quality = nn.functional.mse_loss(ema(xe), xe.sum(1, keepdim=True).sin()).item()
                ema.train()
                lr, averaged = schedule.get_last_lr()[0], int(ema.n_averaged)
                sys.stdout.write(f"EVAL step={step + 1} ema_loss={quality:.4f} lr={lr:.6e} averaged={averaged}\n")
                sys.stdout.flush()
            run.end_step(step + 1, loss=loss, samples=BATCH * run.world.size)


if __name__ == "__main__":
    main()
