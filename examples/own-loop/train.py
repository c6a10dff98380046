"""A plain PyTorch training script of your own, run by mpjob: its own model, optimizer, LR
schedule (AdamW, a linear warm-up, then a cosine; training.learningRate, weightDecay and
warmupSteps set them) and DataLoader (with worker processes). The mpjob SDK gives it the attempt's
precision, the numeric guard, exact-resume checkpoints, live progress and the exit code the
operator reads. Run it with `mpjob run examples/own-loop/own-loop.yaml` or on a cluster.

`--overflow-at STEP` makes an inner activation 1e6 times larger from STEP on: finite in
bf16 and fp32, inf in fp16 (max 65504). An fp16 attempt then ends NumericFault and the next
attempt resumes in bf16 from the last good checkpoint.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from mpjob_trainer import session as mpjob
from mpjob_trainer.tasks.blowup import amplified  # eager even when run.compile compiles the model


class Teacher(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Inputs with the labels a fixed random network gives them: a learnable task, made here."""

    def __init__(self, samples: int, features: int, classes: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, features, generator=gen)
        teacher = torch.randn(features, classes, generator=gen)
        self.y = (torch.tanh(self.x @ teacher) + 0.1 * torch.randn(samples, classes, generator=gen)).argmax(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class DataPosition:
    """Batches this rank has consumed: the data position a resume must restore."""

    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batches = int(state["batches"])


class ShardBatches(Sampler[list[int]]):
    """This rank's batches from batch `start` on: a seeded permutation per epoch, so the order
    depends only on the position, never on how often the job was interrupted."""

    def __init__(self, size: int, batch: int, rank: int, world: int, *, seed: int, start: int) -> None:
        self.size, self.batch, self.rank, self.world, self.seed, self.start = size, batch, rank, world, seed, start

    def __iter__(self):  # type: ignore[no-untyped-def]
        per_epoch = self.size // (self.batch * self.world)
        for b in range(self.start, self.start + 10**9):
            epoch, k = divmod(b, per_epoch)
            perm = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 1000 + epoch))
            first = (k * self.world + self.rank) * self.batch
            yield perm[first : first + self.batch].tolist()


class Net(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int, overflow_at: int | None) -> None:
        super().__init__()
        self.inp, self.norm, self.out = nn.Linear(features, hidden), nn.LayerNorm(hidden), nn.Linear(hidden, classes)
        self.overflow_at, self.gain = overflow_at, 1.0

    def set_step(self, step: int) -> None:
        self.gain = 1e6 if self.overflow_at is not None and step >= self.overflow_at else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = amplified(self.inp(x), self.gain)  # inf in fp16 once the gain is on; LayerNorm undoes it elsewhere
        return self.out(torch.relu(self.norm(h)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=None, help="peak LR (default: training.learningRate)")
    parser.add_argument("--warmup", type=int, default=None, help="linear warm-up steps (default: training.warmupSteps)")
    parser.add_argument("--loader-workers", type=int, default=2)
    parser.add_argument("--overflow-at", type=int, default=None, help="inject an fp16 overflow from this step on")
    args = parser.parse_args()

    with mpjob.start(flops_per_sample=6.0 * (args.features * args.hidden + args.hidden * args.classes)) as run:
        model = Net(args.features, args.hidden, args.classes, args.overflow_at).to(run.device)
        run.keep_fp32(model)
        net = run.wrap(run.compile(model))  # compiled on CUDA (training.compile: auto)
        tr = run.spec.training  # the job sets the optimizer; a flag given on the command line wins
        lr = tr.learning_rate if args.lr is None else args.lr
        warmup = max(1, tr.warmup_steps if args.warmup is None else args.warmup)
        optimizer = run.adamw(model, lr=lr, weight_decay=tr.weight_decay)  # fused on CUDA; no decay on biases, norms
        total = run.total_steps
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))),
        )
        position = DataPosition()
        start = run.resume(model=model, optimizer=optimizer, scheduler=schedule, data=position)

        seed = run.spec.training.seed
        data = Teacher(args.samples, args.features, args.classes, seed=seed)
        rank, world = run.world.rank, run.world.size
        sampler = ShardBatches(len(data), args.batch_size, rank, world, seed=seed, start=position.batches)
        # Its own generator: creating the loader after a resume draws nothing from the global
        # RNG the SDK restored, so dropout and friends continue exactly where they left off.
        loader_rng = torch.Generator().manual_seed(seed)
        loader = DataLoader(
            data,
            batch_sampler=sampler,
            num_workers=args.loader_workers,
            generator=loader_rng,
            pin_memory=run.device.type == "cuda",  # with non_blocking copies: the host does not wait
        )
        batches = iter(loader)
        for step in range(start, total):
            model.set_step(step)
            x, y = (t.to(run.device, non_blocking=True) for t in next(batches))
            with run.autocast():
                loss = nn.functional.cross_entropy(net(x), y)
            run.backward(loss)
            run.step(optimizer, clip_norm=1.0)
            schedule.step()
            position.batches += 1
            run.end_step(step + 1, loss=loss, samples=args.batch_size * run.world.size)


if __name__ == "__main__":
    main()
