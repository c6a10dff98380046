"""The attempt lifecycle, once: begin an attempt, end it and decide the next, finish, suspend.

Pure functions over (spec, status, observed outcome) that write into a `Plan`: the new
status, the attempts to create, the Events to post. The operator's reconcile
(`mpjob.planning.reconcile`) and the local runner (`mpjob run`) both call them, so the same
manifest means the same thing on a laptop and on a cluster: the same attempts[], phase and
conditions for the same endings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from mpjob.planning import elastic, history, skipped
from mpjob.planning import status as st
from mpjob.planning.charging import Disruption, charged
from mpjob.planning.classify import AttemptOutcome, classify, under_policy
from mpjob.planning.planner import Finish, StartAttempt, after_attempt, with_promotion
from mpjob.planning.reported import record_report, step_times
from mpjob.planning.resumepoint import POD_CHECKPOINTS, planned_from, resume_point
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus, settled
from mpjob_contract.api import processes_per_worker as per_worker
from mpjob_contract.codes import FinishReason, Reason
from mpjob_contract.launch import AUTO_MARGIN, checkpoint_root
from mpjob_contract.report import Measurement, TerminationReport


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


#: Endings that are no trouble: their AttemptEnded Event is Normal, any other's a Warning (look).
NO_TROUBLE = frozenset({Reason.SUCCEEDED, Reason.REPROMOTE, Reason.SCALED_UP})


@dataclass(frozen=True)
class When:
    """The moment a transition is recorded at and the spec generation it answers."""

    at: str
    generation: int | None = None


@dataclass
class Plan:
    status: MixedPrecisionJobStatus
    create: list[StartAttempt] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)  # attempt indexes whose Job (+Service) to delete
    cut: list[int] = field(default_factory=list)  # of those, the ones whose live pods are cut (cutoff)
    events: list[Event] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (from, to): down the ladder after a fault
    repromotions: list[tuple[str, str]] = field(default_factory=list)  # (from, to): back up after clean steps
    started_reasons: list[str] = field(default_factory=list)
    ended: Event | None = None  # what ended the last attempt (set by `conclude`), for views that narrate it
    #: What is left of runPolicy.activeDeadlineSeconds for the attempts to create (None: no deadline).
    deadline_seconds: int | None = None


def again(
    spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, attempt: AttemptStatus, *, index: int, start_step: int
) -> StartAttempt:
    """Attempt `index` in the same precision and batch shape as `attempt` (`elastic.next_size`),
    from the newest checkpoint; `attempt` itself made again, its recovery counted from where it was."""
    workers, shape = elastic.next_size(spec, attempt, None)
    start = StartAttempt(
        index,
        attempt.precision,
        None,
        start_step,
        micro_batch=shape.micro_batch if shape else None,
        grad_accumulation=shape.grad_accumulation if shape else None,
        promoted_from=attempt.precision if attempt.repromoted and index == attempt.index else None,
        workers=workers if workers != spec.workers else None,
        recovering_since=attempt.recovering_since if index == attempt.index else None,
    )
    return with_promotion(spec, start, status.attempts, counts=history.counts(status), used=history.used(status))


def condition(plan: Plan, when: When, type_: ConditionType, true: bool, reason: str, message: str) -> None:
    """Set a condition at `when` (its lastTransitionTime moves only when it flips)."""
    st.set_condition(plan.status, type_, true, reason, message, when.at, when.generation)


def created(plan: Plan, when: When, message: str) -> None:
    condition(plan, when, ConditionType.CREATED, True, ConditionReason.CREATED, message)
    plan.status.start_time = plan.status.start_time or when.at


def begin(
    plan: Plan, spec: MixedPrecisionJobSpec, start: StartAttempt, when: When, *, why: str, lost: bool = False
) -> None:
    """Record the attempt (before its children exist) and ask for it to be created; `lost`: the
    checkpoint the status names went with the old pods (`resumepoint`), so the status names none."""
    workers = start.workers or spec.workers
    st.begin_attempt(plan.status, start, world_size=workers * per_worker(spec), at=when.at)
    plan.status.workers = workers
    # Not Running before a trainer runs: `running` says so once one does.
    plan.status.phase = "Pending" if start.fallback_from is None else "Recovering"
    plan.create.append(start)
    plan.started_reasons.append(why)
    if lost:
        plan.status.last_checkpoint = None
    resumed = f", {planned}" if (planned := planned_from(start.start_step, lost)) else ""  # the plan
    plan.events.append(
        Event("Normal", ConditionReason.ATTEMPT_STARTED, f"attempt {start.index} in {start.precision}{resumed}")
    )
    if why in elastic.RESIZE_REASONS:  # kubectl get events shows the job changing size
        was = plan.status.attempts[-2].world_size if len(plan.status.attempts) > 1 else None
        message = f"{was} -> {workers * per_worker(spec)} processes ({workers} worker(s)){resumed}"
        plan.events.append(Event("Normal" if why == Reason.SCALED_UP else "Warning", why, message))
    message = f"attempt {start.index} in {start.precision}: waiting for its pods"
    condition(plan, when, ConditionType.RUNNING, False, ConditionReason.ATTEMPT_STARTED, message)


def running(plan: Plan, when: When) -> None:
    """The current attempt's processes run (its pods were admitted and started)."""
    status, current = plan.status, plan.status.attempts[-1]
    if status.phase != "Running":
        status.phase = "Running"
        message = f"attempt {current.index} in {current.precision}"
        condition(plan, when, ConditionType.RUNNING, True, ConditionReason.ATTEMPT_RUNNING, message)


