"""A user's own training script with a sharded model, as the sharded-checkpoint tests run it.

Plain PyTorch on the SDK: a stack of Linear+LayerNorm blocks with dropout (torch's generator
per rank matters for exact resume), each block and the root sharded with FSDP2's
`fully_shard` by the script itself, AdamW, a LambdaLR driven by the session's applied steps,
and batches drawn from the data position the session keeps in samples, so that a run resumed
on another world size goes on with the very next sample. task.args:
  blocks, width   the model's size
$SHARDED_SCRIPT_STEP_SECONDS slows each step (a test interrupts the run mid-way);
$SHARDED_SCRIPT_BLOCKS, when set, is the number of blocks whatever task.args say (a script
edited between two runs of a job);
$SHARDED_SCRIPT_FULL_STATE names a file where rank 0 saves, at the end, the full model and
optimizer state gathered from all ranks and the data position (what the tests compare).
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

from mpjob_trainer import session as mpjob

BATCH = 4


def build(blocks: int, width: int) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(), nn.Dropout(0.1)) for _ in range(blocks)
    ]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def shard(model: nn.Sequential) -> None:
    """FSDP2 per block, then the root (what run.wrap does under parallelism.strategy fsdp)."""
    for block in list(model)[:-1]:
        fully_shard(block)
    fully_shard(model)


def sample(index: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample number `index` of the stream: a function of the index alone."""
    gen = torch.Generator().manual_seed(seed * 100_003 + index)
    x = torch.randn(width, generator=gen)
    return x, x.sum(0, keepdim=True).sin()


def main() -> None:
    pause = float(os.environ.get("SHARDED_SCRIPT_STEP_SECONDS", "0"))
    with mpjob.start() as run:
        blocks = int(os.environ.get("SHARDED_SCRIPT_BLOCKS") or run.args.get("blocks", 3))
        width = int(run.args.get("width", 32))
        model = build(blocks, width).to(run.device)
        if run.world.distributed:
            shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 0.98**run.applied_steps)
        start = run.resume(model=model, optimizer=optimizer, scheduler=schedule)
        seed, size = run.spec.training.seed, run.world.size
        for step in range(start, run.total_steps):
            first = run.samples_seen + run.world.rank * BATCH
            xs, ys = zip(*(sample(first + i, width, seed) for i in range(BATCH)), strict=True)
            x, y = torch.stack(xs).to(run.device), torch.stack(ys).to(run.device)
            with run.autocast():
                loss = nn.functional.mse_loss(model(x).float(), y)
            run.backward(loss)
            run.step(optimizer, clip_norm=1.0)
            schedule.step()
            run.end_step(step + 1, loss=loss, samples=BATCH * size)
            time.sleep(pause)
        if os.environ.get("SHARDED_SCRIPT_FULL_STATE"):
            full = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_sd, optim_sd = get_state_dict(model, [optimizer], options=full)
            if run.world.is_main:
                state = {"model": model_sd, "optimizer": optim_sd, "samples": run.samples_seen}
                torch.save(state, os.environ["SHARDED_SCRIPT_FULL_STATE"])


if __name__ == "__main__":
    main()
