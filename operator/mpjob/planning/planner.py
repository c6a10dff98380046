"""The attempt planner: what comes after an attempt, given the spec and the history.

Pure functions over the API models. The operator and `mpjob run` both call `first_attempt`
and `after_attempt`; neither re-implements the ladder, the attempt budget or the batch shape.

The batch shape of an attempt (samples per micro-batch, micro-batches per optimizer step)
may differ from spec.training's: an attempt that runs out of GPU memory is followed by one
with the micro-batch split, and a fallback into fp32 (which keeps activations in 4 bytes
instead of 2) splits it too when precision.fallbackKeepsBatch is on. A split divides the
micro-batch by its smallest prime factor (16 -> 8, 12 -> 6, 9 -> 3) and multiplies the
accumulation by the same, so the samples of each optimizer step, and their order, stay the
same (mpjob_trainer.data.StepSampler): resume stays exact in data order. A re-promoted
attempt takes back the largest micro-batch its precision allows (mpjob.planning.batch: the
fallback's split undone, one for running out of memory in that precision or a narrower one kept),
and a fallback never takes a micro-batch its precision is held below (`batch.held`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from mpjob.planning.batch import BatchShape, held, largest_shape, wider
from mpjob.planning.classify import Action, Classification
from mpjob.planning.history import barred, faulted_at, first_trained
from mpjob.planning.repeat import repeated_failure
from mpjob_contract.api import (
    AttemptCounts,
    AttemptStatus,
    MixedPrecisionJobSpec,
    Precision,
    RequestedPrecision,
    fallbacks_after,
    is_auto,
    precision_ladder,
    resolve_auto,
)
from mpjob_contract.codes import FinishReason, Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT, inside_checkpoint_dir
from mpjob_contract.vocabulary import safer_than


@dataclass(frozen=True)
class StartAttempt:
    index: int
    #: `auto` for a first attempt that measures its node (its trainer then trains in what it chose).
    precision: RequestedPrecision
    #: Checkpoint directory to resume from; None lets the trainer take the newest valid one.
    resume_from: str | None
    #: The step the attempt is expected to resume at (for status; the trainer decides).
    start_step: int
    fallback_from: RequestedPrecision | None = None
    #: The attempt's batch shape when it is not spec.training's (see the module doc).
    micro_batch: int | None = None
    grad_accumulation: int | None = None
    #: Re-promotion: end this attempt after so many clean steps (None: never), and the
    #: precision this attempt went back up from, when it is a re-promotion.
    repromote_after_steps: int | None = None
    promoted_from: RequestedPrecision | None = None
    repromote_counts_from: int | None = None  # a fallback's: the step it faulted at (launch.repromoteCountsFrom)
    #: Workers (pods) of the attempt when spec.elastic runs it with fewer than spec.workers
    #: (None: spec.workers); its batch shape then keeps the global batch (mpjob.planning.elastic).
    workers: int | None = None
    #: When the attempt before it ended, by its trainer's clock (Unix seconds; None: not known).
    recovering_since: float | None = None

    @property
    def shape(self) -> BatchShape | None:
        if self.micro_batch is None or self.grad_accumulation is None:
            return None
        return BatchShape(self.micro_batch, self.grad_accumulation)


@dataclass(frozen=True)
class Finish:
    succeeded: bool
    #: An attempt's Reason, a FinishReason, an API refusal's or a lifecycle's ConditionReason.
    reason: StrEnum
    message: str


Decision = StartAttempt | Finish


def compute_capability(spec: MixedPrecisionJobSpec) -> tuple[int, int] | None:
    """The capability `auto` resolves against: None for a CPU job (gpusPerWorker 0)."""
    if spec.resources.gpus_per_worker == 0:
        return None
    major, minor = spec.resources.min_compute_capability.split(".")
    return (int(major), int(minor))


def ladder(spec: MixedPrecisionJobSpec, capability: tuple[int, int] | str | None = "spec") -> list[Precision]:
    """The precisions attempts may walk through, first to last."""
    cap = compute_capability(spec) if isinstance(capability, str) else capability  # "spec"
    return precision_ladder(spec.precision, resolve_auto(spec.precision.mode, cap))


def walked(
    spec: MixedPrecisionJobSpec, history: Sequence[AttemptStatus], capability: tuple[int, int] | str | None = "spec"
) -> list[Precision]:
    """The ladder the job walks: the spec's, from the precision its first attempt trained in. An
    `auto` attempt trains in what it measured on its node, which the spec's capability may not
    predict: its fallbacks follow it, and a re-promotion goes back up to it, never above it."""
    steps = ladder(spec, capability)
    first = first_trained(history)  # an attempt that ended before it measured: the one that did
    if first is None or first == "auto":
        return steps
    if first in steps:
        return steps[steps.index(first) :]
    return [first, *fallbacks_after(spec.precision, first)]


def first_attempt(spec: MixedPrecisionJobSpec, capability: tuple[int, int] | str | None = "spec") -> StartAttempt:
    """Attempt 0: in `auto` mode the trainer measures the precision on its node (the report and
    the metrics say which; the ladder's fallbacks follow it), else the mode's precision."""
    shape = BatchShape.of(spec)
    return StartAttempt(
        index=0,
        precision="auto" if is_auto(spec.precision.mode) else ladder(spec, capability)[0],
        resume_from=None,
        start_step=0,
        micro_batch=shape.micro_batch,
        grad_accumulation=shape.grad_accumulation,
    )


def promotion_target(
    spec: MixedPrecisionJobSpec,
    precision: RequestedPrecision,
    history: Sequence[AttemptStatus],
    capability: tuple[int, int] | str | None = "spec",
    *,
    repromotions: int | None = None,
    counts: AttemptCounts | None = None,
) -> Precision | None:
    """The faster precision an attempt in `precision` may go back up to (the rung above it in the
    ladder), or None: re-promotion off, the budget used (`repromotions` so far; None: the status's
    `counts`, else those in `history`), or that precision barred because it faulted again after a
    re-promotion into it (as `history` and `counts` show: attempts[] drops old entries)."""
    if spec.precision.repromote_after_steps == 0:
        return None
    if made(history, repromotions, counts) >= spec.precision.max_repromotions:
        return None
    steps = walked(spec, history, capability)
    if precision not in steps or steps.index(precision) == 0:
        return None
    above = steps[steps.index(precision) - 1]
    return None if above in barred(history, counts) else above


def made(history: Sequence[AttemptStatus], repromotions: int | None, counts: AttemptCounts | None) -> int:
    """The re-promotions made so far: `repromotions`, else the status's `counts`, else `history`'s."""
    if repromotions is not None:
        return repromotions
    return counts.repromotions if counts is not None else sum(1 for a in history if a.repromoted)


def with_promotion(
    spec: MixedPrecisionJobSpec,
    start: StartAttempt,
    history: Sequence[AttemptStatus],
    capability: tuple[int, int] | str | None = "spec",
    *,
    repromotions: int | None = None,
    counts: AttemptCounts | None = None,
    used: int = 0,
) -> StartAttempt:
    """`start`, told to re-promote after precision.repromoteAfterSteps when it may: a rung above
    it, and an attempt of runPolicy.maxAttempts left after its Repromote ending uses one (`used`:
    the attempts used before it ends), else its re-promotion would end the job AttemptsExhausted.
    A fallback's clean steps count from the step the attempt before it faulted at (`repromote_counts_from`)."""
    room = used + 1 < spec.run_policy.max_attempts
    target = promotion_target(spec, start.precision, history, capability, repromotions=repromotions, counts=counts)
    if not room or target is None:
        return replace(start, repromote_after_steps=None, repromote_counts_from=None)
    return replace(start, repromote_after_steps=spec.precision.repromote_after_steps)


def as_made(decision: StartAttempt, ended: RequestedPrecision, went_on_in: Precision | None) -> StartAttempt:
    """`decision` in the precision a trainer changed to in place from `ended` (`went_on_in`; None: no
    change), a fallback or a re-promotion as it went, whatever a spec edited since its launch plans."""
    if went_on_in is None or went_on_in == decision.precision:
        return decision
    down, up = safer_than(went_on_in, ended), safer_than(ended, went_on_in)
    return replace(decision, precision=went_on_in, fallback_from=ended if down else None,
                   promoted_from=ended if up else None)  # fmt: skip


def _shaped(start: StartAttempt, shape: BatchShape) -> StartAttempt:
    return replace(start, micro_batch=shape.micro_batch, grad_accumulation=shape.grad_accumulation)


def after_attempt(
    spec: MixedPrecisionJobSpec,
    index: int,
    precision: RequestedPrecision,
    result: Classification,
    last_good_step: int,
    last_good_path: str | None,
    capability: tuple[int, int] | str | None = "spec",
    *,
    checkpoint_dir: str = CHECKPOINT_MOUNT,
    used: int | None = None,
    shape: BatchShape | None = None,
    history: Sequence[AttemptStatus] = (),
    repromotions: int | None = None,
    counts: AttemptCounts | None = None,
    workers: int | None = None,
) -> Decision:
    """Decide what follows attempt `index` (0-based) that ran in `precision` and ended as `result`.

    `last_good_step`/`last_good_path` name the newest verified checkpoint known so far (from
    the termination report or the status); the next attempt resumes from it when it lies in
    `checkpoint_dir` (a report is the trainer's word, not proof), else from the newest valid one.
    `used` counts the attempts that used runPolicy.maxAttempts, the ended one included when it
    was charged (the status's counts; None: every attempt up to `index`); `shape` is the ended
    attempt's batch shape (None: spec.training's), which the next attempt keeps unless it splits
    it or is a re-promotion (which takes the largest its precision allows); `workers` the next
    attempt's (None: spec.workers); `history` the job's attempts so far, the ended one included,
    `counts` the status's (attempts[] drops old entries) and `repromotions` the re-promotions made
    before the next attempt (None: as `counts` has them), for re-promotion and its batch shape.
    """
    if result.action is Action.SUCCEED:
        return Finish(True, Reason.SUCCEEDED, result.message)
    if result.action is Action.FAIL:
        return Finish(False, result.reason, result.message)
    if (repeated := repeated_failure(history)) is not None:
        return Finish(False, *repeated)
    attempts_used = index + 1 if used is None else used
    if attempts_used >= spec.run_policy.max_attempts:
        return Finish(
            False,
            FinishReason.ATTEMPTS_EXHAUSTED,
            f"{attempts_used} attempt(s) used (runPolicy.maxAttempts={spec.run_policy.max_attempts}); "
            f"the last ended {result.reason.value}: {result.message}",
        )
    resume_from = last_good_path if last_good_path and inside_checkpoint_dir(last_good_path, checkpoint_dir) else None
    ended = StartAttempt(index, precision, resume_from, last_good_step)
    up = promotion_target(spec, precision, history, capability, repromotions=repromotions, counts=counts)
    raised = None if up is None else largest_shape(spec, up, workers or spec.workers, history, counts)
    decision = _next(spec, ended, result, shape or BatchShape.of(spec), walked(spec, history, capability), up, raised)
    if isinstance(decision, StartAttempt):
        if decision.fallback_from is not None and decision.shape is not None:  # never a shape that ran out
            decision = _shaped(
                decision, held(spec, decision.precision, decision.shape, workers or spec.workers, history, counts)
            )
        faulted = faulted_at(history, index, decision.precision, fallback=decision.fallback_from is not None)
        sized = replace(decision, workers=workers if workers != spec.workers else None, repromote_counts_from=faulted)
        # a re-promoted attempt counts itself against precision.maxRepromotions
        ahead = made(history, repromotions, counts) + (decision.promoted_from is not None)
        return with_promotion(spec, sized, history, capability, repromotions=ahead, counts=counts, used=attempts_used)
    return decision


def _next(
    spec: MixedPrecisionJobSpec,
    ended: StartAttempt,
    result: Classification,
    shape: BatchShape,
    steps: Sequence[RequestedPrecision],
    up: Precision | None,
    raised: BatchShape | None = None,
) -> Decision:
    """The attempt after `ended` (its resume_from/start_step: the checkpoint to go on from) on the
    job's ladder (`walked`); a Repromote ending goes `up` (`promotion_target`: the rung an attempt
    is told to re-promote to) in the `raised` shape (`largest_shape`: the largest micro-batch `up`
    may take; None: `shape`), and with none, as a script's own exit 47, goes on where it was."""
    index, precision, step = ended.index + 1, ended.precision, ended.start_step
    if result.action is Action.SAME_PRECISION:
        return _shaped(StartAttempt(index, precision, None, step), shape)
    if result.action is Action.SMALLER_MICRO_BATCH:
        smaller = shape.split()
        if smaller is None:
            return Finish(
                False,
                result.reason,
                f"out of GPU memory with a micro-batch of one sample; nothing left to split: {result.message}",
            )
        return _shaped(StartAttempt(index, precision, None, step), smaller)
    if result.action is Action.REPROMOTE and up is not None:
        return _shaped(StartAttempt(index, up, ended.resume_from, step, promoted_from=precision), raised or shape)
    if result.action is Action.REPROMOTE:  # not told to, or nothing to go up to: go on where it was
        return _shaped(StartAttempt(index, precision, ended.resume_from, step), shape)
    if precision not in steps:  # an `auto` attempt measured a precision the spec's capability did not predict
        # (or never measured; or `history` lacks the first attempt): its fallbacks follow it all the same
        steps = [precision, *fallbacks_after(spec.precision, precision)]
    position = steps.index(precision)
    if position + 1 >= len(steps):
        return Finish(
            False,
            FinishReason.NO_PRECISION_LEFT,
            f"{precision} ended {result.reason.value} and no precision is left in the fallback "
            f"ladder {steps}: {result.message}",
        )
    nxt = steps[position + 1]
    if wider(nxt, precision) and spec.precision.fallback_keeps_batch:
        shape = shape.split() or shape
    return _shaped(StartAttempt(index, nxt, ended.resume_from, step, fallback_from=precision), shape)
