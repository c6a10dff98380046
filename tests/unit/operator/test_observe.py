"""One rule for live progress: what a reading changes in the status, whether it came from the
operator's read of rank 0's metrics or from `mpjob run`'s trainer event lines."""

from __future__ import annotations

import pytest

from mpjob.controller.exposition import parse
from mpjob.controller.progress import figures, found_reading
from mpjob.localrun.readings import reading_of
from mpjob.planning.observe import CheckpointReading, Reading, changes, observe
from mpjob.planning.phases import amp_slower
from mpjob.planning.plan import Plan, When
from mpjob_contract import events
from mpjob_contract import metrics as tm
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.report import Measurement

pytestmark = pytest.mark.unit


def running(precision: str = "fp16", start: int = 0, **fields: object) -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus.model_validate(
        {"phase": "Running", "precision": precision, "attempt": 1, "step": 40, **fields}
        | {"attempts": [{"index": 0, "precision": "fp16"}, {"index": 1, "precision": precision, "startStep": start}]}
    )


def test_figures_are_rounded_and_the_status_given_is_left_as_it_is() -> None:
    status = running()
    seen = observe(status, Reading(step=50, loss=4.171467304229736, loss_scale=131072.0, samples_per_second=12.345678))
    assert (seen.status.step, seen.status.loss, seen.status.loss_scale) == (50, 4.1715, 131072.0)
    assert seen.status.samples_per_second == 12.346 and status.step == 40 and status.loss is None


def test_another_attempts_reading_changes_nothing() -> None:
    assert changes(running(), observe(running(), Reading(attempt=0, step=90, loss=1.0)).status) == {}
    assert changes(running(), observe(running(), Reading(attempt=1, step=90)).status) == {"step": 90}


@pytest.mark.parametrize(
    "reading",
    [
        Reading(step=20, start_step=20, loss=2.0),  # not past where the attempt began
        Reading(step=30, start_step=-1, loss=2.0),  # the trainer has not decided where it starts
        Reading(step=-1),
    ],
    ids=["before-start", "undecided", "negative"],
)
def test_no_progress_is_claimed_before_the_attempts_first_logged_step(reading: Reading) -> None:
    seen = observe(running(start=20), reading).status
    assert seen.step == 40 and seen.loss is None


def test_placeholders_and_a_scale_outside_fp16_are_no_readings() -> None:
    bf16 = observe(running("bf16"), Reading(step=50, loss_scale=1024.0, samples_per_second=0.0, loss=-1.0)).status
    assert (bf16.step, bf16.loss_scale, bf16.samples_per_second, bf16.loss) == (50, None, None, None)


def test_the_trainers_start_step_corrects_the_plan_with_news() -> None:
    seen = observe(running(start=20), Reading(start_step=10))
    assert seen.status.attempts[-1].start_step == 10 and seen.status.step == 40
    news = seen.news
    assert news is not None and news.reason == "Resumed" and "planned: checkpoint step 20" in news.message
    assert observe(running(start=20), Reading(start_step=20)).news is None


def test_an_auto_attempt_takes_the_precision_it_measured_once() -> None:
    seen = observe(running("auto"), Reading(measured_precision="bf16", measured_step_seconds={"bf16": 0.1}))
    assert seen.status.precision == "bf16" and seen.status.attempts[-1].precision == "bf16"
    again = observe(seen.status, Reading(measured_precision="fp32", measured_step_seconds={"fp32": 0.2})).status
    assert again.precision == "bf16"


def slower(status: MixedPrecisionJobStatus) -> list[tuple[str, str]]:
    return [(c.status, c.reason) for c in status.conditions if c.type == "AmpSlowerThanFp32"]


def test_an_auto_attempt_that_measured_amp_slower_carries_the_condition_while_it_trains() -> None:
    measured = Reading(measured_precision="fp32", measured_step_seconds={"bf16": 0.3, "fp32": 0.1})
    seen = observe(running("auto"), measured)
    assert slower(seen.status) == [("True", "Measured")] and seen.status.precision == "fp32"
    (told,) = seen.told()
    assert (told.type, told.reason) == ("Warning", "AmpSlowerThanFp32") and "bf16 300.0 ms" in told.message
    assert seen.lines() == [f"warning: {told.message}"]  # what `mpjob run` prints
    again = observe(seen.status, measured)  # the next read of the same attempt: nothing new to tell
    assert again.told() == [] and slower(again.status) == [("True", "Measured")]
    ended = Plan(status=again.status)  # the attempt's report carries the same measurement
    amp_slower(ended, Measurement(stepSeconds={"bf16": 0.3, "fp32": 0.1}, chosen="fp32"), When("2026-01-01T00:00:00Z"))
    assert ended.events == [] and slower(ended.status) == [("True", "Measured")]
    unread = Plan(status=running("auto"))  # no read caught it: the report tells it
    amp_slower(unread, Measurement(stepSeconds={"bf16": 0.3, "fp32": 0.1}, chosen="fp32"), When("2026-01-01T00:00:00Z"))
    assert [e.message for e in unread.events] == [told.message] and slower(unread.status) == [("True", "Measured")]


