"""The lines `mpjob run --json` writes on stdout: each one JSON object named by its `event`, the
progress view's (attemptStarted, step, ...) and the errors that end a run before it starts. Kept
apart from the view, which needs the local extra: that extra missing is such an error."""

from __future__ import annotations

from typing import Any

from mpjob_contract.events import line_of


def json_line(event: str, **fields: Any) -> str:
    """One event as one line of JSON, a non-finite figure (a faulting step's loss) as the trainer's lines write it."""
    return line_of(event, fields)


def error_line(message: str, **fields: Any) -> str:
    """An `error` event: `message` for people (what the plain output's `error:` line says) and
    `field` when the error is a manifest's field."""
    return json_line("error", message=message, **fields)
