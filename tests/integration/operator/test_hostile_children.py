"""Bad input and hostile neighbours on the real control plane (issue 14): a child the API server
refuses fails the job with its message and no retry storm; pods the Job controller cannot create
show within seconds and fail the job after runPolicy.podCreationTimeoutSeconds; a forged pod
changes nothing and breaks no watch; an object of a child's name mpjob did not create is never
deleted. The trainers are light stand-ins (`standin`) that serve the trainer's metrics."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from mpjob_contract.codes import Reason
from mpjob_contract.report import TerminationReport
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator

pytestmark = pytest.mark.integration

#: A stand-in trainer: serves the trainer's step, loss and (bf16: zero) loss-scale gauges, logs a
#: step every half second for argv[1] steps, then writes its termination report as the SDK does.
STANDIN = """
import os, sys, time
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from mpjob_contract import metrics as tm
from mpjob_contract.report import TerminationReport
registry = CollectorRegistry()
step, start, loss, scale = (Gauge(n, n, registry=registry) for n in (tm.STEP, tm.START_STEP, tm.LOSS, tm.LOSS_SCALE))
start_http_server(int(os.environ[tm.METRICS_PORT_ENV]), addr=os.environ["MPJOB_METRICS_HOST"], registry=registry)
steps = int(sys.argv[1])
for i in range(1, steps + 1):
    time.sleep(0.5)
    step.set(i)
    loss.set(3 - i / 1000)
