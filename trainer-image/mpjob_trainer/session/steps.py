"""StepNumerics: one optimizer step's arithmetic as the session sees it, and its one sync point.

`run.backward` scales the loss (fp16) and keeps it, `run.step` unscales, clips, steps and
records the gradient norm, `run.end_step` closes the step in the guard. None of it waits for
the device beyond GradScaler's own found_inf check: losses and the gradient norm stay device
tensors (session.tally.StepTally), and which optimizer steps GradScaler applied is learnt on the host from
an optimizer step post-hook (AppliedSteps; GradScaler calls `optimizer.step()` only for
finite gradients). `read()` is the interval's one sync point (NumericGuard.read): it serves
the log line, the metrics, the guard's checks and the checkpoint decision.

The precision every call uses is the current mode's (session.modes): in PROBE `step()`
zeroes the gradients and applies nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mpjob_trainer.checkpoint.state_steps import stepped_for_state
from mpjob_trainer.errors import ConfigError, NumericFault
from mpjob_trainer.guard import GuardReading, NumericGuard
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.progress import Interval, host_value
from mpjob_trainer.session.tally import Number, StepTally, check_samples, is_count
from mpjob_trainer.session.updates import UpdateWatch
from mpjob_trainer.sharding import clip_gradients

#: The loop's step as a function of its 0-based index (Session.register_step).
StepFunction = Callable[[int], None]
#: The dataset indices of a step's samples on this process.
SamplesFunction = Callable[[int], list[int]]


def step_samples(samples: object) -> int:
    """end_step's `samples` (None: 0), the step's samples across all ranks: an integer >= 0, else a
    ConfigError at the call: `samples_seen` adds it, and a checkpoint holding a data position that
    is no count is refused by every resume (the attempt would start over)."""
    if samples is None:
        return 0
    if not is_count(samples, 0):
        raise ConfigError(
            f"end_step(samples={samples!r}): samples is the number of samples the step trained on across all "
            "ranks (run.samples_seen, the data position a resume restores, adds it): an integer >= 0, or None"
        )
    return samples


#: What each function the loop hands the session is called for (`require_callables`).
CALLED_FOR = {
    "step": "step(i) runs optimizer step i",
    "samples": "samples(i) names step i's samples",
    "reshape": "reshape(micro_batch, grad_accumulation) changes the loop's split",
    "evaluate": "evaluate() returns the mean eval loss",
}


def require_callables(call: str, **given: object) -> None:
    """Each function the loop hands `call` is callable (or None): else a ConfigError at the call, not
    a TypeError the first time the session calls it (an InfraError, retried as the platform's fault)."""
    for name, value in given.items():
        if value is not None and not callable(value):
            raise ConfigError(
                f"{call}({name}={value!r}): {name} is a function the session calls back "
                f"({CALLED_FOR[name]}), not a value of type {type(value).__name__}"
            )


class AppliedSteps:
    """Optimizer steps actually applied (GradScaler skips overflowing ones); `before` and `after`:
    run as each watched optimizer's step pre-hook (StepNumerics: is this step the session's own?)
    and post-hook (what a framework's step applied)."""

    def __init__(
        self,
        guard: NumericGuard,
        before: Callable[[torch.optim.Optimizer], None] | None = None,
        after: Callable[[torch.optim.Optimizer], None] | None = None,
    ) -> None:
        self.guard, self.before, self.after = guard, before, after
        self.count = 0
        #: The optimizers hooked, held weakly: not by id(), which a new optimizer made after an
        #: old one was freed (a model wrapped anew in place) can share, leaving it unhooked and
        #: every one of its steps counted as an overflow, on the ranks where the ids met only.
        self._watched: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook the optimizer (once) so the guard and the count see which steps were applied."""
        if optimizer not in self._watched:
            self._watched.add(optimizer)
            if self.before is not None:
                optimizer.register_step_pre_hook(self._stepping)
            optimizer.register_step_post_hook(self._stepped)

    def _stepping(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if self.before is not None and not stepped_for_state():  # a state-dict function's step is no update
            self.before(optimizer)

    def _stepped(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if stepped_for_state():
            return
        if self.after is not None:
            self.after(optimizer)
        if self.guard.optimizer_stepped(optimizer):
            self.count += 1


@dataclass(frozen=True)
class Read:
    """An interval's numbers on the host (loss: the job's at the last step, over every rank)."""

    guard: GuardReading
    loss: float | None
    grad_norm: float | None


class StepNumerics:
    """backward, step and end of step in the attempt's precision, kept by the guard."""

    def __init__(self, precision: AttemptPrecision, guard: NumericGuard) -> None:
        self.precision = precision
        self.guard = guard
        self.tally = StepTally()
        self.applied = AppliedSteps(guard, self._check_own_step, self._applied_elsewhere)
        #: Steps in a row that ran backward and applied no update (checked at checkpoint steps).
        self.updates = UpdateWatch()
        #: Is `step()` stepping an optimizer right now? (In fp16 no other step is the loop's to take.)
        self._stepping = False
        #: A framework steps its optimizer with the attempt's GradScaler itself (`watch`): each of
        #: its steps asked for an update, though not through `step()`.
        self.steps_elsewhere = False
        #: GradScaler updates once per step, after every optimizer of the step has stepped (its
        #: multi-optimizer contract), at `close`: due once it unscaled one, whether that one lives on
        #: or not; those it unscaled since (held weakly, as AppliedSteps holds them).
        self._update_due = False
        self._unscaled: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        #: Those the loop had unscaled before `step()` (`unscale`: for its own clipping): step() leaves them.
        self._unscaled_early: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook an optimizer the loop steps itself (a framework's), not through `step()`."""
        self.steps_elsewhere = True
        self.applied.watch(optimizer)

    def backward(self, loss: torch.Tensor, samples: int | None = None) -> None:
        check_samples(samples, call="backward(loss, samples=", name="samples", least=0)
        scaler = self.precision.scaler
        with self.precision.ours():  # a forward recomputed in it (activation checkpointing) is ours
            (scaler.scale(loss) if scaler is not None else loss).backward()
        self.tally.add_loss(loss, samples)

    def step(self, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                f"step({type(optimizer).__name__}): step() takes the torch.optim.Optimizer to step "
                "(the one whose parameters run.backward() gave gradients)"
            )
        if clip_norm is not None and not clip_norm >= 0:  # a negative norm would turn the update around
            raise ConfigError(
                f"step(clip_norm={clip_norm!r}): clip_norm is a gradient norm to clip to, a positive number, "
                "or None or 0 for no clipping"
            )
        if not self.precision.mode.applies_updates:
            optimizer.zero_grad(set_to_none=True)
            return
        self.applied.watch(optimizer)
        self.tally.stepped = True
        self.tally.lr = optimizer.param_groups[0]["lr"]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        # No gradient: nothing was scaled, nothing can overflow, and GradScaler would refuse a step it
        # has no inf check for. It steps as in bf16 (its parameters stay as they are).
        scaler = self.precision.scaler if any(p.grad is not None for p in params) else None
        if scaler is not None and optimizer not in self._unscaled_early:
            self._unscale(optimizer, scaler)  # clipping sees true gradients
        self._unscaled_early.discard(optimizer)
        self.tally.grad_norm = clip_gradients(params, clip_norm)  # sharded or not: the global norm
        self._stepping = True
        try:
            scaler.step(optimizer) if scaler is not None else optimizer.step()
        finally:
            self._stepping = False
        optimizer.zero_grad(set_to_none=True)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """fp16: unscale `optimizer`'s gradients now, for the loop's own clipping before `step()`, which then
        does not unscale them again; in the other precisions (and while probing) they are true already."""
        scaler = self.precision.scaler
        if scaler is None or not self.precision.mode.applies_updates or optimizer in self._unscaled_early:
            return
        if any(p.grad is not None for group in optimizer.param_groups for p in group["params"]):
            self._unscale(optimizer, scaler)
            self._unscaled_early.add(optimizer)

    def _unscale(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        if optimizer in self._unscaled:  # stepped again within one step: the scale moves first
            self._update_scale()
        scaler.unscale_(optimizer)
        self._unscaled.add(optimizer)
        self._update_due = True

    def _applied_elsewhere(self, optimizer: torch.optim.Optimizer) -> None:
        """A watched optimizer stepped: a framework's (not `step()`'s) applied its gradients, with no
        GradScaler to skip non-finite ones, which spoil the weights at this step (`close`)."""
        elsewhere = self.steps_elsewhere and not self._stepping
        if elsewhere and self.precision.scaler is None and self.precision.mode.applies_updates:
            self.tally.applied_by(optimizer)

    def _check_own_step(self, optimizer: torch.optim.Optimizer) -> None:
        """A watched optimizer's step pre-hook: in fp16 an optimizer the loop steps itself, not
        through `step()` (nor a framework's, `watch`), steps on gradients the attempt's GradScaler
        scaled (or the loop's own GradScaler scaled again): a ConfigError naming what to remove."""
        self.tally.asked = True
        if self._stepping or self.steps_elsewhere or self.precision.scaler is None:
            return
        raise ConfigError(
            f"the {type(optimizer).__name__} was stepped outside run.step() in this {self.precision.precision} "
            "attempt (by a GradScaler of the script's own, scaler.step(optimizer), or by optimizer.step()): its "
            "gradients are scaled by the attempt's GradScaler, and by the script's own too when it scales the loss. "
            "Remove your own torch.amp.GradScaler (scaler.scale, scaler.unscale_, scaler.step, scaler.update) and "
            "the optimizer.step(): call run.backward(loss) and run.step(optimizer, clip_norm=...), which scale, "
            "unscale, clip and step with the attempt's GradScaler (docs/sdk.md)"
        )

    def close(self, step: int, loss: Number | None, *, skipped: bool = False) -> NumericFault | None:
        """Per-step guard bookkeeping, host-only; the fault of too many overflows in a row, if so.
        A step `skipped` whole (quarantined: nothing trained), or one that asked for no update (no
        `step()`: a model without parameters, an evaluation), applied none and is no overflow."""
        self._update_scale()
        observed = self.tally.close(loss)
        # With no GradScaler an update applies whatever gradients it has: non-finite ones spoil the weights, and the
        # trouble begins at this step though its loss is finite (a sqrt at 0), not at the next loss (first_fault_step).
        norm = self.tally.grad_norm if self.tally.stepped and self.precision.scaler is None else self.tally.applied
        spoilt = None if norm is None else (~torch.isfinite(torch.as_tensor(norm, device=self.guard.device))).any()
        if observed is not None:
            self.guard.observe_loss(torch.as_tensor(observed), spoilt)
        asked = self.tally.stepped or self.steps_elsewhere
        fault = self.guard.end_step(step, self.precision.scaler is not None and asked and not skipped)
        backward, judged = self.tally.loss_sum is not None or self.tally.padded, not (skipped or self.steps_elsewhere)
        wanted = self.tally.stepped or self.tally.asked  # run.step() (GradScaler may skip it), or a hooked step
        self.updates.close(backward=backward, asked=wanted, applied=self.guard.applied, judged=judged)
        self.guard.begin_step()
        self.tally.clear()
        return fault

    def drop_step(self) -> None:
        """A step cut short (out of memory) is dropped whole: its tally, and the GradScaler stage
        it left (a scale update due, optimizers unscaled), which the fresh GradScaler `free`
        settles never saw (its update would find no inf checks)."""
        self._update_due = False
        self._unscaled.clear()
        self._unscaled_early.clear()
        self.tally.clear()

    def _update_scale(self) -> None:
        """GradScaler's update, once for the optimizers it unscaled since the last one."""
        if self.precision.scaler is not None and self._update_due:
            self.precision.scaler.update()
        self._update_due = False
        self._unscaled.clear()
        self._unscaled_early.clear()

    def numbers(self, step: int, read: Read) -> Interval:
        """The log line's numbers for the interval `read` was taken at."""
        return Interval(
            step=step,
            precision=self.precision.precision,
            loss=read.loss,
            loss_scale=read.guard.loss_scale,
            grad_norm=read.grad_norm,
            lr=host_value(self.tally.lr),
            overflow_steps=self.guard.overflow_steps,
            non_finite_losses=read.guard.non_finite_losses,
            applied_steps=self.applied.count,
        )

    def read(self, flag: float) -> Read:
        """The interval's one sync point: the guard's counters, the job's loss (every rank's, in
        the same gather: mpjob_trainer.job_loss) and the loss scale, then the gradient norm, on
        the host."""
        tally = self.tally
        reading = self.guard.read(self.precision.scaler, flag=flag, reported=tally.reported, weight=tally.weight)
        return Read(reading, reading.loss, host_value(tally.grad_norm))
