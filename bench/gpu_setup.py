"""What the parts of bench/trainer_gpu.py share: the sizes of its runs (Setup), the figures of
one run (Figures), and giving back what a run in this process held (release).

Figures are the same for both sides, the trainer and nanoGPT's loop: tokens/s, seconds per step,
MFU (against the device's dense bf16 peak, mpjob_trainer.metrics.peak_flops) and peak memory,
the medians of the log windows (`log_every` steps) after a `warmup`-step warm-up, and whether
the side ran compiled.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from mpjob_contract.api import Checkpoint

CUDA = torch.cuda.is_available()
#: checkpoint.everySteps' default: the side-by-side runs are longer, so one save falls inside.
CHECKPOINT_EVERY = Checkpoint().every_steps


@dataclass(frozen=True)
class Setup:
    args: dict[str, Any]
    batch: int
    steps: int  # of each side-by-side run: past checkpoint_every, so one save is staged inside
    compile: str  # training.compile of the trainer; the nanoGPT loop compiles unless "never"
    log_every: int = 10
    warmup: int = 20  # steps left out of every figure (compilation, allocator warm-up)
    checkpoint_every: int = CHECKPOINT_EVERY
    ab_pairs: int = 4
    ab_steps: int = 100


@dataclass(frozen=True)
class Figures:
    tokens_per_s: float
    step_s: float
    mfu: float | None
    peak_bytes: int | None
    compiled: bool | None  # None: the trainer did not say


def precision_of(label: str) -> str:
    return label.split("+")[0]


def release() -> None:
    """Give back what a run in this process held (compiled graphs, cached device memory), so
    the next run, here or in a trainer process, starts with the whole device."""
    torch.compiler.reset()
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
