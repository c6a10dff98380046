"""spec.elastic in a real Kueue queue: a ClusterQueue with quota for 2 `nvidia.com/gpu` holds a
3-worker elastic job's Job back (never admitted); past elastic.waitSeconds the operator ends that
attempt ScaledDown, uncharged, and the next one, with 2 workers, is admitted and trains. Raised
to 3, the quota grows the job back to 3 (ScaledUp, uncharged) at its next checkpoint, to
Succeeded. The job runs on the test cluster's GPU node of the `quota` pool, annotated to hold 3
GPUs meanwhile (the test node agent reports it), so the scheduler never limits it: only the
quota does, and no other test's pod takes those GPUs.

On the test cluster the module starts Kueue itself (`tests.cluster.controlplane.start_kueue`);
against a cluster named by $KUBECONFIG it needs Kueue installed there and is skipped otherwise.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.nodes import GPUS_ANNOTATION, placement
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator

GPU = "nvidia.com/gpu"

pytestmark = pytest.mark.integration

KUEUE = ("kueue.x-k8s.io", "v1beta1")
GPU_NODE = "gpu-node-quota"


def _quota(gpus: int) -> list[dict[str, Any]]:
    return [{"name": "cpu", "nominalQuota": 64}, {"name": "memory", "nominalQuota": "512Gi"},
            {"name": GPU, "nominalQuota": gpus}]  # fmt: skip


@pytest.fixture
def cluster_queue(kueue: None, api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue with quota for 2 GPUs, a LocalQueue `team-a`; the GPU
    node holds 3 GPUs meanwhile."""
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    name = f"elastic-{uuid.uuid4().hex[:6]}"
    version = "/".join(KUEUE)
    custom.create_cluster_custom_object(*KUEUE, "resourceflavors", {"apiVersion": version, "kind": "ResourceFlavor",
                                                                    "metadata": {"name": name}})  # fmt: skip
    group = {"coveredResources": ["cpu", "memory", GPU], "flavors": [{"name": name, "resources": _quota(2)}]}
    spec = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}, "resourceGroups": [group]}
    queue = {"apiVersion": version, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}
    custom.create_cluster_custom_object(*KUEUE, "clusterqueues", queue)
    local = {"apiVersion": version, "kind": "LocalQueue", "metadata": {"name": "team-a"},
             "spec": {"clusterQueue": name}}  # fmt: skip
    custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", local)
    before = core.read_node(GPU_NODE).status.allocatable.get(GPU)
    core.patch_node(GPU_NODE, {"metadata": {"annotations": {GPUS_ANNOTATION: "3"}}})
    wait_for(lambda: core.read_node(GPU_NODE).status.allocatable.get(GPU) == "3", 30, message="3 GPUs on the node")
    yield name
    core.patch_node(GPU_NODE, {"metadata": {"annotations": {GPUS_ANNOTATION: None}}})
    # The next test sees the node as it was (the agent's next heartbeat reports it).
    wait_for(lambda: core.read_node(GPU_NODE).status.allocatable.get(GPU) == before, 30, message="the node's GPUs back")
    for plural in ("clusterqueues", "resourceflavors"):
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(*KUEUE, plural, name)


def test_a_queue_short_of_quota_shrinks_the_job_and_a_raised_quota_grows_it(
    operator: Operator, jobs: Jobs, cluster_queue: str
) -> None:
    jobs.pvc("ckpt")
    spec = {
        "workers": 3,
        "task": {"builtin": "mlp", "args": {"stepDelay": {"bf16": 0.1}}},
        "training": {"steps": 120, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        "elastic": {"minWorkers": 1, "waitSeconds": 5},
        "resources": {"gpusPerWorker": 1},
        "runPolicy": {"queueName": "team-a"},
        "template": placement("quota"),
    }
    jobs.create("queued", spec)

    def training_at_two(status: dict[str, Any]) -> bool:
        return status.get("attempt") == 1 and status.get("phase") == "Running" and status.get("step", 0) >= 5

    jobs.wait_status("queued", training_at_two, 180, "attempt 1 training on 2 workers")
    jobs.custom.patch_cluster_custom_object(*KUEUE, "clusterqueues", cluster_queue, {"spec": {"resourceGroups": [
        {"coveredResources": ["cpu", "memory", GPU], "flavors": [{"name": cluster_queue, "resources": _quota(3)}]}
    ]}})  # fmt: skip
    status = jobs.wait_phase("queued", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    sizes = [(a["worldSize"], a["reason"], a["charged"]) for a in status["attempts"]]
    assert sizes == [(3, "ScaledDown", False), (2, "ScaledUp", False), (3, "Succeeded", True)], status["attempts"]
    first, small, big = status["attempts"]
    assert "its Job waited for its queue's quota" in first["message"] and "3 -> 2" in first["message"]
    assert first["startStep"] == 0 and small["startStep"] == 0  # never admitted: nothing trained at 3
    assert big["startStep"] >= 20 and status["attemptCounts"]["charged"] == 1
    assert small["worldSize"] * small["microBatch"] * small["gradAccumulation"] == 3 * 4  # the global batch
