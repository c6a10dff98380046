"""The job's MLflow run tells how the job stands: each attempt's ending reaches it, so a job
that fails for good leaves it FAILED, and the next attempt of a job that goes on sets it
RUNNING again (a local file store stands in for the tracking server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob_trainer.tracking.mlflow_run import MlflowRuns
from mpjob_trainer.tracking.records import Point, run_status
from tests.tracking.mlflow_server import tracking_client
from tests.unit.trainer.test_tracking_in_place import runs_of, step, tracker_for

pytestmark = pytest.mark.unit


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file store (MLflow keeps one for such uses behind this switch)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def attempt(uri: str, index: int) -> MlflowRuns:
    runs = MlflowRuns(uri=uri, experiment="ladder", key="job-1")
    runs.open(job_name="j", attempt=index, params={"precision.mode": "fp16"}, tags={})
    return runs


def status_of(uri: str, run_id: str) -> str:
    return str(tracking_client(uri).get_run(run_id).info.status)


def test_a_job_that_fails_for_good_ends_its_run_failed(uri: str) -> None:
    first = attempt(uri, 0)
    first.end(status=run_status(42), tags={}, job_done=False)  # a numeric fault: the ladder goes on
    assert status_of(uri, first.job_run) == "FAILED"

    second = attempt(uri, 1)  # the fallback attempt finds the same job run and reopens it
    assert second.job_run == first.job_run and status_of(uri, second.job_run) == "RUNNING"
    second.end(status=run_status(43), tags={}, job_done=False)  # a configuration error: the job fails
    assert status_of(uri, second.job_run) == "FAILED" and status_of(uri, second.attempt_run) == "FAILED"


def test_the_attempt_that_trains_the_last_step_ends_the_job_run_finished(uri: str) -> None:
    attempt(uri, 0).end(status=run_status(44), tags={}, job_done=False)  # preempted
    last = attempt(uri, 1)
    last.end(status=run_status(0), tags={}, job_done=True)
    assert status_of(uri, last.job_run) == "FINISHED"


def test_an_attempt_that_died_without_ending_its_run_is_ended_by_the_next(uri: str) -> None:
    """A killed `mpjob run`, an OOMKilled pod or a lost node leaves its attempt's run RUNNING:
    the next attempt ends it KILLED, at the last point it logged, tagged as unreported; an
    attempt started again under its own index (after a preemption) goes on in its run."""
    killed = attempt(uri, 0)
    killed.log([Point("loss", 2.5, 15, 1_000_000)], attempt_tags={}, job_tags={})
    again = attempt(uri, 0)  # the same attempt started again: its own run, still running
    assert again.attempt_run == killed.attempt_run and status_of(uri, killed.attempt_run) == "RUNNING"

    nxt = attempt(uri, 1)
    lost = tracking_client(uri).get_run(killed.attempt_run)
    assert lost.info.status == "KILLED" and lost.data.tags["mpjob.ending"] == "Unreported"
    assert lost.info.end_time == 1_000_000  # not the next attempt's start: no time claimed unseen
    assert status_of(uri, nxt.attempt_run) == "RUNNING" and status_of(uri, nxt.job_run) == "RUNNING"
    nxt.end(status=run_status(0), tags={}, job_done=True)
    assert status_of(uri, killed.attempt_run) == "KILLED"  # the job's end leaves it as it was


def test_a_run_stopped_early_by_its_loop_ends_the_job_run_finished(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop that stops early (`stop_early`, an early-stopping callback) or leaves before
    spec.training.steps ends the attempt Succeeded, and the job with it: no attempt follows to
    end the job's run, so this one ends it FINISHED, not left RUNNING."""
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "600")  # close returns once all is sent
    tracker = tracker_for(uri)
    step(tracker, 5, "fp16")
    tracker("done", {"time": 6.0, "step": 5})  # short of STEPS: the training's own stop
    tracker.close(0)

    job, (only,) = runs_of(uri)
    assert (only.info.status, only.data.tags["mpjob.ending"]) == ("FINISHED", "Succeeded")
    assert job.info.status == "FINISHED"


def test_an_attempt_started_again_logs_the_steps_it_trains_again_once(uri: str) -> None:
    """An attempt started again (after a preemption) resumes from its last checkpoint and trains
    the steps since again: its run keeps each step once, in order; the job's run has them again."""
    killed = attempt(uri, 0)
    killed.log([Point("loss", 1.0 / s, s, s) for s in range(1, 11)], attempt_tags={}, job_tags={})
    again = attempt(uri, 0)
    again.log([Point("loss", 1.0 / s, s, 100 + s) for s in range(7, 16)], attempt_tags={}, job_tags={})
    client = tracking_client(uri)
    assert [m.step for m in client.get_metric_history(again.attempt_run, "loss")] == list(range(1, 16))
    timeline = [m.step for m in client.get_metric_history(again.job_run, "loss")]
    assert timeline == [*range(1, 11), *range(7, 16)]
