"""What the Hugging Face adapter asks of accelerate's `Accelerator`, the Trainer's engine.

The Trainer keeps some of a step's numbers to itself: it passes the gradient norm it took to
no callback. accelerate is where they pass, through public methods, so the adapter meets them
there: the attempt's GradScaler becomes the accelerator's, the norm `clip_grad_norm_` returns
is kept for the step's end, and the model's class forward is restored where accelerate's
autocast forward would override the session's precision.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.state import AcceleratorState

from mpjob_trainer.session.framework import FrameworkRun


def use_attempt_scaler(bridge: FrameworkRun, accelerator: Any) -> None:
    """fp16: the attempt's GradScaler is the Trainer's; accelerate takes it at prepare()."""
    if bridge.scaler is not None:
        accelerator.scaler = bridge.scaler
        accelerator.native_amp = True  # on a CPU accelerate would otherwise run no autocast at all


def follow_attempt_precision(trainer: Any, precision: str, *, fp16: bool, bf16: bool) -> None:
    """The attempt's precision wins over the script's own `TrainingArguments(fp16=, bf16=)`: a
    script that hard-codes `fp16=True` trains its fp16 attempt in fp16 and its fallback attempt
    in bf16 (refusing the arguments there would end the job at the very fallback it runs for).
    The Trainer's accelerator is built anew with the attempt's mixed precision, as transformers'
    own hyperparameter search rebuilds it after changing the arguments; the script is told on
    stderr (its worker log)."""
    args = trainer.args
    given = {"fp16": bool(args.fp16), "bf16": bool(args.bf16)}
    if given == {"fp16": fp16, "bf16": bf16}:
        return
    args.fp16, args.bf16 = fp16, bf16
    args.mixed_precision = "fp16" if fp16 else "bf16" if bf16 else "no"
    AcceleratorState._reset_state()  # the process's one state refuses another mixed precision
    trainer.create_accelerator_and_postprocess()
    set_by_script = ", ".join(f"{k}=True" for k, v in given.items() if v) or "fp16=False, bf16=False"
    print(
        f"mpjob: the Trainer's TrainingArguments({set_by_script}) are not this attempt's precision: it "
        f"trains in {precision} (spec.precision decides; mpjob_trainer.adapters.hf.training_arguments(run, ...) "
        "sets them for each attempt)",
        file=sys.stderr,
        flush=True,
    )


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
