"""The attempt lifecycle, once: begin an attempt, end it and decide the next, resume one.

Pure functions over (spec, status, observed outcome) that write into a `Plan`: the new
status, the attempts to create, the Events to post. The operator's reconcile
(`mpjob.planning.reconcile`) and the local runner (`mpjob run`) both call them, so the same
manifest means the same thing on a laptop and on a cluster: the same attempts[], phase and
conditions for the same endings.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from mpjob.planning import elastic, history, skipped
from mpjob.planning import status as st
from mpjob.planning.charging import Disruption, charged
from mpjob.planning.classify import AttemptOutcome, Classification, classify, under_policy
from mpjob.planning.phases import (
    amp_slower,
    awaiting_pods,
    condition,
    created,
    finish,
    pods_created,
    pods_refused,
    running,
    suspend,
)
from mpjob.planning.plan import Event, Plan, Started, When
from mpjob.planning.planner import Finish, StartAttempt, after_attempt, as_made, with_promotion
from mpjob.planning.reported import record_report, seen_at, trained_in, without_progress
from mpjob.planning.resumepoint import POD_CHECKPOINTS, planned_from, resume_point
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus, Precision, settled
from mpjob_contract.api import processes_per_worker as per_worker
from mpjob_contract.codes import FinishReason, Reason
from mpjob_contract.launch import checkpoint_root
from mpjob_contract.report import TerminationReport

#: The plan's types and the job's phase transitions (`plan`, `phases`) as this module's callers
#: have always named them (`lc.Plan`, `lc.suspend`, ...).
__all__ = [
    "Event",
    "Plan",
    "When",
    "again",
    "amp_slower",
    "announce",
    "begin",
    "conclude",
    "condition",
    "created",
    "finish",
    "go_on",
    "interrupt",
    "made",
    "pods_created",
    "pods_refused",
    "record_report",
    "refused",
    "resume",
    "running",
    "suspend",
]

#: Endings that are no trouble: their AttemptEnded Event is Normal, any other's a Warning (look).
NO_TROUBLE = frozenset({Reason.SUCCEEDED, Reason.REPROMOTE, Reason.SCALED_UP})


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


def begin(plan: Plan, spec: MixedPrecisionJobSpec, start: StartAttempt, when: When, *, lost: bool = False) -> None:
    """Record the attempt (before its children exist) and ask for it to be created; `lost`: the
    checkpoint the status names went with the old pods (`resumepoint`), so the status names none.
    What the record holds (and the one before it: `began_for`) is what the attempt is said
    started with once its Job is made (`made`)."""
    workers = start.workers or spec.workers
    entry = st.begin_attempt(plan.status, start, workers=workers, per_worker=per_worker(spec), at=when.at)
    plan.status.workers = workers
    # Not Running before a trainer runs: `running` says so once one does.
    plan.status.phase = "Pending" if start.fallback_from is None else "Recovering"
    plan.create.append(start)
    if lost:
        plan.status.last_checkpoint = None
        entry.checkpoints_lost = True
    awaiting_pods(plan, when, start.index, start.precision)


def made(plan: Plan, spec: MixedPrecisionJobSpec, index: int, uid: str) -> bool:
    """Attempt `index`'s Job is made (`uid`), recorded on its entry; whether the entry changed.
    The first Job made for the attempt says and counts it started, once: its jobUid, recorded
    then, says it was made to every later reconcile, which says nothing more (one held by a
    backoff, refused, or not made yet by a reconcile that failed says nothing; the reconciler
    tells what this says also when making the Job's children fails after it). A Job the cache
    holds whose uid no write recorded (that write refused, another operator's won, a crash) is
    made as far as the next write that records it says: that write's reconcile tells it, so the
    start is told by whichever write records the uid and holds. An ended attempt is not told."""
    entry = next((a for a in plan.status.attempts if a.index == index), None)
    # Not an attempt begun in place (said as it began), nor one that ended.
    first = entry is not None and entry.job_uid is None and entry.finish_time is None and not entry.in_place
    changed = st.record_job_uids(plan.status, {index: uid})
    if first and entry is not None:
        announce(plan, spec, entry)
    return changed


def announce(plan: Plan, spec: MixedPrecisionJobSpec, entry: AttemptStatus) -> None:
    """Say and count attempt `entry` started, as its record says: once its first Job is made
    (`made`), or as it begins in the running processes (`inplace`), which no Job is made for."""
    plan.started.append(_announced(plan.status, spec, entry))


def began_for(status: MixedPrecisionJobStatus, entry: AttemptStatus) -> str:
    """Why attempt `entry` began, as the record before it says: the ending it follows, the
    suspension it resumes, or the job's creation."""
    before = [a for a in status.attempts if a.index < entry.index]
    if not before:
        return ConditionReason.CREATED
    return ConditionReason.RESUMED if before[-1].reason == Reason.SUSPENDED else before[-1].reason or ""


def _announced(status: MixedPrecisionJobStatus, spec: MixedPrecisionJobSpec, entry: AttemptStatus) -> Started:
    """What attempt `entry` is said started with, from its record: where it resumes (or why it
    starts over), and for a resize the change of size kubectl get events shows."""
    why, lost = began_for(status, entry), bool(entry.checkpoints_lost)
    planned = planned_from(entry.start_step, lost)
    said = [_started(entry.index, entry.precision, planned)]
    if why in elastic.RESIZE_REASONS:
        was = next((a.world_size for a in reversed(status.attempts) if a.index < entry.index), None)
        workers, resumed = elastic.workers_of(spec, entry), f", {planned}" if planned else ""
        message = f"{was} -> {entry.world_size} processes ({workers} worker(s)){resumed}"
        said.append(Event("Normal" if why == Reason.SCALED_UP else "Warning", why, message))
    return Started(entry.index, why, tuple(said))


def _started(index: int, precision: str, planned: str) -> Event:
    said = f"attempt {index} in {precision}" + (f", {planned}" if planned else "")
    return Event("Normal", ConditionReason.ATTEMPT_STARTED, said)


def refused(plan: Plan, *, index: int, reason: StrEnum, message: str, when: When) -> None:
    """Attempt `index` cannot be made (the API server refused its children for good, or its pods could
    not be created in time): the attempt (`seen_at`: no trainer read, where it began) and the job fail."""
    st.end_attempt(plan.status, index, reason, None, message, seen_at(plan.status, index), when.at)
    plan.delete.append(index)
    finish(plan, Finish(False, reason, message[:1024]), when)


def resume(plan: Plan, spec: MixedPrecisionJobSpec, when: When, *, outlive: bool | None = None) -> None:
    """Out of a suspension: the next attempt, same precision, from the last checkpoint it reaches
    (`outlive`: whether the checkpoints outlive the stopped processes; None: as the spec's storage
    says, `resumepoint`). The suspension used none of runPolicy.maxAttempts; only the charged count."""
    plan.status.message = None  # what the stop said (`interrupt`) no longer holds
    condition(plan, when, ConditionType.SUSPENDED, False, ConditionReason.RESUMED, "runPolicy.suspend cleared")
    go_on(plan, spec, when, outlive=outlive, none_left="no attempt left to resume")


def go_on(plan: Plan, spec: MixedPrecisionJobSpec, when: When, *, outlive: bool | None, none_left: str) -> None:
    """The next attempt, in the newest one's precision and shape (`again`), from the last checkpoint
    it reaches (`outlive`: as `resume`); the job Failed, AttemptsExhausted with `none_left`, when
    runPolicy.maxAttempts leaves none (a suspension out of which it goes on, or a rerun)."""
    status = plan.status
    point = resume_point(status, spec, outlive=outlive)
    nxt = again(spec, status, status.attempts[-1], index=history.next_index(status), start_step=point.step)
    if history.used(status) >= spec.run_policy.max_attempts:
        finish(plan, Finish(False, FinishReason.ATTEMPTS_EXHAUSTED, none_left), when)
        return
    begin(plan, spec, nxt, when, lost=point.lost)


def interrupt(plan: Plan, index: int, report: TerminationReport | None, when: When, *, message: str) -> None:
    """`mpjob run` stopped by Ctrl-C (its trainer checkpointed on SIGTERM) or killed (its
    trainers went with it): the attempt ends Suspended, as under runPolicy.suspend: the user's
    own stop, uncharged; running it again resumes. Without a report, or with one carrying no
    progress, it ends at the job's step, which the runner set where it saw the attempt reach."""
    unseen = report is not None and without_progress(plan.status, index, report)
    end_step = record_report(plan.status, index, report)
    end_step = plan.status.step if unseen else end_step
    user = Disruption.USER_SUSPEND
    st.end_attempt(plan.status, index, Reason.SUSPENDED.value, None, message, end_step, when.at, charged=charged(user))
    suspend(plan, when, message)
    plan.status.message = "interrupted; run `mpjob run` again with the same --out to resume"


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
    went_on_in: Precision | None = None,
    room: elastic.Resize | None = None,
) -> None:
    """End `attempt` as `outcome` says, then begin the next one or finish the job (resuming
    from a checkpoint inside `checkpoint_dir`, where the attempt's trainers keep theirs; by
    default below the spec's store: the volume's mount or the bucket's prefix; when the next
    attempt reaches it: `resumepoint`, `outlive` as there; in `went_on_in`, the precision its
    trainer changed to in place, whatever a spec edited since its launch would pick; with
    `room`, the growth the cluster holds for a smaller attempt now (elastic.grows): the next
    attempt starts that size, not smaller to grow at its first checkpoint, a restart more)."""
    status, report = plan.status, outcome.report
    result = under_policy(classify(outcome), spec.fault_policy, report)
    end_step = record_report(status, attempt.index, report)
    for step in skipped.record(status, report.skipped if report else None):
        plan.events.append(skipped.announcement(step))
    amp_slower(plan, report.measurement if report else None, when)
    index, precision = attempt.index, settled(attempt.precision, report.precision if report else None)
    trained_in(status, index, precision)  # an `auto` attempt ran in what its trainer measured, or trained in
    _end(plan, index, precision, result, outcome.exit_code, end_step, when)
    resized = outcome.resize if result.reason in elastic.RESIZE_REASONS else None
    workers, shape = elastic.next_size(spec, attempt, resized or room)
    status.grow_after_step = None  # where room began to show for the attempt that ended
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
    decision = as_made(decision, precision, went_on_in)
    if decision.fallback_from is not None:
        _fallback(plan, decision, when, result.reason.value, point.lost)
    if decision.promoted_from is not None:
        _repromoted(plan, spec, decision, when, point.lost)
    since = (report.ended_at if report is not None else None) or st.read_stamp(when.at).timestamp()  # a stall's: now
    begin(plan, spec, replace(decision, recovering_since=since), when, lost=point.lost)


def _end(
    plan: Plan, index: int, precision: str, result: Classification, code: int | None, end_step: int | None, when: When
) -> None:
    """Attempt `index` (in `precision`) ended as `result` says: recorded in the status, and said."""
    reason = result.reason.value
    st.end_attempt(plan.status, index, reason, code, result.message, end_step, when.at, charged=result.charged)
    kind = "Normal" if result.reason in NO_TROUBLE else "Warning"
    plan.ended = Event(kind, result.reason, result.message)
    line = f"attempt {index} ({precision}) ended {reason}: {result.message}"[:1000]
    plan.events.append(Event(kind, ConditionReason.ATTEMPT_ENDED, line))


def _repromoted(plan: Plan, spec: MixedPrecisionJobSpec, start: StartAttempt, when: When, lost: bool) -> None:
    """Back up the ladder: PrecisionFallback stays True only while below the first precision."""
    clean, step = spec.precision.repromote_after_steps, start.start_step
    message = f"{start.promoted_from} -> {start.precision} after at least {clean} clean steps (repromoteAfterSteps)"
    message += f", {POD_CHECKPOINTS}" if lost else f", from checkpoint step {step}"  # the trainer's ending: how many
    first = history.first_trained(plan.status.attempts) or start.precision
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
