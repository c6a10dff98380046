"""A job stuck Pending edited as its PodsScheduled condition says, on the real control plane:
the field it names (resources.gpusPerWorker, template.nodeSelector, the checkpoint claim's name,
or, held by CreateContainerConfigError, template.env; by an image it cannot pull, spec.image) is
taken by the API server,
and the attempt whose pods never started is made again from the edited spec, without a new
job. Before, the edit was read (observedGeneration) and nothing else happened: the attempt's
Job kept asking for what no node has until the job was suspended and resumed or recreated."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_hostile_children import condition, standin
from tests.integration.operator.test_image_pulls import IMAGE, registry_fails

pytestmark = pytest.mark.integration


MISSING_KEY = {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "nowhere", "key": "token"}}}


@pytest.mark.parametrize(
    ("name", "over", "edit", "held_by"),
    [
        ("gpus", {"resources": {"gpusPerWorker": 16}}, {"resources": {"gpusPerWorker": 0}}, "PodsScheduled"),
        (
            "selector",
            {"template": {"nodeSelector": {"pool": "no"}}},
            {"template": {"nodeSelector": None}},
            "PodsScheduled",
        ),
        (
            "claim",
            {"checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "typo"}}}},
            {"checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}},
            "PodsScheduled",
        ),
        (
            "env",
            {"template": {"env": [MISSING_KEY]}},
            {"template": {"env": [{"name": "TOKEN", "value": "t"}]}},
            "PodsCreated",
        ),
        ("image", {"image": IMAGE}, {"image": "ghcr.io/team/trainer:2"}, "PodsCreated"),
    ],
)
def test_the_field_a_held_job_names_edited_starts_it_in_the_same_job(
    operator: Operator, jobs: Jobs, name: str, over: dict[str, Any], edit: dict[str, Any], held_by: str
) -> None:
    jobs.pvc("ckpt")
    registry_fails(jobs, "manifest unknown")  # IMAGE's registry: the other cases pull from none
    jobs.create(name, standin(**over))
    jobs.wait_status(name, lambda s: condition(s, held_by).get("status") == "False", 60, f"{held_by}=False")
    jobs.patch_spec(name, edit)
    status = jobs.wait_status(name, lambda s: s.get("phase") == "Running", 60, "the edited job runs")
    assert condition(status, held_by)["status"] == "True", status
    (attempt,) = status["attempts"]
    assert attempt["index"] == 0 and status["attemptCounts"]["charged"] == 0, status
    assert status["observedGeneration"] == 2 and jobs.attempt_jobs(name) == [f"{name}-a0"]
    (said,) = [e.message for e in jobs.events(name, "JobRecreated") if e.reason == "JobRecreated"]
    assert "pods never started and the spec changed (generation 1 -> 2)" in said


def test_an_edit_made_while_the_operator_is_down_is_picked_up_by_the_next_one(operator: Operator, jobs: Jobs) -> None:
    """Read from the Job (the generation it was made from), not from an edit seen happening: an
    operator upgraded or restarted meanwhile makes the attempt's Job again all the same."""
    jobs.create("offline", standin(resources={"gpusPerWorker": 16}))
    jobs.wait_status("offline", lambda s: condition(s, "PodsScheduled").get("status") == "False", 60, "unscheduled")
    operator.stop()
    jobs.patch_spec("offline", {"resources": {"gpusPerWorker": 0}})
    operator.start()
    status = jobs.wait_status("offline", lambda s: s.get("phase") == "Running", 60, "the edited job runs")
    assert [a["index"] for a in status["attempts"]] == [0] and jobs.attempt_jobs("offline") == ["offline-a0"]
