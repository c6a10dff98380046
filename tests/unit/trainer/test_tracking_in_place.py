"""A change made in place (session.inplace) tracks as a restart does: the attempt's MLflow run
ends as the restart's exit would have ended it, and the next attempt's nested run opens in the
same process with the tags a restarted attempt's launch gives it (a local file store stands in
for the tracking server; the event lines are the ones the trainer writes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.tracking import RunTracker
from tests.tracking.mlflow_server import tracking_client

pytestmark = pytest.mark.unit

STEPS = 40


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file store (MLflow keeps one for such uses behind this switch)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "600")  # close returns once all is sent
    return (tmp_path / "mlruns").as_uri()


def tracker_for(uri: str) -> RunTracker:
    spec = MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "mlp"},
            "training": {"steps": STEPS},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
            "tracking": {"mlflow": {"uri": uri, "experiment": "ladder"}},
        }
    )
    launch = AttemptLaunch(job_name="j", namespace="ns", precision="fp16", spec=spec, job_uid="u-1")
    return RunTracker(launch, digest="d", metrics=TrainerMetrics("j", "ns", 0, "fp16"))


def step(tracker: RunTracker, at: int, precision: str) -> None:
    tracker("step", {"time": float(at), "step": at, "loss": 1.0 / at, "precision": precision})


def changed(kind: str, attempt: int, at: int, start: int, to: str, rule: str, message: str) -> dict[str, Any]:
    """A `precisionChanged` line as session.inplace writes it."""
    previous = {"fallback": "fp16", "repromote": "bf16", "microBatch": to}[kind]
    return {"time": at + 0.5, "kind": kind, "attempt": attempt, "step": at, "startStep": start,
            "fromPrecision": previous, "toPrecision": to, "rule": rule, "message": message,
            "recoverySeconds": 0.01, "at": at + 0.25}  # fmt: skip


def runs_of(uri: str) -> tuple[Any, list[Any]]:
    """The job's run and its attempts' runs, oldest attempt first."""
    client = tracking_client(uri)
    experiment = client.get_experiment_by_name("ladder")
    runs = client.search_runs([experiment.experiment_id])
    (job,) = [r for r in runs if r.data.tags.get("mpjob.level") == "job"]
    attempts = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == job.info.run_id]
    assert len(attempts) + 1 == len(runs)
    return job, sorted(attempts, key=lambda r: int(r.data.tags["mpjob.attempt"]))


def steps_of(uri: str, run: Any) -> list[int]:
    return [m.step for m in tracking_client(uri).get_metric_history(run.info.run_id, "loss")]


def test_a_fallback_in_place_ends_the_attempts_run_and_opens_the_next(uri: str) -> None:
    tracker = tracker_for(uri)
    for at in (5, 10, 15):
        step(tracker, at, "fp16")
    message = "LossScaleCollapsed: loss scale 0.5 below guard.minLossScale 1"  # as the report words it
    tracker("precisionChanged", changed("fallback", 1, 17, 10, "bf16", "LossScaleCollapsed", message))
    for at in (15, 20, 25, 30, 35, 40):  # steps 11-17 trained again, in bf16
        step(tracker, at, "bf16")
    tracker("done", {"time": 50.0, "step": STEPS})
    tracker.close(0)

    job, (first, second) = runs_of(uri)
    why = "LossScaleCollapsed: loss scale 0.5 below guard.minLossScale 1 (step 17)"  # the `fault` line's wording
    assert (first.info.status, first.data.tags["mpjob.ending"], first.data.tags["mpjob.fallbackReason"]) == (
        "FAILED",
        "NumericFault",
        why,
    )
    assert (first.data.tags["mpjob.attempt"], first.data.tags["mpjob.precision"]) == ("0", "fp16")
    assert first.info.end_time == 17_250  # when the next attempt began, not when it was sent
    assert (second.data.tags["mpjob.attempt"], second.data.tags["mpjob.precision"]) == ("1", "bf16")
    assert (second.info.status, second.data.tags["mpjob.ending"]) == ("FINISHED", "Succeeded")
    assert "mpjob.fallbackReason" not in second.data.tags and second.info.run_name == "j-attempt-1"
    assert job.info.status == "FINISHED" and job.data.tags["mpjob.fallback.attempt0"] == why
    assert job.data.params["precision.mode"] == "fp16"
    assert steps_of(uri, first) == [5, 10, 15] and steps_of(uri, second) == [15, 20, 25, 30, 35, 40]
    assert steps_of(uri, job) == [5, 10, 15, 15, 20, 25, 30, 35, 40]  # the timeline, in the order they ran


def test_a_repromotion_in_place_and_its_preemption_end_each_run_as_a_restart_would(uri: str) -> None:
    tracker = tracker_for(uri)
    step(tracker, 5, "fp16")
    tracker("precisionChanged", changed("fallback", 1, 6, 0, "bf16", "MaxConsecutiveOverflows", "m"))
    step(tracker, 10, "bf16")
    tracker("precisionChanged", changed("repromote", 2, 20, 20, "fp16", "repromote", "20 clean steps"))
    tracker("precisionChanged", changed("microBatch", 3, 22, 20, "fp16", "OutOfDeviceMemory", "oom"))
    step(tracker, 25, "fp16")
    tracker.close(44)  # a SIGTERM: preempted

    job, runs = runs_of(uri)
    assert [(r.data.tags["mpjob.attempt"], r.data.tags["mpjob.precision"]) for r in runs] == [
        ("0", "fp16"),
        ("1", "bf16"),
        ("2", "fp16"),
        ("3", "fp16"),
    ]
    assert [(r.info.status, r.data.tags["mpjob.ending"]) for r in runs] == [
        ("FAILED", "NumericFault"),
        ("KILLED", "Repromote"),
        ("FAILED", "OutOfDeviceMemory"),
        ("KILLED", "Preempted"),
    ]
    assert ["mpjob.fallbackReason" in r.data.tags for r in runs] == [True, False, False, False]
    assert [steps_of(uri, r) for r in runs] == [[5], [10], [], [25]]
    assert job.info.status == "KILLED"  # as the last attempt ended: the next one reopens it