def pods_refused(plan: Plan, when: When, message: str) -> None:
    """The Job controller cannot create the attempt's pods (`message`, its FailedCreate): the
    job waits (Pending) with PodsCreated=False, and a Warning Event says so once per message."""
    status = plan.status
    if status.phase == "Running":
        status.phase = "Pending"
    known = next((c for c in status.conditions if c.type == ConditionType.PODS_CREATED), None)
    news = known is None or known.status != "False" or known.message != message
    condition(plan, when, ConditionType.PODS_CREATED, False, ConditionReason.FAILED_CREATE, message)
    if news:
        plan.events.append(Event("Warning", ConditionReason.FAILED_CREATE, message[:1000]))


def pods_created(plan: Plan, when: When) -> None:
    """The attempt's pods exist after all (quota freed, a policy changed): PodsCreated turns
    True where it was False; a job that never had trouble carries no such condition."""
    if any(c.type == ConditionType.PODS_CREATED and c.status == "False" for c in plan.status.conditions):
        message = f"attempt {plan.status.attempts[-1].index}'s pods were created"
        condition(plan, when, ConditionType.PODS_CREATED, True, ConditionReason.PODS_CREATED, message)


def refused(plan: Plan, *, index: int, reason: StrEnum, message: str, when: When) -> None:
    """Attempt `index` cannot be made (the API server refused its children for good, or its pods
    could not be created in time): the attempt and the job fail with that message."""
    st.end_attempt(plan.status, index, reason, None, message, plan.status.step, when.at)
    plan.delete.append(index)
    finish(plan, Finish(False, reason, message[:1024]), when)


def resume(plan: Plan, spec: MixedPrecisionJobSpec, when: When, *, outlive: bool | None = None) -> None:
    """Out of a suspension: the next attempt, same precision, from the last checkpoint it reaches
    (`outlive`: whether the checkpoints outlive the stopped processes; None: as the spec's storage
    says, `resumepoint`). The suspension used none of runPolicy.maxAttempts; only the charged count."""
    status, current = plan.status, plan.status.attempts[-1]
    status.message = None  # what the stop said (`interrupt`) no longer holds
    condition(plan, when, ConditionType.SUSPENDED, False, ConditionReason.RESUMED, "runPolicy.suspend cleared")
    point = resume_point(status, spec, outlive=outlive)
    nxt = again(spec, status, current, index=history.next_index(status), start_step=point.step)
    if history.used(status) >= spec.run_policy.max_attempts:
        finish(plan, Finish(False, FinishReason.ATTEMPTS_EXHAUSTED, "no attempt left to resume"), when)
        return
    begin(plan, spec, nxt, when, why=ConditionReason.RESUMED, lost=point.lost)


