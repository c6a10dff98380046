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

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from mpjob.planning import backoff, changed, cost, cutoff, elastic, history, lapse, replan, reported, shortage
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.charging import Disruption, charged
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.elastic import workers_of
from mpjob.planning.endings import JobView, PodView, ended_by_pods, outcome_of, pods_of, preempted_by_queue
from mpjob.planning.phases import past_deadline
from mpjob.planning.plan import Plan, When
from mpjob.planning.planner import StartAttempt, first_attempt
from mpjob.planning.resumepoint import POD_CHECKPOINTS, started_over, suspended
from mpjob.planning.status import FINISHED, ConditionReason
from mpjob.planning.waiting import awaiting_workers, running, settle
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus, processes_per_worker
from mpjob_contract.codes import Reason
from mpjob_contract.report import InPlaceChange
from mpjob_contract.spec_warnings import spec_warnings

__all__ = ["FINISHED", "JobView", "PodView", "ended_by_pods", "outcome_of", "preempted_by_queue", "reconcile"]


def reconcile(
    spec: MixedPrecisionJobSpec,
    status: MixedPrecisionJobStatus,
    generation: int | None,
    jobs: dict[int, JobView],
    now: datetime,
    lingering: frozenset[int] = frozenset(),
    fits: int | None = None,
    changes: Sequence[InPlaceChange] = (),
    unseen_for: float | None = None,
    stopped: dict[int, JobView] | None = None,
    retries: backoff.RetryBackoff = backoff.JOB_CONTROLLER,
) -> Plan:
    """Decide what to do. `jobs` are the attempt Jobs that exist; `lingering` the attempts whose Job is gone
    but some pod still runs (terminating); `stopped` those whose Job is gone and whose pods have all stopped,
    as last seen (`cutoff.heard`); `fits` the workers of the job the cluster holds now (spec.elastic grows on
    it; None: not read); `changes` the fallbacks in place a read of the running attempt found
    (`changed.record` keeps those the status lacks); `unseen_for` the seconds the operator has been reading
    the running attempt without a reading of its own yet (None: it has one; `cutoff.stalled`); `retries` the
    wait before an attempt that retries a failure as it was (`backoff`: its Job is created by a reconcile
    once it is due, which `Plan.requeue_after` asks for). Only the attempts' own Jobs are charged."""
    charged = cost.own_jobs(status, jobs), cost.own_jobs(status, stopped or {})  # from the status read
    plan = _opened(spec, status, generation)
    status = plan.status
    when = When(st.stamp(now), generation)
    cutoff.heard(plan, spec, jobs, stopped or {}, when)  # before anything resumes from the last checkpoint
    if status.phase in FINISHED:
        _expire(plan, spec, jobs, now)
    elif not status.attempts:
        lc.created(plan, when, "MixedPrecisionJob accepted")
        if spec.run_policy.suspend:
            lc.suspend(plan, when, "suspended before the first attempt")
        else:
            lc.begin(plan, spec, first_attempt(spec), when)
    elif status.attempts[-1].finish_time is None:
        if _changes_ended(plan, spec, changes, when):
            pass  # one ended the job: its Job goes
        elif st.deadline_passed(spec, status, now):  # the attempt the trainer went on in, if it changed
            _deadline(plan, spec, jobs, when)
        else:
            _follow_running(plan, spec, jobs, when, lingering=lingering, stopped=stopped or {}, fits=fits,
                            unseen_for=unseen_for)  # fmt: skip
    elif status.phase == "Suspended":
        busy = bool(lingering) or any(p.alive for j in jobs.values() for p in j.pods)
        if not (spec.run_policy.suspend or busy):
            lc.resume(plan, spec, when)
    if plan.status.attempts and plan.status.phase in (*FINISHED, "Suspended"):
        settle(plan, when)  # it waits on nothing any more
    lapse.caught_up(plan, spec.checkpoint.every_steps, when.at)  # a report's checkpoint: no reading says so
    _retire(plan, jobs)
    cutoff.sweep(plan, jobs)
    cost.account(plan.status, spec, cost.seen_usage(plan.status, charged[0], spec, now, charged[1]))
    newest = plan.status.attempts[-1].index if plan.status.attempts else None
    if any(s.index == newest for s in plan.create) and (wait := backoff.held(plan, when, retries, now)) is not None:
        plan.create = [s for s in plan.create if s.index != newest]  # its Job waits out its backoff
        plan.requeue_after = wait.left(now)  # and is made by the reconcile that comes then
    if plan.create:
        plan.deadline_seconds = st.deadline_left(spec, status, now)
    return plan


