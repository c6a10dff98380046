"""Numeric guard overhead: the same fp16 GradScaler loop with and without NumericGuard.

The guard adds host-side bookkeeping per step (an optimizer post-hook, a counter) and one
device-side accumulation of the non-finite-loss count; it reads the device only at log
intervals. Prints per-step times and the overhead in percent.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.baseline import amp_update
from mpjob_contract.api import Guard
from mpjob_trainer.distributed import World
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.tasks.gpt import make_task

STEPS, WARMUP, REPEATS, LOG_EVERY = 60, 10, 5, 10


def loop(with_guard: bool) -> float:
    torch.manual_seed(0)
    task = make_task({"nLayer": 2, "nHead": 4, "nEmbd": 128, "blockSize": 64})
    model, device = task.model, torch.device("cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    guard = NumericGuard(Guard(), device, World(0, 1, 0)) if with_guard else None
    if guard:

        def stepped(*_: object) -> None:
            guard.optimizer_stepped()

        opt.register_step_post_hook(stepped)
    xs = [task.dataset[i] for i in range(16)]
    x = torch.stack([a for a, _ in xs])
    y = torch.stack([b for _, b in xs])
    times = []
    for step in range(STEPS):
        start = time.perf_counter()
        if guard:
            guard.begin_step()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = task.loss(model(x), y)
        if guard:
            guard.observe_loss(loss)
        amp_update(loss, model, opt, scaler)
        if guard:
            guard.end_step(step + 1, True)
            if (step + 1) % LOG_EVERY == 0:
                guard.check(step + 1, guard.read(scaler), None, None)
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(2)
    plain, guarded = [], []
    for _ in range(REPEATS):  # interleave to share machine noise
        plain.append(loop(False))
        guarded.append(loop(True))
    p, g = statistics.median(plain), statistics.median(guarded)
    print(f"plain GradScaler loop : {p * 1e3:.2f} ms/step (median of {REPEATS} runs)")
    print(f"with NumericGuard     : {g * 1e3:.2f} ms/step")
    print(f"guard overhead        : {(g - p) / p * 100:+.2f}% of step time")


if __name__ == "__main__":
    main()
