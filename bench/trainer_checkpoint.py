"""Checkpoint cost: a synchronous save, and the training stall of an asynchronous one.

The stall is what the training thread spends in `Checkpointer.save` for a non-final
checkpoint (waiting for the previous save, capturing and staging the state; the write and
the sha256 run in a background thread). It is timed around the call, so the same script
measures older code that has no `checkpointStaged` event. Between checkpoints the model
trains a real step (the state changes, as in a run) and the previous write is joined
outside the timed window: at the default interval (checkpoint.everySteps, 200 steps) it has
long finished, which the script checks against the measured step time. The first staged
save allocates the reusable buffers and is reported apart.

Usage: PYTHONPATH=. uv run --no-sync python bench/trainer_checkpoint.py [--saves 13]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mpjob_contract.api import Checkpoint as CheckpointSpec
from mpjob_trainer.checkpoint import CheckpointStore, snapshot
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.tasks.gpt import make_task

INTERVAL = CheckpointSpec().every_steps  # the default checkpoint.everySteps
BATCH = 2


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Workload:
    """GPT 6x512 with AdamW: one real optimizer step at a time."""

    def __init__(self, device: torch.device) -> None:
        task = make_task({"nLayer": 6, "nHead": 8, "nEmbd": 512, "blockSize": 128})
        self.task, self.device = task, device
        self.model = task.model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        xs, ys = zip(*(task.dataset[i] for i in range(BATCH)), strict=True)
        self.x, self.y = torch.stack(xs).to(device), torch.stack(ys).to(device)
        self.state = TrainingState({"model": self.model, "optimizer": self.opt})
        self.params = sum(p.numel() for p in self.model.parameters())

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.task.loss(self.model(self.x), self.y).backward()
        self.opt.step()

    def capture(self, step: int) -> Callable[[], dict[str, Any]]:
        return lambda: self.state.capture(step, step, "fp32", None)

    def step_seconds(self, steps: int) -> float:
        """Median wall time of one optimizer step."""
        times = []
        for _ in range(steps):
            sync(self.device)
            start = time.perf_counter()
            self.step()
            sync(self.device)
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def synchronous(work: Workload, root: Path) -> tuple[float, int]:
    """Best of three synchronous saves (snapshot, write, fsync, sha256, rename): seconds, bytes."""
    store = CheckpointStore(root, keep=2, config_digest="bench")
    best, size = float("inf"), 0
    for step in range(1, 4):
        start = time.perf_counter()
        result = store.write(step, "fp32", snapshot(work.capture(step)()))
        best, size = min(best, time.perf_counter() - start), result.bytes
    return best, size


def asynchronous(work: Workload, root: Path, saves: int) -> tuple[list[float], list[float], list[float]]:
    """Wall and process-CPU seconds of `saves` non-final Checkpointer.save calls, and the
    background write times. The CPU time is the steadier figure on a shared machine; it
    also counts torch's intra-op threads (a large copy is split among them)."""
    store = CheckpointStore(root, keep=2, config_digest="bench")
    metrics = TrainerMetrics("bench", "bench", 0, "fp32")
    checkpoints = Checkpointer(store, World(0, 1, 0), EventLog(stream=io.StringIO()), metrics)
    stalls, cpu, writes = [], [], []
    for index in range(saves):
        work.step()
        step = 100 + index
        sync(work.device)
        start, start_cpu = time.perf_counter(), time.process_time()
        checkpoints.save(step, "fp32", work.capture(step), final=False)
        stalls.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        # Untimed: at the default interval the write ends long before the next save.
        done = checkpoints.collect(block=True, training_step=step)
        writes.append(done.seconds if done else float("nan"))
    return stalls, cpu, writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=13, help="asynchronous saves to time (the first allocates)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps timed for the step time")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = Workload(device)
    work.step_seconds(2)  # warm-up: AdamW state exists from here on
    step_time = work.step_seconds(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        sync_seconds, size = synchronous(work, Path(tmp) / "sync")
        stalls, cpu, writes = asynchronous(work, Path(tmp) / "async", args.saves)
    mib = size / 2**20
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"model {work.params / 1e6:.1f}M params, checkpoint {mib:.0f} MiB (fp32 masters + AdamW state)")
    print(f"training step (batch {BATCH}x128): {step_time * 1e3:.1f} ms (median of {args.steps})")
    rate = mib / sync_seconds
    print(f"synchronous save (snapshot+write+fsync+sha256+rename): {sync_seconds:.3f} s ({rate:.0f} MiB/s)")
    report(stalls, cpu, writes, INTERVAL * step_time)


def report(stalls: list[float], cpu: list[float], writes: list[float], interval: float) -> None:
    """The stall per checkpoint, and as a share of the training time between two checkpoints."""
    steady, steady_cpu = statistics.median(stalls[1:]), statistics.median(cpu[1:])
    rest = ", ".join(f"{s * 1e3:.1f}" for s in stalls[1:])
    print(f"stall per checkpoint: first {stalls[0] * 1e3:.1f} ms, then median {steady * 1e3:.1f} ms ({rest})")
    print(f"CPU time in the stall: first {cpu[0] * 1e3:.1f} ms, then median {steady_cpu * 1e3:.1f} ms")
    print(f"background write: median {statistics.median(writes):.3f} s; {INTERVAL} steps take {interval:.1f} s")
    print(f"stall / training time at everySteps={INTERVAL}: {100 * steady / interval:.3f} %")


if __name__ == "__main__":
    main()
