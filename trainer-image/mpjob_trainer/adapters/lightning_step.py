"""Lightning's step and evaluation, as the session runs them itself (fp32 replay, quality gate,
an `auto` attempt's measurement; adapters.replaying)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.data import extract_batch_size

from mpjob_trainer.adapters.reload import lightning_reader
from mpjob_trainer.adapters.replaying import FrameworkWeights, RecordedSteps, loss_of, weights_finite
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session


def register(run: Session, trainer: L.Trainer, module: L.LightningModule, recorded: RecordedSteps) -> None:
    """Give the session Lightning's step (fp32 replay; an `auto` attempt's measurement) and
    evaluation (quality gate). Called at the first micro-batch of the first step, before
    Lightning trains on it: an `auto` attempt measures on that batch there (session.measure),
    the one point inside `fit` where no gradient has been accumulated that the step's
    zero_grad would drop. The gate needs no step: it evaluates whatever the optimizers. Manual
    optimization gives no step the session can run: its `training_step` runs backward and steps
    by itself (a probe's update would be applied, and the session's own backward would go through
    a graph already freed); such an attempt is not replayed, and an `auto` one is not measured."""
    if run.spec.validation.every_steps:
        run.evaluate_with(lambda: evaluate(run, trainer, module))
    if not module.automatic_optimization or len(trainer.optimizers) != 1:
        return  # (automatic optimization steps one optimizer, or none when configure_optimizers gives none)
    optimizer = trainer.optimizers[0]

    def step(index: int) -> None:
        batches = recorded.batches(index)
        weights_finite(module)
        optimizer.zero_grad(set_to_none=True)  # the faulting step's gradients are still there
        with recorded.paused(), clipping(trainer, module, optimizer), unlogged(module):
            for k, batch in enumerate(batches):  # each weighed by its samples, as training weighs it
                loss = loss_of(trainer.strategy.training_step(batch, k)) / len(batches)
                run.backward(loss, samples=extract_batch_size(batch) or None)
            run.step(optimizer)

    weights = FrameworkWeights(module, lightning_reader(module, optimizer), run.checkpoints.store)
    run.register_step(step, modules=[module], weights=weights)


@contextlib.contextmanager
def clipping(trainer: L.Trainer, module: L.LightningModule, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """In the block, the optimizer's step first clips the gradients as Lightning's automatic
    optimization does before each step: the module's `configure_gradient_clipping` with the
    Trainer's gradient_clip_val and gradient_clip_algorithm (Lightning's own clips by norm or by
    value; a module's override as it likes). It runs after `run.step` unscaled the gradients and
    measured their norm (the reported one, before clipping), and only for a step GradScaler takes."""

    def clip(*_: Any) -> None:
        module.configure_gradient_clipping(
            optimizer,
            gradient_clip_val=trainer.gradient_clip_val,
            gradient_clip_algorithm=trainer.gradient_clip_algorithm,
        )

    hook = optimizer.register_step_pre_hook(clip) if module.automatic_optimization else None
    try:
        yield
    finally:
        if hook is not None:
            hook.remove()


def evaluate(run: Session, trainer: L.Trainer, module: L.LightningModule) -> float:
    """Mean `validation_step` loss over the first validation.batches batches of `val_dataloader()`,
    under the session's autocast (the gate runs it in the attempt's precision and in fp32); a
    batch the step skips (None, as Lightning's validation loop allows) is not counted."""
    if type(module).validation_step is L.LightningModule.validation_step:
        raise ConfigError("validation.everySteps is set but the LightningModule has no validation_step")
    loader = validation_loader(module)
    module.eval()
    try:
        outputs = []
        with unlogged(module):
            for k, batch in enumerate(itertools.islice(loader, run.spec.validation.batches)):
                with run.autocast():
                    outputs.append(module.validation_step(trainer.strategy.batch_to_device(batch), k))
    finally:
        module.train()
    if not outputs:
        raise ConfigError("validation.everySteps is set but the LightningModule's val_dataloader() is empty")
    losses = [validation_loss(output) for output in outputs if output is not None]
    if not losses:
        raise ConfigError(
            f"validation.everySteps is set but the LightningModule's validation_step returned no loss for any of "
            f"the {len(outputs)} batches of val_dataloader() the gate evaluates (validation.batches="
            f"{run.spec.validation.batches}): return the loss tensor, or a dict with 'loss'"
        )
    return sum(losses) / len(losses)


def validation_loader(module: L.LightningModule) -> Iterable[Any]:
    """The module's one `val_dataloader()`, which the gate evaluates. Loaders given to `fit` or a
    datamodule are Lightning's own validation's; several are told apart by a `dataloader_idx`."""
    if type(module).val_dataloader is L.LightningModule.val_dataloader:
        raise ConfigError(
            "validation.everySteps is set but the LightningModule has no val_dataloader(): the quality gate "
            "evaluates validation_step on the batches it returns (not on val_dataloaders given to fit, nor a "
            "datamodule's)"
        )
    loader = module.val_dataloader()
    if isinstance(loader, list | tuple | Mapping):
        raise ConfigError(
            f"validation.everySteps is set but the LightningModule's val_dataloader() returns {len(loader)} "
            "loaders: the quality gate evaluates one; return one DataLoader"
        )
    return loader


@contextlib.contextmanager
def unlogged(module: L.LightningModule) -> Iterator[None]:
    """In the block, the module's `self.log` (and `log_dict`, which calls it) records nothing. The
    session runs the module's steps inside training hooks (the callback's on_train_batch_start and
    on_train_batch_end): the gate's `validation_step`, the replay's and the measurement's
    `training_step`. Lightning would take what they log for a metric of that training step
    (callback_metrics, the loggers, a checkpoint's or early stop's monitor): the gate's last batch,
    a replay's fp32 loss or a probe's beside the one the loop logged."""

    def log(*_: Any, **__: Any) -> None:
        pass

    module.log = log  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.log  # the class's again


def validation_loss(output: Any) -> float:
    """The loss a `validation_step` returned: a tensor, or a dict's "loss" (Lightning's contract)."""
    if isinstance(output, Mapping) and "loss" not in output:
        raise ConfigError(
            f"validation.everySteps is set but the LightningModule's validation_step returned a dict without "
            f"'loss' (keys: {', '.join(map(str, output))})"
        )
    return float(loss_of(output))
