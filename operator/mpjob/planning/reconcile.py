"""Level-triggered reconcile, pure: observed CR + observed children -> actions + new status.

The status is the operator's memory. Invariants:
- an attempt is recorded in `status.attempts` (and the status written) before its Job is
  created, and its Job has the deterministic name `<job>-a<N>`: an operator killed at any
  point re-derives the same attempt and never creates a second one;
- an attempt ends exactly once: when its Job has finished (or was deleted) and the
  outcome is classified; the next attempt starts only when no pod of an earlier attempt
  is still alive (so two attempts never write checkpoints at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from mpjob.planning import status as st
from mpjob.planning.classify import Action, AttemptOutcome, Classification, classify
from mpjob.planning.planner import Finish, StartAttempt, after_attempt, first_attempt
from mpjob_contract.api import CheckpointStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus, world_size
from mpjob_contract.codes import Reason
from mpjob_contract.report import TerminationReport

FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    index: int
    phase: str
    alive: bool  # has a running (or not yet terminated) container
    exit_code: int | None = None
    termination_message: str | None = None
    platform_reason: str | None = None  # pod.status.reason / DisruptionTarget / container reason
    deleting: bool = False


@dataclass(frozen=True)
class JobView:
    index: int
    finished: str | None = None  # "Complete" | "Failed" | None
    reason: str | None = None  # the Failed condition's reason (BackoffLimitExceeded, DeadlineExceeded)
    pods: tuple[PodView, ...] = ()
    suspended: bool = False


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: MixedPrecisionJobStatus
    create: list[StartAttempt] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)  # attempt indexes whose Job (+Service) to delete
    events: list[Event] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    started_reasons: list[str] = field(default_factory=list)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _fmt(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def outcome_of(job: JobView) -> AttemptOutcome:
    """The attempt's ending as the pods tell it: the most telling pod explains it."""

    def rank(pod: PodView) -> tuple[int, int]:
        report = TerminationReport.parse_message(pod.termination_message)
        if report is not None and report.reason == Reason.NUMERIC_FAULT:
            return (0, pod.index)
        if report is not None and report.reason == Reason.CONFIG_ERROR:
            return (1, pod.index)
        if pod.platform_reason:
            return (2, pod.index)
        if pod.exit_code not in (None, 0, 44, 143, 137):
            return (3, pod.index)
        if pod.exit_code in (44, 143, 137) or pod.deleting:
            return (4, pod.index)
        return (5, pod.index)

    if job.finished == "Failed" and job.reason == "DeadlineExceeded":
        return AttemptOutcome(
            exit_code=None,
            platform_reason="DeadlineExceeded",
            message="the attempt ran past runPolicy.activeDeadlineSeconds",
        )
    ended = [p for p in job.pods if not p.alive]
    if not ended:
        if job.finished == "Complete":
            return AttemptOutcome(exit_code=0)
        return AttemptOutcome(
            exit_code=None, platform_reason="PodDeleted", message="the attempt's pods disappeared before reporting"
        )
    pod = sorted(ended, key=rank)[0]
    report = TerminationReport.parse_message(pod.termination_message)
    message = "" if report else (pod.termination_message or "")[-512:]
    platform = pod.platform_reason
    if platform is None and report is None and pod.deleting:
        platform = "PodDeleted"
    return AttemptOutcome(exit_code=pod.exit_code, report=report, platform_reason=platform, message=message)


def ended_by_pods(job: JobView, workers: int) -> str | None:
    """How an attempt ended, read from its pods before the Job controller writes it down: each
    pod stopped by itself (none is being deleted: a deadline, a suspension or an eviction goes
    through the Job's own condition), and one failed (backoffLimit 0: the Job fails with it) or
    every index succeeded. None while that is not known."""
    if not job.pods or any(p.alive or p.deleting for p in job.pods):
        return None
    if any(p.exit_code not in (None, 0) or p.platform_reason or p.phase == "Failed" for p in job.pods):
        return "Failed"
    if {p.index for p in job.pods if p.exit_code == 0} >= set(range(workers)):
        return "Complete"
    return None


