"""Faults a built-in workload can be told to have, for demos, runbooks and tests of the
trainer's recovery paths (task.args of the `mlp` workload):

- `nonFiniteSamples: [i, ...]` (or `"all"`): those samples' inputs hold NaN. Every
  precision, fp32 included, turns their loss non-finite: poisoned data, which the fp32 replay
  tells from a precision's fault (NonFiniteInFp32; with guard.onBadData skip, the data rung
  quarantines them). In a run shorter than an epoch a listed sample is served at one step; over
  several epochs it comes back every epoch (until quarantined); `"all"` makes every step bad.
- `batchScale: {atStep: s, steps: n, factor: f}`: the batches (their targets) of optimizer
  steps s..s+n-1 are multiplied by f (default 1000): a finite loss spike, in every precision
  (guard.spike).
- `stepDelay: {fp32: s, bf16: s, fp16: s}`: each forward pass in that precision takes `s`
  seconds longer, as on a device where AMP does (or does not) pay off: `auto` measures it
  (failure mode F6, AmpSlowerThanFp32).
- `cancellationOffset: c`: an inner activation is computed as (x + c) - c. In fp32 that is x;
  in bf16 or fp16 the sum is rounded to the format's spacing at c (8 in bf16 and 0.5 in fp16
  at c = 1000), so the model computes a coarser function in low precision than in fp32 and
  its loss drifts from fp32's at the same weights while staying finite: what the quality gate
  (spec.validation, QualityDrift) is for.
- `fp8OutlierAtStep: s` (and `fp8OutlierUntilStep: u`, exclusive: a transient fault): from step
  s on, the first sample of each batch reaches the first inner linear (an mlp of 2 layers or
  more) scaled by 2^20 and leaves it scaled back (an outlier token, as activation outliers in
  large models are). Powers of two scale exactly in fp32 and bf16, so they compute what they
  did; fp8's tensorwise scaling takes one scale per tensor from its largest value, and the other
  samples' inputs fall below e4m3's smallest step and flush to zero: the loss drifts from fp32's
  in fp8 only, finitely, which the quality gate catches (rowwise scaling, one scale per sample,
  is not hurt).
- `outOfMemoryAbove: n`: a forward pass over more than `n` samples raises
  torch.OutOfMemoryError, as a GPU does when a micro-batch does not fit; the next attempt
  splits the micro-batch (OutOfDeviceMemory), or the attempt goes on in it in place
  (precision.inPlace). With `outOfMemoryFromStep: s`, only from optimizer step s on (as when
  longer sequences or a memory leak arrive mid-run).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from mpjob_contract import builtin_args
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.tasks.blowup import StepSwitched


class PoisonedSamples(Dataset[Any]):
    """A dataset of (input, target) pairs whose listed samples have NaN inputs."""

    def __init__(self, inner: Dataset[Any], poisoned: set[int]) -> None:
        self.inner = inner
        self.poisoned = poisoned

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        inputs, target = self.inner[index]
        if index in self.poisoned:
            inputs = torch.full_like(inputs, float("nan")) if inputs.is_floating_point() else inputs
        return inputs, target


class BatchScale:
    """Targets x factor at optimizer steps [at, at + steps) (set_step), else as they are."""

    def __init__(self, at: int | None, steps: int, factor: float) -> None:
        self.at, self.steps, self.factor = at, steps, factor
        self.active = False

    def set_step(self, step: int) -> None:
        self.active = self.at is not None and self.at <= step < self.at + self.steps

    def __call__(self, target: torch.Tensor) -> torch.Tensor:
        return target * self.factor if self.active else target


def batch_scale(value: Any) -> BatchScale:
    """task.args.batchScale (none: targets as they are), read by the contract's rule."""
    try:
        scale = builtin_args.batch_scale(value)
    except builtin_args.BadTaskArg as exc:
        raise ConfigError(str(exc)) from exc
    return BatchScale(scale.at, scale.steps, scale.factor)


class MemoryCeiling(nn.Module):
    """Identity, except that a batch of more than `limit` samples raises torch.OutOfMemoryError
    (from optimizer step `from_step` on: set_step)."""

    def __init__(self, limit: int | None, from_step: int | None = None) -> None:
        super().__init__()
        self.limit, self.from_step = limit, from_step
        self.active = from_step is None

    def set_step(self, step: int) -> None:
        self.active = self.from_step is None or step >= self.from_step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.limit is not None and self.active and x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (task.args.outOfMemoryAbove={self.limit}): a micro-batch of {x.shape[0]} "
                "samples does not fit"
            )
        return x


class PrecisionDelay(nn.Module):
    """Identity that sleeps `delays[precision]` seconds per forward pass in that precision."""

    def __init__(self, delays: dict[str, float]) -> None:
        super().__init__()
        self.delays = delays

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        precision = "fp32"
        if torch.is_autocast_enabled(kind):
            precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(torch.get_autocast_dtype(kind), "fp32")
        if self.delays.get(precision):
            time.sleep(self.delays[precision])
        return x


class Cancellation(nn.Module):
    """(x + offset) - offset: exact in fp32, rounded to the format's spacing at `offset` in low precision."""

    def __init__(self, offset: float | None) -> None:
        super().__init__()
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if not self.offset else (x + self.offset) - self.offset


class OutlierRow(StepSwitched):
    """`inner` (a linear) with the batch's first sample scaled by `gain` on the way in and back on
    the way out while active (task.args.fp8OutlierAtStep/UntilStep): see the module docstring."""

    def __init__(self, inner: nn.Module, at_step: int | None, until_step: int | None, gain: float = 2.0**20) -> None:
        super().__init__(at_step, until_step)
        self.inner = inner
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return self.inner(x)
        scale = torch.ones(x.shape[0], *([1] * (x.dim() - 1)), dtype=x.dtype, device=x.device)
        scale[0] = self.gain
        return self.inner(x * scale) / scale.to(x.dtype)
