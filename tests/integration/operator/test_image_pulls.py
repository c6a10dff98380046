"""A trainer image the kubelet cannot pull, on the real control plane: the test node agent's
registry (tests/cluster/nodeagent/registry.py) fails pulls from a host while a ConfigMap of the
job's namespace says so, in the kubelet's words (ErrImagePull, then ImagePullBackOff). Before,
the first failed pull failed the job for good; now it waits, PodsCreated=False naming the
registry's answer and spec.image, runs in the same attempt once the registry answers, and fails
after runPolicy.podCreationTimeoutSeconds when it never does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.nodeagent.registry import REGISTRY_FAULTS
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_config_error import held
from tests.integration.operator.test_hostile_children import condition, standin

pytestmark = pytest.mark.integration

REGISTRY = "registry.example"
IMAGE = f"{REGISTRY}:5000/team/trainer:2"
THROTTLED = "unexpected status from HEAD request: 429 Too Many Requests"


def registry_fails(jobs: Jobs, error: str | None) -> None:
    """Make the namespace's pulls from REGISTRY fail with `error`, or (None) succeed again."""
    body: dict[str, Any] = {"metadata": {"name": REGISTRY_FAULTS}, "data": {REGISTRY: error}}
    if error is None:
        jobs.core.delete_namespaced_config_map(REGISTRY_FAULTS, jobs.namespace)
    else:
        jobs.core.create_namespaced_config_map(jobs.namespace, body)


def test_a_registry_that_throttles_holds_the_job_until_it_answers_in_the_same_attempt(
    operator: Operator, jobs: Jobs
) -> None:
    registry_fails(jobs, THROTTLED)
    jobs.create("throttled", standin(steps=4, image=IMAGE))
    status = held(jobs, "throttled")
    said = condition(status, "PodsCreated")
    assert said["reason"] == "ImagePullBackOff" and status["phase"] == "Pending", status
    assert THROTTLED in said["message"] and f"spec.image={IMAGE!r}" in said["message"], said
    events = jobs.events("throttled", "ImagePullBackOff")
    assert [e.message for e in events if e.reason == "ImagePullBackOff"] == [said["message"]]
    registry_fails(jobs, None)
    status = jobs.wait_phase("throttled", ("Failed", "Succeeded"), 90)
    assert status["phase"] == "Succeeded", status
    assert len(status["attempts"]) == 1 and condition(status, "PodsCreated")["status"] == "True", status


def test_a_registry_that_never_answers_fails_the_job_after_the_pod_creation_timeout(
    operator: Operator, jobs: Jobs
) -> None:
    registry_fails(jobs, "dial tcp: lookup registry.example: no such host")
    jobs.create("unreachable", standin(image=IMAGE, runPolicy={"podCreationTimeoutSeconds": 20}))
    assert condition(held(jobs, "unreachable"), "PodsCreated")["reason"] == "ImagePullBackOff"
    status = jobs.wait_phase("unreachable", ("Failed", "Succeeded", "Running"), 90)
    assert status["phase"] == "Failed", status
    assert condition(status, "Failed")["reason"] == "PodCreationTimeout", status
    assert "no such host" in status["message"] and IMAGE in status["message"], status