def reconcile(
    spec: MixedPrecisionJobSpec,
    status: MixedPrecisionJobStatus,
    generation: int | None,
    jobs: dict[int, JobView],
    now: datetime,
    deleted_jobs: frozenset[int] = frozenset(),
    lingering: frozenset[int] = frozenset(),
) -> Plan:
    """Decide what to do. `jobs` are the attempt Jobs that exist; `deleted_jobs` those known to be
    gone; `lingering` the attempts whose Job is gone but some pod still runs (terminating)."""
    status = status.model_copy(deep=True)
    status.observed_generation = generation
    status.total_steps = spec.training.steps
    plan = Plan(status=status)
    stamp = _fmt(now)

    if status.phase in FINISHED:
        ttl = spec.run_policy.ttl_seconds_after_finished
        done = _parse_time(status.completion_time)
        if ttl is not None and done is not None and now >= done + timedelta(seconds=ttl):
            plan.delete = sorted(jobs)
        return plan

    if not status.attempts:
        st.set_condition(status, "Created", True, "Created", "MixedPrecisionJob accepted", stamp, generation)
        status.start_time = status.start_time or stamp
        if spec.run_policy.suspend:
            _suspend(plan, stamp, generation, "suspended before the first attempt")
            return plan
        _start(plan, spec, first_attempt(spec), stamp, generation, "Created")
        return plan

    current = status.attempts[-1]
    job = jobs.get(current.index)
    earlier_alive = bool(lingering) or any(p.alive for i, j in jobs.items() if i != current.index for p in j.pods)

    # Whole-job deadline.
    deadline = spec.run_policy.active_deadline_seconds
    started = _parse_time(status.start_time)
    if deadline and started and now >= started + timedelta(seconds=deadline) and current.finish_time is None:
        st.end_attempt(
            status,
            current.index,
            Reason.DEADLINE_EXCEEDED.value,
            None,
            "runPolicy.activeDeadlineSeconds passed",
            status.step,
            stamp,
        )
        plan.delete = sorted(jobs)
        _finish(
            plan,
            Finish(False, Reason.DEADLINE_EXCEEDED.value, f"runPolicy.activeDeadlineSeconds={deadline} passed"),
            stamp,
            generation,
        )
        return plan

    if current.finish_time is None:
        if spec.run_policy.suspend:
            if job is not None:
                plan.delete.append(current.index)  # pods get SIGTERM: the trainer checkpoints
            st.end_attempt(
                status,
                current.index,
                Reason.SUSPENDED.value,
                None,
                "suspended: the trainer checkpoints on SIGTERM",
                status.step,
                stamp,
            )
            _suspend(plan, stamp, generation, f"attempt {current.index} stopped by runPolicy.suspend")
            return plan
        if job is None:
            if current.index in deleted_jobs:  # our Job vanished under us (deleted by someone)
                outcome = AttemptOutcome(
                    exit_code=None,
                    platform_reason="PodDeleted",
                    message=f"Job {current.index} was deleted while running",
                )
                _after(plan, spec, current.index, current.precision, outcome, stamp, generation)
            else:
                # Recorded but not created (the operator stopped in between): create it now.
                plan.create.append(StartAttempt(current.index, current.precision, None, current.start_step))
                status.phase = "Running" if status.phase != "Recovering" else status.phase
            return plan
        finished = job.finished or ended_by_pods(job, spec.workers)
        if finished is None and job.suspended:
            if status.phase != "Pending":
                status.phase = "Pending"
                st.set_condition(
                    status,
                    "Running",
                    False,
                    "AwaitingAdmission",
                    f"attempt {current.index} waits for its queue to admit it",
                    stamp,
                    generation,
                )
            return plan
        if finished is None:
            if status.phase != "Running":
                status.phase = "Running"
                st.set_condition(
                    status,
                    "Running",
                    True,
                    "AttemptRunning",
                    f"attempt {current.index} in {current.precision}",
                    stamp,
                    generation,
                )
            return plan
        if any(p.alive for p in job.pods):
            return plan  # the Job ended; wait until every pod has stopped (and checkpointed)
        _after(plan, spec, current.index, current.precision, outcome_of(job), stamp, generation)
        return plan

    # The current attempt ended earlier (suspended, or the operator stopped after ending it).
    if status.phase == "Suspended":
        if spec.run_policy.suspend or earlier_alive or (job is not None and any(p.alive for p in job.pods)):
            return plan
        st.set_condition(status, "Suspended", False, "Resumed", "runPolicy.suspend cleared", stamp, generation)
        nxt = StartAttempt(current.index + 1, current.precision, None, _checkpoint_step(status))
        if nxt.index >= spec.run_policy.max_attempts:
            _finish(plan, Finish(False, "AttemptsExhausted", "no attempt left to resume"), stamp, generation)
            return plan
        _start(plan, spec, nxt, stamp, generation, "Resumed")
        return plan
    return plan


