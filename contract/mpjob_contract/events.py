"""The trainer's JSON event lines: one model per event, written by the trainer and read by
`mpjob run`.

The trainer (the builtin loop and every script on the SDK) writes one object per line on
stdout, flushed, with an "event" key, a "time" (Unix seconds) and, on ranks other than 0, a
"rank". Only rank 0 writes step and checkpoint lines; every rank writes errors. The models
(`event_models.py`, `side_events.py`, `store_events.py`, re-exported here) are the schema (camelCase on the wire,
stable): the writer refuses a field an event does not have, so a misspelt field fails in the
trainer's tests instead of vanishing from the view; the reader (`parse_line`) ignores fields
and events it does not know, so a newer trainer still talks to an older `mpjob run`. JSON has
no inf/nan: non-finite floats travel as the strings "inf", "-inf" and "nan" and are read back
as floats.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

from mpjob_contract.event_models import (
    Checkpoint,
    CheckpointFailed,
    CheckpointOutsideLineage,
    CheckpointRejected,
    CheckpointSkipped,
    CheckpointStaged,
    Compile,
    DataSkipped,
    Done,
    Error,
    Eval,
    Fault,
    Fp8,
    FreshStart,
    KeepFp32,
    LossSpike,
    PrecisionChanged,
    PrecisionMeasured,
    Preempted,
    ReplayDone,
    ReplaySkipped,
    Repromote,
    Resume,
    Start,
    Step,
    TrainerEvent,
    Wrap,
)
from mpjob_contract.side_events import Profile, TrackingFailed
from mpjob_contract.store_events import (
    CheckpointCandidatesCapped,
    CheckpointHousekeepingFailed,
    CheckpointListingCapped,
    CheckpointPutUnconditional,
    CheckpointUploadsAborted,
    CheckpointUploadsLeft,
)

__all__ = [
    "EVENTS",
    "Checkpoint",
    "CheckpointCandidatesCapped",
    "CheckpointFailed",
    "CheckpointHousekeepingFailed",
    "CheckpointListingCapped",
    "CheckpointOutsideLineage",
    "CheckpointPutUnconditional",
    "CheckpointRejected",
    "CheckpointSkipped",
    "CheckpointStaged",
    "CheckpointUploadsAborted",
    "CheckpointUploadsLeft",
    "Compile",
    "DataSkipped",
    "Done",
    "Error",
    "Eval",
    "Fault",
    "Fp8",
    "FreshStart",
    "KeepFp32",
    "LossSpike",
    "PrecisionChanged",
    "PrecisionMeasured",
    "Preempted",
    "Profile",
    "ReplayDone",
    "ReplaySkipped",
    "Repromote",
    "Resume",
    "Start",
    "Step",
    "TrackingFailed",
    "TrainerEvent",
    "Wrap",
    "format_line",
    "parse_line",
]


EVENTS: dict[str, type[TrainerEvent]] = {
    model.name: model
    for model in (
        Start,
        CheckpointRejected,
        CheckpointOutsideLineage,
        KeepFp32,
        Fp8,
        Compile,
        Wrap,
        PrecisionMeasured,
        Resume,
        FreshStart,
        Step,
        CheckpointStaged,
        Checkpoint,
        CheckpointSkipped,
        CheckpointFailed,
        CheckpointHousekeepingFailed,
        CheckpointUploadsLeft,
        CheckpointUploadsAborted,
        CheckpointListingCapped,
        CheckpointPutUnconditional,
        CheckpointCandidatesCapped,
        Eval,
        Profile,
        TrackingFailed,
        Fault,
        ReplayDone,
        ReplaySkipped,
        DataSkipped,
        LossSpike,
        PrecisionChanged,
        Repromote,
        Preempted,
        Done,
        Error,
    )
}


def wire(value: Any) -> Any:
    """A value as an event line writes it (the trainer's, `mpjob run --json`'s, series.json): a
    non-finite float by its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "-inf", "nan": JSON has none of them
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [wire(v) for v in value]
    return value


def _aliases(model: type[TrainerEvent]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def format_line(event: str, fields: dict[str, Any]) -> str:
    """One event line: `fields` checked against the event's model (ValueError names an unknown
    event or field, or a value of the wrong type), written as the trainer always wrote them."""
    model = EVENTS.get(event)
    if model is None:
        raise ValueError(f"unknown trainer event {event!r} (known: {', '.join(EVENTS)})")
    unknown = set(fields) - _aliases(model)
    if unknown:
        raise ValueError(f"event {event!r} has no field(s) {', '.join(sorted(unknown))}")
    model.model_validate(fields)
    return line_of(event, fields)


def line_of(event: str, fields: dict[str, Any]) -> str:
    """An event and its fields as one line of JSON, unchecked (`format_line` checks a trainer's)."""
    return json.dumps({"event": event, **wire(fields)})


def parse_line(line: str) -> TrainerEvent | None:
    """The event a trainer line holds; None for anything else (a plain log line, an unknown
    event, a line that does not fit its event's model)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # nested past the parser's depth: not a line we wrote
        return None
    model = EVENTS.get(str(data.get("event"))) if isinstance(data, dict) else None
    if model is None:
        return None
    try:
        return model.model_validate(data)
    except ValidationError:
        return None
