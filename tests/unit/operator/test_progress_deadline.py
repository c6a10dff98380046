"""runPolicy.progressDeadlineSeconds: a running attempt whose step has stood still that long, as
the reads of its rank 0 saw (its progressTime, in the status: an operator that restarts goes on
counting from it), is ended Stalled at once, charged, its Job deleted;
the next attempt, in the same precision from the newest checkpoint, has its Job created once
the stalled attempt's pods are gone. A job's fault policy may fail it instead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.planning import status as st
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.lifecycle import Plan
from mpjob.planning.reconcile import reconcile
from tests.unit.operator.test_lost_nodes import running

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DEADLINE = {"runPolicy": {"progressDeadlineSeconds": 60}}


def pod(rank: int, started: float | None) -> PodView:
    """A running pod whose trainer started `started` seconds before NOW (None: pending)."""
    if started is None:
        return PodView(f"j-a0-{rank}", rank, "Pending", True)
    stamp = st.stamp(NOW - timedelta(seconds=started))
    return PodView(f"j-a0-{rank}", rank, "Running", True, started_at=stamp, node=f"n{rank}")


RUNNING = {0: JobView(0, pods=(pod(0, 600),))}


def ended(
    still_for: float | None,
    workers: int = 1,
    jobs: dict[int, JobView] = RUNNING,
    unseen_for: float | None = None,
    **more: Any,
) -> Plan:
    """The plan for a job of `workers` running its first attempt, whose step has stood still
    `still_for` seconds as its status records (None: no read has answered), read by this
    operator `unseen_for` seconds without a reading of its own (None: it has one), with `more`
    of spec."""
    spec, status = running(workers, **more)
    if still_for is not None:
        status.attempts[0].progress_time = st.stamp(NOW - timedelta(seconds=still_for))
    return reconcile(spec, status, 1, jobs, NOW, unseen_for=unseen_for)


@pytest.mark.parametrize("still_for", [None, 0.0, 59.0])
def test_an_attempt_within_its_deadline_or_not_read_runs_on(still_for: float | None) -> None:
    plan = ended(still_for, **DEADLINE)
    assert (plan.delete, len(plan.status.attempts), plan.status.phase) == ([], 1, "Running")


def test_without_a_deadline_a_step_may_stand_still_for_ever() -> None:
    plan = ended(1e9)
    assert (plan.delete, len(plan.status.attempts)) == ([], 1)


def test_a_stalled_attempt_is_cut_at_once_charged_and_the_next_waits_for_its_pods() -> None:
    plan = ended(61.0, **DEADLINE)
    spec = running(1, **DEADLINE)[0]
    first, second = plan.status.attempts
    assert (plan.delete, plan.cut, plan.create) == ([0], [0], [])  # cut: a hung rank cannot checkpoint
    assert (first.reason, first.charged) == ("Stalled", True), first
    assert "has not moved for 61s" in (first.message or "") and "progressDeadlineSeconds=60" in (first.message or "")
    assert (second.precision, second.start_step) == ("bf16", 20)
    assert reconcile(spec, plan.status, 1, {}, NOW, lingering=frozenset({0})).create == []
    (created,) = reconcile(spec, plan.status, 1, {}, NOW).create
    assert (created.index, created.precision) == (1, "bf16")


def test_the_attempt_after_a_stall_counts_its_recovery_from_the_stall() -> None:
    """No report says when a hung attempt ended: the moment the operator ended it does, so the
    next attempt's recoverySeconds (its trainer's, from its launch's recoveringSince) is recorded."""
    plan = ended(61.0, **DEADLINE)
    spec = running(1, **DEADLINE)[0]
    (created,) = reconcile(spec, plan.status, 1, {}, NOW + timedelta(seconds=12)).create
    assert (created.index, created.recovering_since) == (1, NOW.timestamp())


def test_a_fault_policy_rule_on_stalled_fails_the_job_and_names_itself() -> None:
    plan = ended(120.0, **DEADLINE, faultPolicy={"rules": [{"fault": "Stalled", "action": "Fail"}]})
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
    plan = ended(1000.0, 2, pods, **DEADLINE)
    assert (plan.status.attempts[0].reason == "Stalled") is stalled, plan.status.attempts[0]
    if stalled:
        assert "has not moved for 61s" in (plan.status.attempts[0].message or "")


@pytest.mark.parametrize(("unseen_for", "stalled"), [(0.0, False), (59.0, False), (61.0, True), (None, True)])
def test_an_operator_with_no_reading_of_its_own_counts_from_when_it_began_to_read(
    unseen_for: float | None, stalled: bool
) -> None:
    """A restarted operator finds a progressTime 10 minutes old: the step may have moved while
    no operator looked, so it judges a stall once a reading of its own showed the step where it
    was (None: then from the progressTime), or once it has read that long with no answer."""
    first = ended(600.0, unseen_for=unseen_for, **DEADLINE).status.attempts[0]
    assert (first.reason == "Stalled") is stalled, first
    if stalled:
        assert f"has not moved for {600 if unseen_for is None else 61}s" in (first.message or ""), first