def _checkpoint_step(status: MixedPrecisionJobStatus) -> int:
    return status.last_checkpoint.step if status.last_checkpoint else 0


def _start(
    plan: Plan, spec: MixedPrecisionJobSpec, start: StartAttempt, stamp: str, generation: int | None, why: str
) -> None:
    status = plan.status
    st.begin_attempt(status, start, world_size=world_size(spec), at=stamp)
    status.phase = "Running" if start.fallback_from is None else "Recovering"
    plan.create.append(start)
    plan.started_reasons.append(why)
    resumed = f", resuming from checkpoint step {start.start_step}" if start.start_step else ""
    plan.events.append(Event("Normal", "AttemptStarted", f"attempt {start.index} in {start.precision}{resumed}"))
    st.set_condition(
        status, "Running", True, "AttemptStarted", f"attempt {start.index} in {start.precision}", stamp, generation
    )


def _suspend(plan: Plan, stamp: str, generation: int | None, message: str) -> None:
    plan.status.phase = "Suspended"
    st.set_condition(plan.status, "Suspended", True, "Suspended", message, stamp, generation)
    st.set_condition(plan.status, "Running", False, "Suspended", message, stamp, generation)
    plan.events.append(Event("Normal", "Suspended", message))


def _finish(plan: Plan, decision: Finish, stamp: str, generation: int | None) -> None:
    status = plan.status
    status.phase = "Succeeded" if decision.succeeded else "Failed"
    status.message = decision.message
    status.completion_time = stamp
    st.set_condition(status, "Running", False, decision.reason, decision.message, stamp, generation)
    st.set_condition(status, status.phase, True, decision.reason, decision.message, stamp, generation)
    plan.events.append(Event("Normal" if decision.succeeded else "Warning", status.phase, decision.message))


def _after(
    plan: Plan,
    spec: MixedPrecisionJobSpec,
    index: int,
    precision: str,
    outcome: AttemptOutcome,
    stamp: str,
    generation: int | None,
) -> None:
    status = plan.status
    result: Classification = classify(outcome)
    report = outcome.report
    if report is not None and report.last_good_checkpoint is not None:
        ref = report.last_good_checkpoint
        status.last_checkpoint = CheckpointStatus(
            step=ref.step, sha256=ref.sha256, precision=ref.precision, path=ref.path
        )
    end_step = report.step if report else status.step
    if report is not None:
        status.step = report.step
        for attempt in status.attempts:
            if attempt.index == index and report.start_step:
                attempt.start_step = report.start_step
    st.end_attempt(status, index, result.reason.value, outcome.exit_code, result.message, end_step, stamp)
    plan.events.append(
        Event(
            "Normal" if result.action is Action.SUCCEED else "Warning",
            "AttemptEnded",
            f"attempt {index} ({precision}) ended {result.reason.value}: {result.message}"[:1000],
        )
    )
    ckpt = status.last_checkpoint
    decision = after_attempt(
        spec,
        index,
        precision,
        result,
        ckpt.step if ckpt else 0,  # type: ignore[arg-type]
        ckpt.path if ckpt else None,
    )
    if isinstance(decision, Finish):
        _finish(plan, decision, stamp, generation)
        return
    if decision.fallback_from is not None:
        st.set_condition(
            status,
            "PrecisionFallback",
            True,
            result.reason.value,
            f"{decision.fallback_from} -> {decision.precision} from checkpoint step {decision.start_step}",
            stamp,
            generation,
        )
        plan.events.append(
            Event(
                "Warning",
                "PrecisionFallback",
                f"{decision.fallback_from} -> {decision.precision} after {result.reason.value}, "
                f"resuming from checkpoint step {decision.start_step}",
            )
        )
        plan.fallbacks.append((decision.fallback_from, decision.precision))
    _start(plan, spec, decision, stamp, generation, result.reason.value)
