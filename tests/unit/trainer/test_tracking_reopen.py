"""What the MLflow runs lack is tried again on the tracking thread's schedule (REOPEN_SECONDS, at
the next records), and what was made is used meanwhile: an opening that fails partway keeps the
job's run (records and the end go to it), and an attempt whose run a change in place did not
make gets it at a later try (a local file store stands in for the tracking server; the store is
damaged where MLflow writes, and mended)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from mpjob_trainer import tracking
from mpjob_trainer.tracking.mlflow_run import MlflowRuns, OpenIncomplete
from tests.helpers import wait_for
from tests.tracking.mlflow_server import tracking_client
from tests.unit.trainer.test_tracking_in_place import (
    STEPS,
    change_refused,
    changed,
    opened,
    runs_of,
    step,
    steps_of,
    told,
    tracker_for,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file store (MLflow keeps one for such uses behind this switch)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "600")  # close returns once all is sent
    return (tmp_path / "mlruns").as_uri()


def ending_refused(uri: str, run: object) -> Path:
    """A folder where the store writes the run's `mpjob.ending` tag: ending that run fails."""
    info = run.info  # type: ignore[attr-defined]
    tag = Path(uri.removeprefix("file://")) / info.experiment_id / info.run_id / "tags" / "mpjob.ending"
    tag.mkdir(parents=True)
    return tag


