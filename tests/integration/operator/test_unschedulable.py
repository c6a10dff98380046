"""Pods the scheduler finds no node for, on the real control plane: a checkpoint claim that does
not exist, more GPUs than any node has, a nodeSelector no node matches. Before, the job said
"waiting for its pods" for as long as that lasted; now PodsScheduled=False carries the
scheduler's words and the field to change within seconds, a Warning Event says it, and the job
starts by itself once the cause is gone (the claim created)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_hostile_children import condition, standin

pytestmark = pytest.mark.integration


def unscheduled(jobs: Jobs, name: str) -> dict[str, Any]:
    return jobs.wait_status(
        name, lambda s: condition(s, "PodsScheduled").get("status") == "False", 60, "PodsScheduled=False"
    )


def test_a_checkpoint_claim_that_does_not_exist_is_named_and_the_job_starts_once_it_is_made(
    operator: Operator, jobs: Jobs
) -> None:
    jobs.create("noclaim", standin(checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "made-later"}}}))
    status = unscheduled(jobs, "noclaim")
    said = condition(status, "PodsScheduled")
    assert said["reason"] == "Unschedulable" and status["phase"] == "Pending", status
    assert 'persistentvolumeclaim "made-later" not found' in said["message"]  # the scheduler's words
    assert "checkpoint.volume.persistentVolumeClaim.claimName" in said["message"]
    events = jobs.events("noclaim", "Unschedulable")
    assert [e.message for e in events if e.reason == "Unschedulable"] == [said["message"]]
    jobs.pvc("made-later")
    status = jobs.wait_status(
        "noclaim", lambda s: s.get("phase") == "Running", 90, "the job runs once its claim exists"
    )
    assert condition(status, "PodsScheduled")["status"] == "True"


@pytest.mark.parametrize(
    ("name", "over", "field"),
    [
        ("gpus", {"resources": {"gpusPerWorker": 16}}, "resources.gpusPerWorker=16"),
        ("selector", {"template": {"nodeSelector": {"pool": "nowhere"}}}, "template.nodeSelector={'pool': 'nowhere'}"),
    ],
)
def test_pods_no_node_can_take_name_the_field_that_asks_for_it(
    operator: Operator, jobs: Jobs, name: str, over: dict[str, Any], field: str
) -> None:
    jobs.create(name, standin(**over))
    status = unscheduled(jobs, name)
    assert status["phase"] == "Pending" and field in condition(status, "PodsScheduled")["message"], status
