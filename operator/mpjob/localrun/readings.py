"""The trainer's event lines as live readings: `mpjob run`'s side of live progress. Only a
translation; what a reading changes in the status is `planning/observe.py`'s decision, the same
one the operator makes of a read of the trainer's metrics endpoint."""

from __future__ import annotations

import math

from mpjob.planning import reported
from mpjob.planning.observe import CheckpointReading, Reading
from mpjob_contract import events
from mpjob_contract.skipping import describe_ranges, describe_steps


def finite(value: float | None) -> float | None:
    """A figure the status may hold: a NaN or inf loss is no reading (report.json stays JSON, and
    the operator's reads of the metrics endpoint drop them too: controller.progress)."""
    return value if value is None or math.isfinite(value) else None


def reading_of(attempt: int, event: events.TrainerEvent) -> Reading | None:
    """What attempt `attempt`'s trainer line says of its progress; None for a line that says none."""
    if isinstance(event, events.Step):
        return Reading(
            attempt=attempt,
            step=event.step,
            loss=finite(event.loss),
            loss_scale=finite(event.loss_scale),
            overflow_steps=event.overflow_steps,
            samples_per_second=finite(event.samples_per_second),
        )
    if isinstance(event, events.Eval):
        return Reading(
            attempt=attempt, step=event.step, eval_loss=finite(event.loss), eval_loss_delta=finite(event.delta)
        )
    if isinstance(event, events.PrecisionMeasured):  # validated: a precision the API knows
        return Reading(attempt=attempt, measured_precision=event.chosen, measured_step_seconds=event.step_seconds)
    if isinstance(event, events.Resume):
        return Reading(attempt=attempt, start_step=event.step)
    if isinstance(event, events.FreshStart):  # no checkpoint of its own: it began at step 0
        return Reading(attempt=attempt, start_step=0)
    if isinstance(event, events.DataSkipped):  # the run's quarantine after the skip (newer trainers)
        return Reading(attempt=attempt, skipped=event.quarantine) if event.quarantine is not None else None
    if isinstance(event, events.Checkpoint):
        return Reading(attempt=attempt, checkpoint=CheckpointReading(event.step, event.sha256, path=event.path))
    return None


def reached(step: int | None, event: events.TrainerEvent) -> int | None:
    """The step an attempt's lines put it at after `event` (`step`: before it, None while no line
    named one): a step or eval line's own (a replay after a rollback goes back), raised by a
    checkpoint, preempted or done line that names a later one (the save on SIGTERM falls between
    step lines); a save reported after later steps (asynchronous) never moves it back. A change
    of precision in place begins the next attempt: none named yet."""
    if isinstance(event, events.PrecisionChanged):
        return None
    if isinstance(event, events.Step | events.Eval):
        return event.step
    if isinstance(event, events.Checkpoint | events.Preempted | events.Done):
        return event.step if step is None else max(step, event.step)
    return step


def noted(event: events.TrainerEvent) -> str | None:
    """The line a trainer's event earns in the run's output beside its step lines, if any."""
    if isinstance(event, events.DataSkipped) and event.steps:
        spans = describe_ranges(event.samples) or "not named"
        steps, back = describe_steps(event.steps), event.from_step
        return f"skipped step(s) {steps} ({event.cause}; samples {spans}), back at checkpoint step {back}"
    if isinstance(event, events.CheckpointRejected):  # the next older one is tried, else step 0
        return f"checkpoint {event.path} not used: {event.problem}"
    if isinstance(event, events.CheckpointFailed):  # training goes on; the next save tries again
        return f"checkpoint of step {event.step} not written ({event.failures} failed so far): {event.error}"
    if isinstance(event, events.CheckpointHousekeepingFailed):  # written all the same; the next save tries again
        return f"checkpoint of step {event.step} written, but {event.problem} (the next save tries again)"
    if isinstance(event, events.TrackingFailed):  # training goes on; the worker's log has every failure
        return f"experiment tracking failed: {event.error} (training goes on; rank 0's worker0.log has every failure)"
    if isinstance(event, events.PrecisionMeasured):
        return f"auto measured {reported.step_times(event.step_seconds)} per step: training in {event.chosen}"
    return None
