"""A user's runPolicy.suspend of an attempt no trainer has been seen running yet (its Job waits
in its queue for admission): the attempt ends where it began, claiming none of the steps the
attempt before it reached."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def spec(**run_policy: object) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "gpt"},
            "precision": {"mode": "fp16", "fallback": ["bf16"], "inPlace": False},
            "runPolicy": {"queueName": "team-a", **run_policy},
            "checkpoint": CLAIM,
        }
    )


def _faulted() -> tuple[MixedPrecisionJobStatus, JobView]:
    """Attempt 0 ran to step 30 and faulted (checkpoint 20); attempt 1 (bf16, from 20) is begun."""
    status = reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status
    status.attempts[0].job_uid = "u0"
    running = JobView(0, pods=(PodView("p", 0, "Running", alive=True),), uid="u0")
    status = reconcile(spec(), status, 1, {0: running}, T0).status
    status.step = 30
    ref = CheckpointRef(step=20, path="/checkpoints/step-000000020", sha256="ab", precision="fp16")
    said = TerminationReport(reason=Reason.NUMERIC_FAULT, step=30, precision="fp16", last_good_checkpoint=ref)
    pod = PodView("p", 0, "Failed", False, exit_code=42, termination_message=said.to_message())
    failed = JobView(0, finished="Failed", pods=(pod,), uid="u0")
    status = reconcile(spec(), status, 1, {0: failed}, T0 + timedelta(seconds=5)).status
    assert [(a.index, a.precision, a.start_step) for a in status.attempts][-1] == (1, "bf16", 20)
    return status, failed


def test_a_suspended_attempt_its_queue_never_admitted_claims_no_steps() -> None:
    status, failed = _faulted()
    status.attempts[1].job_uid = "u1"
    queued = {0: failed, 1: JobView(1, suspended=True, uid="u1")}
    status = reconcile(spec(), status, 1, queued, T0 + timedelta(seconds=6)).status
    assert status.phase == "Pending"
    plan = reconcile(spec(suspend=True), status, 2, queued, T0 + timedelta(seconds=7))
    ended = plan.status.attempts[1]
    assert (ended.reason, ended.start_step, ended.end_step) == ("Suspended", 20, 20)
    assert plan.delete == [1]


def test_an_attempt_suspended_before_its_job_is_made_claims_no_steps() -> None:
    status, failed = _faulted()  # attempt 1's Job not made yet (a backoff, a reconcile that failed)
    plan = reconcile(spec(suspend=True), status, 2, {0: failed}, T0 + timedelta(seconds=6))
    ended = plan.status.attempts[1]
    assert (ended.reason, ended.start_step, ended.end_step) == ("Suspended", 20, 20)


def test_an_attempt_its_queue_never_admitted_ends_at_the_deadline_claiming_no_steps() -> None:
    status, failed = _faulted()
    status.attempts[1].job_uid = "u1"
    queued = {0: failed, 1: JobView(1, suspended=True, uid="u1")}
    plan = reconcile(spec(activeDeadlineSeconds=60), status, 2, queued, T0 + timedelta(seconds=61))
    ended = plan.status.attempts[1]
    assert (plan.status.phase, ended.reason, ended.start_step, ended.end_step) == ("Failed", "DeadlineExceeded", 20, 20)


def test_an_attempt_whose_pods_were_never_created_ends_where_it_began() -> None:
    """runPolicy.podCreationTimeoutSeconds fails the job for attempt 1's pods that were never made
    (a PodSecurity refusal after its fallback): attempt 1 trained nothing, so it claims no steps."""
    status, failed = _faulted()
    status.attempts[1].job_uid = "u1"
    refused = {0: failed, 1: JobView(1, uid="u1", create_error='pods "j-a1-0" is forbidden: hostPath')}
    timed = spec(podCreationTimeoutSeconds=60)
    status = reconcile(timed, status, 1, refused, T0 + timedelta(seconds=6)).status
    plan = reconcile(timed, status, 1, refused, T0 + timedelta(seconds=70))
    ended = plan.status.attempts[1]
    assert plan.status.phase == "Failed"
    assert (ended.start_step, ended.end_step) == (20, 20)
