"""The wait before an attempt that retries a failure as it was: exponential, as the Kubernetes
Job controller's between a Job's pods (10 s, doubled per failure in a row, at most 6 min).

A failure that is retried in the same precision and batch shape (InfraError, a trainer killed by
a signal with no report, Stalled, or a fault spec.faultPolicy retries) says nothing about the
next try: when its cause is an outage (the checkpoint store, the network, a filesystem),
attempts started at once fail as fast as they start, and a few minutes of outage spend all of
runPolicy.maxAttempts. So the attempt after such a failure starts only once
`RetryBackoff.seconds(failures in a row)` have passed since it ended. A precision fallback, a
smaller micro-batch, and the platform's endings (preemption, eviction, node lost, suspension,
resizes) are changes or disruptions, not blind retries: they start at once, and they end a run
of failures, as an attempt that trained past where it began or passed a checkpoint does (it
counts as the first failure of a new run).

Everything is read from the status (each attempt's reason, steps, precision, micro-batch and
finishTime): an operator that restarts mid-wait waits out the same wait, with nothing kept in
memory. The operator and `mpjob run` both call `held`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from mpjob.planning import status as st
from mpjob.planning.classify import backoff_seconds
from mpjob.planning.phases import awaiting_pods, condition
from mpjob.planning.plan import Event, Plan, When
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason

#: The setting of the first wait (the operator's flag's default, and `mpjob run`'s): tests and
#: benchmarks shorten it; 0 turns the wait off.
ENV_BASE = "MPJOB_ATTEMPT_BACKOFF_SECONDS"
#: The first wait, and the longest (the Kubernetes Job controller's are 10 s and 6 min).
BASE_SECONDS = 10.0
CAP_SECONDS = 360.0

#: Endings of the attempt's own failure (not the platform's doing) that may be retried as they were.
RETRIED_FAILURES = frozenset(
    {
        Reason.INFRA_ERROR.value,
        Reason.DELETED.value,  # killed by a signal with no report (or deleted by hand): an InfraError fault
        Reason.STALLED.value,
        Reason.NUMERIC_FAULT.value,
        Reason.OUT_OF_DEVICE_MEMORY.value,
        Reason.OOM_KILLED.value,
    }
)


@dataclass(frozen=True)
class RetryBackoff:
    """`base` seconds after the first failure in a row, doubled for each next one, at most `cap`."""

    base: float = BASE_SECONDS
    cap: float = CAP_SECONDS

    def seconds(self, failures: int) -> float:
        return backoff_seconds(failures, base=self.base, cap=self.cap)


def backoff_base(text: str) -> float:
    """A first wait in seconds, as a setting gives it (0: none); ValueError naming what is allowed."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= CAP_SECONDS:
        raise ValueError(f"seconds from 0 to {CAP_SECONDS:g}, not {text!r}")
    return value


#: The rule as the Kubernetes Job controller has it (the operator's and `mpjob run`'s default).
JOB_CONTROLLER = RetryBackoff()


@dataclass(frozen=True)
class Wait:
    """The wait of attempt `index` after `failed`, the last of `failures` failures in a row."""

    index: int
    failed: AttemptStatus
    failures: int
    seconds: float
    until: datetime

    def left(self, now: datetime) -> float:
        return max(0.0, (self.until - now).total_seconds())

    @property
    def message(self) -> str:
        said = f"{self.failed.reason}: {self.failed.message}" if self.failed.message else f"{self.failed.reason}"
        run = f"failure {self.failures} in a row" if self.failures > 1 else "a first failure"
        return (
            f"attempt {self.failed.index} failed ({said[:300]}); attempt {self.index} starts in "
            f"{self.seconds:g}s, at {st.stamp(self.until)} ({run}: retries back off exponentially)"
        )


def retried_as_it_was(ended: AttemptStatus, after: AttemptStatus) -> bool:
    """Whether `after` retries `ended`'s own failure unchanged: the same precision and micro-batch.
    An `auto` attempt that failed before it measured (its precision still "auto") changed none:
    the retry's precision is the one the planner resolves auto to, not a fallback."""
    return (
        ended.reason in RETRIED_FAILURES
        and after.index == ended.index + 1
        and ended.precision in (after.precision, "auto")
        and after.micro_batch == ended.micro_batch
        and not after.in_place
    )


def progressed(ended: AttemptStatus, after: AttemptStatus) -> bool:
    """Whether `ended` trained past where it began, or the checkpoint `after` resumes from is newer."""
    return (ended.end_step is not None and ended.end_step > ended.start_step) or after.start_step > ended.start_step


def failures_in_a_row(attempts: Sequence[AttemptStatus]) -> int:
    """The failures retried as they were right before the newest attempt (`attempts`' last)."""
    count = 0
    for ended, after in zip(reversed(attempts[:-1]), reversed(attempts[1:]), strict=True):
        if ended.finish_time is None or not retried_as_it_was(ended, after):
            break
        count += 1
        if progressed(ended, after):
            break
    return count


def due(status: MixedPrecisionJobStatus, backoff: RetryBackoff) -> Wait | None:
    """The newest attempt's wait after the failure before it (None: it follows no such failure)."""
    failures = failures_in_a_row(status.attempts)
    failed = status.attempts[-2] if failures else None
    ended = st.moment(failed.finish_time) if failed is not None else None
    seconds = backoff.seconds(failures)
    if failed is None or ended is None or seconds <= 0:
        return None
    return Wait(status.attempts[-1].index, failed, failures, seconds, ended + timedelta(seconds=seconds))


def _not_begun(current: AttemptStatus, wait: Wait) -> bool:
    """Whether `current`'s startTime still lies before the end of its `wait`: recorded when the
    failure it retries ended, its startTime moves to when its Job is made (`held`)."""
    began = st.moment(current.start_time)
    return began is not None and began < wait.until


def held(plan: Plan, when: When, backoff: RetryBackoff, now: datetime) -> Wait | None:
    """The newest attempt's wait while it lasts (its Running condition says until when, and an
    Event once), else None; an attempt that waited starts now (its startTime moves here, and its
    Running condition no longer says BackingOff: it waits for its pods)."""
    current = plan.status.attempts[-1] if plan.status.attempts else None
    if current is None or current.finish_time is not None or (wait := due(plan.status, backoff)) is None:
        return None
    running = next((c for c in plan.status.conditions if c.type == ConditionType.RUNNING), None)
    if now >= wait.until:
        if _not_begun(current, wait):
            current.start_time = when.at
        if running is not None and running.reason == ConditionReason.BACKING_OFF:  # the wait is over
            awaiting_pods(plan, when, current.index, current.precision)
        return None
    if running is None or running.reason != ConditionReason.BACKING_OFF or running.message != wait.message:
        plan.events.append(Event("Normal", ConditionReason.BACKING_OFF, wait.message))
    condition(plan, when, ConditionType.RUNNING, False, ConditionReason.BACKING_OFF, wait.message)
    return wait
