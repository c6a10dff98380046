"""Pods whose container the kubelet cannot make, on the real control plane: a checkpoint bucket's
credentialsSecret that does not exist, or lacks a key, holds the trainer pod Pending with its
container waiting (CreateContainerConfigError), as a kubelet does. Before, the job said only
"waiting for its pods" for good; now PodsCreated=False carries the kubelet's words and the field
naming the Secret, a Warning Event says it once, the job starts once the Secret is made, and
fails after runPolicy.podCreationTimeoutSeconds when it is not."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.cluster.s3 import CREDENTIALS, S3Server
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_hostile_children import condition, standin

pytestmark = pytest.mark.integration

FIELD = "checkpoint.storage.s3.credentialsSecret"


def bucket_spec(server: S3Server, secret: str, **over: Any) -> dict[str, Any]:
    s3 = {"bucket": server.bucket, "prefix": f"config-{secret}", "endpoint": server.endpoint}
    return standin(checkpoint={"storage": {"s3": {**s3, "credentialsSecret": secret}}}, **over)


def make_secret(jobs: Jobs, name: str, data: dict[str, str]) -> None:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": name}, "data": encoded})


def held(jobs: Jobs, name: str) -> dict[str, Any]:
    return jobs.wait_status(
        name, lambda s: condition(s, "PodsCreated").get("status") == "False", 60, "PodsCreated=False"
    )


def test_a_credentials_secret_that_does_not_exist_is_named_and_the_job_starts_once_it_is_made(
    operator: Operator, jobs: Jobs, s3_server: S3Server
) -> None:
    jobs.create("nosecret", bucket_spec(s3_server, "keys-later"))
    status = held(jobs, "nosecret")
    said = condition(status, "PodsCreated")
    assert said["reason"] == "CreateContainerConfigError" and status["phase"] == "Pending", status
    assert 'secret "keys-later" not found' in said["message"] and FIELD in said["message"]  # the kubelet's words
    events = jobs.events("nosecret", "CreateContainerConfigError")
    assert [e.message for e in events if e.reason == "CreateContainerConfigError"] == [said["message"]]
    make_secret(jobs, "keys-later", CREDENTIALS)
    status = jobs.wait_status(
        "nosecret", lambda s: s.get("phase") == "Running", 90, "the job runs once its Secret exists"
    )
    assert condition(status, "PodsCreated")["status"] == "True"


def test_a_credentials_secret_without_its_key_fails_the_job_after_the_pod_creation_timeout(
    operator: Operator, jobs: Jobs, s3_server: S3Server
) -> None:
    make_secret(jobs, "half-keys", {"AWS_SECRET_ACCESS_KEY": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]})
    jobs.create("nokey", bucket_spec(s3_server, "half-keys", runPolicy={"podCreationTimeoutSeconds": 20}))
    said = condition(held(jobs, "nokey"), "PodsCreated")
    missing = f"couldn't find key AWS_ACCESS_KEY_ID in Secret {jobs.namespace}/half-keys"
    assert said["reason"] == "CreateContainerConfigError" and missing in said["message"], said
    assert FIELD in said["message"]
    status = jobs.wait_phase("nokey", ("Failed", "Succeeded", "Running"), 90)
    assert status["phase"] == "Failed", status
    assert condition(status, "Failed")["reason"] == "PodCreationTimeout" and missing in status["message"]
