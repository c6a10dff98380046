"""Forgeries from another namespace on the real control plane: whoever may read a job's attempt
Job (its name and UID) in the victim's namespace and create pods or Events in a namespace of their
own cannot make those count as the victim's. A pod there whose controller ownerReference names the
victim's Job, Running with an address that serves fake progress and then ending with a forged
NonFiniteInFp32 report, and a FailedCreate Event there naming the same Job, change neither the
victim's progress nor its outcome. The operator serves both namespaces, so it does see them."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from mpjob_contract import metrics as tm
from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import TerminationReport
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_hostile_children import standin

pytestmark = pytest.mark.integration

FAKE_STEP = 10**6
#: Serves a step far past the victim's and a tiny loss on the pod's own address for argv[1]
#: seconds, then ends as a trainer whose fp32 replay went non-finite.
FORGER = f"""
import os, sys, time
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from mpjob_contract import metrics as tm
from mpjob_contract.report import TerminationReport
registry = CollectorRegistry()
for name, value in ((tm.STEP, {FAKE_STEP}), (tm.START_STEP, 0), (tm.LOSS, 0.001)):
    Gauge(name, name, registry=registry).set(value)
start_http_server(int(os.environ[tm.METRICS_PORT_ENV]), addr=os.environ["MPJOB_METRICS_HOST"], registry=registry)
print("serving", flush=True)
time.sleep(float(sys.argv[1]))
TerminationReport.model_validate_json(sys.argv[2]).write()
sys.exit({int(ExitCode.NON_FINITE_IN_FP32)})
"""
KEEP = "mpjob.dev/test-keep"  # a finalizer: the forged pod's status stays readable after the GC deletes it


@pytest.fixture
def attacker(core: client.CoreV1Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mpjob.dev/test": "true"}}})
    yield name
    for pod in core.list_namespaced_pod(name).items:
        if pod.metadata.finalizers:
            core.patch_namespaced_pod(pod.metadata.name, name, {"metadata": {"finalizers": None}})
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def operator(kubeconfig: str, namespace: str, attacker: str, crd_installed: None, tmp_path: Path) -> Iterator[Operator]:
    """The operator serving the victim's namespace and the attacker's."""
    with Operator.running(kubeconfig, namespace, tmp_path / "operator.log", also=(attacker,)) as op:
        yield op


def victims_job(jobs: Jobs, name: str) -> client.V1Job:
    wait_for(lambda: jobs.attempt_jobs(name), 60, message=f"{name}'s attempt Job")
    return jobs.batch.read_namespaced_job(f"{name}-a0", jobs.namespace)


def owned_by(job: client.V1Job) -> list[dict[str, Any]]:
    """The controller ownerReference of a real pod of `job`: its kind, name and UID."""
    ref = {"kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid}
    return [{"apiVersion": "batch/v1", **ref, "controller": True}]


def forged_pod(job: client.V1Job, *, hold: float) -> dict[str, Any]:
    report = TerminationReport(reason=Reason.NON_FINITE_IN_FP32, step=7, precision="fp32", message="forged")
    return {
        "metadata": {
            "name": f"{job.metadata.name}-0-forged",
            "labels": {**job.spec.template.metadata.labels, "batch.kubernetes.io/job-completion-index": "0"},
            "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
            "finalizers": [KEEP],
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 120,
            "containers": [
                {
                    "name": "trainer",
                    "image": "forged",
                    # SIGTERM ignored from the first instant (the disposition survives exec): the
                    # garbage collector deletes the pod as soon as it names an owner outside its
                    # namespace, and the forgery must run on.
                    "command": ["/bin/sh", "-c", 'trap "" TERM; exec "$0" "$@"', sys.executable, "-c", FORGER],
                    "args": [str(hold), report.to_message()],
                    "env": [
                        {"name": tm.METRICS_PORT_ENV, "value": str(tm.DEFAULT_METRICS_PORT)},
                        {"name": "MPJOB_METRICS_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    ],
                }
            ],
        },
    }


def terminated(core: client.CoreV1Api, name: str, namespace: str) -> Any:
    statuses = core.read_namespaced_pod(name, namespace).status.container_statuses or []
    return statuses[0].state.terminated if statuses else None


def test_a_pod_in_another_namespace_naming_the_victims_job_changes_nothing(
    operator: Operator, jobs: Jobs, attacker: str
) -> None:
    jobs.create("victim", standin(steps=60))
    job = victims_job(jobs, "victim")
    wait_for(lambda: jobs.status("victim").get("step", 0) > 0, 90, message="the victim's live progress")
    forged = jobs.core.create_namespaced_pod(attacker, forged_pod(job, hold=8))
    name = forged.metadata.name
    wait_for(
        lambda: (p := jobs.core.read_namespaced_pod(name, attacker)).status.phase == "Running" and p.status.pod_ip,
        60,
        message="the forged pod running with an address",
    )
    # The owner is named once the pod runs: named at creation, the garbage collector could
    # delete the pod before the node started it, and a pod being deleted is never started.
    jobs.core.patch_namespaced_pod(name, attacker, {"metadata": {"ownerReferences": owned_by(job)}})
    steps: list[int] = []

    def forged_ended() -> Any:
        steps.append(jobs.status("victim").get("step", 0))
        return terminated(jobs.core, name, attacker)

    ended = wait_for(forged_ended, 60, interval=0.5, message="the forged pod's NonFiniteInFp32 exit")
    assert ended.exit_code == ExitCode.NON_FINITE_IN_FP32 and "NonFiniteInFp32" in ended.message
    status = jobs.status("victim")
    assert status["phase"] == "Running", status  # the forgery landed while the victim still ran
    assert max(steps) <= 60  # its address was never read as rank 0's
    status = jobs.wait_phase("victim", ("Succeeded", "Failed"), 120)
    assert (status["phase"], status["precision"], status["step"]) == ("Succeeded", "bf16", 60), status
    assert [(a["precision"], a["reason"]) for a in status["attempts"]] == [("bf16", "Succeeded")]
    events = jobs.events("victim", "Succeeded")  # the last of the plan's Events: the others were posted
    assert not [e for e in events if e.reason == Reason.NON_FINITE_IN_FP32.value]


def test_a_failed_create_in_another_namespace_naming_the_victims_job_changes_nothing(
    operator: Operator, jobs: Jobs, namespace: str, attacker: str
) -> None:
    # No pod may be created at first, so the victim waits on its real FailedCreate: the only
    # state in which a FailedCreate counts at all.
    quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    jobs.core.create_namespaced_resource_quota(namespace, quota)
    jobs.create("victim", standin(steps=20, runPolicy={"podCreationTimeoutSeconds": 600}))
    job = victims_job(jobs, "victim")
    seen: list[dict[str, Any]] = []

    def refused() -> bool:
        seen.append(jobs.status("victim"))
        return any(c["type"] == "PodsCreated" and c["status"] == "False" for c in seen[-1].get("conditions", []))

    wait_for(refused, 60, interval=0.3, message="the victim's real FailedCreate")
    involved = {"apiVersion": "batch/v1", "kind": "Job", "namespace": attacker}
    involved.update(name=job.metadata.name, uid=job.metadata.uid)
    jobs.core.create_namespaced_event(
        attacker,
        {
            "metadata": {"name": f"{job.metadata.name}.forged"},
            "involvedObject": involved,
            "reason": "FailedCreate",
            "message": "forged: pods are forbidden here",
            "type": "Warning",
            "source": {"component": "job-controller"},
        },
    )
    jobs.core.delete_namespaced_resource_quota("no-pods", namespace)
    # The Job controller backs off after each refusal: a change to the Job has it try again now.
    jobs.batch.patch_namespaced_job(job.metadata.name, namespace, {"metadata": {"annotations": {"retry": "now"}}})

    def finished() -> bool:
        seen.append(jobs.status("victim"))
        return seen[-1].get("phase") in ("Succeeded", "Failed")

    wait_for(finished, 120, interval=0.3, message="the victim finished")
    assert "forged" not in json.dumps(seen)  # never its condition, message or phase
    status = seen[-1]
    assert (status["phase"], len(status["attempts"])) == ("Succeeded", 1), status
    events = jobs.events("victim", "Succeeded")
    assert not [e for e in events if "forged" in (e.message or "")]
