"""Pods on a node that is gone: seen as lost at once, not when the garbage collector comes.

A machine can vanish (a hardware fault, a cloud instance reclaimed) and its Node object with it.
No kubelet is left to write its pods' status, so they stay Running in the API until Kubernetes'
pod garbage collector deletes them, 40 s or more after the Node object goes. Meanwhile their
peers fail at the next collective, and an attempt would wait for pods that will never stop.

The operator need not wait. When an attempt shows the signs (`suspect`: a pod ended while a
peer still runs, or its Job is gone with a pod still running) it lists the Nodes, read only
(`NodeReader`; the chart grants the list with rbac.elasticCapacity), and the cache sees a
running pod bound to a node that no longer exists as ended by `NodeLost` (`on_nodes`): an
elastic job shrinks to the workers that are left, any other job's attempt ends uncharged, and
a shrunk attempt does not wait for it. Where the operator may not list Nodes (403) it does not
ask again for QUIET_SECONDS and waits for the garbage collector, as before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from mpjob.controller.cluster import QuietReads
from mpjob.planning.endings import PodView
from mpjob_contract.codes import Reason

if TYPE_CHECKING:
    from mpjob.controller.cache import Observed
    from mpjob.controller.cluster import Cluster

QUIET_SECONDS = 300.0


def on_nodes(view: PodView, nodes: frozenset[str] | None) -> PodView:
    """`view`, or the pod ended by `NodeLost` when it runs on a node `nodes` (those that exist)
    lacks (None: the nodes are not known, and nothing is judged)."""
    if nodes is None or not view.alive or not view.node or view.node in nodes:
        return view
    return replace(view, alive=False, phase="Failed", platform_reason=view.platform_reason or Reason.NODE_LOST.value)


def suspect(seen: Observed) -> bool:
    """Whether an attempt may have lost a node: a Job gone with a pod still running, or a pod
    ended beside one that still runs on a node."""
    if seen.lingering:
        return True
    for job in seen.jobs.values():
        running = any(p.alive and p.node for p in job.pods)
        if running and (job.finished or any(not p.alive for p in job.pods)):
            return True
    return False


class NodeReader:
    """The names of the Nodes that exist, read on demand (quiet after a 403 or 404)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._reads = QuietReads(QUIET_SECONDS)

    def existing(self) -> frozenset[str] | None:
        if (listed := self._reads.read("nodes", self.cluster.core.list_node)) is None:
            return None
        return frozenset(str((n.get("metadata") or {}).get("name", "")) for n in listed.get("items") or [])