def interrupt(plan: Plan, index: int, report: TerminationReport | None, when: When, *, message: str) -> None:
    """`mpjob run` stopped by Ctrl-C (its trainer checkpointed on SIGTERM) or killed (its
    trainers went with it): the attempt ends Suspended, as under runPolicy.suspend: the user's
    own stop, uncharged; running it again resumes."""
    end_step = record_report(plan.status, index, report)
    user = Disruption.USER_SUSPEND
    st.end_attempt(plan.status, index, Reason.SUSPENDED.value, None, message, end_step, when.at, charged=charged(user))
    suspend(plan, when, message)
    plan.status.message = "interrupted; run `mpjob run` again with the same --out to resume"


def suspend(plan: Plan, when: When, message: str) -> None:
    """The job is Suspended; the Event says so when it becomes so (a job suspended before its
    first attempt is reconciled again at every tick and spec edit)."""
    news = plan.status.phase != "Suspended"
    plan.status.phase = "Suspended"
    condition(plan, when, ConditionType.SUSPENDED, True, ConditionReason.SUSPENDED, message)
    condition(plan, when, ConditionType.RUNNING, False, ConditionReason.SUSPENDED, message)
    if news:
        plan.events.append(Event("Normal", ConditionReason.SUSPENDED, message))


def finish(plan: Plan, decision: Finish, when: When) -> None:
    status = plan.status
    status.phase = "Succeeded" if decision.succeeded else "Failed"
    status.message = decision.message
    status.completion_time = when.at
    st.keep_last_figures(status)  # `kubectl get mpj`'s LOSS and SCALE of a job that ended
    condition(plan, when, ConditionType.RUNNING, False, decision.reason, decision.message)
    condition(plan, when, ConditionType(status.phase), True, decision.reason, decision.message)
    plan.events.append(Event("Normal" if decision.succeeded else "Warning", status.phase, decision.message))


def amp_slower(plan: Plan, measurement: Measurement | None, when: When) -> None:
    """F6: no low precision beat fp32 on the node: a condition and, the first time, a Warning Event."""
    if measurement is None or not measurement.amp_slower_than_fp32:
        return
    shown = step_times(measurement.step_seconds)
    message = f"no low precision beat fp32 by {AUTO_MARGIN:.0%} per step on this node ({shown}): training in fp32"
    known = any(c.type == ConditionType.AMP_SLOWER_THAN_FP32 and c.status == "True" for c in plan.status.conditions)
    condition(plan, when, ConditionType.AMP_SLOWER_THAN_FP32, True, ConditionReason.MEASURED, message)
    if not known:
        plan.events.append(Event("Warning", ConditionType.AMP_SLOWER_THAN_FP32, message))


