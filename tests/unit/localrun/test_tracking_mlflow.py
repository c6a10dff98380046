"""spec.tracking.mlflow against a real MLflow tracking server: a job that falls back once
(fp16 overflow -> bf16) is one MLflow run with the params, the loss-scale series and both
attempts as nested runs, read back through MLflow's own client; the same whether the fallback
is made in place (one trainer process) or by a restart."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.helpers import free_port, mpjob_run_json
from tests.tracking.mlflow_server import mlflow_server, tracking_client
from tests.unit.localrun.test_run import manifest, mpjob_run

pytestmark = pytest.mark.unit

ARGS = {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000, "overflowAtStep": 15}


def job(uri: str, *, in_place: bool) -> dict:
    return {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": "tracked"},
        "spec": {
            "task": {"builtin": "gpt", "args": ARGS},
            "training": {"steps": 40, "batchSize": 4, "logEvery": 5},
            "precision": {
                "mode": "fp16",
                "fallback": ["bf16", "fp32"],
                "lossScale": {"init": 1024},
                "inPlace": in_place,
            },
            "checkpoint": {"everySteps": 10},
            "resources": {"gpusPerWorker": 0},
            "tracking": {"mlflow": {"uri": uri, "experiment": "in-place" if in_place else "restart"}},
        },
    }


#: The tracking client waits for a slow server as long as the run may take: a busy machine
#: makes the server answer late, and no shorter clock may drop what it was sent.
PATIENT = {"MPJOB_TRACKING_CLOSE_SECONDS": "600", "MLFLOW_HTTP_REQUEST_TIMEOUT": "600"}


@pytest.mark.process
def test_a_fallback_job_is_one_mlflow_run_with_both_attempts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in PATIENT.items():
        monkeypatch.setenv(name, value)
    with mlflow_server(tmp_path / "mlflow") as uri:
        events, report, out = mpjob_run_json(tmp_path / "in-place", job(uri, in_place=True), timeout=600)
        assert report["attempts"][1]["inPlace"] is True  # the fallback went on in the same process
        assert sorted(p.name for p in (out / "attempts").iterdir()) == ["a0"]
        in_place = check_tracked(uri, "in-place", events, report)
        events, report, _ = mpjob_run_json(tmp_path / "restart", job(uri, in_place=False), timeout=600)
        assert report["attempts"][1].get("inPlace") is None
        assert check_tracked(uri, "restart", events, report) == in_place  # tracked alike, however it recovered


@pytest.mark.process
def test_a_tracking_server_that_refuses_is_told_once_on_the_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training goes on without the server; the console says so once, rank 0's log every time."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    job = manifest(tmp_path, tracking={"mlflow": {"uri": f"http://127.0.0.1:{free_port()}"}})
    result = mpjob_run(str(job), "--out", str(tmp_path / "out"), "--plain")
    assert result.returncode == 0, result.stdout + result.stderr
    told = [line for line in result.stdout.splitlines() if "experiment tracking failed" in line]
    assert len(told) == 1 and "127.0.0.1" in told[0], result.stdout
    log = (tmp_path / "out" / "attempts" / "a0" / "worker0.log").read_text()
    assert "mpjob: tracking failed (1 so far)" in log


@pytest.mark.process
def test_a_tracking_server_that_never_answers_is_told_on_the_console_after_the_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server takes the trainer's requests and answers none (a listening socket that accepts
    nothing): training ends on time and the console says the runs were not ended."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3600")  # no client clock within reach
    monkeypatch.setenv("MPJOB_TRACKING_CLOSE_SECONDS", "1")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        result = mpjob_run(
            str(manifest(tmp_path, tracking={"mlflow": {"uri": uri}})), "--out", str(tmp_path / "o"), "--plain"
        )
    assert result.returncode == 0, result.stdout + result.stderr
    told = [line for line in result.stdout.splitlines() if "experiment tracking failed" in line]
    assert len(told) == 1 and "runs not ended within 1 s" in told[0], result.stdout


def check_tracked(uri: str, name: str, events: list[dict], report: dict) -> dict:
    """Check the job's MLflow runs; what a restart and a change in place must log alike."""
    client = tracking_client(uri)
    experiment = client.get_experiment_by_name(name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    attempts = [(a["precision"], a["reason"]) for a in report["attempts"]]
    assert attempts == [("fp16", "NumericFault"), ("bf16", "Succeeded")]
    assert not [r.data.tags for r in runs if r.info.status == "RUNNING"]  # every run ended
    jobs = [r for r in runs if r.data.tags.get("mpjob.level") == "job"]
    assert len(jobs) == 1, [r.data.tags for r in runs]
    parent = jobs[0]
    params = parent.data.params
    assert params["precision.mode"] == "fp16" and params["precision.ladder"] == "fp16,bf16,fp32"
    assert params["lossScale.init"] == "1024.0" and params["lossScale.backoffFactor"] == "0.5"
    assert len(params["configDigest"]) == 16 and "image" in params
    assert parent.info.status == "FINISHED" and parent.info.run_name == "tracked"
    assert any(tag.startswith("mpjob.fallback.attempt0") for tag in parent.data.tags)

    children = sorted(
        (r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
        key=lambda r: int(r.data.tags["mpjob.attempt"]),
    )
    assert [(r.data.tags["mpjob.attempt"], r.data.tags["mpjob.precision"]) for r in children] == [
        ("0", "fp16"),
        ("1", "bf16"),
    ]
    first, second = children
    assert first.info.status == "FAILED" and first.data.tags["mpjob.ending"] == "NumericFault"
    assert "fallbackReason" in json.dumps(first.data.tags) and second.info.status == "FINISHED"
    assert second.data.tags["mpjob.ending"] == "Succeeded"

    # The loss-scale series: fp16's scale, backed off as the overflow began, in both the
    # attempt's run and the job's timeline; bf16 has no scale to log.
    scale = client_history(uri, first.info.run_id, "loss_scale")
    assert scale and scale[0][1] == 1024.0 and min(v for _, v in scale) < 1024.0
    assert client_history(uri, second.info.run_id, "loss_scale") == []
    timeline = client_history(uri, parent.info.run_id, "loss_scale")
    assert timeline == scale
    losses = client_history(uri, second.info.run_id, "loss")
    assert losses and losses[-1][0] == 40
    # Each attempt's own steps; the job's timeline holds both, in the order they ran.
    restarted, faulted = report["attempts"][1]["startStep"], report["attempts"][0]["endStep"]
    first_steps = [s for s, _ in client_history(uri, first.info.run_id, "loss")]
    second_steps = [s for s, _ in losses]
    assert first_steps[-1] <= faulted and restarted < second_steps[0] <= faulted
    assert [s for s, _ in client_history(uri, parent.info.run_id, "loss")] == first_steps + second_steps
    assert not any(e.get("event") == "error" for e in events)
    tags = ("mpjob.attempt", "mpjob.precision", "mpjob.ending", "mpjob.fallbackReason")
    return {
        "job": (parent.info.status, {k: v for k, v in parent.data.tags.items() if k.startswith("mpjob.fallback")}),
        "attempts": [(r.info.status, [r.data.tags.get(t) for t in tags]) for r in children],
        "loss": [first_steps, second_steps],
        "loss_scale": [s for s, _ in scale],
    }


def client_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in tracking_client(uri).get_metric_history(run_id, key)]
