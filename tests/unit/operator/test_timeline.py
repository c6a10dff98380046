"""The precision timeline: the trainer's keep rule, the report's bounded reader, the status fold."""

from __future__ import annotations

import pytest

from mpjob.planning import timeline
from mpjob.planning.observe import Reading, observe
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.environment import MAX_REPORT_BYTES
from mpjob_contract.report import CheckpointRef, TerminationReport
from mpjob_contract.timeline import (
    MAX_REPORT_SCALE_POINTS,
    MAX_SCALE_POINTS,
    LossScalePoint,
    PrecisionTimeline,
    ScaleHistory,
    readable_points,
)

pytestmark = pytest.mark.unit


def test_the_trainer_keeps_checkpoints_and_changes_of_two_octaves_or_more() -> None:
    history = ScaleHistory()
    history.seen(5, 65536.0)  # the first reading
    history.seen(10, 131072.0)  # one octave up: not news
    history.seen(15, 65536.0 * 4, checkpoint=True)  # a checkpoint: always kept
    history.seen(20, 65536.0)  # two octaves down from the last point kept
    history.seen(25, None)  # no scale (bf16): nothing
    history.seen(30, float("inf"))
    assert history.points == [(5, 65536.0), (15, 262144.0), (20, 65536.0)]


def test_the_trainer_keeps_the_first_and_the_newest_points() -> None:
    history = ScaleHistory(limit=4)
    for step in range(1, 11):
        history.seen(step, 2.0 ** (40 - 2 * step))
    assert [s for s, _ in history.points] == [1, 8, 9, 10]


def test_the_report_reader_drops_bad_pairs_and_bounds_the_rest() -> None:
    pairs = [[1, 2.0], [True, 2.0], [-1, 2.0], [2, "nan"], [3, -4.0], [4], "x", [5, 8]]
    assert readable_points(pairs) == [(1, 2.0), (5, 8.0)]
    assert readable_points({"not": "a list"}) == []
    many = [[i, 2.0] for i in range(500)]
    kept = readable_points(many)
    assert len(kept) == MAX_REPORT_SCALE_POINTS and kept[0] == (0, 2.0) and kept[-1] == (499, 2.0)
    report = TerminationReport.model_validate_json('{"reason": "NumericFault", "lossScales": [[1, 2], [2, null]]}')
    assert report.loss_scales == [(1, 2.0)]


def test_a_full_report_still_fits_the_termination_message() -> None:
    ref = CheckpointRef(step=10**9, path="/" + "p" * 900, sha256="a" * 64, precision="fp16")
    scales = [(10**9 + i, 65536.0 / 3**i) for i in range(MAX_REPORT_SCALE_POINTS)]
    report = TerminationReport(
        reason="NumericFault", step=10**9, last_good_checkpoint=ref, loss_scales=scales, message="m" * 5000
    )
    text = report.to_message()
    assert len(text.encode()) <= MAX_REPORT_BYTES
    back = TerminationReport.parse_message(text)
    assert back is not None and back.loss_scales and back.loss_scales[-1] == scales[-1]


def test_the_report_replaces_what_live_readings_saw_of_its_attempt() -> None:
    status = MixedPrecisionJobStatus(
        timeline=PrecisionTimeline(
            loss_scale=[
                LossScalePoint(step=10, scale=65536, attempt=0),
                LossScalePoint(step=12, scale=1024, attempt=1),
            ]
        )
    )
    timeline.reported(status, 1, [])  # a report with no history of its own: what was seen stays
    assert status.timeline is not None
    assert [(p.attempt, p.step) for p in status.timeline.loss_scale] == [(0, 10), (1, 12)]
    timeline.reported(status, 1, [(11, 65536.0), (14, 8.0)])
    assert [(p.attempt, p.step) for p in status.timeline.loss_scale] == [(0, 10), (1, 11), (1, 14)]


def test_status_keeps_at_most_its_bound_first_and_newest() -> None:
    status = MixedPrecisionJobStatus()
    for attempt in range(3):
        timeline.reported(status, attempt, [(i, 2.0 ** (i % 30)) for i in range(40)])
    assert status.timeline is not None
    points = status.timeline.loss_scale
    assert len(points) == MAX_SCALE_POINTS
    assert (points[0].attempt, points[0].step) == (0, 0) and (points[-1].attempt, points[-1].step) == (2, 39)


def test_a_live_reading_adds_a_point_when_the_scale_moved_two_octaves() -> None:
    status = MixedPrecisionJobStatus(phase="Running", attempts=[AttemptStatus(index=0, precision="fp16")])
    for step, scale in ((5, 65536.0), (10, 32768.0), (15, 4096.0), (15, 2.0), (20, 4096.0)):
        status = observe(status, Reading(attempt=0, step=step, loss_scale=scale)).status
    assert status.timeline is not None
    assert [(p.step, p.scale) for p in status.timeline.loss_scale] == [(5, 65536.0), (15, 4096.0)]


def test_a_bf16_reading_adds_no_loss_scale_point() -> None:
    status = MixedPrecisionJobStatus(phase="Running", attempts=[AttemptStatus(index=0, precision="bf16")])
    status = observe(status, Reading(attempt=0, step=5, loss_scale=65536.0)).status
    assert status.timeline is None
