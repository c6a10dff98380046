"""What an attempt's Job deleted with --cascade=orphan left, deleted against the real API server
(controller/leftovers.py): of the attempt's name, a Service or NetworkPolicy with no controller
and the attempt's labels goes; one without those labels, or with a controller, is somebody
else's and stays, whatever its name. A pod already gone is no error."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from mpjob.controller import leftovers
from mpjob.controller.cluster import Cluster
from mpjob.planning.endings import PodView

pytestmark = pytest.mark.integration


def service(name: str, labels: dict[str, str], owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels, "ownerReferences": owners or []}
    return {"metadata": meta, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}


def policy(name: str, labels: dict[str, str], owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels, "ownerReferences": owners or []}, "spec": {"podSelector": {}}}


def test_only_the_attempts_ownerless_labelled_children_are_deleted(
    api_client: client.ApiClient, namespace: str
) -> None:
    core, networking = client.CoreV1Api(api_client), client.NetworkingV1Api(api_client)
    cluster = Cluster(custom=None, batch=None, core=core, networking=networking)
    anchor = core.create_namespaced_config_map(namespace, {"metadata": {"name": "anchor"}})
    controller = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "anchor", "uid": anchor.metadata.uid}]
    controller[0]["controller"] = True
    for job in ("left", "theirs", "owned"):
        labels = {"mpjob.dev/job": job, "mpjob.dev/attempt": "0"} if job != "theirs" else {"app": "theirs"}
        owners = controller if job == "owned" else None
        core.create_namespaced_service(namespace, service(f"{job}-a0", labels, owners))
        networking.create_namespaced_network_policy(namespace, policy(f"{job}-a0", labels, owners))
    gone = (PodView("left-a0-0-x", 0, "Running", True, uid="no-such-pod"),)
    for job in ("left", "theirs", "owned"):
        assert leftovers.stop(cluster, namespace, job, {0: gone}, policies=True) == []  # gone: none said stopped
    services = {s.metadata.name for s in core.list_namespaced_service(namespace).items}
    policies = {p.metadata.name for p in networking.list_namespaced_network_policy(namespace).items}
    assert services == {"theirs-a0", "owned-a0"}, services
    assert policies == {"theirs-a0", "owned-a0"}, policies
