"""The Hugging Face Trainer's training as the session sees it: `MpjobCallback` closes each
optimizer step in the session (guard, progress, checkpoint decision, SIGTERM) once the Trainer has
logged, evaluated and saved it (adapters.hf_tracking.after_evaluation), with the loss of each of
its micro-batches the Trainer's `training_step` returned (`steps_losses`); a stop told inside a
step's accumulation waits for the step's end (`on_substep_end`)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_pt_utils import find_batch_size

from mpjob_trainer.adapters.accelerated import GradNorms
from mpjob_trainer.adapters.hf_step import TrainerLoss, loss_samples, register
from mpjob_trainer.adapters.hf_tracking import best_inside, epoch_ends
from mpjob_trainer.adapters.quarantined import TakenBack
from mpjob_trainer.adapters.replaying import RecordedSteps, steps_to_keep
from mpjob_trainer.session.framework import FrameworkRun


class MpjobCallback(TrainerCallback):
    """Closes each optimizer step in the session; each micro-batch's loss is the one the Trainer's
    `training_step` returns (kept on the device: no sync per step), summed over the step as the
    Trainer's own log sums it, and its samples counted (`steps_losses`)."""

    def __init__(self, bridge: FrameworkRun, trainer: Trainer) -> None:
        self.bridge = bridge
        self.trainer = trainer
        self._losses: list[torch.Tensor] = []
        self._samples = 0
        self._weight: int | None = 0  # the samples weighing this rank's loss (None: ranks weigh alike)
        self._lr: float | None = None
        self.recorded = RecordedSteps(steps_to_keep(bridge.run.spec))
        self.trainer_loss = TrainerLoss(trainer, self.recorded)
        self.quarantined = TakenBack(bridge, lambda: optimizers(trainer))
        self.grad_norms = GradNorms(trainer.accelerator)
        self._open: dict[str, Any] | None = None  # the step on_step_end left for `close_step`
        self._epoch_over = False  # on_epoch_end came after the open step: the epoch's last call closes it
        self._stop_held = False  # a stop told inside a step's accumulation (`on_substep_end`)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """Ready for the steps `Trainer.train` runs now; the trainer state it read from a checkpoint
        follows no best model's checkpoint outside output_dir (`best_inside`)."""
        best_inside(state, args.output_dir)
        self._losses.clear()  # a re-entry after a rollback: what the left loop held is gone
        self._samples, self._weight, self._open, self._epoch_over, self._stop_held = 0, 0, None, False, False
        self.recorded.clear()
        self.bridge.watch(kw["optimizer"])
        register(self.bridge.run, self.trainer, self.trainer_loss)
        self.bridge.checkpoint_start()

    def drew(self, inputs: dict[str, Any], num_items_in_batch: Any) -> None:
        """A micro-batch the Trainer drew for the step: its samples (an epoch's last may be short),
        and what weighs its loss in the job's (`loss_samples`)."""
        self._samples += find_batch_size(inputs) or self.trainer.args.per_device_train_batch_size
        weight = loss_samples(self.trainer, inputs, num_items_in_batch)
        self._weight = None if weight is None or self._weight is None else self._weight + weight

    def observe(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss as `training_step` returned it: divided by the step's micro-batches,
        or normalised over the whole step's items by a model given `num_items_in_batch`."""
        self._losses.append(loss.detach())

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._lr = kw["optimizer"].param_groups[0]["lr"]  # the step's: the schedule steps after this

    def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """The Trainer leaves its loop wherever `should_training_stop` finds it, also at a micro-batch
        that steps no optimizer (a callback's own stop there): its last step would then close as an
        ordinary one, neither checkpointed as the run's last nor recorded as a stop. Such a stop
        (told by the callbacks before this one, added last) is held back to the step's end."""
        if control.should_training_stop:
            control.should_training_stop, self._stop_held = False, True

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._stop_held:  # `close_step` records it, after the step's evaluation and save
            control.should_training_stop, self._stop_held = True, False
        self.quarantined.take_back()  # before the session may checkpoint this step
        loss = torch.stack(self._losses).float().sum() if self._losses else None
        self._losses.clear()
        lr, self._lr = self._lr, None
        samples, weight, self._samples, self._weight = self._samples * self.bridge.run.world.size, self._weight, 0, 0
        grad_norm = self.grad_norms.take()
        self._epoch_over = False
        self._open = {
            "step": state.global_step,
            "loss": loss,
            "samples": samples,
            "lr": lr,
            "grad_norm": grad_norm,
            "loss_samples": weight or None,
        }

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._epoch_over = True

    def close_step(self) -> None:
        """Close the step `on_step_end` left open in the session, after the Trainer evaluated and
        saved it (adapters.hf_tracking.after_evaluation: mpjob's checkpoint holds that evaluation),
        at the epoch's end after its epoch-end evaluation (`epoch_ends`). A step the Trainer stops
        after (`should_training_stop`: an EarlyStoppingCallback, a callback's own stop) is the run's
        last: its checkpoint records the stop (FrameworkRun.stop_early)."""
        if not self._epoch_over and epoch_ends(self.trainer.state, self.trainer.control):
            return
        step, self._open = self._open, None
        if step is not None:
            if self.trainer.control.should_training_stop:
                self.bridge.stop_early(step["step"])
            self.bridge.end_step(**step)


def steps_losses(trainer: Trainer, callback: MpjobCallback) -> None:
    """The Trainer's `training_step` (an instance attribute now) hands the callback each micro-batch
    and the loss it returns, the one the Trainer logs; at a quarantined step it runs no forward: it
    gives zero gradients, and the callback takes the update back (adapters.quarantined)."""
    original, taken = trainer.training_step, callback.quarantined

    def training_step(model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        callback.drew(inputs, num_items_in_batch)
        if not taken.skips(trainer.state.global_step):
            loss = original(model, inputs, num_items_in_batch)
            callback.observe(loss)
            return loss
        taken.zero_gradients()
        return torch.zeros((), device=trainer.args.device)

    trainer.training_step = training_step  # type: ignore[method-assign]


def optimizers(trainer: Trainer) -> list[torch.optim.Optimizer]:
    optimizer = trainer.optimizer
    return [getattr(optimizer, "optimizer", optimizer)] if optimizer is not None else []
