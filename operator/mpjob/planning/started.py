"""Saying an attempt started: once its first Job is made (`made`), or as it begins in the running
processes (`announce`, in place): its AttemptStarted Event, where it resumes (or why it starts over),
and for a resize the change of size; what it follows (`began_for`)."""

from __future__ import annotations

from mpjob.planning import elastic
from mpjob.planning import status as st
from mpjob.planning.plan import Event, Plan, Started
from mpjob.planning.resumepoint import planned_from
from mpjob.planning.status import ConditionReason
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason


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
