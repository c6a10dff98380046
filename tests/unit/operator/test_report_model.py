"""The termination report is validated at the boundary (mpjob_contract.report): what a tenant's
process writes there can name only known precisions and reasons and bounded numbers; anything
else is refused with the field named, never stored, planned with or used as a metric label."""

from __future__ import annotations

import json

import pytest

from mpjob_contract.codes import Reason
from mpjob_contract.report import (
    MAX_MESSAGE_CHARS,
    MAX_REPORT_INT,
    CheckpointRef,
    Counters,
    InvalidReport,
    Measurement,
    TerminationReport,
)

pytestmark = pytest.mark.unit


def report(**fields: object) -> str:
    return json.dumps({"reason": "Preempted", **fields})


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (report(precision="float16"), "precision"),
        (report(precision="auto"), "precision"),
        (report(step=int("9" * 3000)), "step"),
        (report(step=-1), "step"),
        (report(step=MAX_REPORT_INT + 1), "step"),
        (report(startStep=1.5), "startStep"),
        (report(reason="Exploded"), "reason"),
        (report(counters={"overflowSteps": 2**60}), "counters.overflowSteps"),
        ('{"reason": "Preempted", "counters": {"loss": NaN}}', "counters.loss"),
        ('{"reason": "Preempted", "counters": {"lossScale": Infinity}}', "counters.lossScale"),
        (report(lastGoodCheckpoint={"step": 1, "path": "/c", "sha256": "ab", "precision": "fp4"}), "precision"),
        (report(lastGoodCheckpoint={"step": 1, "path": "/c" * 600, "sha256": "ab", "precision": "fp16"}), "path"),
        (report(measurement={"chosen": "tf32", "stepSeconds": {}}), "measurement.chosen"),
        (report(measurement={"chosen": "fp16", "stepSeconds": {"int8": 0.1}}), "measurement.stepSeconds"),
        (report(replay={"verdict": "maybe", "firstStep": 1}), "replay.verdict"),
        ("[1, 2]", None),
    ],
)
def test_an_invalid_report_is_refused_naming_the_field(text: str, field: str | None) -> None:
    if not text.startswith("{"):
        assert TerminationReport.parse_message(text) is None  # not a report at all: a log tail
        return
    with pytest.raises(InvalidReport) as refused:
        TerminationReport.parse_message(text)
    said = str(refused.value)
    assert said.startswith("invalid termination report: ") and field in said
    assert len(said) < 600  # the offending input is shown short


def test_a_log_tail_of_json_lines_is_not_taken_for_a_report() -> None:
    tail = '{"event": "step", "step": 1}\n{"event": "step", "step": 2}'
    assert TerminationReport.parse_message(tail) is None
    assert TerminationReport.parse_message("Traceback (most recent call last):") is None


def test_a_valid_report_round_trips_within_the_budget() -> None:
    ref = CheckpointRef(step=20, path="/checkpoints/step-20", sha256="ab" * 32, precision="fp16")
    made = TerminationReport(
        reason=Reason.NUMERIC_FAULT,
        step=MAX_REPORT_INT,
        precision="bf16",
        last_good_checkpoint=ref,
        counters=Counters(overflow_steps=3, loss_scale=1.0, loss=2.5),
        measurement=Measurement(step_seconds={"bf16": 0.2, "fp32": None}, chosen="bf16"),
        message="x" * 10_000,
    )
    assert len(made.message) == MAX_MESSAGE_CHARS  # cut, not refused
    again = TerminationReport.parse_message(made.to_message())
    assert again is not None and again.step == MAX_REPORT_INT and again.precision == "bf16"
    assert again.last_good_checkpoint == ref


def test_an_empty_precision_means_not_known_yet() -> None:
    early = TerminationReport.parse_message(report(reason="ConfigError", precision=""))
    assert early is not None and early.precision is None
