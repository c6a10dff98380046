"""Status bookkeeping shared by the operator and `mpjob run`: attempts[] and conditions,
following the Kubernetes API conventions (CamelCase reasons, lastTransitionTime)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from mpjob.planning import history
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import AttemptStatus, Condition, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.status import MAX_FORMER_JOBS

#: The phases a job ends in.
FINISHED = ("Succeeded", "Failed")


class ConditionType(StrEnum):
    CREATED = "Created"
    RUNNING = "Running"
    PRECISION_FALLBACK = "PrecisionFallback"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    #: False while the Job controller cannot create the attempt's pods (FailedCreate).
    PODS_CREATED = "PodsCreated"
    #: False while the scheduler finds no node for a pod of the attempt (planning/scheduling.py).
    PODS_SCHEDULED = "PodsScheduled"
    #: An `auto` attempt measured no low precision faster than fp32 on its node (F6).
    AMP_SLOWER_THAN_FP32 = "AmpSlowerThanFp32"
    #: True while an elastic attempt is short of room that no smaller size can take (docs/elastic.md).
    AWAITING_WORKERS = "AwaitingWorkers"
    #: True while the step is far past the newest checkpoint: saves failing or skipped (planning/lapse.py).
    CHECKPOINTS_FAILING = "CheckpointsFailing"


#: The conditions that say the job waits: the value each holds while it does, and what it waits
#: for. A job that stops (ends, or is suspended) waits on none of them (`waiting.settle`).
WAITS: dict[str, tuple[str, str]] = {
    ConditionType.PODS_CREATED: ("False", "for its pods to be made"),
    ConditionType.PODS_SCHEDULED: ("False", "for a node"),
    ConditionType.AWAITING_WORKERS: ("True", "for workers"),
}


class ConditionReason(StrEnum):
    """Condition and Event reasons of the lifecycle itself; an attempt's ending uses its Reason
    (mpjob_contract.codes) and a finished job its Finish reason."""

    CREATED = "Created"
    ATTEMPT_STARTED = "AttemptStarted"
    ATTEMPT_RUNNING = "AttemptRunning"
    AWAITING_ADMISSION = "AwaitingAdmission"
    #: Back up to a faster precision after precision.repromoteAfterSteps clean steps.
    REPROMOTED = "Repromoted"
    #: The trainer measured the precisions on its node.
    MEASURED = "Measured"
    #: The previous attempt was preempted by its queue; this one waits to be admitted again.
    AWAITING_READMISSION = "AwaitingReadmission"
    RESUMED = "Resumed"
    #: The trainer found no checkpoint of its own and began at step 0 (an Event's reason).
    STARTED_FRESH = "StartedFresh"
    ATTEMPT_ENDED = "AttemptEnded"
    PRECISION_REPROMOTED = "PrecisionRepromoted"
    #: The trainer rolled back and quarantined a step's samples: non-finite in fp32 too, or a
    #: finite loss spike (Event reasons; guard.onBadData, guard.spike).
    DATA_SKIPPED = "DataSkipped"
    LOSS_SPIKE = "LossSpike"
    SUSPENDED = "Suspended"
    #: The spec fails the API models (a CRD older than the operator let it in).
    INVALID_SPEC = "InvalidSpec"
    #: The Job controller could not create a pod (Pod Security, quota, a webhook), and did later.
    FAILED_CREATE = "FailedCreate"
    PODS_CREATED = "PodsCreated"
    #: The kubelet cannot make a pod's container: a Secret or ConfigMap (or its key) not there.
    CONFIG_ERROR = "CreateContainerConfigError"
    #: The kubelet cannot pull a pod's image and tries again (ErrImagePull, ImagePullBackOff).
    IMAGE_PULL_BACKOFF = "ImagePullBackOff"
    #: The scheduler finds no node for a pod of the attempt, and did later.
    UNSCHEDULABLE = "Unschedulable"
    PODS_SCHEDULED = "PodsScheduled"
    #: runPolicy.podCreationTimeoutSeconds passed with pods still refused.
    POD_CREATION_TIMEOUT = "PodCreationTimeout"
    #: The operator deleted the live pods of an attempt whose rank was lost, hung or crashed,
    #: with a short grace period (mpjob.planning.cutoff; an Event's reason).
    RANKS_CUT = "RanksCut"
    #: The running attempt's Job was deleted (not by the operator): created again (an Event's reason).
    JOB_RECREATED = "JobRecreated"
    #: Pods an attempt's Job left behind when it was deleted (--cascade=orphan): deleted (an Event's reason).
    ORPHANS_STOPPED = "OrphanedPodsStopped"
    #: A Job of this job's made for an attempt the status had ended (an operator that acted on an
    #: older status): deleted (an Event's reason; controller/strays.py).
    STRAY_JOB_DELETED = "StrayJobDeleted"
    #: No size from elastic.minWorkers up to what fits keeps the global batch: the attempt waits.
    NO_SMALLER_SIZE = "NoSmallerSize"
    WORKERS_PLACED = "WorkersPlaced"
    #: The attempt after a failure retried as it was waits (mpjob.planning.backoff).
    BACKING_OFF = "BackingOff"


#: How the status writes a moment: RFC 3339 in UTC, whole seconds, as Kubernetes writes its own.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def now() -> str:
    return stamp(datetime.now(UTC))


def stamp(moment: datetime) -> str:
    """A moment (in UTC) as the status writes it."""
    return moment.strftime(TIME_FORMAT)


def read_stamp(value: str) -> datetime:
    """A moment as the status (and Kubernetes, for its own times) writes it; ValueError if not one."""
    return datetime.strptime(value, TIME_FORMAT).replace(tzinfo=UTC)


def moment(value: str | None) -> datetime | None:
    """A moment a pod's status or ours names (RFC 3339), or None when it names none or none
    that reads."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def until_deadline(spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, now: datetime) -> float | None:
    """Seconds left of runPolicy.activeDeadlineSeconds, counted from the job's startTime (at most
    0: it passed; None: no deadline, or the job has not started)."""
    deadline = spec.run_policy.active_deadline_seconds
    started = moment(status.start_time)
    if not (deadline and started):
        return None
    return deadline - (now - started).total_seconds()


