"""A running elastic attempt short of room (spec.elastic), as the cluster shows it: pods the
scheduler finds no node for, a Job its queue holds suspended for want of quota, pods a
ResourceQuota of the namespace keeps the Job controller from creating, nodes lost. Each reads
what it shows into a `Capacity` (the room there is, how long the attempt has waited) for
`elastic.decide`, whose shrink (or wait) it returns; growing back is `elastic.grows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from mpjob.planning import status as st
from mpjob.planning.batch import BatchShape
from mpjob.planning.classify import PLATFORM_REASONS
from mpjob.planning.elastic import Capacity, Held, Resize, Verdict, decide, shape_of, workers_of
from mpjob.planning.endings import JobView, PodView, pods_of
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec
from mpjob_contract.codes import Reason

#: A pod's reasons (pod status, DisruptionTarget) that say its node went away.
NODE_LOST = frozenset(name for name, reason in PLATFORM_REASONS.items() if reason is Reason.NODE_LOST)
#: What the Job controller's FailedCreate says when a ResourceQuota refuses a pod.
QUOTA_REFUSAL = "exceeded quota"


def _shrink(spec: MixedPrecisionJobSpec, attempt: AttemptStatus, capacity: Capacity) -> Resize | None:
    """The attempt shrunk, or left waiting when no smaller size fits (None: it keeps its size)."""
    resize = decide(
        spec, workers=workers_of(spec, attempt), shape=shape_of(attempt) or BatchShape.of(spec), capacity=capacity
    )
    return resize if resize.verdict in (Verdict.SHRINK, Verdict.WAIT) else None


def unschedulable(
    spec: MixedPrecisionJobSpec, attempt: AttemptStatus, pods: Sequence[PodView], now: datetime
) -> Resize | None:
    """A running attempt some of whose pods the scheduler has found no node for: shrunk to the
    pods that were placed once the oldest has waited past elastic.waitSeconds, or left waiting
    (Verdict.WAIT, saying why) when no smaller size keeps the global batch (None: wait on)."""
    if spec.elastic is None:
        return None
    alive = [p for p in pods if p.alive]
    waiting = [since for p in alive if (since := p.unschedulable_since) is not None]
    if not waiting:
        return None
    oldest = min((t for since in waiting if (t := _time(since)) is not None), default=now)
    placed = len(alive) - len(waiting)
    return _shrink(spec, attempt, Capacity(placed, unschedulable_seconds=(now - oldest).total_seconds()))


def queued(
    spec: MixedPrecisionJobSpec, attempt: AttemptStatus, job: JobView, fits: int | None, now: datetime
) -> Resize | None:
    """A running attempt whose Job its queue has held suspended for want of quota: shrunk once it
    has waited suspended past elastic.waitSeconds (since its Suspended condition, else since the
    attempt began) to the workers `fits` (the queue's free quota; None: not read, wait on), or
    left waiting (Verdict.WAIT) as `unschedulable` is."""
    if spec.elastic is None or fits is None or not (job.suspended and job.quota_short) or job.finished:
        return None
    since = _time(job.suspended_since or attempt.start_time or "")
    if since is None:
        return None
    return _shrink(spec, attempt, Capacity(fits, unschedulable_seconds=(now - since).total_seconds(), held=Held.QUEUE))


def over_quota(spec: MixedPrecisionJobSpec, attempt: AttemptStatus, job: JobView, now: datetime) -> Resize | None:
    """A running attempt some of whose pods a ResourceQuota of its namespace keeps the Job
    controller from creating (its FailedCreate says "exceeded quota"): shrunk to the pods it made
    once the attempt has waited past elastic.waitSeconds since it began, or left waiting
    (Verdict.WAIT) as `unschedulable` is. A refusal of any other kind is no want of room."""
    refused = job.create_error or ""
    if spec.elastic is None or QUOTA_REFUSAL not in refused or job.finished:
        return None
    made = len({p.index for p in job.pods if p.alive})
    since = _time(attempt.start_time or "")
    if since is None or made >= pods_of(job, workers_of(spec, attempt)):
        return None
    return _shrink(spec, attempt, Capacity(made, unschedulable_seconds=(now - since).total_seconds(), held=Held.QUOTA))


def node_lost(spec: MixedPrecisionJobSpec, attempt: AttemptStatus, pods: Sequence[PodView]) -> Resize | None:
    """An attempt that ended losing nodes: shrunk at once to the workers whose nodes stayed, or
    (Verdict.WAIT, saying why) not, when no size from elastic.minWorkers up keeps the global batch."""
    lost = sum(1 for p in pods if p.platform_reason in NODE_LOST)
    if spec.elastic is None or not lost:
        return None
    return _shrink(spec, attempt, Capacity(workers_of(spec, attempt) - lost, node_lost=True))


def _time(value: str) -> datetime | None:
    try:
        return st.read_stamp(value)
    except ValueError:
        return None


def short_of_room(
    spec: MixedPrecisionJobSpec, attempt: AttemptStatus, job: JobView, fits: int | None, now: datetime
) -> Resize | None:
    """The shrink (or wait) of a running attempt whose pods lack room: unscheduled, its Job held
    by its queue (`fits`: the queue's free quota), or pods a ResourceQuota refuses."""
    return (
        unschedulable(spec, attempt, job.pods, now)
        or queued(spec, attempt, job, fits, now)
        or over_quota(spec, attempt, job, now)
    )
