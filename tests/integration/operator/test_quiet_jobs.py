"""A job that waits on nothing costs the API server nothing: the ticker reconciled every
suspended job once per tick (a GET of the job each time: 12 a minute per job at the chart's
5 s tick, with nothing to do until its spec changes). A job suspended as its spec asks, with no
children left, is left alone until it is edited; the edit wakes it at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_for
from tests.integration.operator.conftest import Jobs, Operator, operator_samples

pytestmark = pytest.mark.integration

RECONCILES = "mpjob_operator_reconcile_duration_seconds_count"
SPEC = {
    "task": {"builtin": "mlp"},
    "training": {"steps": 4, "logEvery": 2},
    "precision": {"mode": "fp32"},
    "resources": {"gpusPerWorker": 0},
    "runPolicy": {"suspend": True},
}


def test_a_suspended_job_is_not_reconciled_every_tick_until_it_is_edited(
    kubeconfig: str, namespace: str, crd_installed: None, jobs: Jobs, tmp_path: Path
) -> None:
    port = free_port()
    with Operator.running(kubeconfig, namespace, tmp_path / "operator.log", metrics_port=port):
        jobs.create("idle", SPEC)
        jobs.wait_phase("idle", "Suspended", 60)

        def counted(name: str) -> float | None:
            try:
                return operator_samples(port, name).get(name)
            except OSError:
                return None

        # A round of ticks has run since the job's reconcile: it publishes the phase it left.
        wait_for(lambda: counted('mpjob_operator_jobs{phase="Suspended"}') == 1.0, 30, 0.2, "a round of ticks")
        before = counted(RECONCILES)
        time.sleep(5)  # five 1 s ticks: an absence is seen only over a window
        assert counted(RECONCILES) == before, "a suspended job was reconciled by ticks"
        jobs.patch_spec("idle", {"runPolicy": {"suspend": False}})
        status = jobs.wait_phase("idle", ("Succeeded", "Failed"), 180)
    assert status["phase"] == "Succeeded" and len(status["attempts"]) == 1, status
