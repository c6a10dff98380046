"""The job's phase and conditions, as each transition sets them: accepted, its pods created or
refused, running, suspended, finished, the node's measurement that no low precision pays off.
Each sets its condition at the plan's moment and posts its Event once, when the state changes,
never per reconcile. What begins and ends attempts is `lifecycle`'s, which calls these.
"""

from __future__ import annotations

from mpjob.planning import slower
from mpjob.planning import status as st
from mpjob.planning.plan import Event, Plan, When
from mpjob.planning.planner import Finish
from mpjob.planning.reported import seen_at
from mpjob.planning.resumepoint import went_with_pods
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.codes import Reason
from mpjob_contract.report import Measurement


def condition(plan: Plan, when: When, type_: ConditionType, true: bool, reason: str, message: str) -> None:
    """Set a condition at `when` (its lastTransitionTime moves only when it flips)."""
    st.set_condition(plan.status, type_, true, reason, message, when.at, when.generation)


def created(plan: Plan, when: When, message: str) -> None:
    condition(plan, when, ConditionType.CREATED, True, ConditionReason.CREATED, message)
    plan.status.start_time = plan.status.start_time or when.at


def awaiting_pods(plan: Plan, when: When, index: int, precision: str) -> None:
    """Attempt `index`'s Job is made (or about to be): not Running until its trainer runs."""
    message = f"attempt {index} in {precision}: waiting for its pods"
    condition(plan, when, ConditionType.RUNNING, False, ConditionReason.ATTEMPT_STARTED, message)


def running(plan: Plan, when: When) -> None:
    """The current attempt's processes run (its pods were admitted and started)."""
    status, current = plan.status, plan.status.attempts[-1]
    if status.phase != "Running":
        status.phase = "Running"
        message = f"attempt {current.index} in {current.precision}"
        condition(plan, when, ConditionType.RUNNING, True, ConditionReason.ATTEMPT_RUNNING, message)


def pods_refused(plan: Plan, when: When, message: str, reason: str = ConditionReason.FAILED_CREATE) -> None:
    """The Job controller cannot create the attempt's pods (`message`, its FailedCreate), or the
    kubelet their container or its image (`reason` CreateContainerConfigError, ImagePullBackOff):
    the job waits (Pending) with PodsCreated=False, and a Warning Event says so once per message."""
    status = plan.status
    if status.phase == "Running":
        status.phase = "Pending"
    known = next((c for c in status.conditions if c.type == ConditionType.PODS_CREATED), None)
    news = known is None or known.status != "False" or known.message != message
    condition(plan, when, ConditionType.PODS_CREATED, False, reason, message)
    if news:
        plan.events.append(Event("Warning", reason, message[:1000]))


def pods_created(plan: Plan, when: When) -> None:
    """The attempt's pods exist after all (quota freed, a policy changed): PodsCreated turns
    True where it was False; a job that never had trouble carries no such condition."""
    if any(c.type == ConditionType.PODS_CREATED and c.status != "True" for c in plan.status.conditions):
        message = f"attempt {plan.status.attempts[-1].index}'s pods were created"
        condition(plan, when, ConditionType.PODS_CREATED, True, ConditionReason.PODS_CREATED, message)


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


def past_deadline(plan: Plan, spec: MixedPrecisionJobSpec, when: When, *, outlive: bool | None = None) -> None:
    """runPolicy.activeDeadlineSeconds passed before the newest attempt ended (running, or waiting
    for its Job, its queue or its backoff): it ends DeadlineExceeded where it was seen (`seen_at`:
    where it began when no trainer of it was read) and the job fails; checkpoints kept in its pods
    go with them unless they outlive them (`outlive`: a local run's folder; None: as the spec says)."""
    status, index = plan.status, plan.status.attempts[-1].index
    reason, message = Reason.DEADLINE_EXCEEDED, "runPolicy.activeDeadlineSeconds passed"
    st.end_attempt(status, index, reason, None, message, seen_at(status, index), when.at)
    lost = "" if outlive or not went_with_pods(status, spec) else "; its checkpoints went with its pods (emptyDir)"
    deadline = spec.run_policy.active_deadline_seconds
    finish(plan, Finish(False, reason, f"runPolicy.activeDeadlineSeconds={deadline} passed{lost}"), when)


def amp_slower(plan: Plan, measurement: Measurement | None, when: When) -> None:
    """F6: no low precision beat fp32 on the node: a condition and, the first time, a Warning
    Event (`planning/slower.py`; a read of the attempt may have set them already)."""
    if measurement is None:
        return
    chosen, seconds = measurement.chosen, measurement.step_seconds
    if (told := slower.update(plan.status, chosen, seconds, at=when.at, generation=when.generation)) is not None:
        plan.events.append(told)
