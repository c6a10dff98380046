"""Lightning's training as the session sees it: `MpjobCallback` closes each optimizer step in the
session (guard, progress, checkpoint decision, SIGTERM) once Lightning is done with the batch, its
validation there included (`closed_after_validation`), and checks each micro-batch the script's
DataLoader feeds against the attempt's (`checked_batch`).

The micro-batch is the DataLoader's, built by the script: the adapter cannot hand it the
attempt's split (the operator halves `spec.training.batchSize` after a fallback into fp32 or an
out-of-memory, doubling the accumulation, which `trainer_settings` does set). A batch larger
than the attempt's micro-batch would train more samples per step than the job, its report and
its checkpoints say, and run out of memory again where the split was made to avoid it: a
ConfigError, before anything trains on it. A smaller one passes (an epoch's last batch). An
attempt resumed from a checkpoint written in another split counts the epoch's micro-batches
Lightning restored in its own (`in_this_split`): the accumulation and the epoch's end follow them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.data import extract_batch_size

from mpjob_trainer.adapters.lightning_step import register
from mpjob_trainer.adapters.own_saves import outside_store
from mpjob_trainer.adapters.quarantined import TakenBack
from mpjob_trainer.adapters.replaying import RecordedSteps, steps_to_keep
from mpjob_trainer.adapters.spec_settings import spec_name
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session
from mpjob_trainer.session.framework import FrameworkRun

#: The field of MpjobCallback's state in Lightning's checkpoint: the accumulation it was written in.
ACCUMULATED = "gradAccumulation"


def checked_batch(run: Session, size: int) -> int:
    """`size`, the samples of a micro-batch the script's DataLoader gave this process, when it is
    no more than the attempt's micro-batch (`run.spec.training.batch_size`); a ConfigError naming
    both and how to build the loader when it is more."""
    attempt, job = run.spec.training.batch_size, run.launch.spec.training.batch_size
    if size <= attempt:
        return size
    split = f"; this attempt's split trains {attempt}" if attempt != job else ""
    raise ConfigError(
        f"the DataLoader gave a batch of {size} samples, more than the attempt's micro-batch {attempt} "
        f"({spec_name('batch_size')} is {job}{split}): the operator halves it after a fallback into fp32 "
        "or an out-of-memory, and the adapter cannot reach your loader; build it with "
        "DataLoader(..., batch_size=run.spec.training.batch_size)"
    )


class MpjobCallback(L.Callback):
    """Closes each optimizer step in the session: guard, progress, checkpoint decision, SIGTERM.
    Losses stay on the device (no sync per step); steps are Lightning's global steps."""

    def __init__(self, run: Session) -> None:
        self.run = run
        self.bridge = FrameworkRun(run)
        self._loss: torch.Tensor | None = None
        self._samples = 0
        self._size = 0  # the samples of the micro-batch in training
        self._lr: float | None = None
        self._step = 0
        self._open: dict[str, Any] | None = None  # the step on_train_batch_end left for `close_step`
        self._stop_held = False  # a stop told inside a step's accumulation (`whole_steps`)
        self._registered = False
        self.recorded = RecordedSteps(steps_to_keep(run.spec))
        self.optimizers: list[torch.optim.Optimizer] = []  # Lightning's, once fit has made them
        self.quarantined = TakenBack(self.bridge, lambda: list(self.optimizers))
        self._written_in: int | None = None  # the accumulation of the checkpoint fit resumes from

    def state_dict(self) -> dict[str, Any]:
        """What Lightning's checkpoint keeps of this callback: the accumulation its epoch's
        micro-batch count was made in (`in_this_split`)."""
        return {ACCUMULATED: self.run.spec.training.grad_accumulation}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        written = state_dict.get(ACCUMULATED)
        fits = isinstance(written, int) and not isinstance(written, bool) and written > 0
        self._written_in = written if fits else None  # none: a checkpoint of before it was kept

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The script's ModelCheckpoint callbacks, their folders resolved by now (Lightning's
        default_root_dir or logger's where the script gave none), before they write anything."""
        for checkpoint in trainer.checkpoint_callbacks:
            folder = getattr(checkpoint, "dirpath", None)
            if folder is not None:
                outside_store(self.run, str(folder), f"{type(checkpoint).__name__}(dirpath)")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.bridge.reclaim_sigterm()  # Lightning would stop at its next batch, without a checkpoint
        for optimizer in trainer.optimizers:
            self.bridge.watch(optimizer)
        self.optimizers = list(trainer.optimizers)
        self._step = trainer.global_step
        written, self._written_in = self._written_in, None  # a fit without ckpt_path reads none
        if written is not None:
            in_this_split(trainer.fit_loop.epoch_loop.batch_progress, written, trainer.accumulate_grad_batches)
        self._registered = False
        self._loss, self._samples, self._lr = None, 0, None  # a re-entry after a rollback: the left step is gone
        self._open, self._stop_held = None, False  # a new fit: Lightning forgets its stop too
        self.recorded.clear()
        self.bridge.checkpoint_start()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._size = checked_batch(self.run, extract_batch_size(batch))  # before anything trains on it
        self.recorded.add(trainer.global_step, batch)
        if not self._registered:  # the step runs on recorded batches: now there is one
            self._registered = True
            register(self.run, trainer, pl_module, self.recorded)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if optimizer is trainer.optimizers[0]:  # the step's: a step-interval schedule steps before the batch end
            self._lr = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and not self.quarantined.skips(self._step):  # a quarantined step's is 0
            loss = loss.detach().float()
            self._loss = loss if self._loss is None else self._loss + loss
        self._samples += self._size
        if trainer.global_step == self._step:
            return  # accumulating gradients: no optimizer step yet
        self._step = trainer.global_step
        lr, self._lr = self._lr, None
        loss, mine, self._loss, self._samples = self._loss, self._samples, None, 0  # mine: weigh its loss
        self.quarantined.take_back()  # before the session may checkpoint this step
        samples = mine * self.run.world.size
        self._open = {
            "step": trainer.global_step,
            "loss": loss,
            "samples": samples,
            "lr": lr,
            "loss_samples": mine or None,
        }

    def whole_steps(self, trainer: L.Trainer) -> None:
        """Lightning leaves fit wherever `should_stop` finds it, also at a micro-batch that steps no
        optimizer (a Timer's max_time, a callback's stop, a validation inside an accumulation): its
        last step would then close as an ordinary one, neither checkpointed as the run's last nor
        recorded as a stop. Such a stop is held back until the step's own micro-batch, where
        `close_step` records it (the micro-batches already accumulated are trained, not dropped)."""
        if self._open is None and stops_early(trainer):
            trainer.should_stop, self._stop_held = False, True
        elif self._open is not None and self._stop_held:
            trainer.should_stop, self._stop_held = True, False

    def close_step(self, stops: bool) -> None:
        """Close the step `on_train_batch_end` left open in the session, once Lightning validated
        after it, if it does there (`closed_after_validation`: mpjob's checkpoint holds what the
        validation told the callbacks, a ModelCheckpoint's best, an EarlyStopping's patience).
        `stops`: Lightning stops after it (`stops_early`): its checkpoint records the stop."""
        step, self._open = self._open, None
        if step is not None:
            if stops:
                self.bridge.stop_early(step["step"])
            self.bridge.end_step(**step)


