"""Pods on a node that is gone or has stopped answering: seen as lost at once, not when the
garbage collector or the taint manager comes.

A machine can vanish (a hardware fault, a cloud instance reclaimed) and its Node object with it,
or it can stop answering while its Node stays (a hung kernel, a network partition). Either way
no kubelet writes its pods' status, so they stay Running in the API: until Kubernetes' pod
garbage collector deletes them, 40 s or more after the Node object goes; until the taint
manager evicts them, five minutes after the node lifecycle controller taints an unanswering
node `node.kubernetes.io/unreachable` (the default toleration). Meanwhile their peers block in
the next collective until its timeout (NCCL's 10 minutes, Gloo's 30), and an attempt would wait
for pods that will never stop.

The operator need not wait. When an attempt shows the signs (`suspect`: a pod ended while a
peer still runs, its Job gone with a pod still running, or a pod the node lifecycle controller
marked not ready) it lists the Nodes, read only (`NodeReader`; the chart grants the list with
rbac.elasticCapacity), and the cache sees a running pod bound to a node that no longer exists
as ended by `NodeLost`, and one on a node tainted unreachable as ended by `NodeUnreachable`
(`on_nodes`): the attempt ends at once, uncharged (an elastic job shrinks to the workers that
are left), and the next attempt does not wait for those pods. A node that reports itself not
ready (its kubelet answers: `node.kubernetes.io/not-ready`) is not judged: its containers may
train on. Where the operator may not list Nodes (403) it does not ask again for `quiet.QUIET_SECONDS`
and waits for the garbage collector and the taint manager, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mpjob.controller.quiet import QuietReads
from mpjob.planning.endings import PodView
from mpjob_contract.codes import Reason

if TYPE_CHECKING:
    from mpjob.controller.cache import Observed
    from mpjob.controller.cluster import Cluster

#: How long one list of the Nodes answers for (NodeReader).
FRESH_SECONDS = 5.0
#: The taint the node lifecycle controller puts on a node whose kubelet stopped renewing its
#: Lease and status (its Ready condition Unknown).
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
#: The pod reasons `on_nodes` writes (mpjob.planning.classify maps both to NodeLost).
GONE, UNREACHABLE = Reason.NODE_LOST.value, "NodeUnreachable"


@dataclass(frozen=True, slots=True)
class Nodes:
    """What one list of the Nodes showed: the names that exist, and which of them are tainted
    unreachable."""

    existing: frozenset[str]
    unreachable: frozenset[str] = frozenset()

    @classmethod
    def listed(cls, items: list[dict[str, Any]]) -> Nodes:
        existing, unreachable = set(), set()
        for node in items:
            name = str((node.get("metadata") or {}).get("name", ""))
            existing.add(name)
            if any(t.get("key") == UNREACHABLE_TAINT for t in (node.get("spec") or {}).get("taints") or []):
                unreachable.add(name)
        return cls(frozenset(existing), frozenset(unreachable))

    def loss(self, node: str) -> str | None:
        """The reason a pod on `node` is lost (GONE, UNREACHABLE), or None while it is there."""
        if node not in self.existing:
            return GONE
        return UNREACHABLE if node in self.unreachable else None


def on_nodes(view: PodView, nodes: Nodes | None) -> PodView:
    """`view`, or the pod ended by its node's loss when it runs on a node gone or unreachable
    (None: the nodes are not known, and nothing is judged)."""
    if nodes is None or not view.alive or not view.node or (lost := nodes.loss(view.node)) is None:
        return view
    return replace(view, alive=False, phase="Failed", platform_reason=view.platform_reason or lost)


def suspect(seen: Observed) -> bool:
    """Whether an attempt may have lost a node: a Job gone with a pod still running, a pod ended
    beside one that still runs on a node, or a running pod marked not ready by the node
    lifecycle controller."""
    if seen.lingering:
        return True
    for job in seen.jobs.values():
        running = [p for p in job.pods if p.alive and p.node]
        if any(p.marked_unready for p in running):
            return True
        if running and (job.finished or any(not p.alive for p in job.pods)):
            return True
    return False


class NodeReader:
    """The Nodes, read on demand (quiet after a 403 or 404). A list is used for FRESH_SECONDS:
    every job with a pod on a lost node asks at each of its reconciles (while that pod stays in
    the API, which for a node that stopped answering is until it returns or is deleted), and a
    cluster's Node list is large."""

    def __init__(self, cluster: Cluster, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self._reads = QuietReads(clock=clock)  # one clock for the list's freshness and a refusal's quiet
        self._clock = clock
        self._last: tuple[float, Nodes] | None = None  # replaced whole: a reader thread sees one or the other

    def seen(self) -> Nodes | None:
        now, last = self._clock(), self._last
        if last is not None and now - last[0] < FRESH_SECONDS:
            return last[1]
        if (listed := self._reads.read("nodes", self.cluster.core.list_node)) is None:
            return None
        nodes = Nodes.listed(listed.get("items") or [])
        self._last = (now, nodes)
        return nodes