def _changes_ended(plan: Plan, spec: MixedPrecisionJobSpec, changes: Sequence[InPlaceChange], when: When) -> bool:
    """Record the running attempt's changes in place the status lacks (`changed.record`): whether
    they ended the job, one needing an attempt the job no longer has (runPolicy.maxAttempts lowered
    after the trainer's launch planned it). Its Job then goes (`lc.finish`), and nothing follows the
    attempt that change ended, nor ends it again."""
    changed.record(plan, spec, list(changes), when)
    return plan.status.attempts[-1].finish_time is not None


def _follow_running(
    plan: Plan, spec: MixedPrecisionJobSpec, jobs: dict[int, JobView], when: When, *, lingering: frozenset[int],
    stopped: dict[int, JobView], fits: int | None, unseen_for: float | None,
) -> None:  # fmt: skip
    """`_follow` the running attempt in its Job (its own, else its chain's: `running_job`), held
    back while a pod of an earlier attempt still stops."""
    job = running_job(plan.status, jobs)
    current = job.index if job is not None else plan.status.attempts[-1].index
    earlier = bool(lingering) or any(p.alive for i, j in jobs.items() if i != current for p in j.pods)
    gone = running_job(plan.status, stopped)  # its Job, deleted: as its pods were last seen
    _follow(plan, spec, job, when, lingering=earlier, fits=fits, unseen_for=unseen_for, gone=gone)


def _opened(spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, generation: int | None) -> Plan:
    """The plan on a copy of `status` that answers `generation`; a new generation's spec warnings."""
    unread = status.observed_generation != generation  # a spec this operator has not planned from yet
    status = status.model_copy(deep=True)
    status.observed_generation = generation
    # The bound of every step a trainer names (planning/reported.py). Never lowered: an attempt
    # trains to the training.steps it was launched with, so an edit that lowers them reaches the
    # next attempt only, and the steps the running one (or one resumed past the new end) names
    # stay its own.
    status.total_steps = max(spec.training.steps, status.total_steps or 0)
    plan = Plan(status=status)
    if unread:  # once per generation: the status that records it is written before any Event goes
        plan.events.extend(lc.Event("Warning", w.reason, w.message) for w in spec_warnings(spec))
    return plan


def running_job(status: MixedPrecisionJobStatus, jobs: dict[int, JobView]) -> JobView | None:
    """The Job the newest attempt runs in: its own, else (one begun in place) its chain's."""
    index = status.attempts[-1].index
    return jobs.get(index) or jobs.get(history.job_index(status, index))


#: Attempts whose children (Job, pods, headless Service) stay: the newest one (running, or the
#: last) and the one before it, whose pods' logs tell why it ended.
KEEP_CHILDREN = 2


def _retire(plan: Plan, jobs: dict[int, JobView]) -> None:
    """The Jobs of ended attempts older than the newest KEEP_CHILDREN go (their pods and Service
    with them): their outcome is in this plan's status, which is written before any delete, so
    a job that is preempted again and again never piles up children."""
    kept = [history.job_index(plan.status, a.index) for a in plan.status.attempts[-KEEP_CHILDREN:]]
    oldest_kept = min(kept, default=0)
    plan.delete.extend(i for i in sorted(jobs) if i < oldest_kept and i not in plan.delete)


def _expire(plan: Plan, spec: MixedPrecisionJobSpec, jobs: dict[int, JobView], now: datetime) -> None:
    """ttlSecondsAfterFinished: the children go this long after the job finished."""
    ttl = spec.run_policy.ttl_seconds_after_finished
    done = st.moment(plan.status.completion_time)
    if ttl is not None and done is not None and now >= done + timedelta(seconds=ttl):
        plan.delete = sorted(jobs)


def _deadline(plan: Plan, spec: MixedPrecisionJobSpec, jobs: dict[int, JobView], when: When) -> None:
    plan.delete = sorted(jobs)
    past_deadline(plan, spec, when)


