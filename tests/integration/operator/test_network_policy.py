"""Each attempt's NetworkPolicy on the real control plane: the operator creates it beside the
attempt's Service, selecting exactly the attempt's pods and controlled by its Job, and the
garbage collector removes it once the Job and its pods are gone.

The test cluster has no network plugin, so nothing enforces NetworkPolicies here: what these
tests can and do show is the object (its selectors, ports and owner) as the API server stores
it, and its lifetime. Whether traffic is dropped is the network plugin's part."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator

pytestmark = pytest.mark.integration

OPERATOR_LABELS = {"app.kubernetes.io/name": "mpjob", "app.kubernetes.io/instance": "mpjob"}
MONITORING = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
PROMETHEUS = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
SETTING = {
    "operatorNamespace": "mpjob-system",
    "operatorLabels": OPERATOR_LABELS,
    "monitoringNamespaces": MONITORING,
    "monitoringPods": PROMETHEUS,
}


@pytest.fixture
def fencing_operator(kubeconfig: str, namespace: str, crd_installed: None, tmp_path: Path) -> Iterator[Operator]:
    """The operator as the chart configures it by default: a NetworkPolicy per attempt."""
    with Operator.running(
        kubeconfig, namespace, tmp_path / "operator.log", env={"MPJOB_NETWORK_POLICY": json.dumps(SETTING)}
    ) as op:
        yield op


def sleeper(workers: int) -> dict[str, Any]:
    """Pods that only wait: the policy is about them, not about what they train."""
    return {
        "workers": workers,
        "task": {"command": [sys.executable, "-c", "import time; time.sleep(3600)"]},
        "precision": {"mode": "bf16"},
        "resources": {"gpusPerWorker": 0},
    }


def policy_of(networking: client.NetworkingV1Api, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = networking.api_client.sanitize_for_serialization(
            networking.read_namespaced_network_policy(name, namespace)
        )
    except client.rest.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def test_an_attempts_policy_admits_only_its_own_pods_and_goes_with_its_job(
    fencing_operator: Operator, jobs: Jobs, api_client: client.ApiClient, namespace: str
) -> None:
    networking = client.NetworkingV1Api(api_client)
    jobs.create("fenced", sleeper(workers=2))
    jobs.create("neighbour", sleeper(workers=1))
    policy = wait_for(lambda: policy_of(networking, namespace, "fenced-a0"), 60, message="the attempt's policy")
    job = jobs.batch.read_namespaced_job("fenced-a0", namespace)

    (owner,) = [ref for ref in policy["metadata"]["ownerReferences"] if ref.get("controller")]  # its pods beside it
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Job",
        "fenced-a0",
        job.metadata.uid,
        True,
    )
    selector = policy["spec"]["podSelector"]
    assert selector == {"matchLabels": {"mpjob.dev/job": "fenced", "mpjob.dev/attempt": "0"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    same_attempt, metrics = policy["spec"]["ingress"]
    assert same_attempt == {"from": [{"podSelector": selector}]}  # every port: rendezvous, NCCL/Gloo
    assert metrics["ports"] == [{"port": 9400, "protocol": "TCP"}]
    assert metrics["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mpjob-system"}},
            "podSelector": {"matchLabels": OPERATOR_LABELS},
        },
        {"namespaceSelector": MONITORING, "podSelector": PROMETHEUS},
    ]

    # The selector picks exactly the attempt's pods: both workers, not the neighbour's.
    labels = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())

    def selected() -> set[str]:
        return {p.metadata.name for p in jobs.core.list_namespaced_pod(namespace, label_selector=labels).items}

    def owned() -> set[str]:
        pods = jobs.core.list_namespaced_pod(namespace).items
        return {
            p.metadata.name for p in pods if any(o.uid == job.metadata.uid for o in p.metadata.owner_references or [])
        }

    wait_for(lambda: len(owned()) == 2 and selected() == owned(), 60, message="the attempt's two pods")
    neighbour = wait_for(lambda: policy_of(networking, namespace, "neighbour-a0"), 60, message="the neighbour's")
    assert neighbour["spec"]["podSelector"]["matchLabels"]["mpjob.dev/job"] == "neighbour"
    assert not selected() & {
        p.metadata.name
        for p in jobs.core.list_namespaced_pod(namespace, label_selector="mpjob.dev/job=neighbour").items
    }

    # Suspending deletes the attempt's Job; the garbage collector takes its policy with it.
    jobs.patch_spec("fenced", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("fenced", "Suspended", 60)
    wait_for(lambda: policy_of(networking, namespace, "fenced-a0") is None, 120, message="policy collected")
    assert jobs.status("fenced")["phase"] == "Suspended"  # the job itself stays
    assert policy_of(networking, namespace, "neighbour-a0") is not None  # another job's is untouched


def test_a_policy_of_the_attempts_name_mpjob_did_not_make_fails_the_job_and_stays(
    fencing_operator: Operator, jobs: Jobs, api_client: client.ApiClient, namespace: str
) -> None:
    networking = client.NetworkingV1Api(api_client)
    theirs = {"metadata": {"name": "taken-a0"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    networking.create_namespaced_network_policy(namespace, theirs)
    jobs.create("taken", sleeper(workers=1))
    status = jobs.wait_phase("taken", ("Failed", "Running"), 60)
    assert status["phase"] == "Failed" and "NetworkPolicy taken-a0 already exists" in status["message"], status
    assert policy_of(networking, namespace, "taken-a0") is not None  # never deleted
    wait_for(lambda: not jobs.attempt_jobs("taken"), 60, message="the refused attempt's Job removed")


def test_a_deleted_attempts_policy_stays_while_its_pods_shut_down_and_goes_with_the_last(
    fencing_operator: Operator, jobs: Jobs, api_client: client.ApiClient, namespace: str
) -> None:
    """A Job the operator deletes goes at once while its pods run out their grace (the SIGTERM
    checkpoint): the attempt's policy stays until the last of them is gone."""
    networking = client.NetworkingV1Api(api_client)
    stubborn = sleeper(workers=2)  # pods that outlast SIGTERM, as a trainer writing its checkpoint does
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
    stubborn["task"] = {"command": [sys.executable, "-c", ignore]}
    jobs.create("winding", stubborn)
    wait_for(lambda: jobs.attempt_jobs("winding"), 60, message="the attempt's Job")
    job = jobs.batch.read_namespaced_job("winding-a0", namespace)
    labels = "mpjob.dev/job=winding,mpjob.dev/attempt=0"

    def pods() -> dict[str, Any]:
        return {p.metadata.uid: p for p in jobs.core.list_namespaced_pod(namespace, label_selector=labels).items}

    def owners() -> set[str]:
        policy = policy_of(networking, namespace, "winding-a0") or {"metadata": {}}
        return {ref["uid"] for ref in policy["metadata"].get("ownerReferences") or []}

    def both_running() -> dict[str, Any] | None:
        found = pods()
        return found if len(found) == 2 and all(p.status.phase == "Running" for p in found.values()) else None

    running = wait_for(both_running, 60, message="the attempt's two pods running")
    wait_for(lambda: set(running) <= owners(), 60, message="the running pods among the policy's owners")
    assert job.metadata.uid in owners()  # its Job still controls it

    jobs.patch_spec("winding", {"runPolicy": {"suspend": True}})
    wait_for(lambda: not jobs.attempt_jobs("winding"), 60, message="the attempt's Job deleted")
    # The collector drops the Job from the policy's owners and keeps the policy: its pods still run.
    wait_for(lambda: owners() and job.metadata.uid not in owners(), 60, message="the Job gone from the owners")
    assert policy_of(networking, namespace, "winding-a0") is not None
    assert set(pods()) == set(running) and all(p.metadata.deletion_timestamp for p in pods().values())

    for pod in running.values():  # their grace cut short: the last pod gone takes the policy with it
        jobs.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_for(lambda: not pods(), 60, message="the pods gone")
    wait_for(lambda: policy_of(networking, namespace, "winding-a0") is None, 60, message="policy collected")
