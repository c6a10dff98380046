"""StepTally: the current optimizer step's losses, gradient norm and learning rate as the session
keeps them (device values: nothing here waits for the device), and the checks of what a loop
tells `backward` and `end_step` about them (session.steps)."""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator
from typing import TypeGuard

import torch

from mpjob_trainer.distributed import is_dtensor
from mpjob_trainer.errors import ConfigError

Number = torch.Tensor | float


def finite(value: Number | None) -> bool:
    """Is a loss or norm finite? (A host read: probes and replays may sync.)"""
    if value is None:
        return True
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value.detach()).all())
    return math.isfinite(value)


def require_one_number(loss: object) -> None:
    """A loss `end_step` is given to report is one number (else a configuration error, at the call)."""
    require_one_value("loss", "loss", loss, kinds=(int, float))


def require_one_value(name: str, what: str, value: object, kinds: type | tuple[type, ...] = numbers.Real) -> None:
    """A value `end_step` is given to report (a learning rate, a gradient norm: one real number,
    numpy's too; a loss: `kinds` int or float) is one number of `kinds` or a one-element tensor:
    else a configuration error at the call, not a failure at the next log step's read, which would
    end the attempt as the platform's fault."""
    if value is None or isinstance(value, kinds) or (isinstance(value, torch.Tensor) and value.numel() == 1):
        return
    given = (
        f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
    )
    raise ConfigError(f"end_step({name}={given}): the {what} to report is one number, a float or a one-element tensor")


def is_count(value: object, least: int) -> TypeGuard[int]:
    """Whether `value` is a count of samples: an int (not a bool) from `least` on."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_samples(samples: object, *, call: str, name: str, least: int = 1) -> None:
    """A count of samples a loss covers: an integer from `least` on, or None (else a ConfigError naming `call`)."""
    if samples is not None and not is_count(samples, least):
        what = "a positive integer" if least else "an integer >= 0 (0: a pass that trains no sample)"
        raise ConfigError(f"{call}{samples!r}): {name} is how many samples the loss covers, {what}, or None")


class StepTally:
    """The current optimizer step's losses, gradient norm and learning rate (device values)."""

    def __init__(self) -> None:
        self.loss_sum: torch.Tensor | None = None  # the losses passed to backward() since the step began
        self.samples = 0  # the samples backward() was told those losses cover
        self.reported: Number | None = None  # the loss the last closed step reported (this rank's)
        self.weight = 1.0  # the samples it covers: 1 when backward() was not told (every rank weighs alike)
        self.grad_norm: Number | None = None
        self.lr: Number | None = None
        self.stepped = False  # did the loop ask run.step() for an update since the step began?
        self.asked = False  # was an optimizer handed to resume() or step() asked to step since the step began?
        self.padded = False  # did backward() run a pass of 0 samples since the step began?
        #: The norm of the gradients a framework's optimizers applied since the step began, with no
        #: GradScaler to skip non-finite ones (None: none did), on the device.
        self.applied: torch.Tensor | None = None

    def add_loss(self, loss: torch.Tensor, samples: int | None = None) -> None:
        """Keep a backward pass's loss; one of 0 samples (a rank's step padded to its peers' passes:
        mpjob_trainer.data.StepSampler.passes) counts nowhere, not in the loss reported nor the guard's."""
        if samples == 0:
            self.padded = True
            return
        detached = loss.detach().float()
        self.loss_sum = detached if self.loss_sum is None else self.loss_sum + detached
        self.samples += samples or 0

    def close(self, loss: Number | None) -> Number | None:
        """End the step: what it reports (`loss`, else the losses summed); returns what the
        guard observes (the losses summed when there were any)."""
        require_one_number(loss)
        reported = self.loss_sum if loss is None else loss
        self.reported = reported.detach() if isinstance(reported, torch.Tensor) else reported
        self.weight = float(self.samples or 1)
        return self.loss_sum if self.loss_sum is not None else self.reported

    def stepped_elsewhere(
        self, *, lr: Number | None, grad_norm: Number | None, loss_samples: int | None = None
    ) -> None:
        """The step's learning rate and gradient norm, from a loop that steps its optimizer
        itself (a framework), and the samples its loss covers on this rank (its weight in the
        job's loss: a framework runs backward itself); what it does not say stays as `step()`
        and `backward()` recorded it. A gradient norm neither said nor taken by this step's
        `step()` is unknown, never an earlier step's (the guard judges a norm of 0 as stuck)."""
        check_samples(loss_samples, call="end_step(loss_samples=", name="loss_samples")
        require_one_value("lr", "learning rate", lr)
        require_one_value("grad_norm", "gradient norm", grad_norm)
        if loss_samples is not None:
            self.samples = loss_samples
        if lr is not None:
            self.lr = lr
        if grad_norm is not None or not self.stepped:
            self.grad_norm = grad_norm

    def applied_by(self, optimizer: torch.optim.Optimizer) -> None:
        """A framework's `optimizer` applied its gradients: their norm joins `applied` (a non-finite
        one spoils the weights at this step, whatever its loss), on the device: no sync."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads:
            local = [g.to_local() if is_dtensor(g) else g for g in grads]  # this rank's share
            norm = torch.nn.utils.get_total_norm(local)
            self.applied = norm if self.applied is None else self.applied + norm

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Steps the session runs itself in the block (an fp32 replay) leave the training step's
        gradient norm and learning rate as they were: the log lines never show the replay's."""
        saved = (self.grad_norm, self.lr)
        try:
            yield
        finally:
            self.grad_norm, self.lr = saved

    def clear(self) -> None:
        """Forget the losses since the step began (a step the session runs itself begins)."""
        self.loss_sum = None
        self.samples = 0
        self.stepped = self.asked = self.padded = False
        self.applied = None

    def finite_and_clear(self, *, grad_norm: bool) -> bool:
        """Were the losses since the last clear (and, with `grad_norm`, the gradient norm)
        finite? A host read: for the steps a probe or a replay runs, never for training steps."""
        ok = finite(self.loss_sum) and (not grad_norm or finite(self.grad_norm))
        self.clear()
        return ok
