"""What the current attempt's Job waits on before (and while) its trainers run: its queue's
admission, or admission again after the queue preempted it; its pods, which the Job controller
may be unable to create (runPolicy.podCreationTimeoutSeconds); the workers an elastic job lacks
(spec.elastic). Each is a condition, and a Warning Event once per change, never per reconcile.
"""

from __future__ import annotations

from datetime import timedelta

from mpjob.planning import elastic, scheduling
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.elastic import workers_of
from mpjob.planning.endings import JobView, pods_of
from mpjob.planning.plan import Plan, When
from mpjob.planning.resumepoint import POD_CHECKPOINTS, started_over
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.api import AttemptStatus, Condition, MixedPrecisionJobSpec
from mpjob_contract.codes import Reason


def awaiting_workers(plan: Plan, when: When, short: elastic.Resize | None) -> None:
    """AwaitingWorkers while no smaller size can take the attempt short of room; a Warning Event once."""
    known = next((c for c in plan.status.conditions if c.type == ConditionType.AWAITING_WORKERS), None)
    index = plan.status.attempts[-1].index
    if short is not None and short.verdict is elastic.Verdict.WAIT:
        message, reason = f"attempt {index}: {short.why}", ConditionReason.NO_SMALLER_SIZE
        if known is None or known.status != "True" or known.message != message:
            plan.events.append(lc.Event("Warning", reason, message))
            lc.condition(plan, when, ConditionType.AWAITING_WORKERS, True, reason, message)
    elif known is not None and known.status == "True":
        message = f"attempt {index} no longer waits for workers"
        lc.condition(plan, when, ConditionType.AWAITING_WORKERS, False, ConditionReason.WORKERS_PLACED, message)


def settle(plan: Plan, when: When) -> None:
    """A job that ended or is suspended waits on nothing: each condition that still says it waits
    (st.WAITS) is settled, reason the phase: AwaitingWorkers False; PodsCreated and PodsScheduled
    Unknown (its pods were never made or placed: True would claim what was not seen)."""
    phase, index = plan.status.phase, plan.status.attempts[-1].index
    for cond in list(plan.status.conditions):
        waits, what = st.WAITS.get(cond.type, (None, ""))
        if cond.status == waits:
            message = f"attempt {index} no longer waits {what}: the job is {phase}"
            settled = False if waits == "True" else None
            st.set_condition(plan.status, cond.type, settled, phase, message, when.at, when.generation)


def running(plan: Plan, spec: MixedPrecisionJobSpec, *, job: JobView, when: When) -> None:
    """The attempt's Job exists and has not ended: waiting for admission, for its pods (which
    the Job controller may be unable to create), or running once a trainer pod runs."""
    created = {p.index for p in job.pods} >= set(range(pods_of(job, workers_of(spec, plan.status.attempts[-1]))))
    if job.suspended:
        _awaiting_admission(plan, when, queue_message=job.queue_message, outlive=spec.checkpoint.outlives_pods)
    elif job.create_error is not None and not created:
        _pods_refused(plan, spec, message=job.create_error, when=when)
    elif (held := scheduling.unconfigured(spec, job)) is not None:
        _pods_refused(plan, spec, message=held, when=when, reason=ConditionReason.CONFIG_ERROR)
    elif (held := scheduling.unpulled(spec, job)) is not None:
        _pods_refused(plan, spec, message=held, when=when, reason=ConditionReason.IMAGE_PULL_BACKOFF)
    else:
        if created:
            lc.pods_created(plan, when)
        if spec.elastic is None:  # an elastic job's pods short of room: awaiting_workers
            scheduling.unscheduled(plan, spec, job=job, when=when)
        if any(p.phase == "Running" or p.exit_code is not None for p in job.pods):
            lc.running(plan, when)