def deadline_passed(spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, now: datetime) -> bool:
    """Has runPolicy.activeDeadlineSeconds passed (`until_deadline`)?"""
    return (left := until_deadline(spec, status, now)) is not None and left <= 0


def deadline_left(spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, now: datetime) -> int | None:
    """What is left of runPolicy.activeDeadlineSeconds for a new attempt's Job (at least 1 s)."""
    left = until_deadline(spec, status, now)
    return None if left is None else max(1, math.ceil(left))


def failed_condition(status: MixedPrecisionJobStatus) -> Condition | None:
    """The job's Failed condition when it holds (status True), else None."""
    return next((c for c in status.conditions if c.type == ConditionType.FAILED and c.status == "True"), None)


def set_condition(
    status: MixedPrecisionJobStatus,
    type_: str,
    true: bool | None,
    reason: str,
    message: str = "",
    at: str | None = None,
    generation: int | None = None,
) -> None:
    """Upsert a condition (`true` None: Unknown); lastTransitionTime moves only when the status flips."""
    value = "Unknown" if true is None else "True" if true else "False"
    at = at or now()
    for i, cond in enumerate(status.conditions):
        if cond.type == type_:
            moved = cond.status != value
            status.conditions[i] = Condition(
                type=type_,
                status=value,
                reason=reason,
                message=message,
                last_transition_time=at if moved else cond.last_transition_time,
                observed_generation=generation,
            )
            return
    status.conditions.append(
        Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message,
            last_transition_time=at,
            observed_generation=generation,
        )
    )


def holds(status: MixedPrecisionJobStatus, type_: str) -> bool:
    """Whether `status` holds the condition `type_` as True."""
    return any(c.type == type_ and c.status == "True" for c in status.conditions)


