"""mpjob under a real Kueue, with the chart's RBAC: a ClusterQueue with one `nvidia.com/gpu` of
quota, a LocalQueue `team-a`, and jobs that wait for quota, get preempted by a higher-priority
workload and resume, and fall back fp16 -> bf16 with every attempt admitted.

On the test cluster the module starts Kueue itself (`tests.cluster.controlplane.start_kueue`:
built from its pinned Go module, cached); against a cluster named by $KUBECONFIG it needs
Kueue installed there and is skipped otherwise. Tests run in file order on one release.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from mpjob.builders.attempt import KUEUE_QUEUE_LABEL
from tests.e2e.conftest import Cli, Jobs, PhaseWatch, Release, cpu_sized, example, example_docs
from tests.helpers import paced, wait_for

pytestmark = pytest.mark.e2e

KUEUE = ("kueue.x-k8s.io", "v1beta1")
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


def _cluster_object(custom: client.CustomObjectsApi, plural: str, body: dict[str, Any]) -> None:
    custom.create_cluster_custom_object(*KUEUE, plural, body)


@pytest.fixture(scope="module")
def queue(kueue: None, custom: client.CustomObjectsApi, release_namespace: str) -> Iterator[str]:
    """ResourceFlavor, ClusterQueue (1 GPU; a higher priority preempts a lower one within it),
    LocalQueue `team-a` in the release's namespace, and a high WorkloadPriorityClass."""
    suffix = uuid.uuid4().hex[:6]
    flavor, cq, high = f"mpjob-e2e-{suffix}", f"mpjob-e2e-{suffix}", f"mpjob-e2e-high-{suffix}"
    resources = [
        {"name": "cpu", "nominalQuota": 64},
        {"name": "memory", "nominalQuota": "512Gi"},
        {"name": "nvidia.com/gpu", "nominalQuota": 1},
    ]
    _cluster_object(custom, "resourceflavors", {"apiVersion": "/".join(KUEUE), "kind": "ResourceFlavor",
                                                "metadata": {"name": flavor}})  # fmt: skip
    _cluster_object(custom, "workloadpriorityclasses", {"apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass",
                                                        "metadata": {"name": high}, "value": 1000})  # fmt: skip
    spec = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": release_namespace}},
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [
            {"coveredResources": [r["name"] for r in resources], "flavors": [{"name": flavor, "resources": resources}]}
        ],
    }
    _cluster_object(custom, "clusterqueues", {"apiVersion": "/".join(KUEUE), "kind": "ClusterQueue",
                                              "metadata": {"name": cq}, "spec": spec})  # fmt: skip
    local = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "team-a"},
             "spec": {"clusterQueue": cq}}  # fmt: skip
    custom.create_namespaced_custom_object(*KUEUE, release_namespace, "localqueues", local)
    yield high
    for plural, name in (("clusterqueues", cq), ("resourceflavors", flavor), ("workloadpriorityclasses", high)):
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(*KUEUE, plural, name)


