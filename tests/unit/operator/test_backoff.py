"""The wait before an attempt that retries a failure as it was (mpjob.planning.backoff): the rule
on attempts' records, and through the pure reconcile with injected time, an outage of the
checkpoint store included (no real sleeping)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from mpjob.controller.metrics import count_plan
from mpjob.planning import backoff
from mpjob.planning.backoff import RetryBackoff, failures_in_a_row
from mpjob.planning.plan import Plan
from mpjob.planning.reconcile import FINISHED, JobView, PodView, reconcile
from mpjob.planning.resumepoint import POD_CHECKPOINTS
from mpjob_contract.api import AttemptStatus, CheckpointStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator import carried_out
from tests.unit.operator.carried_out import made
from tests.unit.operator.test_planning import spec

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
S = spec(precision={"mode": "bf16"}, runPolicy={"maxAttempts": 6})
REFUSED = "botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL"
#: What the launcher reports for a rank whose checkpoint store is down: its stderr, no progress (step 0).
NO_STORE = TerminationReport(reason=Reason.INFRA_ERROR, step=0, precision="bf16", message=REFUSED).to_message()


def ended(index: int, reason: str = "InfraError", **kw: object) -> AttemptStatus:
    fields = {"precision": "bf16", "micro_batch": 4, "finish_time": "2026-11-22T12:00:00Z", **kw}
    return AttemptStatus(index=index, reason=reason, **fields)  # type: ignore[arg-type]


def newest(index: int, **kw: object) -> AttemptStatus:
    return AttemptStatus(index=index, **{"precision": "bf16", "micro_batch": 4, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attempts", "failures"),
    [
        ([newest(0)], 0),
        ([ended(0), newest(1)], 1),
        ([ended(0), ended(1, "Stalled"), ended(2), newest(3)], 3),
        ([ended(0), ended(1, "Preempted"), newest(2)], 0),  # the platform's: at once
        ([ended(0), ended(1), ended(2, "Evicted"), newest(3)], 0),
        ([ended(0), ended(1, "Preempted"), ended(2), newest(3)], 1),  # a disruption ends the run
        ([ended(0), ended(1, "NumericFault"), newest(2, precision="fp32")], 0),  # a fallback
        ([ended(0), ended(1, "OutOfDeviceMemory"), newest(2, micro_batch=2)], 0),  # a split
        ([ended(0), ended(1, "NumericFault"), newest(2)], 2),  # faultPolicy retries it as it was
        ([ended(0, "OOMKilled"), newest(1)], 1),  # faultPolicy retries a host OOM as it was
        ([ended(0, "PodDeleted"), ended(1, "PodDeleted"), newest(2)], 2),  # killed by a signal, no report
        ([ended(0), ended(1, end_step=30), ended(2), newest(3)], 2),  # 1 trained: it counts, none before it
        ([ended(0), ended(1), newest(2, start_step=20)], 1),  # 1 passed a checkpoint the next resumes from
        ([ended(0), ended(2), newest(3)], 1),  # not in a row (attempts[] dropped one between)
        ([ended(0, precision="auto"), newest(1)], 1),  # an auto attempt that failed before it measured
        ([ended(0, precision="auto"), ended(1), newest(2)], 2),
    ],
)
def test_failures_in_a_row_count_retries_as_they_were_since_the_last_progress(
    attempts: list[AttemptStatus], failures: int
) -> None:
    assert failures_in_a_row(attempts) == failures


def test_the_wait_doubles_from_ten_seconds_up_to_six_minutes() -> None:
    assert [backoff.JOB_CONTROLLER.seconds(n) for n in range(8)] == [0, 10, 20, 40, 80, 160, 320, 360]


@pytest.mark.parametrize("text", ["-1", "abc", "361", ""])
def test_a_first_wait_out_of_bounds_is_refused_naming_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match="seconds from 0 to 360"):
        backoff.backoff_base(text)


def crashed(index: int, said: str = REFUSED) -> dict[int, JobView]:
    pod = PodView(f"p{index}", 0, "Failed", alive=False, exit_code=1, termination_message=said)
    return {index: JobView(index, finished="Failed", reason="BackoffLimitExceeded", pods=(pod,))}


def running(index: int) -> dict[int, JobView]:
    return {index: JobView(index, pods=(PodView(f"p{index}", 0, "Running", alive=True),))}


def read_back(status: MixedPrecisionJobStatus) -> MixedPrecisionJobStatus:
    """The status as an operator (this one, or one restarted) reads it from the API server."""
    return MixedPrecisionJobStatus.model_validate(status.to_api())


def test_the_attempt_after_an_infra_error_is_created_once_its_wait_is_over_and_says_when() -> None:
    first = reconcile(S, MixedPrecisionJobStatus(), 1, {}, NOW, retries=backoff.JOB_CONTROLLER).status
    plan = reconcile(S, read_back(first), 1, crashed(0), NOW, retries=backoff.JOB_CONTROLLER)
    assert [a.index for a in plan.status.attempts] == [0, 1] and plan.create == []
    condition = next(c for c in plan.status.conditions if c.type == "Running")
    assert condition.reason == "BackingOff" and plan.status.phase == "Pending"
    assert condition.message.startswith(f"attempt 0 failed (InfraError: {REFUSED}); attempt 1 starts in 10s")
    assert "at 2026-11-22T12:00:10Z" in condition.message
    assert [e.reason for e in plan.events].count("BackingOff") == 1
    assert plan.requeue_after == 10  # reconciled again when the wait ends, not at a later tick
    later = reconcile(S, read_back(plan.status), 1, {}, NOW + timedelta(seconds=9), retries=backoff.JOB_CONTROLLER)
    assert later.create == [] and "BackingOff" not in [e.reason for e in later.events]  # said once
    assert later.requeue_after == 1
    due = reconcile(S, read_back(later.status), 1, {}, NOW + timedelta(seconds=10), retries=backoff.JOB_CONTROLLER)
    assert [s.index for s in due.create] == [1] and due.requeue_after is None
    assert due.status.attempts[1].start_time == "2026-11-22T12:00:10Z"  # it starts when its Job is made


@pytest.mark.parametrize("code", [42, 44])  # a fallback, a preemption: at once
def test_other_endings_start_the_next_attempt_at_once(code: int) -> None:
    first = reconcile(S, MixedPrecisionJobStatus(), 1, {}, NOW).status
    pod = PodView("p0", 0, "Failed", alive=False, exit_code=code)
    plan = reconcile(S, first, 1, {0: JobView(0, finished="Failed", pods=(pod,))}, NOW)
    assert [s.index for s in plan.create] == [1]


def test_an_unmeasured_auto_attempts_fallback_starts_at_once_and_its_record_names_what_it_trained_in() -> None:
    """An `auto` attempt whose loop registers no step (the HF adapter) trains in its device's
    default and reports that precision without a measurement: its fault falls back at once, as
    any fallback does, and its entry says the precision it trained in, as its Event does."""
    s = spec(precision={"mode": "auto"}, resources={"gpusPerWorker": 1, "minComputeCapability": "7.0"})
    first = reconcile(s, MixedPrecisionJobStatus(), 1, {}, NOW).status
    said = TerminationReport(reason=Reason.NUMERIC_FAULT, step=30, start_step=0, precision="fp16", message="guard")
    pod = PodView("p0", 0, "Failed", alive=False, exit_code=42, termination_message=said.to_message())
    plan = reconcile(s, first, 1, {0: JobView(0, finished="Failed", pods=(pod,))}, NOW, retries=backoff.JOB_CONTROLLER)
    assert [(a.index, a.precision) for a in plan.status.attempts] == [(0, "fp16"), (1, "bf16")]
    assert [s.index for s in plan.create] == [1] and plan.requeue_after is None


def outage(retries: RetryBackoff, *, down_for: int = 120, fails_after: int = 18) -> MixedPrecisionJobStatus:
    """The job's status once an attempt runs after the checkpoint store came back (`down_for`
    seconds after the first attempt began), or once it finished: the first attempt trained to a
    checkpoint at step 100, and while the store is down each attempt fails `fails_after` seconds
    after its Job is made, resuming nothing (the launcher's report: no progress). Reconciled
    every second."""
    status, made = reconcile(S, MixedPrecisionJobStatus(), 1, {}, NOW, retries=retries).status, {0: 0}
    status.step = 100  # as the first attempt's live readings showed it
    status.last_checkpoint = CheckpointStatus(step=100, sha256="ab", precision="bf16", path=f"{CHECKPOINT_MOUNT}/s100")
    for second in range(1, 900):
        now = NOW + timedelta(seconds=second)
        index = status.attempts[-1].index if status.attempts else None
        jobs = {}
        if index in made:
            down = made[index] + fails_after <= min(second, down_for)
            jobs = crashed(index, NO_STORE) if down else running(index)
        plan = reconcile(S, read_back(status), 1, jobs, now, retries=retries)
        status = plan.status
        made.update({s.index: second for s in plan.create})
        if status.phase in FINISHED or any(t >= down_for for t in made.values()):
            return status
    raise AssertionError("the simulation ran out of time")


def test_a_two_minute_outage_of_the_checkpoint_store_leaves_attempts_to_go_on() -> None:
    status = outage(backoff.JOB_CONTROLLER)
    assert status.phase == "Pending" and len(status.attempts) == 4, status.message  # waits 10, 20, 40 s
    assert outage(RetryBackoff(base=0)).phase == "Failed"  # retried at once, it used up all six


def started(plan: Plan, s: MixedPrecisionJobSpec = S) -> list[tuple[str, str]]:
    """The attempts a plan says started once carried out (the Jobs it asks for made: `lifecycle.made`):
    its AttemptStarted Events, and the reasons it counts."""
    said = carried_out.said(s, plan, "AttemptStarted")
    return [*(("event", m) for m in said), *(("counted", begun.reason) for begun in plan.started)]


def attempts_started(reason: str) -> float:
    return REGISTRY.get_sample_value("mpjob_operator_attempts_started_total", {"reason": reason}) or 0.0


def test_the_attempt_after_a_wait_is_said_and_counted_started_once_when_its_job_is_made() -> None:
    retries, before = backoff.JOB_CONTROLLER, attempts_started("InfraError")
    first = reconcile(S, MixedPrecisionJobStatus(), 1, {}, NOW, retries=retries)
    assert started(first) == [("event", "attempt 0 in bf16"), ("counted", "Created")]
    failed = reconcile(S, read_back(first.status), 1, crashed(0), NOW, retries=retries)
    assert started(failed) == [] and failed.create == []  # it waits: nothing made, nothing started
    count_plan(first.status, failed)
    assert attempts_started("InfraError") == before
    # an operator restarted during the wait reads the status back: still nothing started
    waiting = reconcile(S, read_back(failed.status), 1, {}, NOW + timedelta(seconds=5), retries=retries)
    assert started(waiting) == [] and waiting.create == []
    # the operator stopped before the Job was made: the reconcile after makes it, and says it then
    unmade = reconcile(S, read_back(waiting.status), 1, {}, NOW + timedelta(seconds=10), retries=retries)
    due = reconcile(S, read_back(unmade.status), 1, {}, NOW + timedelta(seconds=11), retries=retries)
    assert [s.index for s in due.create] == [1]
    assert started(due) == [("event", "attempt 1 in bf16"), ("counted", "InfraError")]
    count_plan(waiting.status, due)
    assert attempts_started("InfraError") == before + 1
    # its Job deleted and made again, in the same attempt (its jobUid recorded): not started a second time
    again = reconcile(S, read_back(due.status), 1, {}, NOW + timedelta(seconds=12), retries=retries)
    assert [s.index for s in again.create] == [1] and started(again) == []


def test_an_attempt_after_a_wait_says_where_it_resumes_when_its_job_is_made() -> None:
    pods = spec(precision={"mode": "bf16"}, runPolicy={"maxAttempts": 6}, checkpoint={"everySteps": 50})
    ref = CheckpointRef(step=100, path=f"{CHECKPOINT_MOUNT}/s100", sha256="ab", precision="bf16")
    said = TerminationReport(reason=Reason.INFRA_ERROR, step=120, precision="bf16", last_good_checkpoint=ref)
    for kept, resumed in ((S, "attempt 1 in bf16, to resume from checkpoint step 100"), (pods, POD_CHECKPOINTS)):
        status = made(kept, reconcile(kept, MixedPrecisionJobStatus(), 1, {}, NOW)).status
        failed = reconcile(kept, read_back(status), 1, crashed(0, said.to_message()), NOW)
        due = reconcile(kept, read_back(failed.status), 1, {}, NOW + timedelta(seconds=10))
        assert started(failed, kept) == [] and started(due, kept)[0][1].endswith(resumed), started(due, kept)


def test_an_emptydir_job_that_never_checkpointed_is_not_told_its_checkpoints_went_with_the_pods() -> None:
    """Trained to step 30 with no checkpoint (everySteps 50): attempt 1 starts at 0, as it would
    have anyway; none went with the pods, before the wait or after it."""
    pods = spec(precision={"mode": "bf16"}, runPolicy={"maxAttempts": 6}, checkpoint={"everySteps": 50})
    said = TerminationReport(reason=Reason.INFRA_ERROR, step=30, start_step=0, precision="bf16").to_message()
    status = made(pods, reconcile(pods, MixedPrecisionJobStatus(), 1, {}, NOW)).status
    failed = reconcile(pods, read_back(status), 1, crashed(0, said), NOW)
    assert (failed.status.step, failed.create) == (30, [])  # trained, and waits
    due = reconcile(pods, read_back(failed.status), 1, {}, NOW + timedelta(seconds=10))
    assert started(due, pods) == [("event", "attempt 1 in bf16"), ("counted", "InfraError")]


def test_an_attempt_with_no_wait_is_said_started_when_its_job_is_made() -> None:
    first = reconcile(S, MixedPrecisionJobStatus(), 1, {}, NOW, retries=RetryBackoff(base=0)).status
    plan = reconcile(S, read_back(first), 1, crashed(0), NOW, retries=RetryBackoff(base=0))
    assert [s.index for s in plan.create] == [1]
    assert started(plan) == [("event", "attempt 1 in bf16"), ("counted", "InfraError")]


def test_a_host_oom_a_rule_retries_waits_as_an_infra_error_does() -> None:
    retries = spec(precision={"mode": "bf16"}, faultPolicy={"rules": [{"fault": "OOMKilled", "action": "Retry"}]})
    first = reconcile(retries, MixedPrecisionJobStatus(), 1, {}, NOW, retries=backoff.JOB_CONTROLLER).status
    pod = PodView("p0", 0, "Failed", alive=False, exit_code=137, platform_reason="OOMKilled")
    killed = {0: JobView(0, finished="Failed", reason="BackoffLimitExceeded", pods=(pod,))}
    plan = reconcile(retries, read_back(first), 1, killed, NOW, retries=backoff.JOB_CONTROLLER)
    assert [(a.index, a.reason) for a in plan.status.attempts] == [(0, "OOMKilled"), (1, None)]
    assert plan.status.attempts[0].charged is not False and plan.create == [] and plan.requeue_after == 10
    assert "spec.faultPolicy.rules[0] (fault: OOMKilled, action: Retry)" in (plan.status.attempts[0].message or "")
    failed = reconcile(S, read_back(first), 1, killed, NOW, retries=backoff.JOB_CONTROLLER).status
    assert failed.phase == "Failed" and [a.reason for a in failed.attempts] == ["OOMKilled"]  # no rule: as before


def test_a_trainer_killed_by_a_signal_again_and_again_waits_as_an_infra_error_does() -> None:
    """A pod whose trainer dies by SIGKILL with no report (a sidecar's or a host's kill, a pod deleted)
    is an infrastructure failure, charged: retried at once each time it would spend the budget in
    as many pod starts."""
    first = reconcile(S, MixedPrecisionJobStatus(), 1, {}, NOW, retries=backoff.JOB_CONTROLLER).status
    pod = PodView("p0", 0, "Failed", alive=False, exit_code=137)
    killed = {0: JobView(0, finished="Failed", reason="BackoffLimitExceeded", pods=(pod,))}
    plan = reconcile(S, read_back(first), 1, killed, NOW, retries=backoff.JOB_CONTROLLER)
    assert [(a.index, a.reason) for a in plan.status.attempts] == [(0, "PodDeleted"), (1, None)]
    assert plan.create == [] and plan.requeue_after == 10
