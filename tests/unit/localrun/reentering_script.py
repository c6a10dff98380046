"""A loop on the SDK that trains the builtin gpt sharded and runs through `run.reentering`, as
docs/sdk.md shows: it registers its step, so a fault is handled by the session, and a change of
precision in place leaves the loop, which runs again with its model wrapped anew.
`reentering_script.py STEP [DAMAGED]`: the gpt's activations overflow fp16 from STEP on; with
DAMAGED, rank 0 flips a byte of rank 0's shards in the checkpoint of step DAMAGED before step STEP
runs the first time (once it is committed): a checkpoint damaged after its save."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fsdp_script import batch  # beside this script

from mpjob_trainer import session as mpjob
from mpjob_trainer.tasks.gpt import make_task

SHAPE = {"nLayer": 2, "nEmbd": 32, "nHead": 2, "blockSize": 16, "data": "random", "samples": 256}


def damage(folder: Path) -> None:
    """Flip a byte in the middle of rank 0's shards in `folder` once its manifest is there."""
    deadline = time.monotonic() + 120
    while not (folder / "manifest.json").exists():
        assert time.monotonic() < deadline, f"{folder} was never committed"
        time.sleep(0.01)
    shards = next(folder.rglob("__0_0.distcp"))
    data = bytearray(shards.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shards.write_bytes(bytes(data))


def train(run: mpjob.Session, overflow_at: int, damaged: list[int]) -> None:
    task = make_task({**SHAPE, "overflowAtStep": overflow_at})
    net = run.wrap(task.model, blocks=task.blocks)
    optimizer = run.adamw(task.model, lr=3e-3, weight_decay=0.0)
    start = run.resume(model=task.model, optimizer=optimizer)
    size = run.spec.training.batch_size

    def one_step(step: int) -> None:
        x, y = batch(task, run, step)
        with run.autocast():
            loss = task.loss(net(x), y)
        run.backward(loss)
        run.step(optimizer, clip_norm=1.0)

    run.register_step(one_step)
    for step in range(start, run.total_steps):
        if step == overflow_at and damaged and run.world.is_main:
            damage(Path(run.launch.checkpoint_dir) / f"step-{damaged.pop():09d}")
        run.run_step(step)
        run.end_step(step + 1, samples=size * run.world.size)


def main() -> None:
    with mpjob.start() as run:
        damaged = [int(step) for step in sys.argv[2:3]]  # once: the loop runs again after the change
        run.reentering(lambda: train(run, int(sys.argv[1]), damaged))


if __name__ == "__main__":
    main()
