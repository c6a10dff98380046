"""status.skipped and the DataSkipped / LossSpike Events, from the trainer's report and from
live readings: the same planning code for the operator and `mpjob run` (planning/skipped.record,
called by lifecycle.conclude and observe.observe)."""

from __future__ import annotations

import pytest

from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.lifecycle import Plan, When, begin, conclude
from mpjob.planning.observe import Observation, Reading, changes, observe
from mpjob.planning.plan import Event
from mpjob.planning.planner import first_attempt
from mpjob.planning.skipped import announcement, merged
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
        begin(plan, SPEC, start, when)
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
    assert event.type == "Warning" and "step 13 skipped: non-finite in fp32 too" in event.message
    assert event.message.endswith("samples 30")


def test_a_later_attempt_announces_only_the_steps_it_newly_skipped() -> None:
    first = end(MixedPrecisionJobStatus(), Reason.PREEMPTED, skipped(data(12, 30)))
    spike = SkippedStep(step=40, cause="spike", samples=[SampleRange(first=3, last=9)])
    second = end(first.status, Reason.SUCCEEDED, skipped(data(12, 30), spike))
    assert [e.reason for e in second.events if e.reason in ("DataSkipped", "LossSpike")] == ["LossSpike"]
    (announced,) = [e for e in second.events if e.reason == "LossSpike"]
    assert "step 41 skipped: finite loss spike" in announced.message and "samples 3-9" in announced.message
    assert second.status.skipped is not None and second.status.skipped.count == 2


def test_a_report_that_knows_less_does_not_shrink_the_record() -> None:
    more, less = skipped(data(1, 1), data(2, 2)), skipped(data(1, 1))
    assert merged(more, less) == more and merged(less, more) == more and merged(None, less) == less


def running() -> MixedPrecisionJobStatus:
    plan = Plan(status=MixedPrecisionJobStatus())
    begin(plan, SPEC, first_attempt(SPEC), When("2026-01-01T00:00:00Z"))
    return plan.status


def live(status: MixedPrecisionJobStatus, record: Skipped, *, attempt: int = 0) -> Observation:
    return observe(status, Reading(attempt=attempt, skipped=record))


def test_a_skip_seen_live_is_in_status_and_announced_once_and_the_report_does_not_announce_it_again() -> None:
    seen = live(running(), skipped(data(12, 30)))
    assert seen.status.skipped == skipped(data(12, 30)) and seen.status.attempts[-1].reason is None
    assert [announcement(s) for s in seen.skips] == [
        Event(
            "Warning",
            "DataSkipped",
            "step 13 skipped: non-finite in fp32 too (bad data); rolled back to the last good checkpoint; samples 30",
        )
    ]
    again = live(seen.status, skipped(data(12, 30)))  # the next read shows the same quarantine
    assert again.skips == () and changes(seen.status, again.status) == {}
    ended = end(seen.status, Reason.SUCCEEDED, skipped(data(12, 30)))
    assert [e.reason for e in ended.events if e.reason in ("DataSkipped", "LossSpike")] == []
    assert ended.status.skipped is not None and ended.status.skipped.count == 1  # counted once


def test_a_restarted_operator_reading_the_stored_status_announces_nothing_again() -> None:
    seen = live(running(), skipped(data(12, 30), data(20, 41)))
    stored = MixedPrecisionJobStatus.model_validate(seen.status.to_api())  # what the API server gives back
    assert live(stored, skipped(data(12, 30), data(20, 41))).skips == ()
    grown = live(stored, skipped(data(12, 30), data(20, 41), data(33, 7)))
    assert [s.step for s in grown.skips] == [33]


def test_a_reading_of_another_attempt_or_with_no_quarantine_claims_no_skip() -> None:
    status = running()
    assert live(status, skipped(data(12, 30)), attempt=1).status.skipped is None
    assert observe(status, Reading(attempt=0, step=5)).status.skipped is None


def test_the_listing_only_grows_so_a_step_once_listed_is_never_announced_twice() -> None:
    many = [data(step, step) for step in range(MAX_SKIPPED_ENTRIES)]
    first = live(running(), Skipped(count=MAX_SKIPPED_ENTRIES + 4, samples=20, steps=many))
    assert [s.step for s in first.skips] == list(range(MAX_SKIPPED_ENTRIES))
    assert first.status.skipped is not None and first.status.skipped.count == MAX_SKIPPED_ENTRIES + 4
    # A newer record lists another step first and leaves step 0 out: nothing listed moves or goes.
    shuffled = Skipped(count=MAX_SKIPPED_ENTRIES + 5, samples=21, steps=[data(100, 1), *reversed(many[1:])])
    again = live(first.status, shuffled)
    assert again.skips == ()  # step 100 is past the bound: counted, not listed or announced
    assert again.status.skipped is not None
    assert [s.step for s in again.status.skipped.steps] == list(range(MAX_SKIPPED_ENTRIES))
    assert (again.status.skipped.count, again.status.skipped.samples) == (MAX_SKIPPED_ENTRIES + 5, 21)


def test_counts_are_the_largest_seen_never_a_sum_and_never_below_the_listing() -> None:
    before = Skipped(count=3, samples=9, steps=[data(1, 1), data(2, 2)])
    now = Skipped(count=1, samples=2, steps=[data(5, 5)])  # a resumed attempt that knows less
    assert (merged(before, now).count, merged(before, now).samples) == (3, 9)
    assert merged(Skipped(count=0, samples=0), Skipped(count=0, samples=0, steps=[data(1, 1)])).count == 1


def test_the_newer_record_has_the_last_word_on_a_step_it_lists() -> None:
    wide = SkippedStep(step=12, cause="data", samples=[SampleRange(first=30, last=31)])
    status = live(running(), skipped(data(12, 30))).status
    ended = end(status, Reason.SUCCEEDED, Skipped(count=1, samples=1, steps=[wide]))
    assert ended.status.skipped is not None and ended.status.skipped.steps == [wide]


def test_sample_ranges_are_merged_and_bounded() -> None:
    assert [(r.first, r.last) for r in ranges([9, 3, 4, 5, 7, 3])] == [(3, 5), (7, 7), (9, 9)]
    assert len(ranges(list(range(0, 200, 2)))) == MAX_SKIPPED_ENTRIES
