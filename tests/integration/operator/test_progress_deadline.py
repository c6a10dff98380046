"""runPolicy.progressDeadlineSeconds on the real control plane: an attempt whose data loader
hangs at step 25 (its metrics endpoint answers on, showing a step that no longer moves) is
ended Stalled once its step has stood still 30 s as the operator's reads saw, its pod stopped
(SIGTERM, then SIGKILL: the hung rank cannot act on it), and the next attempt goes on in the
same precision from the step-20 checkpoint to Succeeded."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import Jobs, Operator

pytestmark = pytest.mark.integration


def test_an_attempt_whose_step_stands_still_past_its_deadline_is_stopped_and_retried(
    operator: Operator, jobs: Jobs
) -> None:
    jobs.pvc("ckpt")
    spec = {
        "task": {
            "module": "tests.unit.localrun.stall_task:make_task",
            "args": {"inputs": 8, "hidden": 16, "samples": 256, "hangAfter": {"0": 25 * 4}},
        },
        "training": {"steps": 40, "batchSize": 4, "logEvery": 1},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 10, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": {"progressDeadlineSeconds": 30},
    }
    jobs.create("hung", spec)
    status = jobs.wait_phase("hung", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["charged"]) == ("bf16", "Stalled", True), first
    assert "has not moved for" in first["message"] and "progressDeadlineSeconds=30" in first["message"]
    assert first["endStep"] == 25, first  # the last step its reads showed
    assert (second["precision"], second["startStep"], second["reason"]) == ("bf16", 20, "Succeeded")
    assert status["step"] == 40