def in_this_split(progress: Any, written: int, accumulation: int) -> None:
    """Lightning's count of the epoch's micro-batches (`batch_progress`, restored from a checkpoint
    written in an accumulation of `written`) in this attempt's `accumulation`: the same optimizer
    steps. It accumulates up to each multiple of the accumulation and ends the epoch at the
    loader's length, both in micro-batches: an attempt in another split (the operator's, after a
    fallback into fp32 or an out-of-memory, or its taking back) would otherwise step after a
    part of a step's micro-batches and end its epoch early or late. The epochs before are kept as
    counted; the counters' differences (a batch counted ready and not yet completed) too."""
    if written == accumulation:
        return
    current, total, ready = progress.current, progress.total, progress.current.ready
    for name in ("ready", "started", "processed", "completed"):
        counted = ready // written * accumulation - (ready - getattr(current, name))
        setattr(total, name, getattr(total, name) - getattr(current, name) + counted)
        setattr(current, name, counted)


def stops_early(trainer: L.Trainer) -> bool:
    """Does Lightning leave fit after the batch it just ended, short of max_steps on its own
    decision: `should_stop` (EarlyStopping, the Timer's max_time, a callback's own) with min_steps
    and min_epochs met (else it trains on), or its max_epochs reached (at an epoch's end, where
    `current_epoch` counts the epoch just trained: it is completed)?"""
    loop = trainer.fit_loop
    steps_met = not loop.min_steps or trainer.global_step >= loop.min_steps
    epochs_met = not loop.min_epochs or trainer.current_epoch >= loop.min_epochs  # inside an epoch: those before it
    epochs = trainer.max_epochs
    epochs_done = epochs is not None and epochs >= 0 and trainer.current_epoch >= epochs
    return bool(trainer.should_stop and steps_met and epochs_met) or epochs_done


@contextmanager
def closed_after_validation(trainer: L.Trainer, callback: MpjobCallback) -> Iterator[None]:
    """In the block, `callback.close_step(stops_early(trainer))` runs at the end of each of
    Lightning's training batches, after the validation it runs there, if any, with every callback's
    and the module's hooks: the training epoch loop's `on_advance_end` (a stop told inside a step's
    accumulation held back to the step's end first: `whole_steps`). After the batch that ends an epoch (its
    last, max_steps, a stop) it runs once the epoch has ended, after every `on_train_epoch_end`
    (a ModelCheckpoint's save there, an EarlyStopping's check) and the epoch's LR schedule: the
    fit loop's `on_advance_end`. (Instance attributes, the classes' again after the block.)
    Lightning's own checkpoints taken after it resume as saved 'on last': no validation again."""
    fit_loop, epoch_loop = trainer.fit_loop, trainer.fit_loop.epoch_loop
    batch_end, epoch_end = epoch_loop.on_advance_end, fit_loop.on_advance_end
    held = [False]  # a batch that ended its epoch waits for the epoch's end

    close = callback.close_step

    def on_batch_end(*args: Any, **kwargs: Any) -> None:
        batch_end(*args, **kwargs)
        callback.whole_steps(trainer)
        if epoch_loop.done:
            held[0] = True
        else:
            close(stops_early(trainer))

    def on_epoch_end(*args: Any, **kwargs: Any) -> None:
        epoch_end(*args, **kwargs)
        if held[0]:
            held[0] = False
            close(stops_early(trainer))

    epoch_loop.on_advance_end = on_batch_end  # type: ignore[method-assign]
    fit_loop.on_advance_end = on_epoch_end  # type: ignore[method-assign]
    try:
        yield
    finally:
        del epoch_loop.on_advance_end, fit_loop.on_advance_end
