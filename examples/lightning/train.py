"""A PyTorch Lightning script run by mpjob: a small LightningModule (a classifier with a
LayerNorm, AdamW and a step-driven cosine schedule after a linear warm-up, all three set by the
job's training.learningRate, weightDecay and warmupSteps) on data made here; nothing is downloaded.

It is an ordinary Lightning script with three mpjob lines: `mpjob.start()`,
`L.Trainer(**trainer_settings(run))` and `mpjob_lightning.fit(run, trainer, model)`. The
adapter gives the Trainer the attempt's precision and GradScaler, and the session's guard,
checkpoints (Lightning's own `.ckpt`, adopted with a sha256 manifest), resume, progress and
exit code. Run it with `mpjob run examples/lightning/lightning.yaml`.

`--overflow-at STEP` makes an inner activation 1e6 times larger from optimizer step STEP on:
inf in fp16 (max 65504), finite in bf16 and fp32, so an fp16 attempt ends NumericFault and the
next one resumes in bf16 from the last good checkpoint.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from mpjob_trainer import session as mpjob
from mpjob_trainer.adapters import lightning as mpjob_lightning


class Batches(Sampler[list[int]]):
    """This rank's endless batches from batch `start` on: a seeded permutation per epoch, whose
    batches the ranks share out (rank r of w takes batches r, r + w, ...). The data order is a
    function of the position alone, so a resumed run reads what a straight one reads."""

    def __init__(self, size: int, batch: int, rank: int, world: int, *, seed: int, start: int) -> None:
        self.size, self.batch, self.rank, self.world, self.seed, self.start = size, batch, rank, world, seed, start

    def __iter__(self) -> Iterator[list[int]]:
        per_epoch = self.size // (self.batch * self.world)
        for b in range(self.start, self.start + 10**9):
            epoch, k = divmod(b, per_epoch)
            perm = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 1000 + epoch))
            first = (k * self.world + self.rank) * self.batch
            yield perm[first : first + self.batch].tolist()


class Classifier(L.LightningModule):
    """`optimizer`: AdamW's peak learning rate, weight decay and warm-up steps."""

    def __init__(
        self, opts: argparse.Namespace, optimizer: tuple[float, float, int], *, steps: int, batch: int, seed: int
    ) -> None:
        super().__init__()
        self.opts, self.steps, self.batch, self.seed = opts, steps, batch, seed
        self.lr, self.weight_decay, self.warmup = optimizer
        self.inp, self.norm = nn.Linear(opts.features, opts.hidden), nn.LayerNorm(opts.hidden)
        self.out = nn.Linear(opts.hidden, opts.classes)
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(opts.samples, opts.features, generator=gen)
        teacher = torch.randn(opts.features, opts.classes, generator=gen)
        self.data = TensorDataset(x, torch.tanh(x @ teacher).argmax(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        at = self.opts.overflow_at
        gain = 1e6 if at is not None and self.global_step >= at else 1.0
        h = self.inp(x) * gain  # inf in fp16 once the gain is on; LayerNorm undoes it in bf16/fp32
        return self.out(torch.relu(self.norm(h)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x).float(), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)

        def factor(step: int) -> float:
            return (
                min(1.0, (step + 1) / max(1, self.warmup)) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / self.steps)))
            )

        schedule = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        # Lightning calls this after restoring the checkpoint: the position is the global step.
        # The loader's own generator keeps its iterator from drawing on torch's global one,
        # which mpjob restored to the checkpoint's state (Lightning itself saves no RNG state).
        start = self.trainer.global_step * self.trainer.accumulate_grad_batches
        rank, world = self.trainer.global_rank, self.trainer.world_size
        batches = Batches(len(self.data), self.batch, rank, world, seed=self.seed, start=start)
        return DataLoader(self.data, batch_sampler=batches, generator=torch.Generator().manual_seed(self.seed))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--overflow-at", type=int, default=None, help="inject an fp16 overflow from this step on")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--lr", type=float, default=None, help="AdamW's peak learning rate (default: training.learningRate)")
    return p.parse_args()


def main() -> None:
    opts = parse()
    with mpjob.start() as run:
        tr = run.spec.training  # Lightning's module builds its optimizer: the spec's settings are handed to it
        optimizer = (tr.learning_rate if opts.lr is None else opts.lr, tr.weight_decay, tr.warmup_steps)
        model = Classifier(opts, optimizer, steps=run.total_steps, batch=tr.batch_size, seed=tr.seed)
        # Batches shares the data out between the ranks itself: Lightning must not put a sampler in
        settings = mpjob_lightning.trainer_settings(
            run, logger=False, enable_model_summary=False, use_distributed_sampler=False
        )
        trainer = L.Trainer(**settings)
        mpjob_lightning.fit(run, trainer, model)


if __name__ == "__main__":
    main()