def test_an_opening_that_fails_partway_keeps_the_job_run_and_ends_it_as_the_job_ends(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 0's process died with its run RUNNING, and the store refuses to end it when
    attempt 1 opens (after it set the job's run RUNNING again). Before, nothing of attempt 1 was
    recorded and the job's run stayed RUNNING after the job ended; now attempt 1's run is made and
    takes its records, the job's run ends FINISHED, and attempt 0's run is ended at a later try."""
    monkeypatch.setattr(tracking, "REOPEN_SECONDS", 0.0)  # each batch tries again what is lacking
    died = tracker_for(uri)
    step(died, 5, "fp16")
    _, (first,) = opened(uri, died, attempts=1)
    refused = ending_refused(uri, first)
    lines = io.StringIO()
    tracker = tracker_for(uri, lines, attempt=1)
    step(tracker, 10, "fp16")
    job, (first, second) = opened(uri, tracker, attempts=2)
    assert [r.info.status for r in (job, first, second)] == ["RUNNING", "RUNNING", "RUNNING"]
    assert tracker.failed >= 1 and tracker.degraded is None  # attempt 1 has its run
    shutil.rmtree(refused)
    step(tracker, 20, "fp16")  # the next batch tries again: attempt 0's run is ended
    wait_for(lambda: runs_of(uri)[1][0].info.status == "KILLED", 120, message="attempt 0's run ended")
    step(tracker, 40, "fp16")
    tracker("done", {"time": 50.0, "step": STEPS})
    tracker.close(0)

    job, (first, second) = runs_of(uri)
    assert [r.info.status for r in (job, first, second)] == ["FINISHED", "KILLED", "FINISHED"]
    assert first.data.tags["mpjob.ending"] == "Unreported"
    assert steps_of(uri, second) == [10, 20, 40] and steps_of(uri, job) == [5, 10, 20, 40]
    assert "ending earlier attempts' runs left RUNNING" in told(lines)[0]


def test_an_attempt_whose_run_a_change_did_not_make_gets_it_at_a_later_try(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses attempt 1's run at the change in place (a damaged run folder fails its
    search): its records go to the job's run only while it has none, and once the store is mended
    the next batch makes it (before, it never had one: `degraded` for good)."""
    monkeypatch.setattr(tracking, "REOPEN_SECONDS", 0.0)
    lines = io.StringIO()
    tracker = tracker_for(uri, lines)
    step(tracker, 5, "fp16")
    job, _ = opened(uri, tracker, attempts=1)
    damaged = change_refused(uri, tracker, job)
    wait_for(lambda: tracker.degraded, 120, message="the change's failure")
    assert "attempt 1 has no run of its own" in str(tracker.degraded)
    step(tracker, 15, "bf16")  # tried again, failing again: counted, not told again
    wait_for(lambda: tracker.failed >= 2, 120, message="the failed try")
    shutil.rmtree(damaged)
    step(tracker, 40, "bf16")
    job, (first, second) = opened(uri, tracker, attempts=2)
    assert tracker.degraded is None and second.data.tags["mpjob.precision"] == "bf16"
    tracker("done", {"time": 50.0, "step": STEPS})
    tracker.close(0)

    job, (first, second) = runs_of(uri)
    assert [r.info.status for r in (job, first, second)] == ["FINISHED", "FAILED", "FINISHED"]
    assert steps_of(uri, first) == [5] and steps_of(uri, second) == [40]
    assert steps_of(uri, job) == [5, 10, 15, 40]
    (error,) = told(lines)
    assert "attempt 1 has no run of its own" in error, error


def test_a_second_open_does_only_what_the_first_left(uri: str) -> None:
    """MlflowRuns.open after a failure partway keeps the job's run it found (RUNNING) and the
    attempt's run it made, and does the part that failed."""
    died = MlflowRuns(uri=uri, experiment="ladder", key="k")
    died.open(job_name="j", attempt=0, params={"precision.mode": "fp16"}, tags={})
    refused = ending_refused(uri, tracking_client(uri).get_run(died.attempt_run))
    runs = MlflowRuns(uri=uri, experiment="ladder", key="k")
    with pytest.raises(OpenIncomplete) as failed:
        runs.open(job_name="j", attempt=1, params={}, tags={})
    assert failed.value.opened and "ending earlier attempts' runs left RUNNING" in str(failed.value)
    assert (runs.job_run, runs.complete) == (died.job_run, False) and runs.attempt_run
    made = runs.attempt_run
    shutil.rmtree(refused)
    runs.open(job_name="j", attempt=1, params={}, tags={})
    assert runs.complete and runs.attempt_run == made
    assert tracking_client(uri).get_run(died.attempt_run).info.status == "KILLED"


def test_a_run_a_change_did_not_end_is_ended_at_a_later_try_as_the_change_ended_it(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses to end attempt 0's run at the fallback in place (a folder where it writes
    the run's `mpjob.ending` tag); attempt 1's run is made. Before, attempt 0's run stayed RUNNING
    in this process, to be ended KILLED 'Unreported' by another; now it is tried again with the
    next records (each REOPEN_SECONDS) and ended as the change ended it: FAILED, with the fault,
    at the change's moment. The failure is told once, a try failing again counted."""
    monkeypatch.setattr(tracking, "REOPEN_SECONDS", 0.0)
    lines = io.StringIO()
    tracker = tracker_for(uri, lines)
    step(tracker, 5, "fp16")
    _, (first,) = opened(uri, tracker, attempts=1)
    refused = ending_refused(uri, first)
    tracker("precisionChanged", changed("fallback", 1, 6, 0, "bf16", "MaxConsecutiveOverflows", "m"))
    step(tracker, 10, "bf16")  # the change is sent with the first record after it
    _, (first, _) = opened(uri, tracker, attempts=2)
    assert first.info.status == "RUNNING" and tracker.failed == 1
    step(tracker, 15, "bf16")  # tried again, failing again
    wait_for(lambda: tracker.failed >= 2, 60, message="the failed try")
    shutil.rmtree(refused)
    step(tracker, 20, "bf16")
    wait_for(lambda: runs_of(uri)[1][0].info.status == "FAILED", 60, message="attempt 0's run ended")
    step(tracker, 40, "bf16")
    tracker("done", {"time": 50.0, "step": STEPS})
    tracker.close(0)

    job, (first, second) = runs_of(uri)
    assert [r.info.status for r in (job, first, second)] == ["FINISHED", "FAILED", "FINISHED"]
    assert first.data.tags["mpjob.ending"] == "NumericFault" and first.info.end_time == 6250  # the change's `at`
    assert first.data.tags["mpjob.fallbackReason"] == "MaxConsecutiveOverflows: m (step 6)"
    assert steps_of(uri, first) == [5] and steps_of(uri, second) == [10, 15, 20, 40]
    (error,) = told(lines)
    assert "ending attempt 0's run" in error, error
