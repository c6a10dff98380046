"""spec.elastic on the real control plane: a 3-worker job (a GPU each) on a GPU node that holds
2. The GPU jobs here run on the test cluster's GPU node of their own (EXCLUSIVE_PLACEMENT), so
the GPUs they count are theirs and a blocker's, never those of tests running beside them. The
third pod stays unschedulable (the real scheduler says so on the pod); past elastic.waitSeconds
the operator ends the attempt ScaledDown, uncharged, and the next attempt runs with the 2
workers that fit, in the same precision (fp16) and with the same global batch; an fp16 fault
there falls back to bf16 on those 2 workers, to Succeeded. With a GPU held by another pod, a
2-worker job shrinks to 1 and grows back to 2 at its first checkpoint after that GPU frees.

In a real Kueue queue (in this file, so that it never runs beside the tests above: it changes
that node's count): a ClusterQueue with quota for 2 `nvidia.com/gpu` holds a 3-worker elastic
job's Job back (never admitted); past elastic.waitSeconds the operator ends that attempt
ScaledDown, uncharged, and the next one, with 2 workers, is admitted and trains. Raised to 3,
the quota grows the job back to 3 (ScaledUp, uncharged) at its next checkpoint, to Succeeded.
The GPU node is annotated to hold 3 GPUs meanwhile (the test node agent reports it), so the
scheduler never limits it: only the quota does.

On the test cluster the module starts Kueue itself (`tests.cluster.controlplane.start_kueue`);
against a cluster named by $KUBECONFIG it needs Kueue installed there and is skipped otherwise.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.nodes import EXCLUSIVE_PLACEMENT, GPUS_ANNOTATION
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator, gpt_spec

GPU = "nvidia.com/gpu"

pytestmark = pytest.mark.integration


def test_pods_unschedulable_past_wait_seconds_shrink_the_job_and_the_ladder_goes_on_at_the_smaller_size(
    operator: Operator, jobs: Jobs
) -> None:
    """3 workers on a node with 2 GPUs: ScaledDown to 2 in fp16; an fp16 overflow on 2 workers
    then falls back to bf16 on 2, the global batch kept throughout."""
    jobs.pvc("ckpt")
    elastic = {"minWorkers": 2, "waitSeconds": 5}
    spec = gpt_spec("ckpt", steps=30, workers=3, elastic=elastic, template=EXCLUSIVE_PLACEMENT)
    spec["task"]["args"]["overflowAtStep"] = 15
    jobs.create("elastic", spec)
    status = jobs.wait_phase("elastic", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    rows = [(a["precision"], a["worldSize"], a["reason"], a["charged"]) for a in status["attempts"]]
    assert rows == [("fp16", 3, "ScaledDown", False), ("fp16", 2, "NumericFault", True), ("bf16", 2, "Succeeded", True)]
    first, faulted, last = status["attempts"]
    assert "pods unschedulable for" in first["message"] and "3 -> 2" in first["message"]
    assert first["startStep"] == faulted["startStep"] == 0 and 0 < last["startStep"] < 15  # its last good checkpoint
    for attempt in (faulted, last):
        assert attempt["worldSize"] * attempt["microBatch"] * attempt["gradAccumulation"] == 3 * 4  # the global batch
    assert status["workers"] == 2 and status["attemptCounts"]["charged"] == 2
    job = jobs.batch.read_namespaced_job("elastic-a2", jobs.namespace)
    assert (job.spec.completions, job.spec.parallelism) == (2, 2)


def _blocker(name: str) -> dict[str, Any]:
    """A pod that holds one GPU of the GPU node until it is deleted."""
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "hold", "image": "busybox", "command": ["sleep", "3600"], "resources": {"limits": {GPU: "1"}}}
            ],
            "nodeSelector": EXCLUSIVE_PLACEMENT["nodeSelector"],
            "tolerations": [
                {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
                *EXCLUSIVE_PLACEMENT["tolerations"],
            ],
            "terminationGracePeriodSeconds": 1,
        },
    }


def test_a_shrunk_job_grows_back_at_its_next_checkpoint_when_a_gpu_frees(operator: Operator, jobs: Jobs) -> None:
    jobs.core.create_namespaced_pod(jobs.namespace, _blocker("hold"))
    wait_for(lambda: jobs.core.read_namespaced_pod("hold", jobs.namespace).status.phase == "Running", 60)
    jobs.pvc("ckpt")
    spec = {
        "workers": 2,
        "task": {"builtin": "mlp", "args": {"stepDelay": {"bf16": 0.1}}},
        "training": {"steps": 150, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        # Long enough for the scheduler's retry after the smaller attempt's pod is gone (its first
        # try may find the GPU still taken, and backs off longer on a loaded machine).
        "elastic": {"minWorkers": 1, "waitSeconds": 10},
        "resources": {"gpusPerWorker": 1},
        "template": EXCLUSIVE_PLACEMENT,
    }
    jobs.create("grows", spec)

    def training_small(status: dict[str, Any]) -> bool:
        return status.get("attempt") == 1 and status.get("phase") == "Running" and status.get("step", 0) >= 10

    jobs.wait_status("grows", training_small, 240, "attempt 1 training on 1 worker")
    jobs.core.delete_namespaced_pod("hold", jobs.namespace)
    status = jobs.wait_phase("grows", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    sizes = [(a["worldSize"], a["reason"], a["charged"]) for a in status["attempts"]]
    assert sizes == [(2, "ScaledDown", False), (1, "ScaledUp", False), (2, "Succeeded", True)], status["attempts"]
    small, big = status["attempts"][1:]
    # Stopped after a checkpoint past the step where the GPU freed; SIGTERM makes the trainer
    # checkpoint where it stands, and the bigger attempt resumes there.
    assert big["startStep"] > small["startStep"] and big["startStep"] >= 20
    assert (small["microBatch"], small["gradAccumulation"], big["microBatch"], big["gradAccumulation"]) == (4, 2, 4, 1)


def test_a_node_lost_while_training_shrinks_the_job_at_once_from_the_last_checkpoint(
    operator: Operator, jobs: Jobs
) -> None:
    """The node of worker 2 goes away: its pod gets the taint manager's DisruptionTarget and is
    deleted, as when a node stays unreachable. The job goes on with 2 workers at once, from its
    newest checkpoint."""
    jobs.pvc("ckpt")
    spec = {
        "workers": 3,
        "task": {"builtin": "mlp", "args": {"stepDelay": {"bf16": 0.05}}},
        "training": {"steps": 120, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        "elastic": {"minWorkers": 2, "waitSeconds": 600},
        "resources": {"gpusPerWorker": 0},
    }
    jobs.create("lost", spec)
    wait_for(
        lambda: (jobs.status("lost").get("lastCheckpoint") or {}).get("step", 0) >= 20, 240, message="a checkpoint"
    )
    selector = "mpjob.dev/job=lost,mpjob.dev/attempt=0"
    (pod,) = [
        p.metadata.name
        for p in jobs.core.list_namespaced_pod(jobs.namespace, label_selector=selector).items
        if p.metadata.name.startswith("lost-a0-2-")
    ]
    gone = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByTaintManager",
        "message": "Taint manager: deleting due to NoExecute taint",
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    jobs.core.patch_namespaced_pod_status(pod, jobs.namespace, {"status": {"conditions": [gone]}})
    jobs.core.delete_namespaced_pod(pod, jobs.namespace)
    status = jobs.wait_phase("lost", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["worldSize"], first["reason"], first["charged"]) == (3, "ScaledDown", False), first
    assert "a node was lost" in first["message"]
    assert (second["precision"], second["worldSize"], second["reason"]) == ("bf16", 2, "Succeeded")
    # From the newest checkpoint: the last periodic one, or the one the trainers wrote on SIGTERM
    # (the deleted pod had its grace period; a node that vanishes gives none).
    assert second["startStep"] >= 20
    assert second["worldSize"] * second["microBatch"] * second["gradAccumulation"] == 3 * 4


KUEUE = ("kueue.x-k8s.io", "v1beta1")
GPU_NODE = "gpu-node-own"


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
        "template": EXCLUSIVE_PLACEMENT,
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
