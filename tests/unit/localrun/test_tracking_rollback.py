"""spec.tracking.mlflow against a real MLflow tracking server when an attempt rolls back in
place (a poisoned sample skipped): the attempt's MLflow run holds each logged step once, in
order, as the local view does; the job's run, the whole timeline, has the steps trained again
after the skip again, later."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import mpjob_run_json
from tests.tracking.mlflow_server import mlflow_server, tracking_client
from tests.unit.localrun.test_data_rung import mlp
from tests.unit.localrun.test_run import BASE
from tests.unit.localrun.test_tracking_mlflow import PATIENT, client_history

pytestmark = pytest.mark.unit


@pytest.mark.process
def test_a_rollback_in_place_logs_each_step_once_in_the_attempts_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in PATIENT.items():
        monkeypatch.setenv(name, value)
    job = {**BASE, "metadata": {"name": "skipping"}, "spec": dict(BASE["spec"])}  # type: ignore[dict-item]
    job["spec"].update(
        task=mlp(nonFiniteSamples=[5]),
        training={"steps": 24, "batchSize": 8, "logEvery": 1},
        checkpoint={"everySteps": 10},
    )
    with mlflow_server(tmp_path / "mlflow") as uri:
        job["spec"]["tracking"] = {"mlflow": {"uri": uri, "experiment": "skips"}}
        events, report, _ = mpjob_run_json(tmp_path / "run", job, timeout=600)
        (skipped,) = report["skipped"]["steps"]
        assert len(report["attempts"]) == 1 and report["phase"] == "Succeeded"
        client = tracking_client(uri)
        runs = client.search_runs([client.get_experiment_by_name("skips").experiment_id])
        (job_run,) = [r for r in runs if r.data.tags.get("mpjob.level") == "job"]
        (attempt,) = [r for r in runs if r.data.tags.get("mpjob.level") == "attempt"]
        logged = [e["step"] for e in events if e.get("event") == "step"]
        again = [s for i, s in enumerate(logged) if s in logged[:i]]
        assert again, (skipped, logged)  # the rollback trained steps it had logged again
        steps = [s for s, _ in client_history(uri, attempt.info.run_id, "loss")]
        assert steps == sorted(set(steps)) == list(range(1, 25)), (skipped, steps)  # each once, in order
        assert [s for s, _ in client_history(uri, job_run.info.run_id, "loss")] == logged  # the timeline
        # The skip itself is on record: which step, why, and from where training went on.
        said = f"data: step {skipped['step']} skipped, trained on from the checkpoint at step 0 (1 step skipped so far)"
        assert attempt.data.tags.get("mpjob.skipped") == said, attempt.data.tags
        assert job_run.data.tags.get("mpjob.skipped.attempt0") == said, job_run.data.tags
        assert client_history(uri, attempt.info.run_id, "skipped_steps") == [(skipped["step"], 1.0)]
