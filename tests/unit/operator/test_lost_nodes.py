"""A pod on a node that is gone: the cache sees it ended by NodeLost once the reconcile passes
the Nodes that exist (mpjob.controller.lostnodes), so a lost rank's attempt ends at once and a
shrunk attempt does not wait for the garbage collector; when to list the Nodes at all."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mpjob.controller.cache import ChildCache, Observed
from mpjob.controller.lostnodes import on_nodes, suspect
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_cache import MPJ_UID, job, pod

pytestmark = pytest.mark.unit


def test_a_running_pod_on_a_node_that_is_gone_has_ended_by_node_loss() -> None:
    running = PodView("p", 0, "Running", True, node="n2")
    lost = on_nodes(running, frozenset({"n0", "n1"}))
    assert (lost.alive, lost.phase, lost.platform_reason) == (False, "Failed", "NodeLost")
    assert on_nodes(running, frozenset({"n2"})) == running  # its node is there
    assert on_nodes(running, None) == running  # the nodes are not known: nothing is judged
    ended = PodView("p", 0, "Failed", False, exit_code=1, node="n2")
    assert on_nodes(ended, frozenset()) == ended  # it ended on its own: its own words stand
    assert on_nodes(PodView("p", 0, "Pending", True), frozenset()).alive  # not bound yet


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


def test_the_cache_ends_the_pods_of_a_node_gone_and_a_deleted_job_does_not_linger_on_them() -> None:
    cache = ChildCache(lambda key: None)
    cache.apply("jobs", "ADDED", job(0))
    cache.apply("pods", "ADDED", pod(0, "Failed", rank=0, node="n0", exitCode=1))
    cache.apply("pods", "ADDED", pod(0, rank=1, node="n1"))
    seen = cache.observe("ns", "j", MPJ_UID)
    assert [p.alive for p in seen.jobs[0].pods] == [False, True] and suspect(seen)
    seen = cache.observe("ns", "j", MPJ_UID, frozenset({"n0"}))
    assert [(p.alive, p.platform_reason) for p in seen.jobs[0].pods] == [(False, None), (False, "NodeLost")]
    cache.apply("jobs", "DELETED", job(0))
    assert cache.observe("ns", "j", MPJ_UID).lingering == frozenset({0})
    assert cache.observe("ns", "j", MPJ_UID, frozenset({"n0"})).lingering == frozenset()


def test_a_peer_failed_beside_a_lost_node_shrinks_an_elastic_job_uncharged() -> None:
    spec = MixedPrecisionJobSpec.model_validate(
        {
            "workers": 3,
            "task": {"builtin": "mlp"},
            "training": {"batchSize": 4},
            "precision": {"mode": "bf16", "fallback": ["fp32"]},
            "elastic": {"minWorkers": 2, "waitSeconds": 600},
        }
    )
    status = MixedPrecisionJobStatus.model_validate(
        {
            "phase": "Running",
            "attempt": 0,
            "precision": "bf16",
            "attempts": [{"index": 0, "precision": "bf16", "startStep": 0, "worldSize": 3}],
            "lastCheckpoint": {"step": 20, "path": "/ck/step-000000020"},
        }
    )
    failed = PodView("j-a0-0", 0, "Failed", False, exit_code=1, termination_message="peer lost", node="n0")
    also = PodView("j-a0-1", 1, "Failed", False, exit_code=1, termination_message="peer lost", node="n1")
    lost = on_nodes(PodView("j-a0-2", 2, "Running", True, node="n2"), frozenset({"n0", "n1"}))
    jobs = {0: JobView(0, finished="Failed", pods=(failed, also, lost))}
    plan = reconcile(spec, status, 1, jobs, datetime.now(UTC))
    first, second = plan.status.attempts
    assert (first.reason, first.charged, second.world_size) == ("ScaledDown", False, 2), plan.status.attempts
    assert "a node was lost" in (first.message or "") and second.start_step == 20
