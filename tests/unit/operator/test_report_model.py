"""The termination report is validated at the boundary (mpjob_contract.report): what a tenant's
process writes there can name only known precisions and reasons and bounded numbers; anything
else is refused with the field named, never stored, planned with or used as a metric label."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob.summary import summary_lines
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import TRAINER_REASONS, Reason
from mpjob_contract.report import (
    MAX_MESSAGE_CHARS,
    MAX_REPORT_INT,
    CheckpointRef,
    Counters,
    InvalidReport,
    Measurement,
    TerminationReport,
)
from mpjob_contract.tracking import ProfileAnswer

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


#: A skipped step as a report lists it.
SPIKE = {"step": 1, "cause": "spike"}


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
        *((report(reason=reason.value), "reason") for reason in Reason if reason not in TRAINER_REASONS),
        (report(counters={"overflowSteps": 2**60}), "counters.overflowSteps"),
        ('{"reason": "Preempted", "counters": {"loss": NaN}}', "counters.loss"),
        ('{"reason": "Preempted", "counters": {"lossScale": Infinity}}', "counters.lossScale"),
        (report(lastGoodCheckpoint={"step": 1, "path": "/c", "sha256": "ab", "precision": "fp4"}), "precision"),
        (report(lastGoodCheckpoint={"step": 1, "path": "/c" * 600, "sha256": "ab", "precision": "fp16"}), "path"),
        (report(lastGoodCheckpoint={"step": 1, "path": "/c\x1b[2J", "sha256": "ab", "precision": "fp16"}), "path"),
        (report(lastGoodCheckpoint={"step": 1, "path": "/c", "sha256": "\x1b]0;x\x07", "precision": "fp16"}), "sha256"),
        (report(measurement={"chosen": "tf32", "stepSeconds": {}}), "measurement.chosen"),
        (report(measurement={"chosen": "fp16", "stepSeconds": {"int8": 0.1}}), "measurement.stepSeconds"),
        (report(replay={"verdict": "maybe", "firstStep": 1}), "replay.verdict"),
        # The quarantine's figures go to status.skipped, whose patch the API server refuses past 2^53.
        (report(skipped={"count": 2**60}), "skipped.count"),
        (report(skipped={"count": 1, "samples": MAX_REPORT_INT + 1}), "skipped.samples"),
        (report(skipped={"count": 1, "steps": [{"step": 10**30, "cause": "data"}]}), "skipped.steps.0.step"),
        (report(skipped={"count": 1, "steps": [SPIKE | {"samples": [{"first": 0, "last": 2**64}]}]}), "samples.0.last"),
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


#: What a hostile trainer writes to take over the terminal of whoever reads its job's status: a
#: colour, a cleared screen, a cursor moved up over the lines before, a title and a hyperlink
#: (OSC), a carriage return that writes over the line, a bell, a C1 control (CSI as one byte).
ESCAPES = "\x1b[31mred\x1b[0m \x1b[2J\x1b[1A\x1b]0;pwned\x07\x1b]8;;http://evil\x1b\\link\rover\x07 \x9b31m"


def _controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]


def test_a_reports_messages_reach_no_terminal_with_control_characters() -> None:
    """A report's messages end up in the status, its Events and `mpjob status`, which other users
    read in their terminals: colour codes go, any other control character is shown as U+FFFD, and
    a traceback keeps its lines."""
    change = {"attempt": 1, "step": 5, "startStep": 0, "fromPrecision": "fp16", "toPrecision": "bf16",
              "rule": "MaxNonFiniteLosses", "message": ESCAPES, "recoverySeconds": 0.1}  # fmt: skip
    text = report(message=f"Traceback:\n\tline 1\r\n{ESCAPES}", precisionChanges=[change])
    read = TerminationReport.parse_message(text)
    assert read is not None
    assert _controls(read.message) == [] and _controls(read.precision_changes[0].message) == []
    assert read.message.startswith("Traceback:\n\tline 1\nred ")
    profile = ProfileAnswer.model_validate({"id": 1, "state": "Failed", "message": ESCAPES})
    assert profile.message is not None and _controls(profile.message) == []


def test_a_log_tail_in_place_of_a_report_reaches_the_status_without_control_characters() -> None:
    """A pod that wrote no report leaves its log's tail as its termination message (the pod's
    FallbackToLogsOnError), the tenant's word as much as a report: the attempt's message and
    `mpjob status` get it without terminal control."""
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, "precision": {"mode": "fp32"}})
    began = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, NOW).status
    tail = f"Traceback (most recent call last):\n  boom\n{ESCAPES}"
    pod = PodView("p0", 0, "Failed", alive=False, exit_code=1, termination_message=tail,
                  started_at=NOW.isoformat(), finished_at=NOW.isoformat())  # fmt: skip
    ended = reconcile(spec, began, 1, {0: JobView(0, finished="Failed", pods=(pod,))}, NOW).status
    first = ended.attempts[0]
    assert "boom" in first.message and _controls(first.message) == []
    assert _controls("\n".join(summary_lines("j", ended))) == []


@pytest.mark.parametrize("said", ["DeadlineExceeded", "OOMKilled", "ImagePullError"])
def test_a_report_claiming_the_clusters_word_is_a_crash_retried_not_the_end_of_the_job(said: str) -> None:
    """The operator took a report's reason as given: a tenant's process that wrote
    `{"reason": "DeadlineExceeded"}` and exited 1 failed the job as if its deadline had passed."""
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, "precision": {"mode": "fp32"}})
    began = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, NOW).status
    pod = PodView("p0", 0, "Failed", alive=False, exit_code=1, termination_message=report(reason=said, step=5))
    ended = reconcile(spec, began, 1, {0: JobView(0, finished="Failed", pods=(pod,))}, NOW).status
    first = ended.attempts[0]
    assert (first.reason, ended.phase) == ("InfraError", "Pending"), ended
    assert f"{said} is the cluster's to say" in first.message and len(ended.attempts) == 2
