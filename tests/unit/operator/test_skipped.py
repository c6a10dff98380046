"""status.skipped and the DataSkipped / LossSpike Events, from the trainer's report: the same
planning code for the operator and `mpjob run` (planning/lifecycle.conclude)."""

from __future__ import annotations

import pytest

from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.lifecycle import Plan, When, begin, conclude
from mpjob.planning.planner import first_attempt
from mpjob.planning.skipped import merged
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import TerminationReport
from mpjob_contract.skipping import MAX_SKIPPED_ENTRIES, SampleRange, Skipped, SkippedStep, ranges

pytestmark = pytest.mark.unit

SPEC = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, "training": {"steps": 100}})


def skipped(*steps: SkippedStep) -> Skipped:
    return Skipped(
        count=len(steps), samples=sum(s.samples[0].last - s.samples[0].first + 1 for s in steps), steps=steps
    )


def data(step: int, sample: int) -> SkippedStep:
    return SkippedStep(step=step, cause="data", samples=[SampleRange(first=sample, last=sample)])


def end(status: MixedPrecisionJobStatus, reason: Reason, record: Skipped | None) -> Plan:
    plan, when = Plan(status=status), When("2026-01-01T00:00:00Z")
    start = first_attempt(SPEC)
    if not status.attempts:
        begin(plan, SPEC, start, when, why="Created")
        plan = Plan(status=plan.status)
    report = TerminationReport(reason=reason, step=100, precision="fp16", skipped=record)
    conclude(
        plan, SPEC, attempt=start, outcome=AttemptOutcome(0 if reason == Reason.SUCCEEDED else 44, report), when=when
    )
    return plan


def test_a_skipped_step_lands_in_status_and_is_announced_once_naming_step_and_samples() -> None:
    plan = end(MixedPrecisionJobStatus(), Reason.SUCCEEDED, skipped(data(12, 30)))
    assert plan.status.phase == "Succeeded" and plan.status.skipped is not None
    assert plan.status.skipped.count == 1 and plan.status.skipped.steps[0].step == 12
    (event,) = [e for e in plan.events if e.reason == "DataSkipped"]
    assert event.type == "Warning" and "step 12 skipped: non-finite in fp32 too" in event.message
    assert event.message.endswith("samples 30")


def test_a_later_attempt_announces_only_the_steps_it_newly_skipped() -> None:
    first = end(MixedPrecisionJobStatus(), Reason.PREEMPTED, skipped(data(12, 30)))
    spike = SkippedStep(step=40, cause="spike", samples=[SampleRange(first=3, last=9)])
    second = end(first.status, Reason.SUCCEEDED, skipped(data(12, 30), spike))
    assert [e.reason for e in second.events if e.reason in ("DataSkipped", "LossSpike")] == ["LossSpike"]
    (announced,) = [e for e in second.events if e.reason == "LossSpike"]
    assert "step 40 skipped: finite loss spike" in announced.message and "samples 3-9" in announced.message
    assert second.status.skipped is not None and second.status.skipped.count == 2


def test_a_report_that_knows_less_does_not_shrink_the_record() -> None:
    more, less = skipped(data(1, 1), data(2, 2)), skipped(data(1, 1))
    assert merged(more, less) is more and merged(less, more) is more and merged(None, less) is less


def test_sample_ranges_are_merged_and_bounded() -> None:
    assert [(r.first, r.last) for r in ranges([9, 3, 4, 5, 7, 3])] == [(3, 5), (7, 7), (9, 9)]
    assert len(ranges(list(range(0, 200, 2)))) == MAX_SKIPPED_ENTRIES
