"""The chart lets the operator read (list, nothing more) Kueue's Workloads, for the queue's
words in a waiting job's status (mpjob.controller.queue), in every Role it renders; and get
LocalQueues and ClusterQueues (cluster-scoped: in a ClusterRole), the quota an elastic job in a
queue is sized by."""

from __future__ import annotations

import pytest

from tests.unit.test_chart import _grants, helm, of_kind, render

pytestmark = pytest.mark.unit

__all__ = ["helm"]  # the fixture, shared with test_chart.py

WORKLOADS = {("kueue.x-k8s.io", "workloads", "list"), ("kueue.x-k8s.io", "localqueues", "get")}
CLUSTER_QUEUES = {("kueue.x-k8s.io", "clusterqueues", "get")}


def test_the_operator_may_list_kueue_workloads_and_nothing_more(helm: str) -> None:
    (cluster_role,) = [d for d in of_kind(render(helm), "ClusterRole") if d["metadata"]["name"] == "r-mpjob"]
    assert _grants(cluster_role["rules"]) >= WORKLOADS
    kueue = {g for g in _grants(cluster_role["rules"]) if g[0] == "kueue.x-k8s.io"}
    assert kueue == WORKLOADS | CLUSTER_QUEUES, "least privilege: no watch, no writes"
    namespaced = render(helm, "watchNamespaces={a,b}")
    for role in of_kind(namespaced, "Role"):
        if "helm.sh/hook" not in role["metadata"].get("annotations", {}):
            assert _grants(role["rules"]) >= WORKLOADS
    (reader,) = [d for d in of_kind(namespaced, "ClusterRole") if d["metadata"]["name"] == "r-mpjob-cluster-reader"]
    assert {g for g in _grants(reader["rules"]) if g[0] == "kueue.x-k8s.io"} == CLUSTER_QUEUES
