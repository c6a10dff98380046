"""spec.elastic on the real control plane: a 3-worker job (a GPU each) on a cluster whose GPU
node holds 2. The third pod stays unschedulable (the real scheduler says so on the pod); past
elastic.waitSeconds the operator ends the attempt ScaledDown, uncharged, and the next attempt
runs with the 2 workers that fit, in the same precision and with the same global batch, to
Succeeded."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import Jobs, Operator, gpt_spec

pytestmark = pytest.mark.integration


def test_pods_unschedulable_past_wait_seconds_shrink_the_job_to_the_workers_that_fit(
    operator: Operator, jobs: Jobs
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=30, workers=3, elastic={"minWorkers": 2, "waitSeconds": 5})
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    jobs.create("elastic", spec)
    status = jobs.wait_phase("elastic", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["worldSize"], first["reason"], first["charged"]) == (3, "ScaledDown", False)
    assert "pods unschedulable for" in first["message"] and "3 -> 2" in first["message"]
    assert (second["precision"], second["worldSize"], second["reason"]) == ("bf16", 2, "Succeeded")
    assert second["worldSize"] * second["microBatch"] * second["gradAccumulation"] == 3 * 4  # the global batch
    assert status["workers"] == 2 and status["attemptCounts"]["charged"] == 1
    job = jobs.batch.read_namespaced_job("elastic-a1", jobs.namespace)
    assert (job.spec.completions, job.spec.parallelism) == (2, 2)
