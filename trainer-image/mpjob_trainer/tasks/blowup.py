"""A deterministic activation blow-up: the workload side of the fp16 overflow story.

From `overflowAtStep` on (until `overflowUntilStep`, exclusive, when set: a transient fault), an
inner activation is multiplied by `overflowGain` before a
non-linearity and divided by it after. In fp32 and bf16 (8 exponent bits) the product stays
finite and the block keeps training; in fp16 (max 65504) it overflows to inf, the loss turns
non-finite and GradScaler skips every step: the failure mode F1 of the reference article.

The blown-up product runs eagerly even in a compiled model: inductor computes a chain of
pointwise ops in fp32 and rounds only what it stores, so a fused gelu(g * x) / g never holds
g * x in fp16 and never overflows (seen on an H200 with training.compile auto). Eagerly the
product is stored in the autocast dtype, as a real overflowing activation is.
"""

from __future__ import annotations

import torch
from torch import nn


def within(step: int, at_step: int | None, until_step: int | None) -> bool:
    """Is a fault switched on at `step`: from at_step (none: never) until until_step (none: on)."""
    return at_step is not None and step >= at_step and (until_step is None or step < until_step)


class StepSwitched(nn.Module):
    """A fault module that is on from `at_step` until `until_step` (see `within`); the task
    calls `set_step` before each step."""

    def __init__(self, at_step: int | None, until_step: int | None) -> None:
        super().__init__()
        self.at_step = at_step
        self.until_step = until_step
        self.active = False

    def set_step(self, step: int) -> None:
        self.active = within(step, self.at_step, self.until_step)


@torch.compiler.disable
def amplified(x: torch.Tensor, gain: float) -> torch.Tensor:
    """x * gain, stored in x's dtype even inside a compiled model (see the module docstring):
    an injected overflow (this module's, the examples') overflows fp16 as an unfused model does."""
    return x * gain


class ActivationBlowUp(StepSwitched):
    """gelu(g * x) / g, with g = 1 until the switch step and `gain` afterwards."""

    def __init__(self, at_step: int | None, gain: float, until_step: int | None = None) -> None:
        super().__init__(at_step, until_step)
        self.gain = gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return nn.functional.gelu(x)
        return nn.functional.gelu(amplified(x, self.gain)) / self.gain