def begin_attempt(
    status: MixedPrecisionJobStatus, start: StartAttempt, *, workers: int, per_worker: int, at: str | None = None
) -> AttemptStatus:
    """Record the attempt as started (idempotent: a known index is left as it is), counted and
    within the history's bound (`mpjob.planning.history`)."""
    for existing in status.attempts:
        if existing.index == start.index:
            return existing
    entry = AttemptStatus(
        index=start.index,
        precision=start.precision,
        start_step=start.start_step,
        world_size=workers * per_worker,
        workers=workers,
        micro_batch=start.micro_batch,
        grad_accumulation=start.grad_accumulation,
        repromoted=True if start.promoted_from is not None else None,
        recovering_since=start.recovering_since,
        start_time=at or now(),
    )
    history.started(status, entry)
    status.attempt = start.index
    status.precision = start.precision
    # Live figures are each attempt's own: none until its first real reading.
    status.loss = status.loss_scale = status.samples_per_second = None
    status.overflow_steps = status.eval_loss = status.eval_loss_delta = None
    return entry


def end_attempt(
    status: MixedPrecisionJobStatus,
    index: int,
    reason: str,
    exit_code: int | None,
    message: str,
    end_step: int | None,
    at: str | None = None,
    *,
    charged: bool = True,
) -> None:
    """Record how attempt `index` ended, once; `charged`: whether it used one of
    runPolicy.maxAttempts (`mpjob.planning.charging` decides)."""
    history.counts(status)  # counted before this ending (a status from before counts existed)
    for entry in status.attempts:
        if entry.index == index and entry.finish_time is None:
            entry.reason = reason
            entry.exit_code = exit_code
            entry.message = message[:1024]
            entry.end_step = end_step
            entry.finish_time = at or now()
            entry.loss, entry.loss_scale = status.loss, status.loss_scale
            history.ended(status, entry, charged=charged)


def keep_last_figures(status: MixedPrecisionJobStatus) -> None:
    """A finished job shows the last figures it saw when its last attempt logged none (it resumed
    at the final checkpoint, or ended before its first real reading): the newest loss an attempt
    ended with, and in fp16 the newest fp16 loss scale (bf16 and fp32 train without one)."""
    ended = [a for a in reversed(status.attempts) if a.finish_time is not None]
    if status.loss is None:
        status.loss = next((a.loss for a in ended if a.loss is not None), None)
    if status.loss_scale is None and status.precision == "fp16":
        scales = (a.loss_scale for a in ended if a.precision == "fp16" and a.loss_scale is not None)
        status.loss_scale = next(scales, None)


def job_uids(status: MixedPrecisionJobStatus) -> dict[int, str]:
    """By attempt, the UID of the Job made for it, as the status records it."""
    return {entry.index: entry.job_uid for entry in status.attempts if entry.job_uid}


def record_job_uids(status: MixedPrecisionJobStatus, uids: Mapping[int, str]) -> bool:
    """Record on the attempts' entries the UIDs of their Jobs (`uids`, by attempt: a Job made now,
    or held by the cache, so of this job's); whether any entry changed. A Job made again for an
    attempt (its Job deleted while it ran) leaves the one before it in the entry's formerJobUids,
    the newest MAX_FORMER_JOBS: its trainers' checkpoints stay of the lineage (history.lineage)."""
    changed = False
    for entry in status.attempts:
        if (uid := uids.get(entry.index)) is not None and entry.job_uid != uid:
            if entry.job_uid:
                entry.former_job_uids = [*(entry.former_job_uids or []), entry.job_uid][-MAX_FORMER_JOBS:]
            entry.job_uid, changed = uid, True
    return changed


STATUS_FIELDS = frozenset(f.alias or n for n, f in MixedPrecisionJobStatus.model_fields.items())


def status_patch(stored: dict[str, Any], new: MixedPrecisionJobStatus) -> dict[str, Any]:
    """A merge patch from the `stored` status to `new`: the fields that differ, and None for
    those `new` no longer has (a live figure from an earlier attempt, say)."""
    after = new.to_api()
    patch: dict[str, Any] = {k: v for k, v in after.items() if stored.get(k) != v}
    patch.update({k: None for k in stored if k not in after and k in STATUS_FIELDS})
    return patch