TerminationReport(reason="Succeeded", step=steps, precision="bf16", message="stand-in done").write()
"""
FOREVER = 10**9


def standin(steps: int = FOREVER, **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "task": {"command": [sys.executable, "-c", STANDIN, str(steps)]},
        "precision": {"mode": "bf16"},
        "resources": {"gpusPerWorker": 0},
    }
    spec.update(over)
    return spec


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def refusals(operator: Operator) -> int:
    """How often the operator was refused a child (its log's root handler line for each)."""
    lines = operator.log.read_text().splitlines()
    return sum(1 for line in lines if " WARNING mpjob.operator " in line and "the API server refused attempt" in line)


def test_a_child_the_api_server_rejects_fails_the_job_with_its_message(operator: Operator, jobs: Jobs) -> None:
    # The CRD's schemas cannot see a label key's syntax; the API server's validation of the Job can.
    jobs.create("rejected", standin(template={"nodeSelector": {"bad key!": "x"}}))
    status = jobs.wait_phase("rejected", ("Failed", "Running", "Succeeded"), 60)
    assert status["phase"] == "Failed", status
    assert "nodeSelector" in status["message"] and "Invalid value" in status["message"]  # the server's words
    failed = condition(status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidPodTemplate")
    assert [a["reason"] for a in status["attempts"]] == ["InvalidPodTemplate"]
    assert jobs.attempt_jobs("rejected") == []
    events = jobs.events("rejected", "Failed")
    assert any(e.reason == "Failed" and "nodeSelector" in e.message for e in events)
    assert refusals(operator) == 1  # asked once, never again


@pytest.fixture
def forbidding_policy(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy that refuses (403) every Job created in the test namespace."""
    admission = client.AdmissionregistrationV1Api(api_client)
    name = f"mpjob-test-no-jobs-{uuid.uuid4().hex[:6]}"
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]}
                    ]
                },
                "validations": [{"expression": "false", "message": "no Jobs here, by policy", "reason": "Forbidden"}],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
        }
    )
    try:
        yield name
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def test_a_child_forbidden_by_policy_fails_the_job_with_the_servers_message(
    operator: Operator, jobs: Jobs, forbidding_policy: str
) -> None:
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
    probe = {"metadata": {"generateName": "probe-"}, "spec": {"template": {"spec": pod}}}

    def enforced() -> bool:
        try:
            jobs.batch.create_namespaced_job(jobs.namespace, probe, dry_run="All")
        except client.rest.ApiException as exc:
            return exc.status == 403
        return False

    wait_for(enforced, 30, message="the admission policy in force")
    jobs.create("forbidden", standin())
    status = jobs.wait_phase("forbidden", ("Failed", "Running", "Succeeded"), 60)
    assert status["phase"] == "Failed" and "no Jobs here, by policy" in status["message"], status
    assert condition(status, "Failed")["reason"] == "Forbidden"
    assert refusals(operator) == 1


def test_pods_that_cannot_be_created_show_at_once_and_fail_after_the_timeout(
    operator: Operator, jobs: Jobs, namespace: str
) -> None:
    jobs.core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    template = {
        "volumes": [{"name": "host", "hostPath": {"path": "/tmp"}}],
        "volumeMounts": [{"name": "host", "mountPath": "/host"}],
    }
    jobs.create("hostpath", standin(template=template, runPolicy={"podCreationTimeoutSeconds": 20}))
    phases: list[str] = []

    def refused() -> dict[str, Any] | None:
        status = jobs.status("hostpath")
        phases.append(status.get("phase", ""))
        return status if condition(status, "PodsCreated").get("status") == "False" else None

    status = wait_for(refused, 30, interval=0.5, message="PodsCreated=False")
    pods_created = condition(status, "PodsCreated")
    assert pods_created["reason"] == "FailedCreate" and "violates PodSecurity" in pods_created["message"]
    assert status["phase"] == "Pending"
    events = jobs.events("hostpath", "FailedCreate")
    assert any(e.reason == "FailedCreate" and "hostPath" in e.message for e in events)
    status = jobs.wait_phase("hostpath", ("Failed", "Succeeded"), 60)
    failed = condition(status, "Failed")
    assert failed["reason"] == "PodCreationTimeout" and "violates PodSecurity" in status["message"]
    assert "Running" not in phases  # never Running: no trainer pod ever ran
    wait_for(lambda: not jobs.attempt_jobs("hostpath"), 30, message="the attempt's Job deleted")


def forged_pod(name: str, job: str, index: str) -> dict[str, Any]:
    """A pod anyone may create: the labels of `job`'s attempt 0, no owner, exit 42 with a report."""
    report = TerminationReport(reason=Reason.NUMERIC_FAULT, step=5, precision="bf16", message="forged")
    script = (
        "import sys\nfrom mpjob_contract.report import TerminationReport\n"
        f"TerminationReport.model_validate_json({report.to_message()!r}).write()\nsys.exit(42)\n"
    )
    return {
        "metadata": {
            "name": name,
            "labels": {
                "mpjob.dev/job": job,
                "mpjob.dev/attempt": "0",
                "batch.kubernetes.io/job-completion-index": index,
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": index},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "forged", "command": [sys.executable, "-c", script]}],
        },
    }


def test_a_forged_pod_changes_nothing_for_the_job_and_breaks_no_watch(operator: Operator, jobs: Jobs) -> None:
    jobs.create("target", standin())
    wait_for(lambda: jobs.status("target").get("step", 0) > 0, 90, message="live progress")
    for name, index in (("forged-bad-index", "not-a-number"), ("forged-index-0", "0")):
        jobs.core.create_namespaced_pod(jobs.namespace, forged_pod(name, "target", index))
    for name in ("forged-bad-index", "forged-index-0"):
        wait_for(
            lambda n=name: jobs.core.read_namespaced_pod(n, jobs.namespace).status.phase == "Failed",
            60,
            message=f"{name} exited 42",
        )
    before = jobs.status("target")["step"]
    wait_for(lambda: jobs.status("target")["step"] >= before + 4, 30, message="progress after the forged exits")
    status = jobs.status("target")
    assert status["phase"] == "Running" and len(status["attempts"]) == 1 and "reason" not in status["attempts"][0]
    assert "lossScale" not in status and status["loss"] > 0  # bf16: no scale; a real reading of the loss
    log = operator.log.read_text()
    assert "watch of pods failed" not in log and "skipping pod" not in log  # not ours: not even read
    jobs.patch_spec("target", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("target", "Suspended", 60)


@pytest.mark.parametrize("kind", ["Service", "Job"])
def test_an_object_of_a_childs_name_that_mpjob_did_not_create_is_never_deleted(
    operator: Operator, jobs: Jobs, kind: str
) -> None:
    name = f"taken-{kind.lower()}"
    if kind == "Service":
        made = jobs.core.create_namespaced_service(
            jobs.namespace,
            {"metadata": {"name": f"{name}-a0"}, "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}]}},
        )
        read = lambda: jobs.core.read_namespaced_service(f"{name}-a0", jobs.namespace)  # noqa: E731
    else:
        pod = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "command": ["true"]}]}}
        made = jobs.batch.create_namespaced_job(
            jobs.namespace, {"metadata": {"name": f"{name}-a0"}, "spec": {"suspend": True, "template": pod}}
        )
        read = lambda: jobs.batch.read_namespaced_job(f"{name}-a0", jobs.namespace)  # noqa: E731
    jobs.create(name, standin(runPolicy={"ttlSecondsAfterFinished": 1}))
    status = jobs.wait_phase(name, ("Failed", "Succeeded"), 60)
    assert condition(status, "Failed")["reason"] == "NameConflict", status
    assert f"{kind} {name}-a0 already exists and was not created by mpjob" in status["message"]
    jobs.custom.delete_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", jobs.namespace, "mixedprecisionjobs", name, propagation_policy="Foreground"
    )
    wait_for(lambda: not _exists(jobs, name), 60, message="the job deleted with its own children")
    assert read().metadata.uid == made.metadata.uid  # still there, the very same object


def _exists(jobs: Jobs, name: str) -> bool:
    try:
        jobs.get(name)
    except client.rest.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
