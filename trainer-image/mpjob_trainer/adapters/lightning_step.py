"""Lightning's step and evaluation, as the session runs them itself (fp32 replay, quality gate,
an `auto` attempt's measurement; adapters.replaying)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import lightning as L
import torch

from mpjob_trainer.adapters.reload import lightning_reader
from mpjob_trainer.adapters.replaying import FrameworkWeights, RecordedSteps, loss_of, weights_finite
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session


def register(run: Session, trainer: L.Trainer, module: L.LightningModule, recorded: RecordedSteps) -> None:
    """Give the session Lightning's step (fp32 replay; an `auto` attempt's measurement) and
    evaluation (quality gate). Called at the first micro-batch of the first step, before
    Lightning trains on it: an `auto` attempt measures on that batch there (session.measure),
    the one point inside `fit` where no gradient has been accumulated that the step's
    zero_grad would drop."""
    if len(trainer.optimizers) != 1:
        return  # manual optimization with several optimizers: no one step to re-run
    optimizer, clip = trainer.optimizers[0], float(trainer.gradient_clip_val or 0) or None
    by_value = trainer.gradient_clip_algorithm == "value"  # else by norm, Lightning's default

    def step(index: int) -> None:
        batches = recorded.batches(index)
        weights_finite(module.parameters())
        optimizer.zero_grad(set_to_none=True)  # the faulting step's gradients are still there
        with recorded.paused(), clipping_values(optimizer, clip if by_value else None):
            for k, batch in enumerate(batches):
                run.backward(loss_of(trainer.strategy.training_step(batch, k)) / len(batches))
            run.step(optimizer, clip_norm=None if by_value else clip)

    weights = FrameworkWeights(module.parameters, lightning_reader(module, optimizer))
    run.register_step(step, modules=[module], weights=weights)
    if run.spec.validation.every_steps:
        run.evaluate_with(lambda: evaluate(run, trainer, module))


@contextlib.contextmanager
def clipping_values(optimizer: torch.optim.Optimizer, value: float | None) -> Iterator[None]:
    """In the block, the optimizer's step first clips each gradient element to [-value, value], as
    Lightning's `gradient_clip_algorithm="value"` does: after `run.step` unscaled them and measured
    their norm (the reported one, before clipping), and only for a step GradScaler takes."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    clip = (lambda *_: torch.nn.utils.clip_grad_value_(params, value)) if value else (lambda *_: None)
    hook = optimizer.register_step_pre_hook(clip)
    try:
        yield
    finally:
        hook.remove()


def evaluate(run: Session, trainer: L.Trainer, module: L.LightningModule) -> float:
    """Mean `validation_step` loss over the first validation.batches batches of `val_dataloader()`,
    under the session's autocast (the gate runs it in the attempt's precision and in fp32)."""
    if type(module).validation_step is L.LightningModule.validation_step:
        raise ConfigError("validation.everySteps is set but the LightningModule has no validation_step")
    module.eval()
    try:
        losses = []
        for k, batch in enumerate(itertools.islice(module.val_dataloader(), run.spec.validation.batches)):
            with run.autocast():
                losses.append(float(loss_of(module.validation_step(trainer.strategy.batch_to_device(batch), k))))
    finally:
        module.train()
    if not losses:
        raise ConfigError("validation.everySteps is set but the LightningModule's val_dataloader() is empty")
    return sum(losses) / len(losses)