def conclude(
    plan: Plan,
    spec: MixedPrecisionJobSpec,
    *,
    attempt: AttemptStatus | StartAttempt,
    outcome: AttemptOutcome,
    when: When,
    capability: tuple[int, int] | str | None = "spec",
    checkpoint_dir: str | None = None,
    resumed_at: int | None = None,
    outlive: bool | None = None,
) -> None:
    """End `attempt` as `outcome` says, then begin the next one or finish the job (resuming
    from a checkpoint inside `checkpoint_dir`, where the attempt's trainers keep theirs; by
    default below the spec's store: the volume's mount or the bucket's prefix; when the next
    attempt reaches it: `resumepoint`, `outlive` as there)."""
    status, report = plan.status, outcome.report
    result = under_policy(classify(outcome), spec.fault_policy, report)
    end_step = record_report(status, attempt.index, report)
    for step in skipped.record(status, report.skipped if report else None):
        plan.events.append(Event(*skipped.announcement(step)))
    amp_slower(plan, report.measurement if report else None, when)
    # An `auto` attempt ran in what its trainer measured and trained in.
    index, precision = attempt.index, settled(attempt.precision, report.precision if report else None)
    reason, code = result.reason.value, outcome.exit_code
    st.end_attempt(status, index, reason, code, result.message, end_step, when.at, charged=result.charged)
    kind = "Normal" if result.reason in NO_TROUBLE else "Warning"
    plan.ended = Event(kind, result.reason, result.message)
    line = f"attempt {index} ({precision}) ended {result.reason.value}: {result.message}"[:1000]
    plan.events.append(Event(kind, ConditionReason.ATTEMPT_ENDED, line))
    resized = outcome.resize if result.reason in elastic.RESIZE_REASONS else None
    workers, shape = elastic.next_size(spec, attempt, resized)
    point = resume_point(status, spec, resumed_at=resumed_at, outlive=outlive)
    decision = after_attempt(
        spec,
        index,
        precision,
        result,
        point.step,
        point.path,
        capability,
        checkpoint_dir=checkpoint_dir or checkpoint_root(spec),
        used=history.used(status),
        shape=shape,
        history=status.attempts,
        counts=history.counts(status),
        workers=workers,
    )
    if isinstance(decision, Finish):
        finish(plan, decision, when)
        return
    if decision.fallback_from is not None:
        _fallback(plan, decision, when, result.reason.value, point.lost)
    if decision.promoted_from is not None:
        _repromoted(plan, spec, decision, when, point.lost)
    since = (report.ended_at if report is not None else None) or st.read_stamp(when.at).timestamp()  # a stall's: now
    begin(plan, spec, replace(decision, recovering_since=since), when, why=result.reason.value, lost=point.lost)


def _repromoted(plan: Plan, spec: MixedPrecisionJobSpec, start: StartAttempt, when: When, lost: bool) -> None:
    """Back up the ladder: PrecisionFallback stays True only while below the first precision."""
    clean, step = spec.precision.repromote_after_steps, start.start_step
    message = f"{start.promoted_from} -> {start.precision} after at least {clean} clean steps (repromoteAfterSteps)"
    message += f", {POD_CHECKPOINTS}" if lost else f", from checkpoint step {step}"  # the trainer's ending: how many
    first = plan.status.attempts[0].precision if plan.status.attempts else start.precision
    reason = ConditionReason.REPROMOTED
    condition(plan, when, ConditionType.PRECISION_FALLBACK, start.precision != first, reason, message)
    plan.events.append(Event("Normal", ConditionReason.PRECISION_REPROMOTED, message))
    plan.repromotions.append((start.promoted_from or "", start.precision))


#: Where an attempt goes on from when no checkpoint was written before it (start step 0).
NO_CHECKPOINT = "starting over: no checkpoint"


def _fallback(plan: Plan, start: StartAttempt, when: When, reason: str, lost: bool) -> None:
    moved, step = f"{start.fallback_from} -> {start.precision}", start.start_step
    over = POD_CHECKPOINTS if lost else NO_CHECKPOINT
    message = f"{moved} from checkpoint step {step}" if step else f"{moved}, {over}"
    condition(plan, when, ConditionType.PRECISION_FALLBACK, True, reason, message)
    resuming = planned_from(step, lost) or NO_CHECKPOINT  # the trainer's start corrects it
    plan.events.append(Event("Warning", ConditionType.PRECISION_FALLBACK, f"{moved} after {reason}, {resuming}"))
    plan.fallbacks.append((start.fallback_from or "", start.precision))
