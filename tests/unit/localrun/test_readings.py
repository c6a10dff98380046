"""`mpjob run`'s live readings: a non-finite figure in a trainer's step line is no reading, so
report.json stays strict JSON and keeps the last finite loss, as the operator's status does."""

from __future__ import annotations

import json

import pytest

from mpjob.localrun.readings import noted, reading_of
from mpjob.planning.observe import observe
from mpjob_contract import events
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus

pytestmark = pytest.mark.unit


def step_line(step: int, loss: str, scale: str) -> events.TrainerEvent:
    line = f'{{"event": "step", "time": 1.0, "step": {step}, "loss": {loss}, "lossScale": {scale}}}'
    event = events.parse_line(line)
    assert event is not None
    return event


def test_a_nan_loss_leaves_the_last_finite_one_and_the_status_strict_json() -> None:
    status = MixedPrecisionJobStatus(
        phase="Running", precision="fp16", attempt=0, attempts=[AttemptStatus(index=0, precision="fp16", start_step=0)]
    )
    for event in (step_line(40, "0.5508", "32768.0"), step_line(50, "NaN", "Infinity")):
        reading = reading_of(0, event)
        assert reading is not None
        status = observe(status, reading).status
    assert status.step == 50 and status.loss == 0.5508
    json.dumps(status.to_api(), allow_nan=False)  # report.json: no NaN token


def test_a_checkpoint_not_used_or_not_written_gets_a_line_of_its_own() -> None:
    """A folder's checkpoint the trainer refused (another job's, a corrupt one) and a save that
    failed are said beside the step lines: without them `start step 0` and a missing checkpoint
    would come with no word of why."""
    rejected = events.parse_line(
        '{"event": "checkpointRejected", "time": 1.0, "path": "/o/checkpoints/step-000000020",'
        " \"problem\": \"step-000000020: config digest 'f6' does not match this job's 'dc'\"}"
    )
    failed = events.parse_line(
        '{"event": "checkpointFailed", "time": 1.0, "step": 20, "trainingStep": 30,'
        ' "error": "CheckpointTaken: step-000000020 holds a checkpoint this job did not write", "failures": 1}'
    )
    assert rejected is not None and failed is not None
    assert noted(rejected) == (
        "checkpoint /o/checkpoints/step-000000020 not used: "
        "step-000000020: config digest 'f6' does not match this job's 'dc'"
    )
    assert noted(failed) == (
        "checkpoint of step 20 not written (1 failed so far): "
        "CheckpointTaken: step-000000020 holds a checkpoint this job did not write"
    )


def test_a_save_whose_housekeeping_failed_is_said_written_with_what_was_left() -> None:
    """A checkpoint written whose pruning failed after its commit is the run's checkpoint: its
    `checkpoint` line moves the run's last checkpoint, and the housekeeping line says what was left,
    never that the checkpoint was not written."""
    saved = events.parse_line(
        '{"event": "checkpoint", "time": 1.0, "step": 30, "path": "s3://b/p/step-000000030",'
        ' "sha256": "ab", "seconds": 0.1, "bytes": 10, "async": true}'
    )
    left = events.parse_line(
        '{"event": "checkpointHousekeepingFailed", "time": 1.0, "step": 30,'
        ' "problem": "older checkpoints not pruned: EndpointConnectionError: Could not connect"}'
    )
    assert saved is not None and left is not None
    reading = reading_of(0, saved)
    assert reading is not None and reading.checkpoint is not None and reading.checkpoint.step == 30
    assert noted(left) == (
        "checkpoint of step 30 written, but older checkpoints not pruned: "
        "EndpointConnectionError: Could not connect (the next save tries again)"
    )


def test_a_tracking_failure_gets_a_line_that_says_training_goes_on() -> None:
    line = events.parse_line(
        '{"event": "trackingFailed", "time": 1.0, "error": "MlflowException: API request to'
        ' http://127.0.0.1:1/api/2.0/mlflow/experiments/get-by-name failed"}'
    )
    assert isinstance(line, events.TrackingFailed) and reading_of(0, line) is None
    assert noted(line) == (
        "experiment tracking failed: MlflowException: API request to"
        " http://127.0.0.1:1/api/2.0/mlflow/experiments/get-by-name failed"
        " (training goes on; rank 0's worker0.log has every failure)"
    )
