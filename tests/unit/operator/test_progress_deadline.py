"""runPolicy.progressDeadlineSeconds: a running attempt whose step has stood still that long, as
the reads of its rank 0 saw (`still_for`), is ended Stalled at once, charged, its Job deleted;
the next attempt, in the same precision from the newest checkpoint, has its Job created once
the stalled attempt's pods are gone. A job's fault policy may fail it instead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.planning.endings import JobView, PodView
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def pod(rank: int, started: float | None) -> PodView:
    """A running pod whose trainer started `started` seconds before NOW (None: pending)."""
    if started is None:
        return PodView(f"j-a0-{rank}", rank, "Pending", True)
    stamp = (NOW - timedelta(seconds=started)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return PodView(f"j-a0-{rank}", rank, "Running", True, started_at=stamp, node=f"n{rank}")


RUNNING = {0: JobView(0, pods=(pod(0, 600),))}


def spec(workers: int = 1, **run_policy: Any) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {
            "workers": workers,
            "task": {"builtin": "mlp"},
            "precision": {"mode": "bf16", "fallback": ["fp32"]},
            "runPolicy": run_policy,
        }
    )


def running() -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus.model_validate(
        {
            "phase": "Running",
            "attempt": 0,
            "precision": "bf16",
            "step": 25,
            "attempts": [{"index": 0, "precision": "bf16", "startStep": 0}],
            "lastCheckpoint": {"step": 20, "path": "/ck/step-000000020"},
        }
    )


@pytest.mark.parametrize("still_for", [None, 0.0, 59.9])
def test_an_attempt_within_its_deadline_or_not_read_runs_on(still_for: float | None) -> None:
    plan = reconcile(spec(progressDeadlineSeconds=60), running(), 1, RUNNING, NOW, still_for=still_for)
    assert (plan.delete, len(plan.status.attempts), plan.status.phase) == ([], 1, "Running")


def test_without_a_deadline_a_step_may_stand_still_for_ever() -> None:
    plan = reconcile(spec(), running(), 1, RUNNING, NOW, still_for=1e9)
    assert (plan.delete, len(plan.status.attempts)) == ([], 1)


def test_a_stalled_attempt_ends_at_once_charged_and_the_next_waits_for_its_pods() -> None:
    plan = reconcile(spec(progressDeadlineSeconds=60), running(), 1, RUNNING, NOW, still_for=61.0)
    first, second = plan.status.attempts
    assert (plan.delete, plan.create) == ([0], [])
    assert (first.reason, first.charged) == ("Stalled", True), first
    assert "has not moved for 61s" in (first.message or "") and "progressDeadlineSeconds=60" in (first.message or "")
    assert (second.precision, second.start_step) == ("bf16", 20)
    assert reconcile(spec(progressDeadlineSeconds=60), plan.status, 1, {}, NOW, lingering=frozenset({0})).create == []
    (created,) = reconcile(spec(progressDeadlineSeconds=60), plan.status, 1, {}, NOW).create
    assert (created.index, created.precision) == (1, "bf16")


def test_a_fault_policy_rule_on_stalled_fails_the_job_and_names_itself() -> None:
    policy = {"faultPolicy": {"rules": [{"fault": "Stalled", "action": "Fail"}]}}
    job = MixedPrecisionJobSpec.model_validate({**spec(progressDeadlineSeconds=60).model_dump(by_alias=True), **policy})
    plan = reconcile(job, running(), 1, RUNNING, NOW, still_for=120.0)
    assert plan.status.phase == "Failed" and plan.delete == [0]
    assert "spec.faultPolicy.rules[0] (fault: Stalled, action: Fail)" in (plan.status.message or "")


@pytest.mark.parametrize(
    ("started", "stalled"),
    [
        ((600, None), False),  # rank 1's pod is pending: rank 0 waits for it, it is not hung
        ((600, 30), False),  # rank 1 started 30 s ago: the stall counts from there
        ((600, 61), True),
    ],
)
def test_a_stall_counts_from_when_the_last_pod_started(started: tuple[float, float | None], stalled: bool) -> None:
    pods = {0: JobView(0, pods=tuple(pod(rank, s) for rank, s in enumerate(started)))}
    plan = reconcile(spec(2, progressDeadlineSeconds=60), running(), 1, pods, NOW, still_for=1000.0)
    assert (plan.status.attempts[0].reason == "Stalled") is stalled, plan.status.attempts[0]
    if stalled:
        assert "has not moved for 61s" in (plan.status.attempts[0].message or "")
