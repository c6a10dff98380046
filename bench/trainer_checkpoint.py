"""Checkpoint cost: synchronous save time vs the training stall of an asynchronous save
(CPU snapshot, then fsync'd write + sha256 in a background thread)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from mpjob_trainer.checkpoint import CheckpointStore, snapshot
from mpjob_trainer.tasks.gpt import make_task


def state(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict:
    return {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}


def main() -> None:
    task = make_task({"nLayer": 6, "nHead": 8, "nEmbd": 512, "blockSize": 128})
    model = task.model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = task.dataset[0]
    task.loss(model(x[None]), y[None]).backward()
    opt.step()
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(Path(tmp), keep=2, config_digest="bench")
        sync = []
        for step in range(1, 4):
            t = time.perf_counter()
            result = store.save(step, "fp32", snapshot(state(model, opt, step)))
            sync.append(time.perf_counter() - t)
        stalls, writes = [], []
        for step in range(10, 13):
            t = time.perf_counter()
            store.save_async(step, "fp32", snapshot(state(model, opt, step)))
            stalls.append(time.perf_counter() - t)
            done = store.wait()
            writes.append(done.seconds if done else float("nan"))
    size = result.bytes / 2**20
    print(f"model {params / 1e6:.1f}M params, checkpoint {size:.0f} MiB (fp32 masters + AdamW state)")
    print(f"synchronous save (write+fsync+sha256+rename): {min(sync):.3f} s  ({size / min(sync):.0f} MiB/s)")
    print(
        f"asynchronous save: training stall {min(stalls) * 1e3:.1f} ms (snapshot), background write {min(writes):.3f} s"
    )


if __name__ == "__main__":
    main()
