"""An attempt's Job deleted by hand while its pods ran: the operator creates it again in the same
attempt (uncharged), says so in a Warning Event, and the attempt keeps the start step it had (its
second Job's pods resume further on: their report's start is not where the attempt began)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mpjob.planning.observe import Reading, observe
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob.planning.status import ConditionReason
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator.test_cost import T0, job_spec, stamp

pytestmark = pytest.mark.unit

SPEC = job_spec(workers=1, training={"steps": 100, "batchSize": 4}, precision={"mode": "fp16"})


def _ran_to(step: int) -> MixedPrecisionJobStatus:
    """Attempt 0 running, its trainer read at `step` having begun at step 0."""
    status = reconcile(SPEC, MixedPrecisionJobStatus(), 1, {}, T0).status
    pods = (PodView("p0", 0, "Running", True, started_at=stamp(2)),)
    status = reconcile(SPEC, status, 1, {0: JobView(0, pods=pods)}, T0 + timedelta(seconds=5)).status
    return observe(status, Reading(attempt=0, step=step, start_step=0)).status


def test_a_running_attempt_s_job_deleted_is_created_again_with_a_warning_once() -> None:
    status = _ran_to(30)
    assert status.phase == "Running"
    plan = reconcile(SPEC, status, 1, {}, T0 + timedelta(seconds=20))
    assert [start.index for start in plan.create] == [0] and plan.status.phase == "Pending"
    (event,) = [e for e in plan.events if e.reason == ConditionReason.JOB_RECREATED]
    assert event.type == "Warning" and "attempt 0" in event.message
    assert len(plan.status.attempts) == 1 and plan.status.attempts[0].finish_time is None
    again = reconcile(SPEC, plan.status, 1, {}, T0 + timedelta(seconds=21))  # not seen yet: no second word
    assert [start.index for start in again.create] == [0] and not again.events


def test_a_job_created_but_not_seen_yet_is_created_again_without_a_word() -> None:
    status = reconcile(SPEC, MixedPrecisionJobStatus(), 1, {}, T0).status
    plan = reconcile(SPEC, status, 1, {}, T0 + timedelta(seconds=1))
    assert [start.index for start in plan.create] == [0] and not plan.events


def test_the_second_job_s_report_leaves_the_attempt_s_start() -> None:
    status = reconcile(SPEC, _ran_to(30), 1, {}, T0 + timedelta(seconds=20)).status  # its Job deleted
    ref = CheckpointRef(step=100, path="/c/step-100", sha256="ab", precision="fp16")
    report = TerminationReport(reason=Reason.SUCCEEDED, step=100, start_step=40, precision="fp16",
                               last_good_checkpoint=ref)  # fmt: skip
    pod = PodView("p1", 0, "Succeeded", False, 0, report.to_message(), started_at=stamp(30), finished_at=stamp(60))
    plan = reconcile(SPEC, status, 1, {0: JobView(0, "Complete", pods=(pod,))}, T0 + timedelta(seconds=70))
    (attempt,) = plan.status.attempts
    assert plan.status.phase == "Succeeded" and (attempt.start_step, attempt.end_step) == (0, 100)


def test_an_attempt_created_again_keeps_the_moment_its_recovery_began() -> None:
    spec = SPEC.model_copy(update={"precision": SPEC.precision.model_copy(update={"fallback": ["bf16"]})})
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    fault = TerminationReport(reason=Reason.NUMERIC_FAULT, step=30, precision="fp16", ended_at=1.0e9).to_message()
    pod = PodView("p0", 0, "Failed", False, 42, fault, started_at=stamp(2), finished_at=stamp(20))
    plan = reconcile(spec, status, 1, {0: JobView(0, "Failed", pods=(pod,))}, T0 + timedelta(seconds=21))
    assert [(start.index, start.recovering_since) for start in plan.create] == [(1, 1.0e9)]
    # The operator stopped before attempt 1's Job was made (or it was deleted): made again, the
    # trainer still counts its recoverySeconds from the fault.
    stored = MixedPrecisionJobStatus.model_validate(plan.status.model_dump(by_alias=True, mode="json"))
    again = reconcile(spec, stored, 1, {}, T0 + timedelta(seconds=40))
    assert [(start.index, start.recovering_since) for start in again.create] == [(1, 1.0e9)]
