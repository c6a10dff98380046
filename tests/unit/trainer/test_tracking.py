"""Experiment tracking in the trainer: what an attempt tells MLflow (params, metrics, tags,
from the event lines), and that logging never holds up or ends training: a tracking server
that refuses or never answers costs the training thread nothing, and is counted."""

from __future__ import annotations

import io
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mpjob_contract import metrics as names
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.tracking import QUEUE_SIZE, RunTracker, track
from mpjob_trainer.tracking.records import job_key, job_params, run_status, update_for
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.unit


def launch(uri: str, **over: object) -> AttemptLaunch:
    spec = MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "mlp"},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "lossScale": {"init": 512}},
            "tracking": {"mlflow": {"uri": uri}},
        }
    )
    return AttemptLaunch(job_name="j", namespace="ns", precision="fp16", spec=spec, **over)  # type: ignore[arg-type]


def test_params_name_the_precision_ladder_and_loss_scaling() -> None:
    params = job_params(launch("http://x:1"), digest="abc", image="reg/trainer:1")
    assert params["precision.ladder"] == "fp16,bf16,fp32" and params["lossScale.init"] == "512.0"
    assert params["configDigest"] == "abc" and params["image"] == "reg/trainer:1"
    assert job_key(launch("http://x:1", job_uid="u-1")) == "u-1"
    local = job_key(launch("http://x:1", checkpoint_dir="/a"))
    assert local.startswith("local-") and local != job_key(launch("http://x:1", checkpoint_dir="/b"))


def test_event_lines_become_metrics_and_tags() -> None:
    step = update_for("step", {"time": 2.0, "step": 10, "loss": 3.5, "lossScale": 256.0, "gradNorm": None}, attempt=0)
    assert step is not None
    assert {(p.key, p.value, p.step, p.timestamp_ms) for p in step.metrics} == {
        ("loss", 3.5, 10, 2000),
        ("loss_scale", 256.0, 10, 2000),
    }
    evaluated = update_for("eval", {"step": 20, "loss": 2.0, "lossFp32": 1.9, "delta": 0.05}, attempt=0)
    assert evaluated is not None
    assert {p.key for p in evaluated.metrics} == {"eval_loss", "eval_loss_fp32", "eval_loss_delta"}
    fault = update_for("fault", {"step": 31, "rule": "LossScaleCollapsed", "message": "scale 0.5"}, attempt=2)
    assert fault is not None and "LossScaleCollapsed" in fault.attempt_tags["mpjob.fallbackReason"]
    assert "mpjob.fallback.attempt2" in fault.job_tags
    assert update_for("checkpoint", {"step": 10}, attempt=0) is None
    skip = {"time": 3.0, "cause": "spike", "steps": [41, 42], "fromStep": 40, "skippedSteps": 3}
    skipped = update_for("dataSkipped", skip, attempt=1)
    assert skipped is not None and [(p.key, p.value, p.step) for p in skipped.metrics] == [("skipped_steps", 3.0, 42)]
    said = "spike: steps 41, 42 skipped, trained on from the checkpoint at step 40 (3 steps skipped so far)"
    assert skipped.attempt_tags == {"mpjob.skipped": said} and skipped.job_tags == {"mpjob.skipped.attempt1": said}
    assert update_for("dataSkipped", {**skip, "steps": ["41"]}, attempt=1) is None  # nothing it can name
    assert [run_status(c) for c in (0, 42, 44)] == ["FINISHED", "FAILED", "KILLED"]


