"""spec.elastic on the real control plane: a 3-worker job (a GPU each) on a GPU node that holds
2. The GPU jobs here run on the test cluster's GPU node of their own (EXCLUSIVE_PLACEMENT), so
the GPUs they count are theirs and a blocker's, never those of tests running beside them. The
third pod stays unschedulable (the real scheduler says so on the pod); past elastic.waitSeconds
the operator ends the attempt ScaledDown, uncharged, and the next attempt runs with the 2
workers that fit, in the same precision (fp16) and with the same global batch; an fp16 fault
there falls back to bf16 on those 2 workers, to Succeeded. With a GPU held by another pod, a
2-worker job shrinks to 1 and grows back to 2 at its first checkpoint after that GPU frees.

Under a ResourceQuota of one GPU, a 2-worker job whose second pod the quota refuses shrinks to
1 and stays so while the node has room, then grows back to 2 once the quota is raised.

A node lost: test_node_loss.py; a queue short of quota: test_elastic_queue.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.nodes import EXCLUSIVE_PLACEMENT
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
        # 0.1 s a step: the 1-worker attempt has about 29 s left once the GPU frees, for the
        # operator to see it and stop that attempt at a checkpoint, on a starved machine too.
        "training": {"steps": 300, "batchSize": 4, "logEvery": 5},
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


def _gpu_quota(jobs: Jobs, gpus: int) -> None:
    """The namespace's ResourceQuota of `gpus` GPUs, once the quota controller has counted it
    (the API server admits pods against a quota only then)."""
    body = {"metadata": {"name": "gpus"}, "spec": {"hard": {f"requests.{GPU}": str(gpus)}}}
    try:
        jobs.core.create_namespaced_resource_quota(jobs.namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        jobs.core.patch_namespaced_resource_quota("gpus", jobs.namespace, body)

    def counted() -> bool:
        hard = jobs.core.read_namespaced_resource_quota("gpus", jobs.namespace).status.hard or {}
        return hard.get(f"requests.{GPU}") == str(gpus)

    wait_for(counted, 30, message=f"the quota of {gpus} GPU(s) counted")


def test_a_job_a_quota_shrank_stays_small_until_the_quota_is_raised(operator: Operator, jobs: Jobs) -> None:
    _gpu_quota(jobs, 1)
    jobs.pvc("ckpt")
    spec = {
        "workers": 2,
        "task": {"builtin": "mlp", "args": {"stepDelay": {"bf16": 0.1}}},
        "training": {"steps": 400, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 20, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        "elastic": {"minWorkers": 1, "waitSeconds": 5},
        "resources": {"gpusPerWorker": 1},
        "template": EXCLUSIVE_PLACEMENT,  # a node of 2 GPUs: room for both workers, not quota
    }
    jobs.create("quota", spec)

    def small_past_two_checkpoints(status: dict[str, Any]) -> bool:
        return status.get("attempt") == 1 and status.get("phase") == "Running" and status.get("step", 0) >= 45

    # Two checkpoints past its start with the node's second GPU free: had the quota not capped
    # the room, the attempt would have ended ScaledUp at the first.
    status = jobs.wait_status("quota", small_past_two_checkpoints, 240, "attempt 1 training on 1 worker")
    first = status["attempts"][0]
    assert (first["reason"], first["charged"], first["worldSize"]) == ("ScaledDown", False, 2), first
    assert "refused by a ResourceQuota" in first["message"] and "2 -> 1" in first["message"]
    _gpu_quota(jobs, 2)
    status = jobs.wait_phase("quota", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    sizes = [(a["worldSize"], a["reason"], a["charged"]) for a in status["attempts"]]
    assert sizes == [(2, "ScaledDown", False), (1, "ScaledUp", False), (2, "Succeeded", True)], status["attempts"]
    assert status["attempts"][2]["startStep"] >= 45
