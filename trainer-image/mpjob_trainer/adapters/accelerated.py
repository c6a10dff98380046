"""What the Hugging Face adapter asks of accelerate's `Accelerator`, the Trainer's engine.

The Trainer keeps some of a step's numbers to itself: it passes the gradient norm it took to
no callback. accelerate is where they pass, through public methods, so the adapter meets them
there: the attempt's GradScaler becomes the accelerator's, the norm `clip_grad_norm_` returns
is kept for the step's end, and the model's class forward is restored where accelerate's
autocast forward would override the session's precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from mpjob_trainer.session.framework import FrameworkRun


def use_attempt_scaler(bridge: FrameworkRun, accelerator: Any) -> None:
    """fp16: the attempt's GradScaler is the Trainer's; accelerate takes it at prepare()."""
    if bridge.scaler is not None:
        accelerator.scaler = bridge.scaler
        accelerator.native_amp = True  # on a CPU accelerate would otherwise run no autocast at all


class GradNorms:
    """The gradient norm of the Trainer's last optimizer step (before clipping, unscaled; a
    device tensor: no sync). The Trainer takes it from `accelerator.clip_grad_norm_` at every
    optimizer step (with an infinite max norm when it does not clip): the wrapper keeps it."""

    def __init__(self, accelerator: Any) -> None:
        self.last: torch.Tensor | float | None = None
        clip = accelerator.clip_grad_norm_

        def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2) -> Any:
            self.last = clip(parameters, max_norm, norm_type=norm_type)
            return self.last

        accelerator.clip_grad_norm_ = clip_grad_norm_

    def take(self) -> torch.Tensor | float | None:
        """The step's norm, once (None: the Trainer took none since the last take)."""
        value, self.last = self.last, None
        return value


@contextlib.contextmanager
def class_forward(model: torch.nn.Module) -> Iterator[None]:
    """Run the model's class forward in the block: accelerate's mixed precision replaces the
    instance's `forward` with one that enters autocast itself, which no outer autocast (the
    session's fp32 replay or evaluation) could turn off."""
    patched = model.__dict__.pop("forward", None)
    try:
        yield
    finally:
        if patched is not None:
            model.forward = patched
