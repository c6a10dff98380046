"""Which attempts use up runPolicy.maxAttempts (mpjob.planning.charging), and the bounded
attempt history (mpjob.planning.history): evidence comes from the cluster or the user, never
from the trainer's own exit code or report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning.charging import CHARGING_POLICY, Disruption, charged
from mpjob.planning.classify import Action, AttemptOutcome, classify
from mpjob.planning.reconcile import JobView, PodView, ended_by_pods, outcome_of, preempted_by_queue, reconcile
from mpjob_contract.api import MAX_ATTEMPT_ENTRIES, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import TerminationReport

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
PREEMPTED_REPORT = TerminationReport(reason=Reason.PREEMPTED, step=40, precision="fp16", message="SIGTERM").to_message()


def spec(max_attempts: int = 3, **run_policy: object) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {
            "task": {"command": ["python", "-c", "import sys; sys.exit(44)"]},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
            "runPolicy": {"maxAttempts": max_attempts, **run_policy},
        }
    )


def pod(code: int, message: str | None = None, *, platform: str | None = None, deleting: bool = False) -> PodView:
    return PodView("p0", 0, "Failed", False, code, message, platform_reason=platform, deleting=deleting)


@dataclass(frozen=True)
class Case:
    name: str
    job: JobView
    reason: Reason
    charged: bool


CASES = [
    Case("a trainer's own exit 44", JobView(0, "Failed", pods=(pod(44),)), Reason.PREEMPTED, True),
    Case("a Preempted report", JobView(0, "Failed", pods=(pod(44, PREEMPTED_REPORT),)), Reason.PREEMPTED, True),
    Case(
        "a Preempted report that claims Evicted",  # the cluster's word in a report: invalid, a crash
        JobView(0, "Failed", pods=(pod(44, PREEMPTED_REPORT.replace("Preempted", "Evicted")),)),
        Reason.INFRA_ERROR,
        True,
    ),
    Case(
        "the Eviction API (DisruptionTarget)",
        JobView(0, "Failed", pods=(pod(44, PREEMPTED_REPORT, platform="EvictionByEvictionAPI"),)),
        Reason.EVICTED,
        False,
    ),
    Case(
        "the scheduler's preemption (DisruptionTarget)",
        JobView(0, "Failed", pods=(pod(143, platform="PreemptionByScheduler", deleting=True),)),
        Reason.EVICTED,
        False,
    ),
    Case("the kubelet's eviction", JobView(0, "Failed", pods=(pod(137, platform="Evicted"),)), Reason.EVICTED, False),
    Case(
        "the taint manager (node gone)",
        JobView(0, "Failed", pods=(pod(137, platform="DeletionByTaintManager", deleting=True),)),
        Reason.NODE_LOST,
        False,
    ),
    Case("a pod deleted by someone", JobView(0, "Failed", pods=(pod(143, deleting=True),)), Reason.DELETED, True),
    Case("a crash", JobView(0, "Failed", pods=(pod(1),)), Reason.INFRA_ERROR, True),
    Case(
        "an invalid report",
        JobView(0, "Failed", pods=(pod(44, '{"reason": "Preempted", "precision": "float16"}'),)),
        Reason.INFRA_ERROR,
        True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_attempt_is_uncharged_only_with_evidence_from_the_cluster(case: Case) -> None:
    result = classify(outcome_of(case.job))
    assert (result.reason, result.charged) == (case.reason, case.charged)


def test_a_queue_preemption_is_evidence_whatever_the_trainer_said() -> None:
    job = JobView(0, "Failed", "BackoffLimitExceeded", (pod(1, '{"reason": "ConfigError"}'),), suspended=True)
    outcome = preempted_by_queue(job)
    assert outcome is not None and outcome.disruption is Disruption.QUEUE_PREEMPTED
    result = classify(outcome)
    assert (result.reason, result.charged) == (Reason.PREEMPTED, False)


def test_the_policy_charges_nothing_but_the_absence_of_evidence() -> None:
    assert [rule.evidence for rule in CHARGING_POLICY if rule.charged] == [None]
    assert all(not charged(d) for d in Disruption)
    assert classify(AttemptOutcome(44, disruption=Disruption.USER_SUSPEND)).charged is False


def test_an_invalid_report_is_an_infrastructure_failure_naming_the_field() -> None:
    step = '{"reason": "Succeeded", "step": ' + "9" * 3000 + "}"
    result = classify(outcome_of(JobView(0, "Failed", pods=(pod(0, step),))))
    assert result.reason is Reason.INFRA_ERROR and result.message.startswith("invalid termination report: step:")
    assert len(result.message) < 300  # the 3,000 digits are not repeated back


# ---------------------------------------------------------------- through the reconcile


def end(
    s: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, now: datetime, *pods: PodView
) -> MixedPrecisionJobStatus:
    index = status.attempts[-1].index
    return reconcile(s, status, 1, {index: JobView(index, "Failed", pods=pods)}, now).status


def test_a_command_that_always_exits_44_fails_after_max_attempts() -> None:
    s = spec(max_attempts=3)
    status, now = reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status, T0
    for _ in range(10):
        if status.phase == "Failed":
            break
        now += timedelta(seconds=10)
        status = end(s, status, now, pod(44, PREEMPTED_REPORT))
    assert status.phase == "Failed" and "AttemptsExhausted" in {c.reason for c in status.conditions}
    assert [a.charged for a in status.attempts] == [True, True, True]
    assert status.attempt_counts is not None and status.attempt_counts.charged == 3


def test_suspend_and_resume_use_none_of_max_attempts() -> None:
    s, held = spec(max_attempts=1), spec(max_attempts=1, suspend=True)
    status, now = reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status, T0
    for _ in range(5):
        now += timedelta(seconds=10)
        index = status.attempts[-1].index
        status = reconcile(held, status, 2, {index: JobView(index)}, now).status
        assert status.phase == "Suspended"
        status = reconcile(s, status, 3, {}, now).status
        assert status.phase == "Pending", status.message
    assert [a.reason for a in status.attempts[:-1]] == ["Suspended"] * 5
    assert status.attempt_counts is not None and status.attempt_counts.charged == 0
    assert status.attempts[-1].index == 5  # indexes stay monotonic: a new name per attempt


def test_five_hundred_evictions_keep_the_status_bounded_and_counted() -> None:
    s = spec(max_attempts=2)
    status, now = reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status, T0
    for _ in range(500):
        now += timedelta(seconds=10)
        status = end(s, status, now, pod(44, PREEMPTED_REPORT, platform="EvictionByEvictionAPI"))
    counts = status.attempt_counts
    assert counts is not None and (counts.started, counts.charged, counts.by_reason) == (501, 0, {"Evicted": 500})
    assert len(status.attempts) == MAX_ATTEMPT_ENTRIES and counts.omitted == 501 - MAX_ATTEMPT_ENTRIES
    assert status.attempts[0].index == 0 and status.attempts[-1].index == 500  # the first and the newest
    assert [a.index for a in status.attempts[1:]] == list(range(481, 501))
    assert len(json.dumps(status.to_api())) < 64 * 1024
    # One charged ending now exhausts maxAttempts 2 only after a second: the counts decide.
    status = end(s, status, now + timedelta(seconds=1), pod(44, PREEMPTED_REPORT))
    assert status.phase != "Failed" and status.attempts[-1].index == 501
    status = end(s, status, now + timedelta(seconds=2), pod(44, PREEMPTED_REPORT))
    assert status.phase == "Failed"


def test_a_status_written_before_counts_is_counted_from_its_entries() -> None:
    s = spec(max_attempts=2)
    status = reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status
    status = end(s, status, T0 + timedelta(seconds=5), pod(44, PREEMPTED_REPORT))
    legacy = MixedPrecisionJobStatus.model_validate(status.to_api() | {"attemptCounts": None})
    for entry in legacy.attempts:
        entry.charged = None
    legacy.attempts[0].reason = "NumericFault"
    status = end(s, legacy, T0 + timedelta(seconds=10), pod(1))
    assert status.phase == "Failed" and status.attempt_counts is not None and status.attempt_counts.charged == 2


def test_children_of_ended_attempts_go_but_the_newest_two_attempts_stay() -> None:
    s = spec(max_attempts=5)
    status = reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status
    crashes = [pod(1, f"crash {i}") for i in range(3)]  # distinct: not one early failure repeated
    for i in range(3):
        status = end(s, status, T0 + timedelta(seconds=10 * (i + 1)), crashes[i])
    jobs = {i: JobView(i, "Failed", pods=(crashes[i],)) for i in range(3)} | {3: JobView(3)}
    plan = reconcile(s, status, 1, jobs, T0 + timedelta(seconds=50))
    assert plan.delete == [0, 1]  # attempt 2 (the last ended) and 3 (running) keep theirs


def test_an_evicted_pod_ends_the_attempt_while_it_still_shows_its_disruption() -> None:
    evicted = pod(143, platform="EvictionByEvictionAPI", deleting=True)
    assert ended_by_pods(JobView(0, pods=(evicted,)), 1) == "Failed"
    assert ended_by_pods(JobView(0, pods=(pod(143, deleting=True),)), 1) is None  # a deadline, a suspension
    assert ended_by_pods(JobView(0, pods=(evicted,), suspended=True), 1) is None  # its queue's business


@pytest.mark.parametrize(
    ("platform", "charged_as"),
    [("Evicted", False), ("TerminationByKubelet", False), ("DeletionByPodGC", False), ("OOMKilled", True)],
)
def test_a_trainers_decision_outranks_what_the_cluster_says_of_the_same_pod(platform: str, charged_as: bool) -> None:
    """A pod whose trainer ended NumericFault (its report, exit 42) that the cluster also marked
    (an eviction, its node gone, the OOM killer) ends NumericFault: the next attempt falls back.
    Before, the cluster's reason won and the attempt was retried in the precision that faulted
    (or the job failed, OOMKilled), its message the fault's. The evidence still counts."""
    said = TerminationReport(reason=Reason.NUMERIC_FAULT, step=40, precision="fp16", message="3 non-finite losses")
    result = classify(outcome_of(JobView(0, "Failed", pods=(pod(42, said.to_message(), platform=platform),))))
    assert (result.reason, result.action, result.charged) == (Reason.NUMERIC_FAULT, Action.NEXT_PRECISION, charged_as)


def test_the_operators_own_endings_stand_over_the_trainers_report() -> None:
    said = TerminationReport(reason=Reason.NUMERIC_FAULT, step=40, precision="fp16").to_message()
    told = outcome_of(JobView(0, "Failed", "DeadlineExceeded", pods=(pod(42, said),)))
    assert classify(told).reason is Reason.DEADLINE_EXCEEDED
