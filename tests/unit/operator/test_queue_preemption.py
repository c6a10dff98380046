"""A queue (Kueue) preempting a running attempt, as the planner sees it. What Kubernetes v1.34
does: Kueue suspends the attempt's Job, the Job controller stops its pods without counting them
as failed, and the Job waits in the queue until Kueue admits it again; the attempt goes on in
the same Job and precision (AwaitingReadmission meanwhile). Should such a Job fail instead (a
pod that failed by itself as it was stopped), the attempt ends Preempted whatever its pods
still show and the next one resumes in the same precision. Either way preemptions use none of
runPolicy.maxAttempts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.controller.queue import workload_message
from mpjob.planning.reconcile import JobView, PodView, preempted_by_queue, reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def spec(max_attempts: int = 2) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "gpt"},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
            "runPolicy": {"maxAttempts": max_attempts, "queueName": "team-a"},
            "checkpoint": CLAIM,
        }
    )


def checkpoint_at(step: int) -> CheckpointRef:
    return CheckpointRef(step=step, path=f"/checkpoints/step-{step:09d}", sha256="ab", precision="fp16")


def preempted_pod(step: int) -> PodView:
    ref = checkpoint_at(step)
    report = TerminationReport(reason=Reason.PREEMPTED, step=step, start_step=0, precision="fp16",
                               last_good_checkpoint=ref, message="SIGTERM: checkpointed")  # fmt: skip
    return PodView("p0", 0, "Failed", False, 44, report.to_message(), deleting=True)


def running(status: MixedPrecisionJobStatus, now: datetime) -> MixedPrecisionJobStatus:
    index = status.attempts[-1].index
    pod = PodView("p0", 0, "Running", True)
    return reconcile(spec(), status, 1, {index: JobView(index, pods=(pod,))}, now).status


def preempt(status: MixedPrecisionJobStatus, now: datetime, *, pods: tuple[PodView, ...]) -> MixedPrecisionJobStatus:
    index = status.attempts[-1].index
    job = JobView(index, "Failed", "BackoffLimitExceeded", pods=pods, suspended=True)
    return reconcile(spec(), status, 1, {index: job}, now).status


def test_a_running_attempt_whose_job_its_queue_suspends_waits_for_readmission_in_the_same_attempt() -> None:
    status = reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status
    status = running(status, T0 + timedelta(seconds=5))
    assert status.phase == "Running"
    plan = reconcile(spec(), status, 1, {0: JobView(0, suspended=True)}, T0 + timedelta(seconds=10))
    waiting = plan.status
    assert waiting.phase == "Pending" and waiting.precision == "fp16" and len(waiting.attempts) == 1
    cond = next(c for c in waiting.conditions if c.type == "Running")
    assert (cond.status, cond.reason) == ("False", "AwaitingReadmission")
    assert [e.reason for e in plan.events] == ["Preempted"]
    assert not plan.create and not plan.delete, "the same Job goes on once readmitted"
    again = reconcile(spec(), waiting, 1, {0: JobView(0, suspended=True)}, T0 + timedelta(seconds=20))
    assert not again.events and again.status.conditions == waiting.conditions, "said once"
    # Readmitted: its new pod runs, then the attempt succeeds, still attempt 0.
    status = running(again.status, T0 + timedelta(seconds=30))
    assert status.phase == "Running" and len(status.attempts) == 1


def test_a_suspended_job_that_failed_ends_its_attempt_preempted_even_with_its_pods_gone() -> None:
    outcome = preempted_by_queue(JobView(0, "Failed", "BackoffLimitExceeded", pods=(), suspended=True))
    assert outcome is not None and outcome.exit_code == 44 and "queue" in outcome.message
    with_report = preempted_by_queue(JobView(0, "Failed", "BackoffLimitExceeded", (preempted_pod(30),), True))
    assert with_report is not None and with_report.report is not None and with_report.report.step == 30


@pytest.mark.parametrize(
    "job",
    [
        JobView(0, "Failed", "BackoffLimitExceeded", suspended=False),  # a pod failed: no queue involved
        JobView(0, "Failed", "DeadlineExceeded", suspended=True),  # the deadline, not the queue
        JobView(0, None, None, suspended=True),  # suspended, its pods still stopping: not ended yet
    ],
)
def test_other_endings_are_not_taken_for_a_queue_preemption(job: JobView) -> None:
    assert preempted_by_queue(job) is None


def test_the_next_attempt_waits_for_readmission_in_the_same_precision_from_the_checkpoint() -> None:
    status = reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status
    status = running(status, T0 + timedelta(seconds=5))
    status = preempt(status, T0 + timedelta(seconds=10), pods=(preempted_pod(30),))
    first, second = status.attempts
    assert (first.reason, first.exit_code, first.end_step) == ("Preempted", 44, 30)
    assert (second.precision, second.start_step) == ("fp16", 30)
    # The new attempt's Job is created suspended; Kueue has not admitted it yet.
    waiting = reconcile(spec(), status, 1, {1: JobView(1, suspended=True)}, T0 + timedelta(seconds=11)).status
    assert waiting.phase == "Pending" and waiting.precision == "fp16"
    cond = next(c for c in waiting.conditions if c.type == "Running")
    assert (cond.status, cond.reason) == ("False", "AwaitingReadmission")
    assert "preempted by its queue" in cond.message and "from checkpoint step 30" in cond.message
    assert not any(c.type == "PrecisionFallback" for c in waiting.conditions)


def test_the_next_attempt_waiting_for_readmission_is_never_said_preempted_itself() -> None:
    """The next reconcile (a tick, any event, an operator that restarted) of a job whose new
    attempt waits in its queue read its own AwaitingReadmission and said that attempt, never
    admitted, was preempted, and resumes from the newest checkpoint as last seen."""
    status = reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status
    status = running(status, T0 + timedelta(seconds=5))
    status = preempt(status, T0 + timedelta(seconds=10), pods=(preempted_pod(30),))
    queued = {1: JobView(1, suspended=True)}
    waiting = reconcile(spec(), status, 1, queued, T0 + timedelta(seconds=11)).status
    again = reconcile(spec(), waiting, 1, queued, T0 + timedelta(seconds=41))
    said, now = (next(c for c in s.conditions if c.type == "Running") for s in (waiting, again.status))
    assert now.message == said.message and now.message.startswith("attempt 0 was preempted by its queue; attempt 1")
    assert again.status == waiting and again.told == []


def test_an_attempt_preempted_after_its_predecessors_preemption_is_said_preempted_itself() -> None:
    status = reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status
    status = running(status, T0 + timedelta(seconds=5))
    status = preempt(status, T0 + timedelta(seconds=10), pods=(preempted_pod(30),))
    status = running(status, T0 + timedelta(seconds=20))  # attempt 1 admitted: it runs
    queued = {1: JobView(1, suspended=True)}  # and its queue preempts it in turn
    waiting = reconcile(spec(), status, 1, queued, T0 + timedelta(seconds=30)).status
    again = reconcile(spec(), waiting, 1, queued, T0 + timedelta(seconds=60)).status
    for seen in (waiting, again):
        cond = next(c for c in seen.conditions if c.type == "Running")
        assert cond.message.startswith("attempt 1 was preempted by its queue (its Job was suspended)")
    assert again == waiting


def test_an_attempt_preempted_in_the_second_it_began_is_still_said_preempted_itself() -> None:
    status = reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status
    status = running(status, T0)
    queued = {0: JobView(0, suspended=True)}
    waiting = reconcile(spec(), status, 1, queued, T0).status
    assert reconcile(spec(), waiting, 1, queued, T0 + timedelta(seconds=30)).status == waiting


def test_preemptions_never_exhaust_the_attempt_budget() -> None:
    status = reconcile(spec(max_attempts=2), MixedPrecisionJobStatus(), 1, {}, T0).status
    now = T0
    for _ in range(4):  # four preemptions, with maxAttempts 2
        now += timedelta(seconds=10)
        status = running(status, now)
        status = preempt(status, now, pods=())
        assert status.phase != "Failed", status.message
    assert [a.reason for a in status.attempts[:-1]] == ["Preempted"] * 4
    assert [a.charged for a in status.attempts[:-1]] == [False] * 4  # the suspended Job is the evidence
    assert status.attempt_counts is not None and status.attempt_counts.charged == 0
    assert status.attempts[-1].finish_time is None and status.attempts[-1].precision == "fp16"


def test_a_job_waiting_in_its_queue_shows_the_queues_words() -> None:
    status = reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status
    words = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor f"
    waiting = JobView(0, suspended=True, queue_message=words)
    status = reconcile(spec(), status, 1, {0: waiting}, T0 + timedelta(seconds=1)).status
    cond = next(c for c in status.conditions if c.type == "Running")
    assert cond.reason == "AwaitingAdmission" and cond.message.endswith(f"the queue says: {words}")
    # Words change (or go), the message follows; the transition time stays.
    later = reconcile(spec(), status, 1, {0: JobView(0, suspended=True)}, T0 + timedelta(seconds=9)).status
    again = next(c for c in later.conditions if c.type == "Running")
    assert again.message == "attempt 0 waits for its queue to admit it"
    assert again.last_transition_time == cond.last_transition_time


def test_kueues_verdict_is_read_from_its_workload() -> None:
    quota = {"type": "QuotaReserved", "status": "False", "message": "insufficient unused quota for nvidia.com/gpu"}
    evicted = {"type": "Evicted", "status": "True", "message": "Preempted to accommodate a workload"}
    assert workload_message({"status": {"conditions": [evicted, quota]}}) == quota["message"]
    assert workload_message({"status": {"conditions": [evicted]}}) == evicted["message"]
    admitted = {"type": "QuotaReserved", "status": "True", "message": "Quota reserved in ClusterQueue cq"}
    assert workload_message({"status": {"conditions": [admitted]}}) is None


def test_a_queue_preemption_resumes_from_the_newest_checkpoint_any_pod_reported() -> None:
    """Rank 0 writes a DDP job's checkpoints: its pod names the one it wrote on SIGTERM (step 40),
    the other pods the one they resumed from (step 20). Worker 0's pod ended InfraError (a sibling's
    collective failed once the other pods had gone), so the first Preempted report was worker 1's,
    and the next attempt resumed from step 20, redoing the steps since."""
    said = TerminationReport.model_validate_json(preempted_pod(40).termination_message or "")
    crashed = said.model_copy(update={"reason": Reason.INFRA_ERROR, "message": "rank 1: NCCL error"})
    older = said.model_copy(update={"last_good_checkpoint": checkpoint_at(20)})
    worker0 = PodView("p0", 0, "Failed", False, 1, crashed.to_message(), deleting=True)
    worker1 = PodView("p1", 1, "Failed", False, 44, older.to_message(), deleting=True)
    job = JobView(0, "Failed", "BackoffLimitExceeded", pods=(worker0, worker1), suspended=True)
    outcome = preempted_by_queue(job)
    assert outcome is not None and outcome.report is not None and outcome.report.reason == "Preempted"
    assert outcome.report.last_good_checkpoint == checkpoint_at(40)


def test_a_queue_preemption_with_no_preempted_report_still_resumes_from_the_newest_checkpoint() -> None:
    """Every pod ended another way as its Job was suspended (worker 0 wrote its SIGTERM checkpoint
    at step 40, then a collective failed; worker 1's rank was cut): no report says Preempted, but
    the newest checkpoint one names is the attempt's own, and the ending stays the queue's."""
    said = TerminationReport.model_validate_json(preempted_pod(40).termination_message or "")
    crashed = said.model_copy(update={"reason": Reason.INFRA_ERROR, "message": "rank 1: NCCL error"})
    cut = said.model_copy(update={"reason": Reason.DELETED, "last_good_checkpoint": checkpoint_at(20)})
    worker0 = PodView("p0", 0, "Failed", False, 1, crashed.to_message(), deleting=True)
    worker1 = PodView("p1", 1, "Failed", False, 143, cut.to_message(), deleting=True)
    job = JobView(0, "Failed", "BackoffLimitExceeded", pods=(worker1, worker0), suspended=True)
    outcome = preempted_by_queue(job)
    assert outcome is not None and outcome.report is not None
    assert outcome.report.reason == "Preempted" and "queue" in (outcome.report.message or "")
    assert outcome.report.last_good_checkpoint == checkpoint_at(40)