def _follow(
    plan: Plan,
    spec: MixedPrecisionJobSpec,
    job: JobView | None,
    when: When,
    *,
    lingering: bool,
    fits: int | None,
    unseen_for: float | None = None,
    gone: JobView | None = None,
) -> None:
    """The current attempt runs: suspend it, (re)create its Job, watch it, resize it, or end it
    (`lingering`: some pod of an earlier attempt still stops; `fits`: workers the cluster holds;
    `gone`: its Job that was deleted, its pods stopped; its step standing still past
    runPolicy.progressDeadlineSeconds ends it `Stalled`)."""
    status = plan.status
    current = status.attempts[-1]
    if spec.run_policy.suspend:
        if job is not None:
            plan.delete.append(job.index)  # pods get SIGTERM: the trainer checkpoints
        message = "suspended: the trainer checkpoints on SIGTERM"
        user = charged(Disruption.USER_SUSPEND)
        at = reported.seen_at(status, current.index)
        st.end_attempt(status, current.index, Reason.SUSPENDED.value, None, message, at, when.at, charged=user)
        gone_with_pods = suspended(status, spec)  # its pods go: what they hold is no resume point
        lc.suspend(plan, when, f"attempt {current.index} stopped by runPolicy.suspend{gone_with_pods}")
        return
    if job is None and lingering:
        return  # a new attempt waits until its predecessor's pods are gone (no two write checkpoints)
    if job is None:
        _create(plan, spec, when, gone=gone)
        return
    if replan.stale(job, when.generation):  # the edit its PodsScheduled condition asks for
        replan.remake(plan, job, when)
        return
    finished = job.finished or ended_by_pods(job, pods_of(job, workers_of(spec, current)))
    now = st.moment(when.at) or datetime.now(UTC)
    short = shortage.short_of_room(spec, current, job, fits, now)
    if finished is None and short is not None and short.verdict is elastic.Verdict.SHRINK:
        cutoff.resize(plan, spec, short, when, job=job.index)
    elif (lost := cutoff.lost_pod(job)) is not None and any(p.alive for p in job.pods):
        cutoff.end_lost(plan, spec, job, lost, when)  # at once: the lost pod may leave no trace once peers stop
    elif cutoff.crashed(job):
        plan.cut.append(job.index)  # its live ranks are cut (its Job kept for its logs); it ends once they stop
    elif finished is None and (stall := cutoff.stalled(spec, job, current, now, unseen_for)):
        cutoff.end_now(plan, spec, job, AttemptOutcome(None, platform_reason=Reason.STALLED.value, message=stall), when)
    elif (
        finished is None
        and (grow := elastic.grown(spec, status, elastic.grows(spec, current, fits, status))) is not None
    ):
        cutoff.resize(plan, spec, grow, when, job=job.index)
    elif finished is None:
        awaiting_workers(plan, when, short)
        running(plan, spec, job=job, when=when)
    elif not any(p.alive for p in job.pods):  # else wait until every pod has stopped (and checkpointed)
        _ended(plan, spec, job, when, fits)


def _ended(plan: Plan, spec: MixedPrecisionJobSpec, job: JobView, when: When, fits: int | None) -> None:
    """The running attempt's Job finished, its pods stopped: the changes in place its report lists
    that no read caught are recorded first (the attempt that ends is the last one they began),
    then its outcome ends it; a smaller one the `fits` workers the cluster holds now would grow
    is followed by one of that size, unless it ran out of memory: the grown size's split, chosen
    before that micro-batch was known too big, may be it; it goes on split and grows at a checkpoint."""
    outcome = preempted_by_queue(job) or outcome_of(job)
    if _changes_ended(plan, spec, outcome.report.precision_changes if outcome.report else [], when):
        return
    current = plan.status.attempts[-1]
    outcome = replace(outcome, resize=shortage.node_lost(spec, current, job.pods))
    room = elastic.room_after(spec, plan.status, current, outcome, fits)
    lc.conclude(plan, spec, attempt=current, outcome=outcome, when=when, room=room)


def _create(plan: Plan, spec: MixedPrecisionJobSpec, when: When, *, gone: JobView | None) -> None:
    """Create the current attempt's Job, recorded but not created (the operator stopped in between,
    or a shrink), or deleted while its pods ran (the phase says so; they have stopped: `gone`, as
    last seen), in the same attempt."""
    status, current = plan.status, plan.status.attempts[-1]
    ran, kept = status.phase == "Running", spec.checkpoint.outlives_pods
    if ran and not kept:
        started_over(status, current)  # its new pods start at 0: what the old ones wrote went with them
    start = lc.again(spec, status, current, index=current.index, start_step=current.start_step)
    _remade_size(status, spec, current, start)
    plan.create.append(start)
    if ran:
        message = f"attempt {current.index}'s Job was deleted while it ran: created again, in the same attempt"
        message += " (uncharged), " + ("to resume from its newest checkpoint" if kept else POD_CHECKPOINTS)
        plan.events.append(lc.Event("Warning", ConditionReason.JOB_RECREATED, message))
        if gone is not None:  # once: the phase below makes this the only such reconcile
            cost.deleted_job(status, current, gone, spec, st.moment(when.at) or datetime.now(UTC))
        status.phase = "Pending"
        if kept:
            current.start_step_reported = True  # it began where it says: the new pods resume further on


def _remade_size(
    status: MixedPrecisionJobStatus, spec: MixedPrecisionJobSpec, entry: AttemptStatus, start: StartAttempt
) -> None:
    """The attempt's record as its Job made again runs: its processes and split, the job's workers.
    An edit since its first Job (gpusPerWorker, as PodsScheduled asks; workers under fsdp) changes
    them, and what counts its pods (`workers_of`: a stall, the pods made, an ending) reads them."""
    workers = start.workers or spec.workers
    entry.world_size, entry.workers = workers * processes_per_worker(spec), workers
    status.workers = workers
    entry.micro_batch, entry.grad_accumulation = start.micro_batch, start.grad_accumulation