@pytest.fixture
def black_hole() -> Iterator[socket.socket]:
    """A server that never answers: a listening socket that accepts nothing (a client's
    connection completes in its backlog and its request waits) until the test closes it (then
    the connection is reset and the request fails at once)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4096)
        yield server


def held(server: socket.socket) -> bool:
    """Whether a client's connection waits in the server's backlog (the listener is readable)."""
    return bool(select.select([server], [], [], 0)[0])


def failures(metrics: TrainerMetrics) -> float:
    return metrics.registry.get_sample_value(names.TRACKING_FAILURES + "_total", metrics.labels) or 0.0


def dropped(metrics: TrainerMetrics) -> float:
    return metrics.registry.get_sample_value(names.TRACKING_DROPPED + "_total", metrics.labels) or 0.0


@pytest.mark.process
@pytest.mark.timeout(180)  # a put or a close that waited for the held thread would hang here
def test_a_server_that_never_answers_costs_the_training_thread_nothing(
    black_hole: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No client timeout within reach: the tracking thread stays in its first request, and takes
    # nothing from the queue, until the test closes the server; no clock decides the outcome.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3600")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "0.5")
    metrics = TrainerMetrics("j", "ns", 0, "fp16")
    port = black_hole.getsockname()[1]
    lines = io.StringIO()
    tracker = RunTracker(launch(f"http://127.0.0.1:{port}"), digest="d", metrics=metrics, log=EventLog(0, lines))
    wait_for(lambda: held(black_hole), 120, 0.01, message="the tracking thread's first request")
    cpu = time.thread_time()  # this thread's CPU: a starved machine does not add to it
    for step in range(1, 2 * QUEUE_SIZE):
        tracker("step", {"time": 1.0, "step": step, "loss": 1.0})
    assert time.thread_time() - cpu < 2.0
    assert dropped(metrics) == QUEUE_SIZE - 1  # the queue filled, then every put dropped: none waited
    tracker.close(0)  # bounded by its own deadline: the server still holds the request
    assert dropped(metrics) == QUEUE_SIZE  # the end too, on a full queue
    # The line after the attempt's last says so (`mpjob run` shows it): its runs were not ended.
    assert failures(metrics) == 1 and [json.loads(line)["error"] for line in lines.getvalue().splitlines()] == [
        "TimeoutError: the attempt's runs not ended within 0.5 s (MPJOB_TRACKING_CLOSE_SECONDS): they may stay RUNNING"
    ]
    black_hole.close()
    wait_for(lambda: failures(metrics) >= 2, 60, message="the held request counted as a failure")


def test_a_refused_server_is_counted_and_never_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    # close waits for the tracking thread to end, however slowly it runs: its failure, and the
    # line it prints after counting it, are in when close returns.
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "600")
    metrics = TrainerMetrics("j", "ns", 0, "fp16")
    lines = io.StringIO()
    log = EventLog(0, lines)
    tracker = track(launch(f"http://127.0.0.1:{free_port()}"), rank0=True, digest="d", metrics=metrics, log=log)
    assert tracker is not None
    log.listeners.append(tracker)
    tracker("step", {"time": 1.0, "step": 1, "loss": float("nan")})
    tracker.close(42)
    assert failures(metrics) >= 1
    assert "mpjob: tracking failed" in capsys.readouterr().err
    for step in range(2, 5):  # told once: at the end when no line came after it, and never again
        log("step", step=step, loss=1.0)
    told = [json.loads(line) for line in lines.getvalue().splitlines() if '"trackingFailed"' in line]
    assert len(told) == 1 and told[0]["error"], lines.getvalue()
    assert track(launch("http://x:1"), rank0=False, digest="d", metrics=metrics) is None


def test_a_password_in_the_tracking_uri_is_never_printed_or_told(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URI that carries its credentials (http://user:password@host) reaches the server with
    them; a failure's message, on stderr and on the event lines, says the URI without them."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "600")
    metrics = TrainerMetrics("j", "ns", 0, "fp16")
    lines = io.StringIO()
    uri = f"http://alice:s3cr3t-pw@127.0.0.1:{free_port()}"
    tracker = RunTracker(launch(uri), digest="d", metrics=metrics, log=EventLog(0, lines))
    tracker("step", {"time": 1.0, "step": 1, "loss": 1.0})
    tracker.close(42)
    told = lines.getvalue() + capsys.readouterr().err
    assert failures(metrics) >= 1 and "127.0.0.1" in told and "trackingFailed" in told
    assert "s3cr3t" not in told and "alice" not in told, told


@pytest.mark.process
def test_mlflows_usage_telemetry_is_off_in_a_trainer_that_tracks() -> None:
    """A process outside CI and tests (where MLflow turns it off by itself) that opens the
    tracking client: MLflow starts no telemetry client (and no thread fetching its settings)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_CURRENT_TEST", "GITHUB_ACTIONS")}
    env.pop("MLFLOW_DISABLE_TELEMETRY", None)
    code = (
        "from mpjob_trainer.tracking.mlflow_run import MlflowRuns\n"
        "MlflowRuns(uri='http://127.0.0.1:1', experiment='e', key='k')\n"
        "from mlflow.telemetry.client import get_telemetry_client\n"
        "print(get_telemetry_client())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "None", out.stdout
