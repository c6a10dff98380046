"""The data order: a seeded permutation per epoch, so the data position is just the step.

Sample k of the global stream is permutation_e[k mod N] with e = k div N, and micro-batch m
of optimizer step s on rank r takes the `batch` samples starting at
k = ((s * accumulation + m) * world + r) * batch. Exact resume needs only the step.

Optimizer step s covers the stream positions [s * P, (s + 1) * P) with P = accumulation x
world x batch, whatever the split of P: an attempt that halves `batch` and doubles
`accumulation` (a fallback to fp32, or after running out of GPU memory) trains on the same
samples per step, in the same order on one process (across ranks the same set per step).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, default_collate


class StepSampler:
    def __init__(self, size: int, batch: int, accumulation: int, world: int, rank: int, seed: int) -> None:
        self.size = size
        self.batch = batch
        self.accumulation = accumulation
        self.world = world
        self.rank = rank
        self.seed = seed
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.size, generator=gen)
            self._epoch = epoch
        return self._perm

    def indices(self, step: int, micro: int) -> list[int]:
        start = ((step * self.accumulation + micro) * self.world + self.rank) * self.batch
        out: list[int] = []
        for k in range(start, start + self.batch):
            out.append(int(self._permutation(k // self.size)[k % self.size]))
        return out

    def step_indices(self, step: int) -> list[int]:
        """This rank's samples of optimizer step `step`, micro-batch by micro-batch."""
        return [i for micro in range(self.accumulation) for i in self.indices(step, micro)]


def micro_batch(dataset: Dataset[Any], sampler: StepSampler, step: int, micro: int) -> Any:
    return default_collate([dataset[i] for i in sampler.indices(step, micro)])


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
