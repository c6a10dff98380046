"""The trainer's event lines as one contract: written through the models, read by `mpjob run`."""

from __future__ import annotations

import io
import json

import pytest

from mpjob_contract import events
from mpjob_trainer.events import EventLog

pytestmark = pytest.mark.unit


def test_a_step_line_round_trips_with_non_finite_figures() -> None:
    out = io.StringIO()
    EventLog(0, out)("step", step=30, loss=float("nan"), lossScale=float("inf"), overflowSteps=4, precision="fp16")
    text = out.getvalue()
    assert text.startswith('{"event": "step"') and text.endswith("\n")
    assert json.loads(text)["loss"] == "nan"  # JSON has no NaN: the line stays valid JSON
    parsed = events.parse_line(text)
    assert isinstance(parsed, events.Step)
    assert parsed.step == 30 and parsed.overflow_steps == 4 and parsed.loss_scale == float("inf")
    assert parsed.loss is not None and parsed.loss != parsed.loss  # nan


def test_the_writer_refuses_an_unknown_event_or_field_naming_it() -> None:
    log = EventLog(0, io.StringIO())
    with pytest.raises(ValueError, match="unknown trainer event 'stepp'"):
        log("stepp", step=1)
    with pytest.raises(ValueError, match=r"event 'resume' has no field.*stp"):
        log("resume", stp=1, path="p", sha256="s", fromPrecision="fp16")
    with pytest.raises(ValueError, match="step"):
        log("preempted", step="soon")


def test_ranks_other_than_0_write_only_lines_for_all_ranks() -> None:
    out = io.StringIO()
    log = EventLog(2, out)
    log("step", step=1)
    log("error", kind="RuntimeError", message="boom", all_ranks=True)
    (line,) = out.getvalue().splitlines()
    parsed = events.parse_line(line)
    assert isinstance(parsed, events.Error) and parsed.rank == 2 and parsed.message == "boom"


def test_the_reader_ignores_what_it_does_not_know() -> None:
    newer = {"event": "checkpoint", "step": 10, "path": "/c", "sha256": "ab", "seconds": 1.0, "bytes": 5}
    parsed = events.parse_line(json.dumps({**newer, "async": False, "region": "eu"}))
    assert isinstance(parsed, events.Checkpoint) and parsed.asynchronous is False
    assert events.parse_line(json.dumps({"event": "somethingNew", "x": 1})) is None
    assert events.parse_line("plain log line") is None
    assert events.parse_line('{"event": "step"}') is None  # a step line without its step
    assert events.parse_line("[1, 2]") is None


def test_nested_models_are_the_report_s_own() -> None:
    line = json.dumps({"event": "precisionMeasured", "stepSeconds": {"bf16": 0.1, "fp32": None}, "chosen": "bf16"})
    parsed = events.parse_line(line)
    assert isinstance(parsed, events.PrecisionMeasured)
    assert parsed.step_seconds == {"bf16": 0.1, "fp32": None} and parsed.amp_slower_than_fp32 is False
    replay = events.parse_line(json.dumps({"event": "replay", "verdict": "data", "firstStep": 3, "samples": [1, 2]}))
    assert isinstance(replay, events.ReplayDone) and replay.samples == [1, 2]


def test_a_line_nested_deeper_than_the_parser_reads_is_no_event() -> None:
    """What a trainer's processes print is theirs: a JSON line nested past the interpreter's
    recursion limit is a plain line to the reader, never an exception out of it."""
    assert events.parse_line('{"event": "step", "step": ' + "[" * 100_000) is None
    assert events.parse_line('{"event": "step", "x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001) is None
