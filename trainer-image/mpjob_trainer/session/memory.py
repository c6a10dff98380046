"""SmallerMicroBatch: running out of device memory goes on in place, in a smaller micro-batch.

When a step raises torch.OutOfMemoryError and the launch names a smaller split
(AttemptLaunch.inPlaceSplits: the attempt the planner would start next after an
OutOfDeviceMemory ending, the same precision and samples per step), the process need not end:
once what the failed step held is freed, it is healthy. In the running process the session

1. frees what the failed step held: the gradients, a GradScaler stage the step left half done,
   the tally of its losses and, on CUDA, the allocator's cached blocks;
2. restores the last good state (the checkpoint, else the fresh start's step 0) as a fallback in
   place does (DataRung.rewind);
3. tells the loop its new split (the `reshape` it registered with its step), and the session's
   spec.training says it too;
4. runs the steps from there through the one that failed, in the new split (DataRung.go_on),
   and the loop closes that step and goes on.

A restarted attempt loads the same checkpoint and runs the same steps in the same split, so the
result is the restart path's, bit for bit; the change is told as a fallback's is (InPlace.split,
kind `microBatch`). A fault met while catching up ends the attempt, as one met while a fallback
catches up does.

Single-process attempts only: with several ranks, a rank that runs out of memory leaves its step
while its peers wait in the step's gradient all-reduce (DDP's, at the last micro-batch), so no
collective can agree the verdict without one more sync per micro-batch; such an attempt ends
OutOfDeviceMemory and restarts, its message saying why. So does one whose launch names no split
(a micro-batch of one sample, the job's faultPolicy, precision.inPlace false, a sharded model)
or whose loop registered no `reshape`.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable

import torch
from torch import nn

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.ending import Standing, classify
from mpjob_trainer.session.inplace import InPlace, Reshape
from mpjob_trainer.session.machine import Event
from mpjob_trainer.session.skipping import DataRung
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import StepFunction, StepNumerics


class SmallerMicroBatch:
    def __init__(
        self, rung: DataRung, in_place: InPlace | None, context: AttemptContext, launch: AttemptLaunch
    ) -> None:
        self.rung, self.in_place, self.context, self.launch = rung, in_place, context, launch
        #: The job's spec as the attempt trains it now (its split: the launch's, then each one made here).
        self.spec: MixedPrecisionJobSpec = launch.attempt_spec()
        #: How the loop changes its split (None: it cannot; an out-of-memory then restarts).
        self.reshape: Reshape | None = None
        #: The launch the attempt started with (`launch` is another once a split is made in place).
        self.launched = launch

    def arm(self, reshape: Reshape | None) -> None:
        """The loop registered its step, and how it changes its split (`reshape`). A loop that
        re-entered after a split made in place (a sharded model wrapped anew: Session.reentering)
        is handed that split, whatever it built its data from."""
        self.reshape = reshape
        if self.in_place is not None:
            self.in_place.why_not_split = self._why_not()
            self.in_place.resplit = self.resplit if reshape is not None else None
        if reshape is not None and self.launch is not self.launched:
            reshape(self.spec.training.batch_size, self.spec.training.grad_accumulation)

    def resplit(self, micro_batch: int, grad_accumulation: int) -> None:
        """The attempt trains in this split from its next step on: the loop's data and accumulation
        (its reshape), and the spec and launch the session says it trains by."""
        assert self.reshape is not None  # armed with one
        self.launch = self.launch.split(micro_batch, grad_accumulation)
        self.spec = self.launch.attempt_spec()
        self.reshape(micro_batch, grad_accumulation)

    def _why_not(self) -> str | None:
        """Why this attempt cannot go on in a smaller split in place (None: it can)."""
        if self.reshape is None:
            return "the loop registered no reshape for its micro-batch"
        if self.context.world.distributed:
            return "several ranks cannot agree an out-of-memory while their peers wait in the gradient all-reduce"
        return None

    def why_restart(self) -> str | None:
        """Why an out-of-memory the launch would split in place ends the attempt instead (None: not so)."""
        if self.in_place is None or not self.in_place.splits:
            return None
        return self.in_place.why_not or self.in_place.why_not_split

    def run(self, step_fn: StepFunction, step: int, *, state: TrainingState | None, checkpoints: Checkpointer) -> None:
        """Run step `step` (0-based) with `step_fn`; out of memory (there, or again while catching up
        in a split), go on in the next split when the launch allows, else raise."""
        attempt: Callable[[], Exception | None] = functools.partial(step_fn, step)  # type: ignore[arg-type]
        while True:
            try:
                ending = attempt()
                break
            except torch.OutOfMemoryError as exc:
                if self.in_place is None or state is None or not self.in_place.can_split():
                    raise
                # Leaving the handler drops the failed step's frames, and with them its activations.
                detected, oom = time.monotonic(), exc.with_traceback(None)
            at = {"step": step, "detected": detected, "state": state, "checkpoints": checkpoints}
            attempt = functools.partial(self.recover, oom, **at)  # type: ignore[arg-type]
        if ending is not None:
            raise ending

    def recover(
        self, oom: Exception, *, step: int, detected: float, state: TrainingState, checkpoints: Checkpointer
    ) -> Exception | None:
        """Free, restore, split and catch up through step index `step`: None, or what ends the attempt
        (the out-of-memory itself when there is no good state to go back to; a fault met catching up)."""
        assert self.in_place is not None and self.reshape is not None  # can_split() said so
        self.rung.machine.fire(Event.OUT_OF_MEMORY)
        free(state, self.context.numerics)
        told = state.told_stop()  # rewinding loads a checkpoint's record, older than the stop the loop told
        start = self.rung.rewind(step, state=state, checkpoints=checkpoints)
        if isinstance(start, Exception):
            return oom
        message = classify(oom, Standing()).message  # as the restart path's report words it
        split = self.in_place.split(step=step, start=start, message=message, detected=detected)
        self.resplit(split.micro_batch, split.grad_accumulation)
        if (ending := self.rung.go_on(start, step + 1, state=state)) is None:
            told()  # caught up: the loop's step goes on as the loop told it
        return ending


def free(state: TrainingState, numerics: StepNumerics) -> None:
    """Drop what a step cut short by an out-of-memory held."""
    for held in state.objects.values():
        if isinstance(held, nn.Module | torch.optim.Optimizer):
            held.zero_grad(set_to_none=True)
    precision = numerics.precision
    if precision.scaler is not None:  # a step cut short after unscale_ left its optimizer's stage behind:
        precision.settle(precision.precision)  # a fresh GradScaler, its scale restored with the rest
    numerics.drop_step()
    release_cached(numerics.precision.device)


def release_cached(device: torch.device) -> None:
    """Collect what nothing holds any more and, on CUDA, hand the allocator's cached blocks back."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
