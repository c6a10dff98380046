"""A termination report that carries no progress (the launcher's, for ranks that died before
they resumed: step 0, no start step) leaves the job's step where it stood; it reset it to 0,
and `mpjob run` said 'Failed in bf16 at step 0' of a job with a checkpoint at step 20."""

from __future__ import annotations

import pytest

from mpjob.planning.lifecycle import record_report
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import TerminationReport

pytestmark = pytest.mark.unit


def status_at(step: int) -> MixedPrecisionJobStatus:
    attempt = AttemptStatus(index=2, precision="bf16", start_step=step)
    return MixedPrecisionJobStatus(attempts=[attempt], step=step, total_steps=200)


def test_a_report_without_progress_leaves_the_jobs_step_where_the_attempt_began() -> None:
    status = status_at(20)
    died = TerminationReport(reason=Reason.INFRA_ERROR, message="rank 0: EndpointConnectionError")
    end = record_report(status, 2, died)
    assert status.step == 20
    assert end == 0  # the attempt's endStep stays 'unknown' (below its start: planning.repeat)


@pytest.mark.parametrize(
    ("step", "start", "job_step"),
    [(30, None, 30), (0, 0, 0), (12, 8, 12)],  # progress; a fresh start at 0; one that resumed earlier
)
def test_a_report_that_says_where_it_began_or_got_sets_the_jobs_step(
    step: int, start: int | None, job_step: int
) -> None:
    status = status_at(20)
    record_report(status, 2, TerminationReport(reason=Reason.INFRA_ERROR, step=step, start_step=start))
    assert status.step == job_step


def test_a_report_without_progress_leaves_the_live_counts_as_read() -> None:
    """Its counters are the launcher's zeros, not the trainer's: the overflow count, loss and
    scale a live read took stay (a count of 0 would say the attempt never overflowed)."""
    status = status_at(20)
    status.overflow_steps, status.loss, status.loss_scale = 7, 2.5, 1024.0
    died = TerminationReport(reason=Reason.INFRA_ERROR, message="rank 0: killed", precision="fp16")
    record_report(status, 2, died)
    assert (status.overflow_steps, status.loss, status.loss_scale) == (7, 2.5, 1024.0)


@pytest.mark.parametrize(("index", "began"), [(0, 0), (2, 20)], ids=["first-attempt", "resumed"])
def test_a_report_without_progress_ends_the_attempt_where_a_live_reading_last_saw_it(index: int, began: int) -> None:
    """Its ranks trained (a reading saw step 27), then were killed before any wrote a report: the
    launcher's zeros neither reset the job's step nor make the attempt end where it began. A
    first attempt's report at step 0 read as progress and set both to 0 (an elastic run
    shrunk at step 20 said its first attempt ended at step 0)."""
    attempt = AttemptStatus(index=index, precision="fp16", start_step=began, progress_time="2026-12-03T09:00:00Z")
    status = MixedPrecisionJobStatus(attempts=[attempt], step=27, total_steps=200)
    killed = TerminationReport(reason=Reason.INFRA_ERROR, message="rank 1: killed by signal 9", precision="fp16")
    assert record_report(status, index, killed) == 27
    assert status.step == 27


def test_a_first_attempt_no_reading_saw_ends_where_it_began() -> None:
    """Without a reading the launcher's report is all there is: step 0, where it began (two such
    attempts fail the job FailedBeforeFirstStep, planning.repeat)."""
    status = MixedPrecisionJobStatus(attempts=[AttemptStatus(index=0, precision="fp16")], total_steps=200)
    died = TerminationReport(reason=Reason.INFRA_ERROR, message="rank 0: ImportError: no module named 'train'")
    assert record_report(status, 0, died) == 0 and status.step == 0
