"""A finished job keeps its last figures: `kubectl get mpj` of a job that ended shows the LOSS
(and, when it ended in fp16, the SCALE) it last saw, also when its last attempt logged none
(it resumed at the final checkpoint, or failed before its first real reading)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning.observe import Reading, observe
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, Counters, TerminationReport
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def spec(mode: str, fallback: list[str]) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "gpt"},
            "training": {"steps": 60},
            "precision": {"mode": mode, "fallback": fallback},
            "checkpoint": CLAIM,
        }
    )


def ended(index: int, code: int, report: TerminationReport | None) -> dict[int, JobView]:
    message = report.to_message() if report else None
    pod = PodView(f"p{index}", index, "Succeeded" if code == 0 else "Failed", False, code, message)
    return {index: JobView(index, "Complete" if code == 0 else "Failed", pods=(pod,))}


def running(status: MixedPrecisionJobStatus, *, step: int, loss: float, scale: float | None) -> MixedPrecisionJobStatus:
    """The attempt's live reading at `step` (the operator's scrape)."""
    current = status.attempts[-1].index
    return observe(status, Reading(attempt=current, step=step, loss=loss, loss_scale=scale)).status


def test_a_job_whose_last_attempt_logged_nothing_keeps_the_loss_and_scale_it_last_saw() -> None:
    s = spec("fp16", ["bf16"])
    status = running(reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status, step=60, loss=2.5, scale=1024.0)
    final = CheckpointRef(step=60, path="/checkpoints/step-60", sha256="ab", precision="fp16")
    crash = TerminationReport(reason=Reason.INFRA_ERROR, step=60, precision="fp16", last_good_checkpoint=final)
    status = reconcile(s, status, 1, ended(0, 1, crash), T0 + timedelta(seconds=10)).status
    assert status.attempts[-1].start_step == 60 and status.loss is None  # a new attempt: its own figures
    # It resumes at the final checkpoint and ends at once: no interval, no loss in its report.
    done = TerminationReport(reason=Reason.SUCCEEDED, step=60, start_step=60, precision="fp16")
    status = reconcile(s, status, 1, ended(1, 0, done), T0 + timedelta(seconds=20)).status
    assert status.phase == "Succeeded" and (status.loss, status.loss_scale) == (2.5, 1024.0)
    assert {"loss": 2.5, "lossScale": 1024.0}.items() <= status.to_api().items()  # the LOSS and SCALE columns


def test_a_job_that_fails_for_good_keeps_its_last_loss_and_has_no_scale_in_bf16() -> None:
    s = spec("fp16", ["bf16"])
    status = running(reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status, step=25, loss=3.25, scale=512.0)
    ckpt = CheckpointRef(step=20, path="/checkpoints/step-20", sha256="ab", precision="fp16")
    counters = Counters(nonFiniteLosses=4, lossScale=256.0)  # its loss went non-finite: the report has none
    fault = TerminationReport(reason=Reason.NUMERIC_FAULT, step=30, precision="fp16", last_good_checkpoint=ckpt)
    fault = fault.model_copy(update={"counters": counters})
    status = reconcile(s, status, 1, ended(0, 42, fault), T0 + timedelta(seconds=10)).status
    # The bf16 attempt faults too before its first real reading: no precision is left.
    last = TerminationReport(reason=Reason.NUMERIC_FAULT, step=21, precision="bf16")
    status = reconcile(s, status, 1, ended(1, 42, last), T0 + timedelta(seconds=20)).status
    assert status.phase == "Failed" and status.loss == 3.25 and status.loss_scale is None  # bf16 has no scale
    assert [(a.loss, a.loss_scale) for a in status.attempts] == [(3.25, 256.0), (None, None)]
