"""A pod on a node that is gone or has stopped answering: the cache sees it ended (NodeLost,
NodeUnreachable) once the reconcile passes the Nodes as listed (mpjob.controller.lostnodes), so
a lost rank's attempt ends at once, elastic or not, and the next attempt does not wait for the
garbage collector or the taint manager; when to list the Nodes at all."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes.client.rest import ApiException

from mpjob.controller.cache import ChildCache, Observed
from mpjob.controller.lostnodes import FRESH_SECONDS, NodeReader, Nodes, on_nodes, suspect
from mpjob.controller.quiet import QUIET_SECONDS
from mpjob.controller.records import pod_view
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.cases import CLAIM
from tests.unit.operator.test_cache import MPJ_UID, job, pod
from tests.unit.operator.test_elastic_queue import Response

pytestmark = pytest.mark.unit

UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-11-30T00:00:00Z"}


def nodes(*names: str, unreachable: tuple[str, ...] = ()) -> Nodes:
    return Nodes(frozenset(names), frozenset(unreachable))


def test_a_running_pod_on_a_node_that_is_gone_has_ended_by_node_loss() -> None:
    running = PodView("p", 0, "Running", True, node="n2")
    lost = on_nodes(running, nodes("n0", "n1"))
    assert (lost.alive, lost.phase, lost.platform_reason) == (False, "Failed", "NodeLost")
    assert on_nodes(running, nodes("n2")) == running  # its node is there
    assert on_nodes(running, None) == running  # the nodes are not known: nothing is judged
    ended = PodView("p", 0, "Failed", False, exit_code=1, node="n2")
    assert on_nodes(ended, nodes()) == ended  # it ended on its own: its own words stand
    assert on_nodes(PodView("p", 0, "Pending", True), nodes()).alive  # not bound yet


def test_a_running_pod_on_a_node_tainted_unreachable_has_ended_and_one_not_ready_has_not() -> None:
    listed = Nodes.listed(
        [
            {"metadata": {"name": "n0"}, "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}},
            {"metadata": {"name": "n1"}, "spec": {"taints": [UNREACHABLE]}},
            {"metadata": {"name": "n2"}, "spec": {"taints": [{"key": "node.kubernetes.io/not-ready"}]}},
            {"metadata": {"name": "n3"}},
        ]
    )
    assert listed == nodes("n0", "n1", "n2", "n3", unreachable=("n1",))
    cut_off = on_nodes(PodView("p", 0, "Running", True, node="n1"), listed)
    assert (cut_off.alive, cut_off.phase, cut_off.platform_reason) == (False, "Failed", "NodeUnreachable")
    # A kubelet that says its node is not ready still answers: its containers may train on.
    assert on_nodes(PodView("p", 0, "Running", True, node="n2"), listed).alive
    # The taint manager's word, once it has evicted the pod, stands before ours.
    evicted = PodView("p", 0, "Running", True, platform_reason="DeletionByTaintManager", node="n1")
    assert on_nodes(evicted, listed).platform_reason == "DeletionByTaintManager"


def test_the_node_lifecycle_controllers_mark_is_read_from_the_pods_conditions() -> None:
    def conditions(ready: str, containers: str) -> dict[str, object]:
        body = pod(0, node="n1")
        body["status"]["conditions"] = [
            {"type": "Ready", "status": ready},
            {"type": "ContainersReady", "status": containers},
        ]
        return body

    assert pod_view(conditions("False", "True")).marked_unready  # Ready flipped alone: the mark
    assert not pod_view(conditions("False", "False")).marked_unready  # a kubelet's own not-ready
    assert not pod_view(conditions("True", "True")).marked_unready
    assert not pod_view(pod(0, node="n1")).marked_unready  # no conditions yet


def observed(*pods: PodView, finished: str | None = None, lingering: frozenset[int] = frozenset()) -> Observed:
    return Observed({0: JobView(0, finished=finished, pods=pods)}, lingering, {}, {})


def test_the_nodes_are_listed_only_when_an_attempt_looks_like_it_lost_one() -> None:
    up = PodView("a", 0, "Running", True, node="n0")
    failed = PodView("b", 1, "Failed", False, exit_code=1, node="n1")
    assert not suspect(observed(up, up))  # every rank runs
    assert not suspect(observed(failed, failed))  # every rank ended: no pod to judge
    assert suspect(observed(up, failed))  # a peer failed while this one still runs
    assert suspect(observed(up, finished="Failed"))
    assert suspect(observed(lingering=frozenset({0})))  # a Job gone, a pod of it still running
    assert not suspect(observed(PodView("c", 0, "Pending", True), failed))  # not bound: no node to lose
    # Every rank runs, but the node lifecycle controller marked one not ready: its node stopped
    # answering, and its peers may be blocked already.
    assert suspect(observed(up, PodView("d", 1, "Running", True, node="n1", marked_unready=True)))


def test_the_cache_ends_the_pods_of_a_node_gone_and_a_deleted_job_does_not_linger_on_them() -> None:
    cache = ChildCache(lambda key: None)
    cache.apply("jobs", "ADDED", job(0))
    cache.apply("pods", "ADDED", pod(0, "Failed", rank=0, node="n0", exitCode=1))
    cache.apply("pods", "ADDED", pod(0, rank=1, node="n1"))
    seen = cache.observe("ns", "j", MPJ_UID)
    assert [p.alive for p in seen.jobs[0].pods] == [False, True] and suspect(seen)
    seen = cache.observe("ns", "j", MPJ_UID, nodes("n0"))
    assert [(p.alive, p.platform_reason) for p in seen.jobs[0].pods] == [(False, None), (False, "NodeLost")]
    cache.apply("jobs", "DELETED", job(0))
    assert cache.observe("ns", "j", MPJ_UID).lingering == frozenset({0})
    assert cache.observe("ns", "j", MPJ_UID, nodes("n0")).lingering == frozenset()
    assert cache.observe("ns", "j", MPJ_UID, nodes("n0", "n1", unreachable=("n1",))).lingering == frozenset()
    assert cache.observe("ns", "j", MPJ_UID, nodes("n0", "n1")).lingering == frozenset({0})


def test_the_mark_alone_queues_a_reconcile() -> None:
    changed: list[object] = []
    cache = ChildCache(changed.append)
    cache.apply("jobs", "ADDED", job(0))
    cache.apply("pods", "ADDED", pod(0, rank=1, node="n1"))
    changed.clear()
    marked = pod(0, rank=1, node="n1")
    marked["status"]["conditions"] = [
        {"type": "Ready", "status": "False"},
        {"type": "ContainersReady", "status": "True"},
    ]
    cache.apply("pods", "MODIFIED", marked)
    assert changed, "the node lifecycle controller's mark changed nothing the planner acts on"


def running(workers: int, **more: Any) -> tuple[MixedPrecisionJobSpec, MixedPrecisionJobStatus]:
    """A bf16 job of `workers` (and `more` of spec) whose first attempt runs past its step-20
    checkpoint."""
    body = {
        "task": {"builtin": "mlp"},
        "training": {"batchSize": 4},
        "precision": {"mode": "bf16"},
        "checkpoint": CLAIM,
    }
    body.update(more)
    status = {
        "phase": "Running",
        "attempt": 0,
        "precision": "bf16",
        "attempts": [{"index": 0, "precision": "bf16", "startStep": 0, "worldSize": workers}],
        "lastCheckpoint": {"step": 20, "path": "/ck/step-000000020"},
    }
    spec = MixedPrecisionJobSpec.model_validate({"workers": workers, **body})
    return spec, MixedPrecisionJobStatus.model_validate(status)


def test_a_peer_failed_beside_a_lost_node_shrinks_an_elastic_job_uncharged() -> None:
    spec, status = running(3, elastic={"minWorkers": 2, "waitSeconds": 600})
    failed = PodView("j-a0-0", 0, "Failed", False, exit_code=1, termination_message="peer lost", node="n0")
    also = PodView("j-a0-1", 1, "Failed", False, exit_code=1, termination_message="peer lost", node="n1")
    lost = on_nodes(PodView("j-a0-2", 2, "Running", True, node="n2"), nodes("n0", "n1"))
    jobs = {0: JobView(0, finished="Failed", pods=(failed, also, lost))}
    plan = reconcile(spec, status, 1, jobs, datetime.now(UTC))
    first, second = plan.status.attempts
    assert (first.reason, first.charged, second.world_size) == ("ScaledDown", False, 2), plan.status.attempts
    assert plan.cut == []  # no pod of it is left to stop
    assert "a node was lost" in (first.message or "") and second.start_step == 20


def test_an_elastic_attempt_shrinks_at_once_and_its_blocked_ranks_are_cut() -> None:
    spec, status = running(3, elastic={"minWorkers": 2, "waitSeconds": 600})
    blocked = tuple(PodView(f"j-a0-{i}", i, "Running", True, node=f"n{i}") for i in (0, 1))
    silent = on_nodes(
        PodView("j-a0-2", 2, "Running", True, node="n2", marked_unready=True),
        nodes("n0", "n1", "n2", unreachable=("n2",)),
    )
    plan = reconcile(spec, status, 1, {0: JobView(0, pods=(*blocked, silent))}, datetime.now(UTC))
    first, second = plan.status.attempts
    assert (first.reason, second.world_size) == ("ScaledDown", 2), plan.status.attempts
    assert (plan.delete, plan.cut, plan.create) == ([0], [0], [])  # its ranks cannot checkpoint: cut


def test_an_attempt_that_cannot_shrink_ends_at_once_when_a_node_stops_answering() -> None:
    """Rank 0 still runs, blocked in a collective with the rank whose node stopped answering:
    the attempt is not left to wait for the collective's timeout. It ends NodeLost, uncharged,
    its Job deleted and its pods cut (cutoff.CUT_GRACE_SECONDS); the next attempt, in the same
    precision from the last checkpoint, has its Job created once the stopped attempt's pods are
    gone."""
    spec, status = running(2)
    blocked = PodView("j-a0-0", 0, "Running", True, node="n0")
    cut_off = PodView("j-a0-1", 1, "Running", True, node="n1", marked_unready=True)
    now = datetime.now(UTC)
    waiting = reconcile(spec, status, 1, {0: JobView(0, pods=(blocked, cut_off))}, now)
    assert (waiting.delete, len(waiting.status.attempts)) == ([], 1)  # the nodes not read yet: nothing judged
    lost = on_nodes(cut_off, nodes("n0", "n1", unreachable=("n1",)))
    plan = reconcile(spec, status, 1, {0: JobView(0, pods=(blocked, lost))}, now)
    first, second = plan.status.attempts
    assert (plan.delete, plan.cut, plan.create) == ([0], [0], [])  # rank 0 is cut, not left its grace period
    assert (first.reason, first.charged) == ("NodeLost", False), first
    assert "j-a0-1" in (first.message or "") and "NodeUnreachable" in (first.message or "")
    assert (second.precision, second.start_step, second.world_size) == ("bf16", 20, 2)
    assert reconcile(spec, plan.status, 1, {}, now, lingering=frozenset({0})).create == []  # rank 0 still stops
    (created,) = reconcile(spec, plan.status, 1, {}, now).create
    assert created.index == 1


def test_an_elastic_attempt_that_no_smaller_size_can_take_says_so_when_it_ends_node_lost() -> None:
    """Two workers and elastic.minWorkers 2: one lost leaves no smaller size to take.
    The attempt ends NodeLost, and its message says why it did not shrink (as AwaitingWorkers does)."""
    spec, status = running(2, elastic={"minWorkers": 2, "waitSeconds": 600})
    blocked = PodView("j-a0-0", 0, "Running", True, node="n0")
    lost = on_nodes(PodView("j-a0-1", 1, "Running", True, node="n1"), nodes("n0"))
    plan = reconcile(spec, status, 1, {0: JobView(0, pods=(blocked, lost))}, datetime.now(UTC))
    first, second = plan.status.attempts
    assert (first.reason, second.world_size, plan.cut) == ("NodeLost", 2, [0])
    assert "j-a0-1" in (first.message or "") and "elastic.minWorkers=2 allows no fewer than 2" in (first.message or "")
    failed = PodView("j-a0-0", 0, "Failed", False, exit_code=1, termination_message="peer lost", node="n0")
    stopped = reconcile(spec, status, 1, {0: JobView(0, finished="Failed", pods=(failed, lost))}, datetime.now(UTC))
    first = stopped.status.attempts[0]  # seen once every pod has stopped: it says so too
    assert first.reason == "NodeLost" and "elastic.minWorkers=2 allows no fewer than 2" in (first.message or ""), first


class Core:
    """The Node list as the API serves it, counting the lists; `denied`: a chart without the rule."""

    def __init__(self, denied: bool = False) -> None:
        self.denied, self.lists, self.taints = denied, 0, [UNREACHABLE]

    def list_node(self, **_: Any) -> Response:
        self.lists += 1
        if self.denied:
            raise ApiException(status=403)
        return Response(
            {"items": [{"metadata": {"name": "n0"}}, {"metadata": {"name": "n1"}, "spec": {"taints": self.taints}}]}
        )


def test_one_list_of_the_nodes_answers_every_reconcile_for_a_few_seconds_and_a_403_quiets_them() -> None:
    now = [0.0]
    core = Core()
    reader = NodeReader(cast(Any, SimpleNamespace(core=core)), clock=lambda: now[0])
    assert reader.seen() == nodes("n0", "n1", unreachable=("n1",))
    core.taints = []  # n1 answers again
    now[0] = FRESH_SECONDS - 0.1
    assert reader.seen() == nodes("n0", "n1", unreachable=("n1",)) and core.lists == 1
    now[0] = FRESH_SECONDS
    assert reader.seen() == nodes("n0", "n1") and core.lists == 2
    refused = Core(denied=True)
    quiet = NodeReader(cast(Any, SimpleNamespace(core=refused)), clock=lambda: now[0])
    assert (quiet.seen(), quiet.seen(), refused.lists) == (None, None, 1)
    now[0] += QUIET_SECONDS  # on the reader's clock: the refusal is asked again
    assert quiet.seen() is None and refused.lists == 2
