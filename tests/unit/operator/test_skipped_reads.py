"""status.skipped while the attempt runs: the trainer's quarantine as its metrics endpoint shows
it (mpjob_trainer.metrics), read back by the operator (controller/progress.py). An endpoint is
the pod's: a series the trainer could not have written is no reading."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from mpjob.controller.exposition import parse
from mpjob.controller.progress import figures, quarantine
from mpjob_contract import metrics as tm
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.skipping import MAX_SKIPPED_ENTRIES, SampleRange, Skipped, SkippedStep, spans_label, spans_of
from mpjob_trainer.metrics import TrainerMetrics
from tests.unit.operator.live_reads import progress_patch

pytestmark = pytest.mark.unit

LABELS = 'job="j",namespace="ns",attempt="0",precision="fp16"'
RECORD = Skipped(
    count=2,
    samples=5,
    steps=[
        SkippedStep(step=12, cause="data", samples=[SampleRange(first=30, last=30)]),
        SkippedStep(step=40, cause="spike", samples=[SampleRange(first=3, last=5), SampleRange(first=9, last=9)]),
    ],
)


def exposed(record: Skipped, *, relabel: str | None = None) -> str:
    metrics = TrainerMetrics("j", "ns", 0, "fp16")
    metrics.quarantined(record)
    if relabel is not None:
        metrics.relabel(relabel)
    return generate_latest(metrics.registry).decode()


def listed(step: str, cause: str, samples: str, place: int) -> str:
    return f'{tm.QUARANTINED_STEP}{{{LABELS},step="{step}",cause="{cause}",samples="{samples}"}} {place}\n'


def test_the_trainers_quarantine_reads_back_as_the_record_it_showed() -> None:
    assert quarantine(parse(exposed(RECORD))) == RECORD


def test_an_auto_attempt_relabelled_after_a_resume_still_shows_its_quarantine_once() -> None:
    text = exposed(RECORD, relabel="bf16")
    assert quarantine(parse(text)) == RECORD
    assert 'precision="fp16"' not in text.split(tm.QUARANTINED_STEP, 1)[1]  # the old label's series went


def test_a_trainer_with_nothing_skipped_shows_no_record() -> None:
    assert quarantine(parse(exposed(Skipped()))) is None
    assert "skipped" not in figures(parse(exposed(Skipped())), precision="fp16")


def test_the_listing_keeps_the_trainers_order_not_the_expositions() -> None:
    text = listed("40", "spike", "3-5,9", 2) + listed("12", "data", "30", 1) + f"{tm.QUARANTINE_STEPS} 2\n"
    record = quarantine(parse(text))
    assert record is not None and [s.step for s in record.steps] == [12, 40]


@pytest.mark.parametrize(
    "series",
    [
        listed("-1", "data", "30", 1),
        listed("1e3", "data", "30", 1),
        listed("1234567890123456", "data", "30", 1),  # beyond what a status holds exactly
        listed("12", "poison", "30", 1),
        listed("12", "data", "31-30", 1),
        listed("12", "data", "30,,31", 1),
        listed("12", "data", "x", 1),
        listed("12", "data", ",".join(str(i) for i in range(0, 2 * MAX_SKIPPED_ENTRIES + 2, 2)), 1),
        listed("12", "data", "1" * 600, 1),
    ],
    ids=["negative", "float", "huge", "cause", "backwards", "empty-range", "word", "too-many", "too-long"],
)
def test_a_series_the_trainer_could_not_have_written_is_no_reading(series: str) -> None:
    assert quarantine(parse(series + listed("7", "data", "1", 2))) == Skipped(
        count=1, samples=0, steps=[SkippedStep(step=7, cause="data", samples=[SampleRange(first=1, last=1)])]
    )


def test_a_count_below_the_listing_is_raised_to_it_and_a_negative_one_is_no_claim() -> None:
    text = listed("12", "data", "30", 1) + listed("40", "spike", "", 2) + f"{tm.QUARANTINE_STEPS} 1\n"
    record = quarantine(parse(text))
    assert record is not None and record.count == 2 and record.steps[1].samples == []
    negative = f"{tm.QUARANTINE_STEPS} -3\n{tm.QUARANTINE_SAMPLES} -7\n"
    assert quarantine(parse(negative)) is None
    one = quarantine(parse(negative + listed("12", "data", "30", 1)))
    assert one is not None and (one.count, one.samples) == (1, 0)


def test_a_flood_of_series_lists_at_most_the_bound() -> None:
    text = "".join(listed(str(step), "data", str(step), step) for step in range(5000))
    record = quarantine(parse(text))
    assert record is not None and [s.step for s in record.steps] == list(range(MAX_SKIPPED_ENTRIES))


def test_ranges_round_trip_through_a_label() -> None:
    spans = [SampleRange(first=3, last=5), SampleRange(first=9, last=9)]
    assert spans_label(spans) == "3-5,9" and spans_of("3-5,9") == spans and spans_of("") == []


def test_a_read_writes_status_skipped_while_the_attempt_runs() -> None:
    status = MixedPrecisionJobStatus(phase="Running", attempt=0, attempts=[AttemptStatus(index=0, precision="fp16")])
    found = figures(parse(exposed(RECORD)), precision="fp16")
    assert progress_patch(status, found) == {"skipped": RECORD.model_dump(by_alias=True)}


def test_a_label_naming_samples_past_what_a_status_holds_is_not_read() -> None:
    most = 2**53 - 1
    assert spans_of(f"3,{most}") == [SampleRange(first=3, last=3), SampleRange(first=most, last=most)]
    assert spans_of("3,9999999999999999") is None
    assert spans_of("9-9999999999999999") is None
