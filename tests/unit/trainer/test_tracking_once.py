"""The job's MLflow params are logged once per run, whichever try or attempt gets them there, and a
tracking failure after a close that timed out is told on the event lines as the others are (a
local file store stands in for the tracking server; the event lines are the ones the trainer
writes)."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from mpjob_trainer.tracking.mlflow_run import MlflowRuns, OpenIncomplete
from mpjob_trainer.tracking.records import TAG_JOB_KEY, TAG_LEVEL
from tests.helpers import wait_for
from tests.tracking.mlflow_server import tracking_client
from tests.unit.trainer.test_tracking_in_place import opened, step, told, tracker_for

pytestmark = pytest.mark.unit

PARAMS = {"precision.mode": "fp16", "training.steps": "40", "image": "trainer:2"}


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file store (MLflow keeps one for such uses behind this switch)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def died_after_making_the_job_run(uri: str, logged: dict[str, str]) -> str:
    """The job's run as an attempt left it that died after making it, having logged `logged`."""
    client = tracking_client(uri)
    experiment = client.create_experiment("ladder")
    run = client.create_run(experiment, run_name="j", tags={TAG_JOB_KEY: "k", TAG_LEVEL: "job"})
    for name, value in logged.items():
        client.log_param(run.info.run_id, name, value)
    return str(run.info.run_id)


@pytest.mark.parametrize("logged", [{}, {"precision.mode": "fp16", "image": "trainer:1"}])
def test_the_next_attempt_logs_the_params_the_job_run_lacks(uri: str, logged: dict[str, str]) -> None:
    """Before, only the attempt that made the job's run logged its params: one that died first
    (or whose params the server refused before it ended) left the run without them for good. A
    param the run holds is not sent again (its value stays: MLflow refuses a change)."""
    job = died_after_making_the_job_run(uri, logged)
    runs = MlflowRuns(uri=uri, experiment="ladder", key="k")
    runs.open(job_name="j", attempt=1, params=PARAMS, tags={})
    assert runs.job_run == job and runs.complete
    assert tracking_client(uri).get_run(job).data.params == {**PARAMS, **logged}


def test_a_retried_opening_logs_only_the_params_it_did_not(uri: str) -> None:
    """The store refuses one param (a folder where its file goes): the opening fails; the retry,
    once the store is mended, sends what the run lacks, and the run holds each param once."""
    job = died_after_making_the_job_run(uri, {})
    store = Path(uri.removeprefix("file://"))
    refused = next(store.glob(f"*/{job}")) / "params" / "training.steps"
    refused.mkdir(parents=True)
    runs = MlflowRuns(uri=uri, experiment="ladder", key="k")
    with pytest.raises(OpenIncomplete) as failed:
        runs.open(job_name="j", attempt=1, params=PARAMS, tags={})
    assert "logging the job's params" in str(failed.value) and not runs.complete
    shutil.rmtree(refused)
    runs.open(job_name="j", attempt=1, params=PARAMS, tags={})
    assert runs.complete and tracking_client(uri).get_run(job).data.params == PARAMS


@pytest.mark.timeout(180)  # a FIFO never opened for reading would hold the tracking thread
def test_a_failure_after_a_timed_out_close_is_told_on_the_event_lines(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's run's end waits on the store (a FIFO where its `mpjob.ending` tag is
    written) past the close's deadline, then fails (its meta.yaml damaged meanwhile). Before,
    that failure reached stderr only; now the tracking thread tells it as a `trackingFailed` line."""
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "0.5")
    lines = io.StringIO()
    tracker = tracker_for(uri, lines)
    step(tracker, 5, "fp16")
    _, (attempt,) = opened(uri, tracker, attempts=1)
    run = Path(uri.removeprefix("file://")) / attempt.info.experiment_id / attempt.info.run_id
    fifo = run / "tags" / "mpjob.ending"
    os.mkfifo(fifo)
    tracker.close(42)  # the tracking thread waits in the FIFO's opening
    assert [error.split(":")[0] for error in told(lines)] == ["TimeoutError"]
    (run / "meta.yaml").rename(tmp_path / "meta.yaml")
    (run / "meta.yaml").mkdir()  # ending the run reads it
    with open(fifo, encoding="utf-8") as tag:  # the thread writes the tag, then fails to end the run
        assert tag.read() == "NumericFault"  # exit 42
    errors = wait_for(lambda: (errors := told(lines)) and len(errors) == 2 and errors, 60, message="the late failure")
    assert "TimeoutError" not in errors[1], errors


def test_a_param_the_job_run_holds_otherwise_is_kept_and_said(
    uri: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job's image changed between attempts: MLflow keeps a param's first value, so the job's
    run keeps `trainer:1`. Before, nothing said the second attempt's `trainer:2` was not recorded;
    now a warning goes to stderr and on the event lines (what `mpjob run` shows), once."""
    from mpjob_contract.tracking import IMAGE_ENV

    monkeypatch.setenv(IMAGE_ENV, "trainer:1")
    first = tracker_for(uri)
    step(first, 5, "fp16")
    opened(uri, first, attempts=1)
    first.close(42)
    monkeypatch.setenv(IMAGE_ENV, "trainer:2")
    lines = io.StringIO()
    second = tracker_for(uri, lines, attempt=1)
    step(second, 10, "bf16")
    job, _ = opened(uri, second, attempts=2)
    second.close(0)
    assert job.data.params["image"] == "trainer:1"
    said = "ParamsKept: the job's run keeps the params it began with (MLflow keeps a param's first value), "
    said += "not this attempt's: image 'trainer:1' (this attempt: 'trainer:2')"
    assert told(lines) == [said]
    assert capsys.readouterr().err.count(said) == 1


def test_params_kept_names_the_first_five_that_differ() -> None:
    from mpjob_trainer.tracking.records import params_kept

    held = {f"p{i}": "a" for i in range(7)} | {"same": "x"}
    assert params_kept(held, {"same": "x", "new": "y"}) is None  # nothing held otherwise
    said = params_kept(held, {f"p{i}": "b" for i in range(7)} | {"same": "x"})
    assert said is not None and said.endswith("p4 'a' (this attempt: 'b'); and 2 more") and "p5" not in said
