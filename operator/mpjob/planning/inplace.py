"""Fallbacks the trainer makes in its running processes (spec.precision.inPlace; the trainer's
side is mpjob_trainer.session.inplace), planned by the same rules as restarts (recorded by
them too: mpjob.planning.changed).

- `in_place_targets`: what an attempt's launch allows (AttemptLaunch.inPlaceTo): the precisions
  the planner would start next after a numeric fault, one after another, while runPolicy.maxAttempts
  leaves room; none for an elastic job (its size changes restart its attempts). An `auto`
  attempt's launch names them, as the others below, for each precision it may measure
  (AttemptLaunch.inPlaceMeasured; `in_place_plan`): its trainer takes those of what it measured.
- `in_place_splits`: the smaller micro-batches an attempt may go on in after running out of
  device memory (AttemptLaunch.inPlaceSplits): the planner's next attempts after an
  OutOfDeviceMemory ending, one after another, as long as each keeps the precision and splits
  the micro-batch (the job's faultPolicy may say otherwise), runPolicy.maxAttempts leaves room
  and the model is not sharded (its ranks wait in FSDP2's collectives while one that ran out of
  memory leaves its step: session.memory's rule for several ranks).
- `promotion_in_place`: where an attempt's own re-promotion goes in place (each fallback
  target carries its own, `promoteTo`): the precision the planner would start after it, when
  that needs no restart either (fp8 does: its float8 linears are made when the model is built),
  with the fallbacks the re-promoted attempt may make in place in turn (`inPlaceTo`): the plan is
  a tree, as deep as the attempt budget and ladder allow. A target in another split than the
  attempt's names it (microBatch x gradAccumulation: a fallback into fp32 that splits the
  micro-batch, fallbackKeepsBatch; the re-promotion that takes it back), a sharded model's too (its
  loop re-enters in the split, the model wrapped anew).

One process makes at most report.MAX_CHANGES changes, in any branch of the plan: its termination
report lists each (a longer list is refused, the report with it), so a change past them restarts."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mpjob.planning import history
from mpjob.planning.classify import Action, Classification, under_policy
from mpjob.planning.planner import BatchShape, StartAttempt, after_attempt
from mpjob_contract.api import AttemptCounts, AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus, Precision
from mpjob_contract.codes import Reason
from mpjob_contract.launch import InPlaceSplit, InPlaceTarget
from mpjob_contract.report import MAX_CHANGES

#: What an `auto` attempt may measure and train in (mpjob_trainer.session.measure's candidates).
MEASURABLE: tuple[Precision, ...] = ("fp8", "fp16", "bf16", "fp32")
FAULT = Classification(Reason.NUMERIC_FAULT, Action.NEXT_PRECISION, "")
REPROMOTION = Classification(Reason.REPROMOTE, Action.REPROMOTE, "")
OUT_OF_MEMORY = Classification(Reason.OUT_OF_DEVICE_MEMORY, Action.SMALLER_MICRO_BATCH, "")


@dataclass(frozen=True)
class InPlacePlan:
    """What an attempt may change in its running processes: the fallbacks (AttemptLaunch.inPlaceTo)
    and its own re-promotion (promoteInPlaceTo)."""

    to: list[InPlaceTarget] = field(default_factory=list)
    promote_to: InPlaceTarget | None = None
    #: The smaller micro-batches it may go on in after running out of device memory.
    splits: list[InPlaceSplit] = field(default_factory=list)
    #: An `auto` attempt's plan by the precision it measures on its node (its own three: empty).
    measured: dict[Precision, InPlacePlan] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.to or self.promote_to or self.splits or self.measured)


def in_place_plan(
    spec: MixedPrecisionJobSpec,
    start: StartAttempt,
    status: MixedPrecisionJobStatus,
    capability: tuple[int, int] | str | None = "spec",
) -> InPlacePlan:
    """What attempt `start` may change in place; an `auto` attempt, for each precision it may
    measure (the plan of an attempt launched in it: the planner's walk follows what it measured)."""
    if start.precision == "auto":
        plans = {p: in_place_plan(spec, replace(start, precision=p), status, capability) for p in MEASURABLE}
        return InPlacePlan(measured={p: plan for p, plan in plans.items() if plan})
    return InPlacePlan(
        in_place_targets(spec, start, status, capability),
        promotion_in_place(spec, start, status, capability),
        in_place_splits(spec, start, status, capability),
    )


def _may_change(spec: MixedPrecisionJobSpec, start: StartAttempt) -> bool:
    """Whether attempt `start` may change precision in place at all (spec.precision.inPlace; an
    `auto` attempt by the plans for what it measures, `in_place_plan`; not an elastic job, whose
    size changes restart its attempts: its changes of precision do too)."""
    return spec.precision.in_place and start.precision != "auto" and spec.elastic is None


@dataclass(frozen=True)
class _Past:
    """The job's attempts as they would stand when an attempt ends: those before it, the attempt
    budget they used and the re-promotions made."""

    attempts: list[AttemptStatus]
    used: int
    repromotions: int
    #: The status's counts (what the planner reads of entries no longer in attempts[]).
    counts: AttemptCounts | None = None
    #: The changes in place its processes made before the attempt (MAX_CHANGES in all).
    made: int = 0


def _past(status: MixedPrecisionJobStatus, start: StartAttempt) -> _Past:
    before = [a for a in status.attempts if a.index < start.index]
    tally = history.counts(status)
    return _Past(before, history.used(status), tally.repromotions, tally)


def in_place_targets(
    spec: MixedPrecisionJobSpec,
    start: StartAttempt,
    status: MixedPrecisionJobStatus,
    capability: tuple[int, int] | str | None = "spec",
) -> list[InPlaceTarget]:
    """The precisions attempt `start` may fall back to in place, in order, each with the
    re-promotion the planner gives that attempt and where that re-promotion goes in place, if
    it may (empty: none)."""
    return _fallbacks(spec, start, _past(status, start), capability) if _may_change(spec, start) else []


def _fallbacks(
    spec: MixedPrecisionJobSpec, start: StartAttempt, past: _Past, capability: tuple[int, int] | str | None
) -> list[InPlaceTarget]:
    """The planner's next attempts after a numeric fault of `start`, one after another, while
    they need no restart (the attempt budget, the changes its processes' report lists)."""
    targets: list[InPlaceTarget] = []
    ended, used, attempts = start, past.used, list(past.attempts)
    while past.made + len(targets) < MAX_CHANGES:  # its processes' report lists them all
        used += 1  # the attempt that would end charges one
        attempts.append(faulted(ended))  # as it would stand then: a re-promoted precision that faults is barred
        decision = after_attempt(
            spec, ended.index, ended.precision, FAULT, ended.start_step, None, capability,
            used=used, shape=ended.shape, history=attempts, repromotions=past.repromotions, counts=past.counts,
        )  # fmt: skip
        if not isinstance(decision, StartAttempt) or decision.fallback_from is None:
            return targets
        split = _split(spec, decision, ended)
        then = _Past(list(attempts), used, past.repromotions, past.counts, past.made + len(targets) + 1)
        promote = _promotion(spec, decision, then, capability)
        targets.append(InPlaceTarget(precision=decision.precision, repromote_after_steps=decision.repromote_after_steps,
                                     promote_to=promote, **split))  # type: ignore[arg-type]  # fmt: skip
        ended = decision
    return targets


def _split(spec: MixedPrecisionJobSpec, attempt: StartAttempt, ended: StartAttempt) -> dict[str, int]:
    """The split `attempt`'s in-place target names ({}: `ended`'s)."""
    split = attempt.shape if attempt.shape not in (None, ended.shape or BatchShape.of(spec)) else None
    return {} if split is None else {"micro_batch": split.micro_batch, "grad_accumulation": split.grad_accumulation}


def in_place_splits(
    spec: MixedPrecisionJobSpec,
    start: StartAttempt,
    status: MixedPrecisionJobStatus,
    capability: tuple[int, int] | str | None = "spec",
) -> list[InPlaceSplit]:
    """The smaller micro-batches attempt `start` may go on in after running out of device memory,
    in order, each with the re-promotion the planner gives that attempt and where it goes in place
    (empty: none; an out-of-memory then restarts)."""
    if not _may_change(spec, start) or spec.parallelism.strategy == "fsdp":
        return []
    splits: list[InPlaceSplit] = []
    past = _past(status, start)
    ended, used, attempts = start, past.used, list(past.attempts)
    result = under_policy(OUT_OF_MEMORY, spec.fault_policy, None)  # the job's faultPolicy may retry or fail
    while len(splits) < 8:
        used += 1
        shape = ended.shape or BatchShape.of(spec)
        attempts.append(faulted(ended, Reason.OUT_OF_DEVICE_MEMORY))
        decision = after_attempt(
            spec, ended.index, ended.precision, result, ended.start_step, None, capability,
            used=used, shape=shape, history=attempts, repromotions=past.repromotions, counts=past.counts,
        )  # fmt: skip
        if not isinstance(decision, StartAttempt) or decision.precision != ended.precision:
            return splits
        if decision.shape is None or decision.shape == shape:
            return splits
        then = _Past(list(attempts), used, past.repromotions, past.counts, past.made + len(splits) + 1)
        split, again = decision.shape, decision.repromote_after_steps
        splits.append(InPlaceSplit(micro_batch=split.micro_batch, grad_accumulation=split.grad_accumulation,
                                   repromote_after_steps=again, promote_to=_promotion(spec, decision, then, capability),
                                   in_place_to=_fallbacks(spec, decision, then, capability)))  # fmt: skip
        ended = decision
    return splits


def promotion_in_place(
    spec: MixedPrecisionJobSpec,
    start: StartAttempt,
    status: MixedPrecisionJobStatus,
    capability: tuple[int, int] | str | None = "spec",
) -> InPlaceTarget | None:
    """Where attempt `start`'s own re-promotion goes in place (None: it restarts, or it has none)."""
    return _promotion(spec, start, _past(status, start), capability) if _may_change(spec, start) else None


def _promotion(
    spec: MixedPrecisionJobSpec, attempt: StartAttempt, past: _Past, capability: tuple[int, int] | str | None
) -> InPlaceTarget | None:
    """The attempt `attempt`'s re-promotion would start, when it has one and needs no restart (in
    the attempt budget: `past.used` before `attempt` ends; not fp8), with the fallbacks it may make in
    place in turn."""
    if attempt.repromote_after_steps is None or past.made >= MAX_CHANGES:
        return None
    ended = AttemptStatus(index=attempt.index, precision=attempt.precision, start_step=attempt.start_step,
                          reason=Reason.REPROMOTE.value)  # type: ignore[arg-type]  # fmt: skip
    then = _Past([*past.attempts, ended], past.used + 1, past.repromotions + 1, past.counts, past.made + 1)
    decision = after_attempt(
        spec, attempt.index, attempt.precision, REPROMOTION, attempt.start_step, None, capability,
        used=then.used, shape=attempt.shape, history=then.attempts, repromotions=past.repromotions,
        counts=then.counts,
    )  # fmt: skip
    if not isinstance(decision, StartAttempt) or decision.promoted_from is None:
        return None
    shape = _split(spec, decision, attempt)
    if decision.precision == "fp8":
        return None
    return InPlaceTarget(precision=decision.precision, repromote_after_steps=decision.repromote_after_steps,  # type: ignore[arg-type]
                         in_place_to=_fallbacks(spec, decision, then, capability), **shape)  # fmt: skip


def faulted(attempt: StartAttempt, reason: Reason = Reason.NUMERIC_FAULT) -> AttemptStatus:
    """`attempt`'s entry as `reason` (a numeric fault, running out of memory) would end it, re-promoted
    or not as the status would say (the planner bars re-promoting a precision that faults again), in
    its batch shape (a re-promotion keeps below a micro-batch the job ran out of memory in)."""
    repromoted = True if attempt.promoted_from is not None else None
    return AttemptStatus(
        index=attempt.index, precision=attempt.precision, start_step=attempt.start_step,  # type: ignore[arg-type]
        repromoted=repromoted, reason=reason.value, micro_batch=attempt.micro_batch,
        grad_accumulation=attempt.grad_accumulation,
    )  # fmt: skip