def _awaiting_admission(plan: Plan, when: When, *, queue_message: str | None = None, outlive: bool = True) -> None:
    """The attempt's Job waits suspended for its queue: to be admitted, or to be admitted again.

    A Job that ran and is suspended again was preempted by its queue (Kueue suspends it; the
    operator never does: runPolicy.suspend deletes the Job). The Job controller stops its pods
    without counting them as failed, the trainer checkpoints on SIGTERM, and once the queue
    admits the Job again its pods start anew in the same attempt and precision, resuming from
    the newest valid checkpoint (`outlive`: checkpoints in the pod's emptyDir went with the old pods,
    so they start over): no new attempt, none of runPolicy.maxAttempts used."""
    status, current = plan.status, plan.status.attempts[-1]
    running = next((c for c in status.conditions if c.type == ConditionType.RUNNING), None)
    was = running.reason if running is not None else None
    previous = status.attempts[-2] if len(status.attempts) > 1 else None
    reason, message = ConditionReason.AWAITING_ADMISSION, f"attempt {current.index} waits for its queue to admit it"
    over = f"starts again in {current.precision}, {POD_CHECKPOINTS}"
    readmission = was == ConditionReason.AWAITING_READMISSION and not _waits_since_begun(current, previous, running)
    if status.phase == "Running" or readmission:
        step = status.last_checkpoint.step if status.last_checkpoint else current.start_step
        reason = ConditionReason.AWAITING_READMISSION
        goes_on = f"resumes in {current.precision} from the newest checkpoint (step {step} when last seen)"
        message = (
            f"attempt {current.index} was preempted by its queue (its Job was suspended); it waits to be admitted "
            f"again and {goes_on if outlive else over}"
        )
    elif previous is not None and previous.reason == Reason.PREEMPTED.value:
        reason = ConditionReason.AWAITING_READMISSION
        goes_on = f"resumes in {current.precision} from checkpoint step {current.start_step}"
        message = (
            f"attempt {previous.index} was preempted by its queue; attempt {current.index} waits to be admitted "
            f"again and {goes_on if outlive else over}"
        )
    if queue_message:
        message = f"{message}; the queue says: {queue_message}"[:1024]
    if status.phase != "Pending" or was != reason or (running is not None and running.message != message):
        if reason == ConditionReason.AWAITING_READMISSION and was != reason:
            plan.events.append(lc.Event("Warning", Reason.PREEMPTED, message))
        if status.phase == "Running" and not outlive:
            started_over(status, current)  # once readmitted, its pods are made anew
        status.phase = "Pending"
        lc.condition(plan, when, ConditionType.RUNNING, False, reason, message)


def _waits_since_begun(current: AttemptStatus, previous: AttemptStatus | None, running: Condition | None) -> bool:
    """Whether the `current` attempt has waited for its queue since it began, its predecessor
    preempted: it never ran, so its Running condition has not turned since it began (True while
    its pods ran, then False once its own Job was preempted). It is not said preempted itself, by
    the reconcile that said it waits nor by any after it (each reads that AwaitingReadmission)."""
    if previous is None or previous.reason != Reason.PREEMPTED.value or running is None:
        return False
    turned, began = st.moment(running.last_transition_time), st.moment(current.start_time)
    return turned is not None and began is not None and turned <= began


def _pods_refused(
    plan: Plan, spec: MixedPrecisionJobSpec, *, message: str, when: When, reason: str = ConditionReason.FAILED_CREATE
) -> None:
    """Pods the Job controller cannot create, or whose container the kubelet cannot make or
    whose image it cannot pull (`reason`):
    shown at once, the job failed after runPolicy.podCreationTimeoutSeconds from the attempt's
    start (quota may free up, the Secret be made, meanwhile)."""
    current = plan.status.attempts[-1]
    timeout = spec.run_policy.pod_creation_timeout_seconds
    started, now = st.moment(current.start_time), st.moment(when.at)
    if started is None or now is None or now < started + timedelta(seconds=timeout):
        lc.pods_refused(plan, when, message, reason)
        return
    text = f"pods not created within runPolicy.podCreationTimeoutSeconds={timeout}: {message}"
    reason = ConditionReason.POD_CREATION_TIMEOUT
    lc.refused(plan, index=current.index, reason=reason, message=text, when=when)
