"""A loop on the SDK that trains the builtin gpt sharded (run.wrap with its blocks) and whose
checkpoints hold no model state (run.resume() names nothing): `mpjob run` of an fsdp job, end
to end, whatever format a sharded model's checkpoint has. It prints the first and last loss.
`fsdp_script.py STEP`: the gpt's activations overflow fp16 from STEP on."""

from __future__ import annotations

import sys

import torch

from mpjob_trainer import session as mpjob
from mpjob_trainer.tasks import Task
from mpjob_trainer.tasks.gpt import make_task


def batch(task: Task, run: mpjob.Session, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of step `step` (0-based), the task told the step: four batches, seen again."""
    if task.set_step is not None:
        task.set_step(step)
    size = run.spec.training.batch_size
    first = ((step % 4) * run.world.size + run.world.rank) * size
    items = [task.dataset[first + i] for i in range(size)]
    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


def main() -> None:
    with mpjob.start() as run:
        overflow = {"overflowAtStep": int(sys.argv[1])} if len(sys.argv) > 1 else {}  # fp16 overflows from there
        shape = {"nLayer": 2, "nEmbd": 32, "nHead": 2, "blockSize": 16, "data": "random", "samples": 256}
        task = make_task({**shape, **overflow})
        net = run.wrap(task.model, blocks=task.blocks)
        optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
        start = run.resume()
        size = run.spec.training.batch_size
        losses = []
        for step in range(start, run.total_steps):
            x, y = batch(task, run, step)
            with run.autocast():
                loss = task.loss(net(x), y)
            run.backward(loss)
            run.step(optimizer, clip_norm=1.0)
            run.end_step(step + 1, loss=loss, samples=size * run.world.size)
            losses.append(float(loss))
        if run.world.is_main:
            print(f"losses {losses[0]:.4f} {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
