"""spec.tracking.mlflow against a real MLflow tracking server: a job that falls back once
(fp16 overflow -> bf16) is one MLflow run with the params, the loss-scale series and both
attempts as nested runs, read back through MLflow's own client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import mpjob_run_json
from tests.tracking.mlflow_server import mlflow_server, tracking_client

pytestmark = pytest.mark.unit

ARGS = {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000, "overflowAtStep": 15}


def job(uri: str) -> dict:
    return {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": "tracked"},
        "spec": {
            "task": {"builtin": "gpt", "args": ARGS},
            "training": {"steps": 40, "batchSize": 4, "logEvery": 5},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "lossScale": {"init": 1024}},
            "checkpoint": {"everySteps": 10},
            "resources": {"gpusPerWorker": 0},
            "tracking": {"mlflow": {"uri": uri, "experiment": "ladder"}},
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
        events, report, _ = mpjob_run_json(tmp_path / "run", job(uri), timeout=600)
        check_tracked(uri, events, report)


def check_tracked(uri: str, events: list[dict], report: dict) -> None:
    client = tracking_client(uri)
    experiment = client.get_experiment_by_name("ladder")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    attempts = [(a["precision"], a["reason"]) for a in report["attempts"]]
    assert attempts == [("fp16", "NumericFault"), ("bf16", "Succeeded")]
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
    assert not any(e.get("event") == "error" for e in events)


def client_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in tracking_client(uri).get_metric_history(run_id, key)]
