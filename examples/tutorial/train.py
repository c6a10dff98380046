"""The tutorial's training script (docs/tutorial.md): a small regression network in plain
PyTorch on the mpjob SDK, one process, a few seconds per attempt on a CPU.

The data is step-addressed: optimizer step i trains on positions [i x batch, (i+1) x batch) of
a seeded shuffle per epoch, so the session can run any step again by its index
(`run.register_step`: the fp32 replay of a fault, the catch-up after a skip) and a resume needs
no data state of its own.

The job sets the optimizer: AdamW with training.learningRate and weightDecay, after a linear
warm-up over training.warmupSteps (each step's rate set from its index, so a replay or a resume
trains with the very same rates).

`--overflow-at STEP`: from STEP on an activation is 1e6 times larger: inf in fp16, finite in
bf16 and fp32. A precision fault: the fp16 attempt ends NumericFault and the next attempt
resumes in bf16 from the last good checkpoint.
`--poison INDEX`: dataset sample INDEX holds inf, non-finite in every precision. Bad data: the
fp32 replay blames it, the session rolls back to the last good checkpoint, quarantines the
sample and goes on in the same precision.
`TUTORIAL_HOLD_AT=STEP` (in the environment): the script trains the steps before STEP, then
waits there until it is killed: a stand-in for a job far from its end, so that a kill lands
mid-run. The environment, not a flag: a flag would change the command, which is part of what
a checkpoint must agree with to be resumed, and the rerun runs the job unheld.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import torch
from torch import nn

from mpjob_trainer import session as mpjob


class Net(nn.Module):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.inp, self.norm, self.out = nn.Linear(features, hidden), nn.LayerNorm(hidden), nn.Linear(hidden, 1)
        self.gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) * self.gain  # inf in fp16 once the gain is 1e6; the LayerNorm undoes it elsewhere
        return self.out(torch.relu(self.norm(h)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--overflow-at", type=int, default=None, help="inject an fp16 overflow from this step on")
    parser.add_argument("--poison", type=int, default=None, help="make this dataset sample non-finite")
    args = parser.parse_args()

    with mpjob.start() as run:
        seed, batch = run.spec.training.seed, run.spec.training.batch_size
        rank, world = run.world.rank, run.world.size
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(args.samples, args.features, generator=gen)
        y = x.sum(1, keepdim=True).sin()
        if args.poison is not None:
            x[args.poison] = float("inf")

        model = Net(args.features, args.hidden).to(run.device)
        run.keep_fp32(model)  # spec.precision.keepFp32: the LayerNorm
        net = run.wrap(model)
        tr = run.spec.training  # the job sets the optimizer: learningRate, weightDecay, warmupSteps
        optimizer = run.adamw(model, lr=tr.learning_rate, weight_decay=tr.weight_decay)
        start = run.resume(model=model, optimizer=optimizer)

        @functools.lru_cache(maxsize=2)
        def order(epoch: int) -> list[int]:
            return torch.randperm(args.samples, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()

        def samples(step: int) -> list[int]:
            """The dataset indices of optimizer step `step` (0-based) on this rank."""
            first = (step * world + rank) * batch
            return [order(k // args.samples)[k % args.samples] for k in range(first, first + batch)]

        def one_step(step: int) -> None:
            """Optimizer step `step` as the loop runs it; the session runs it too (replay, catch-up)."""
            model.gain = 1e6 if args.overflow_at is not None and step >= args.overflow_at else 1.0
            for group in optimizer.param_groups:  # a linear warm-up, set from the step alone
                group["lr"] = tr.learning_rate * min(1.0, (step + 1) / max(1, tr.warmup_steps))
            indices = run.quarantined.keep(samples(step))  # never train on a quarantined sample
            if not indices:  # every sample of the step is quarantined: nothing to train on
                return
            with run.autocast():
                loss = nn.functional.mse_loss(net(x[indices].to(run.device)).float(), y[indices].to(run.device))
            run.backward(loss)
            run.step(optimizer, clip_norm=run.spec.training.grad_clip_norm)

        def non_finite_alone(indices: list[int]) -> list[int]:
            """Which of a bad step's samples are non-finite on their own (fp32, no autocast)."""
            with torch.no_grad():
                return [i for i in indices if not torch.isfinite(model(x[i : i + 1].to(run.device))).all()]

        run.register_step(one_step, samples=samples)
        run.quarantined.screen = non_finite_alone
        hold_at = int(os.environ.get("TUTORIAL_HOLD_AT", "0"))
        for step in range(start, run.total_steps):
            while step + 1 == hold_at:  # wait to be killed, before training step `hold_at`
                time.sleep(1)
            one_step(step)
            run.end_step(step + 1, samples=batch * world)


if __name__ == "__main__":
    main()