def gpu_holder(name: str, *, priority: str | None = None) -> dict[str, Any]:
    """A plain queued Job that holds the queue's one GPU until the test deletes it."""
    labels = {KUEUE_QUEUE_LABEL: "team-a", **({PRIORITY_LABEL: priority} if priority else {})}
    container = {"name": "hold", "image": "busybox", "command": ["sleep", "600"],
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    pod = {"restartPolicy": "Never", "containers": [container], "tolerations": [{"operator": "Exists"}],
           "terminationGracePeriodSeconds": 1}  # fmt: skip
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": pod}}}  # fmt: skip


def with_own_claim(jobs: Jobs, job: dict[str, Any]) -> dict[str, Any]:
    """The job with a checkpoint claim of its own (named for it, bound), so no job resumes
    from another's checkpoints."""
    name = job["metadata"]["name"]
    claim = copy.deepcopy(example_docs("volumes/checkpoints-pvc")[0])
    claim["metadata"]["name"] = f"ckpt-{name}"
    jobs.apply(claim)
    wait_for(lambda: jobs.core.read_namespaced_persistent_volume_claim(f"ckpt-{name}", jobs.namespace).status.phase
             == "Bound", 60, message=f"claim ckpt-{name} bound")  # fmt: skip
    job["spec"]["checkpoint"]["volume"] = {"persistentVolumeClaim": {"claimName": f"ckpt-{name}"}}
    return job


def workload_of(custom: client.CustomObjectsApi, namespace: str, job: str) -> dict[str, Any] | None:
    """Kueue's Workload for a batch Job (owned by it)."""
    items = custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
    owned = [w for w in items if any(o["name"] == job for o in w["metadata"].get("ownerReferences", []))]
    return owned[0] if owned else None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def running_condition(status: dict[str, Any]) -> dict[str, Any]:
    return condition({"status": status}, "Running")


def test_install_the_chart(release: Release, cli: Cli, queue: str) -> None:
    release.install_output = cli.helm("install", release.name, *release.install_args())
    release.installed = True
    assert "NOTES:" in release.install_output


def test_a_queued_job_waits_for_quota_then_kueue_admits_it_and_it_succeeds(
    release: Release, jobs: Jobs, batch: client.BatchV1Api
) -> None:
    ns = release.namespace
    batch.create_namespaced_job(ns, gpu_holder("holder"))
    wait_for(lambda: condition(workload_of(jobs.custom, ns, "holder"), "Admitted").get("status") == "True", 60,
             message="the holder admitted")  # fmt: skip
    jobs.apply(with_own_claim(jobs, cpu_sized(example("kueue-queued"))))
    status = wait_for(
        lambda: running_condition(s := jobs.status("kueue-queued")).get("reason") == "AwaitingAdmission" and s,
        60,
        message="kueue-queued awaiting admission",
    )
    assert status["phase"] == "Pending" and status["attempt"] == 0
    # Kueue says why: the quota is taken (the workload has no quota reserved).
    workload = wait_for(
        lambda: (w := workload_of(jobs.custom, ns, "kueue-queued-a0")) and condition(w, "QuotaReserved") and w,
        60,
        message="the attempt's Workload with Kueue's verdict",
    )
    reserved = condition(workload, "QuotaReserved")
    assert reserved["status"] == "False" and "nvidia.com/gpu" in reserved["message"], reserved
    assert workload["spec"]["queueName"] == "team-a"
    # ... and the job's own status carries Kueue's words (`kubectl describe mpj` shows them).
    said = wait_for(
        lambda: "the queue says" in (m := running_condition(jobs.status("kueue-queued")).get("message", "")) and m,
        60,
        message="Kueue's reason in the job's status",
    )
    assert reserved["message"] in said or "nvidia.com/gpu" in said, said
    assert batch.read_namespaced_job("kueue-queued-a0", ns).spec.suspend is True
    assert not jobs.pods("mpjob.dev/job=kueue-queued")

    batch.delete_namespaced_job("holder", ns, propagation_policy="Background")
    status = jobs.wait_phase("kueue-queued", ("Succeeded", "Failed"), 600)
    assert status["phase"] == "Succeeded", status
    assert [(a["precision"], a["reason"]) for a in status["attempts"]] == [("fp16", "Succeeded")]
    assert condition(workload_of(jobs.custom, ns, "kueue-queued-a0"), "Admitted").get("status") == "True"


def test_kueue_preempts_a_running_attempt_and_the_job_resumes_in_the_same_precision(
    release: Release, jobs: Jobs, batch: client.BatchV1Api, queue: str
) -> None:
    ns = release.namespace
    # Long enough to be preempted mid-run on any machine: 600 steps of at least 50 ms each
    # (task.args.stepDelay: the clock makes it long, not the cores). Periodic checkpoints far
    # apart, so the step it resumes at tells the SIGTERM checkpoint from a periodic one.
    job = cpu_sized(example("kueue-queued"), steps=600)
    job["spec"]["task"]["args"]["stepDelay"] = paced(0.05)
    job["spec"]["checkpoint"]["everySteps"] = 1000
    job["metadata"]["name"] = "preempted"
    job["spec"]["runPolicy"]["maxAttempts"] = 1  # a preemption must use none of it
    watcher = PhaseWatch(jobs.custom, ns, "preempted").start()
    jobs.apply(with_own_claim(jobs, job))
    wait_for(lambda: jobs.status("preempted").get("step", 0) >= 15, 300, interval=1, message="preempted training")
    (first_pod,) = jobs.pods("mpjob.dev/job=preempted")

    batch.create_namespaced_job(ns, gpu_holder("urgent", priority=queue))
    status = wait_for(
        lambda: running_condition(s := jobs.status("preempted")).get("reason") == "AwaitingReadmission" and s,
        180,
        interval=1,
        message="preempted waiting for readmission",
    )
    evicted = condition(workload_of(jobs.custom, ns, "preempted-a0"), "Evicted")
    assert evicted.get("reason") == "Preempted", evicted
    assert status["phase"] == "Pending" and status["precision"] == "fp16"
    assert [(a["precision"], a.get("reason")) for a in status["attempts"]] == [("fp16", None)], "the same attempt"
    assert not any(c["type"] == "PrecisionFallback" for c in status["conditions"])
    assert batch.read_namespaced_job("preempted-a0", ns).spec.suspend is True
    wait_for(lambda: not jobs.pods("mpjob.dev/job=preempted"), 120, message="the preempted pod stopped")
    preempted_at = jobs.status("preempted")["step"]

    batch.delete_namespaced_job("urgent", ns, propagation_policy="Background")
    try:
        status = jobs.wait_phase("preempted", ("Succeeded", "Failed"), 900)
        watcher.stop_after(("Succeeded", "Failed"))
    finally:
        watcher.stop.set()
    assert status["phase"] == "Succeeded", status
    (attempt,) = status["attempts"]
    assert (attempt["precision"], attempt["reason"]) == ("fp16", "Succeeded")
    # The preemption used none of maxAttempts 1: only the attempt that succeeded is charged.
    assert status["attemptCounts"]["charged"] == 1 and status["attemptCounts"]["byReason"] == {"Succeeded": 1}
    # The readmitted Job's new pod resumed from the checkpoint the trainer wrote on SIGTERM.
    assert attempt["startStep"] >= max(15, preempted_at), (attempt, preempted_at)
    assert attempt["startStep"] % 1000 != 0, "not a periodic checkpoint"
    (second_pod,) = jobs.pods("mpjob.dev/job=preempted")
    assert second_pod.metadata.uid != first_pod.metadata.uid
    assert condition(workload_of(jobs.custom, ns, "preempted-a0"), "Admitted").get("status") == "True"
    phases = watcher.phases()
    assert "Failed" not in [phase for phase, _ in phases] and {precision for _, precision in phases} == {"fp16"}
    assert phases.index(("Pending", "fp16")) < len(phases) - 1, phases


def test_an_fp16_job_that_overflows_gets_its_bf16_attempt_admitted(
    release: Release, jobs: Jobs, batch: client.BatchV1Api
) -> None:
    ns = release.namespace
    job = cpu_sized(example("fp16-recovery"))
    job["spec"].setdefault("runPolicy", {})["queueName"] = "team-a"
    job["spec"]["precision"]["inPlace"] = False  # the bf16 attempt as a Job of its own, for the queue to admit
    jobs.apply(with_own_claim(jobs, job))
    status = jobs.wait_phase("fp16-recovery", ("Succeeded", "Failed"), 900)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"]) == ("fp16", "NumericFault")
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    for attempt in ("fp16-recovery-a0", "fp16-recovery-a1"):
        assert batch.read_namespaced_job(attempt, ns).metadata.labels[KUEUE_QUEUE_LABEL] == "team-a"
        admitted = condition(workload_of(jobs.custom, ns, attempt), "Admitted")
        assert admitted.get("status") == "True", (attempt, admitted)
