"""nanoGPT's loop (bench/baseline.py's NanoGPTLoop) timed for bench/trainer_gpu.py, beside the
trainer: the same model class and data (the `gpt` task), the model torch.compile'd unless the
run says "never", fused AdamW, nanoGPT's weight-decay groups. Its log windows are synchronized
at the same step edges where the trainer reads its interval, so its Figures compare with the
trainer's (bench/gpu_trainer.py), TF32 set as the trainer's fp32 attempts set it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch

from bench.baseline import NanoGPTLoop, random_batches
from bench.gpu_setup import CUDA, Figures, Setup, precision_of, release
from mpjob_trainer.metrics import peak_flops
from mpjob_trainer.tasks.gpt import make_task


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


@contextlib.contextmanager
def tf32(allowed: bool) -> Iterator[None]:
    """TF32 matmuls as the trainer's fp32 attempts set them (precision.tf32)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def timed_windows(step: Callable[[], None], setup: Setup) -> list[float]:
    """Seconds per step of each `log_every` window after the warm-up, synchronized at the
    window edges (where the trainer reads its interval)."""
    for _ in range(setup.warmup):
        step()
    sync()
    per_step = []
    for _ in range((setup.steps - setup.warmup) // setup.log_every):
        start = time.perf_counter()
        for _ in range(setup.log_every):
            step()
        sync()
        per_step.append((time.perf_counter() - start) / setup.log_every)
    return per_step


def baseline_run(setup: Setup, label: str) -> Figures:
    device = torch.device("cuda" if CUDA else "cpu")
    release()
    torch.manual_seed(0)
    task = make_task(setup.args)
    flops, tokens = task.flops_per_sample or 0.0, task.tokens_per_sample or 0
    data = random_batches(task.dataset, setup.batch, device)
    compiled = setup.compile != "never"
    loop = NanoGPTLoop(task.model.to(device), task.loss, data, precision=precision_of(label), compiled=compiled)
    if CUDA:
        torch.cuda.reset_peak_memory_stats(device)
    with tf32(label.endswith("TF32")):
        step_s = statistics.median(timed_windows(loop.step, setup))
    peak_bytes = torch.cuda.max_memory_allocated(device) if CUDA else None
    del task, loop, data
    release()
    peak, samples_per_s = peak_flops(device), setup.batch / step_s
    return Figures(
        tokens_per_s=samples_per_s * tokens,
        step_s=step_s,
        mfu=samples_per_s * flops / peak if peak else None,
        peak_bytes=peak_bytes,
        compiled=compiled,
    )