@pytest.mark.parametrize(
    ("chosen", "seconds"),
    [("bf16", {"bf16": 0.1, "fp32": 0.3}), ("fp32", {"bf16": None, "fp32": 0.3})],
    ids=["amp-faster", "amp-non-finite"],
)
def test_a_measurement_where_amp_was_not_slower_carries_no_condition(chosen: str, seconds: dict) -> None:
    seen = observe(running("auto"), Reading(measured_precision=chosen, measured_step_seconds=seconds))
    assert slower(seen.status) == [] and seen.told() == [] and seen.status.precision == chosen


def test_the_last_checkpoint_only_moves_forward_or_gains_its_sha256() -> None:
    held = running(lastCheckpoint={"step": 200, "precision": "fp16", "sha256": "", "path": ""})
    named = observe(held, Reading(checkpoint=CheckpointReading(200, "a" * 64, "fp16"))).status
    assert named.last_checkpoint is not None and named.last_checkpoint.sha256 == "a" * 64
    assert changes(named, observe(named, Reading(checkpoint=CheckpointReading(200, "b" * 64))).status) == {}
    assert changes(named, observe(named, Reading(checkpoint=CheckpointReading(100))).status) == {}
    later = observe(named, Reading(checkpoint=CheckpointReading(400))).status.last_checkpoint
    assert later is not None and (later.step, later.precision, later.sha256) == (400, "fp16", "")


def test_a_scrape_and_an_event_line_of_the_same_progress_change_the_status_alike() -> None:
    text = f"{tm.STEP} 50\n{tm.START_STEP} 0\n{tm.LOSS} 2.123456\n{tm.LOSS_SCALE} 1024\n{tm.OVERFLOW_STEPS}_total 3\n"
    scraped = found_reading(figures(parse(text), precision="fp16"), attempt=1)
    line = events.parse_line('{"event": "step", "step": 50, "loss": 2.123456, "lossScale": 1024, "overflowSteps": 3}')
    assert line is not None
    logged = reading_of(1, line)
    assert logged is not None
    assert observe(running(), scraped).status == observe(running(), logged).status


def test_a_flapping_start_step_is_taken_once_per_attempt() -> None:
    status, news, writes = running(start=20), [], 0
    for start in (10, 20, 10, 0, 20, 10):
        seen = observe(status, Reading(start_step=start))
        writes += "attempts" in changes(status, seen.status)
        news += [seen.news] if seen.news is not None else []
        status = seen.status
    assert len(news) == 1 and news[0].reason == "Resumed" and writes == 1
    assert status.attempts[-1].start_step == 10 and status.attempts[-1].start_step_reported
    assert status.to_api()["attempts"][-1]["startStepReported"] is True


def test_the_progress_time_is_the_first_sighting_and_each_move_of_the_step_after() -> None:
    """runPolicy.progressDeadlineSeconds counts from attempts[-1].progressTime: a reading's time
    when it first showed the attempt (its start-up counts: a placeholder step is a sighting),
    then each time its step moved. It lives in the status, so an operator that restarts goes on
    counting from it; a reading of another attempt, or one given no time, leaves it."""
    first = observe(running(start=20), Reading(step=20, start_step=20), at="2026-12-01T10:00:00Z").status
    assert (first.attempts[-1].progress_time, first.step) == ("2026-12-01T10:00:00Z", 40)  # a placeholder
    same = observe(first, Reading(step=20, start_step=20), at="2026-12-01T10:00:30Z").status
    assert same.attempts[-1].progress_time == "2026-12-01T10:00:00Z"
    moved = observe(same, Reading(step=41), at="2026-12-01T10:01:00Z").status
    assert moved.attempts[-1].progress_time == "2026-12-01T10:01:00Z"
    still = observe(moved, Reading(step=41), at="2026-12-01T10:02:00Z").status
    assert still.attempts[-1].progress_time == "2026-12-01T10:01:00Z"
    other = observe(still, Reading(attempt=0, step=90), at="2026-12-01T10:03:00Z").status
    untimed = observe(still, Reading(step=42)).status
    assert other.attempts[-1].progress_time == untimed.attempts[-1].progress_time == "2026-12-01T10:01:00Z"
