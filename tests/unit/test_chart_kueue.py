"""The chart lets the operator read (list, nothing more) Kueue's Workloads, for the queue's
words in a waiting job's status (mpjob.controller.queue), in every Role it renders."""

from __future__ import annotations

import pytest

from tests.unit.test_chart import _grants, helm, of_kind, render

pytestmark = pytest.mark.unit

__all__ = ["helm"]  # the fixture, shared with test_chart.py

WORKLOADS = {("kueue.x-k8s.io", "workloads", "list")}


def test_the_operator_may_list_kueue_workloads_and_nothing_more(helm: str) -> None:
    (cluster_role,) = [d for d in of_kind(render(helm), "ClusterRole") if d["metadata"]["name"] == "r-mpjob"]
    assert _grants(cluster_role["rules"]) >= WORKLOADS
    kueue = {g for g in _grants(cluster_role["rules"]) if g[0] == "kueue.x-k8s.io"}
    assert kueue == WORKLOADS, "least privilege: no watch, no writes"
    for role in of_kind(render(helm, "watchNamespaces={a,b}"), "Role"):
        if "helm.sh/hook" not in role["metadata"].get("annotations", {}):
            assert _grants(role["rules"]) >= WORKLOADS
