"""A change made in place (session.inplace) tracks as a restart does: the attempt's MLflow run
ends as the restart's exit would have ended it, and the next attempt's nested run opens in the
same process with the tags a restarted attempt's launch gives it (a local file store stands in
for the tracking server; the event lines are the ones the trainer writes)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import tracking
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.tracking import RunTracker
from tests.helpers import wait_for
from tests.tracking.mlflow_server import tracking_client

pytestmark = pytest.mark.unit

STEPS = 40


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file store (MLflow keeps one for such uses behind this switch)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "600")  # close returns once all is sent
    return (tmp_path / "mlruns").as_uri()


def tracker_for(uri: str, lines: io.StringIO | None = None, attempt: int = 0) -> RunTracker:
    """A tracker of `attempt` (`lines`: where its event lines, the failures it tells, are written)."""
    spec = MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "mlp"},
            "training": {"steps": STEPS},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
            "tracking": {"mlflow": {"uri": uri, "experiment": "ladder"}},
        }
    )
    launch = AttemptLaunch(job_name="j", namespace="ns", precision="fp16", spec=spec, job_uid="u-1", attempt=attempt)
    log = EventLog(0, lines) if lines is not None else None
    tracker = RunTracker(launch, digest="d", metrics=TrainerMetrics("j", "ns", 0, "fp16"), log=log)
    if log is not None:
        log.listeners.append(tracker)
    return tracker


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


def told(lines: io.StringIO) -> list[str]:
    """The `trackingFailed` lines' errors: what `mpjob run` shows on its console."""
    records = [json.loads(line) for line in lines.getvalue().splitlines()]
    return [r["error"] for r in records if r["event"] == "trackingFailed"]


def opened(uri: str, tracker: RunTracker, *, attempts: int) -> tuple[Any, list[Any]]:
    """The runs once the tracking thread made `attempts` attempts' runs (a loss point in the last)."""
    return wait_for(
        lambda: (found := runs_of(uri)) and len(found[1]) == attempts and steps_of(uri, found[1][-1]) and found,
        120,
        message=f"{attempts} attempts' runs",
    )


def test_each_state_of_a_change_in_place_shows_as_a_restart_shows_it(uri: str) -> None:
    """While the job trains on after the change its run is RUNNING, the faulted attempt's FAILED;
    the job's run ends as the job ends (here a configuration error: FAILED, as a restart's)."""
    tracker = tracker_for(uri)
    step(tracker, 5, "fp16")
    job, (first,) = opened(uri, tracker, attempts=1)
    assert (job.info.status, first.info.status) == ("RUNNING", "RUNNING")
    tracker("precisionChanged", changed("fallback", 1, 6, 0, "bf16", "MaxConsecutiveOverflows", "m"))
    step(tracker, 10, "bf16")
    job, (first, second) = opened(uri, tracker, attempts=2)
    assert [r.info.status for r in (job, first, second)] == ["RUNNING", "FAILED", "RUNNING"]
    tracker.close(43)
    job, (first, second) = runs_of(uri)
    assert [r.info.status for r in (job, first, second)] == ["FAILED", "FAILED", "FAILED"]
    assert second.data.tags["mpjob.ending"] == "ConfigError"


def change_refused(uri: str, tracker: RunTracker, job: Any) -> Path:
    """Attempt 1's fallback to bf16 in place at step 6, sent (with the first record after it) to a
    store that refuses the next attempt's run: a damaged run folder fails MLflow's search. The
    folder, for the test to mend."""
    damaged = Path(uri.removeprefix("file://")) / job.info.experiment_id / "damaged"
    damaged.mkdir()
    (damaged / "meta.yaml").write_text("run_id: [not closed\n")
    tracker("precisionChanged", changed("fallback", 1, 6, 0, "bf16", "MaxConsecutiveOverflows", "m"))
    step(tracker, 10, "bf16")
    return damaged


def test_a_change_whose_next_run_was_not_made_ends_the_job_run_as_the_job_ends(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the next attempt's run at the change (its search fails on a damaged run
    folder): that attempt's records go to the job's run only, told, and the job's run ends as the
    job ends (it stayed RUNNING for good: the end went to no attempt's run, so to none at all).
    Its run is tried again only after REOPEN_SECONDS: none comes before the end here."""
    monkeypatch.setattr(tracking, "REOPEN_SECONDS", 3600.0)
    lines = io.StringIO()
    tracker = tracker_for(uri, lines)
    step(tracker, 5, "fp16")
    job, _ = opened(uri, tracker, attempts=1)
    damaged = change_refused(uri, tracker, job)
    wait_for(lambda: tracker.failed, 120, message="the change's failure")
    shutil.rmtree(damaged)
    step(tracker, 40, "bf16")
    tracker("done", {"time": 50.0, "step": STEPS})
    tracker.close(0)

    job, (first,) = runs_of(uri)  # attempt 1 has no run of its own
    assert (job.info.status, first.info.status) == ("FINISHED", "FAILED")
    assert steps_of(uri, first) == [5] and steps_of(uri, job) == [5, 10, 40]
    assert tracker.failed == 1 and tracker.degraded is not None and "attempt 1" in tracker.degraded
    (error,) = told(lines)
    assert "attempt 1 has no run of its own" in error, error


def test_a_change_half_made_sends_no_record_to_the_ending_attempts_run(uri: str) -> None:
    """The job's run refuses the fallback's tag (a folder where the store writes it): the ending
    attempt's run is ended all the same and the next attempt's opened, and the next attempt's
    records go to its own run, never to the ended one; the failure is told."""
    lines = io.StringIO()
    tracker = tracker_for(uri, lines)
    step(tracker, 5, "fp16")
    job, _ = opened(uri, tracker, attempts=1)
    tag = Path(uri.removeprefix("file://")) / job.info.experiment_id / job.info.run_id / "tags"
    (tag / "mpjob.fallback.attempt0").mkdir(parents=True)
    tracker("precisionChanged", changed("fallback", 1, 6, 0, "bf16", "MaxConsecutiveOverflows", "m"))
    for at in (10, 40):
        step(tracker, at, "bf16")
    tracker("done", {"time": 50.0, "step": STEPS})
    tracker.close(0)

    job, runs = runs_of(uri)
    assert steps_of(uri, runs[0]) == [5]  # not [5, 10, 40]: the ended run took the next one's records
    job, (first, second) = runs_of(uri)
    assert [r.info.status for r in (job, first, second)] == ["FINISHED", "FAILED", "FINISHED"]
    assert steps_of(uri, second) == [10, 40]
    assert steps_of(uri, job) == [5, 10, 40] and tracker.degraded is None
    (error,) = told(lines)
    assert "mpjob.fallback.attempt0" in error and "attempt 1" in error, error
