"""A step a trainer names (its termination report, its metrics endpoint, its event lines) is the
tenant's word: the status holds each one to [0, training.steps], so a report of step 2^53 - 1
can inflate neither an attempt's endStep nor its samples nor the steps it wasted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mpjob.planning.observe import CheckpointReading, Reading, observe
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import MAX_REPORT_INT, CheckpointRef, TerminationReport
from tests.unit.operator.live_reads import progress_patch
from tests.unit.operator.test_cost import T0, job_spec, stamp

pytestmark = pytest.mark.unit

STEPS = 100
HUGE = MAX_REPORT_INT


def _report(step: int, checkpoint: int, start: int | None = None) -> str:
    ref = CheckpointRef(step=checkpoint, path=f"/c/step-{checkpoint}", sha256="ab", precision="fp16")
    report = TerminationReport(
        reason=Reason.NUMERIC_FAULT, step=step, start_step=start, precision="fp16", last_good_checkpoint=ref
    )
    return report.to_message()


def _after_fault(message: str) -> MixedPrecisionJobStatus:
    spec = job_spec(workers=1, training={"steps": STEPS, "batchSize": 4}, precision={"mode": "fp16"})
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    pod = PodView("p0", 0, "Failed", False, 42, message, started_at=stamp(2), finished_at=stamp(32))
    return reconcile(spec, status, 1, {0: JobView(0, "Failed", pods=(pod,))}, T0 + timedelta(seconds=40)).status


def test_a_reported_step_past_the_end_ends_the_attempt_at_the_last_step() -> None:
    status = _after_fault(_report(HUGE, 20))
    first = status.attempts[0]
    assert (first.end_step, status.step) == (STEPS, STEPS)
    assert first.samples == STEPS * 4 * 2  # steps x batch x (1 worker x 2 GPUs)
    assert first.wasted_steps == STEPS - 20 and status.cost is not None and status.cost.wasted_steps == STEPS - 20


def test_a_reported_checkpoint_and_start_past_the_end_are_held_to_it() -> None:
    status = _after_fault(_report(HUGE, HUGE, start=HUGE))
    first = status.attempts[0]
    assert first.start_step == STEPS and first.end_step == STEPS
    assert status.last_checkpoint is not None and status.last_checkpoint.step == STEPS
    assert status.attempts[1].start_step == STEPS and first.wasted_steps == 0


def _running() -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus.model_validate(
        {"phase": "Running", "precision": "fp16", "attempt": 0, "step": 10, "totalSteps": STEPS}
        | {"attempts": [{"index": 0, "precision": "fp16", "startStep": 0}]}
    )


def test_a_live_reading_past_the_end_is_held_to_it() -> None:
    reading = Reading(attempt=0, step=HUGE, start_step=HUGE - 1, checkpoint=CheckpointReading(HUGE, "a" * 64))
    status = observe(_running(), reading).status
    assert status.step == STEPS and status.attempts[0].start_step == STEPS
    assert status.last_checkpoint is not None and status.last_checkpoint.step == STEPS
    assert progress_patch(_running(), {"step": HUGE}) == {"step": STEPS}
    assert progress_patch(_running(), {"step": STEPS - 1}) == {"step": STEPS - 1}


def test_steps_lowered_while_an_attempt_runs_leave_its_steps_and_checkpoints_as_it_names_them() -> None:
    """The running attempt trains to the training.steps it was launched with: an edit that lowers
    them reaches the next attempt only, so the steps the running one names past the new end are
    its own, not a tenant's inflation (they once read as the new end: a checkpoint of step 90
    recorded as step 20 with step 90's digest, and a step that stood still)."""
    spec = job_spec(workers=1, training={"steps": STEPS, "batchSize": 4}, precision={"mode": "fp16"})
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    lowered = spec.model_copy(update={"training": spec.training.model_copy(update={"steps": 20})})
    status = observe(status, Reading(attempt=0, step=80, checkpoint=CheckpointReading(80, "a" * 64))).status
    running = JobView(0, pods=(PodView("p0", 0, "Running", True, started_at=stamp(2)),))
    status = reconcile(lowered, status, 2, {0: running}, T0 + timedelta(seconds=30)).status
    assert status.step == 80 and progress_patch(status, {"step": 85}) == {"step": 85}
    pod = PodView("p0", 0, "Failed", False, 42, _report(90, 80), started_at=stamp(2), finished_at=stamp(32))
    status = reconcile(lowered, status, 2, {0: JobView(0, "Failed", pods=(pod,))}, T0 + timedelta(seconds=40)).status
    first = status.attempts[0]
    assert (first.end_step, status.step) == (90, 90)
    assert status.last_checkpoint is not None and status.last_checkpoint.step == 80
    assert status.attempts[1].start_step == 80
