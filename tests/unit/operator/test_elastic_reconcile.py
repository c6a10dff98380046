"""spec.elastic in the operator's reconcile: an attempt whose pods stay unschedulable past
waitSeconds, or that loses a node (ended, or while its peers still run), goes on smaller; and
the pods' PodScheduled condition as the cache reads it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.controller.records import COMPLETION_INDEX, pod_view
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.lifecycle import Plan
from mpjob.planning.planner import BatchShape
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_elastic import spec

pytestmark = pytest.mark.unit


def _reconcile(job: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, jobs: dict, at: int, **kw: Any) -> Plan:
    return reconcile(job, status, 1, jobs, datetime(2026, 11, 28, 12, 0, tzinfo=UTC) + timedelta(seconds=at), **kw)


def _pods(*views: Any) -> Any:
    return {0: JobView(index=0, pods=tuple(views))}


def test_the_operator_shrinks_an_attempt_whose_pods_stay_unschedulable_past_wait_seconds() -> None:
    job = spec()
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    assert plan.create[0].workers is None and plan.status.workers == 3
    since = "2026-11-28T12:00:05Z"
    pods = _pods(
        PodView("p0", 0, "Running", True),
        PodView("p1", 1, "Running", True),
        PodView("p2", 2, "Pending", True, unschedulable_since=since),
    )
    waiting = _reconcile(job, plan.status, pods, 60)  # 55 s unschedulable: within waitSeconds=60
    assert not waiting.delete and len(waiting.status.attempts) == 1
    shrunk = _reconcile(job, plan.status, pods, 70)
    assert shrunk.delete == [0] and not shrunk.create  # created once attempt 0's pods are gone
    first, second = shrunk.status.attempts
    assert (first.reason, first.charged, second.world_size, shrunk.status.workers) == ("ScaledDown", False, 2, 2)
    assert "pods unschedulable for 65s" in (first.message or "")
    stopping = {0: _pods(PodView("p0", 0, "Running", True, deleting=True))[0]}
    assert not _reconcile(job, shrunk.status, stopping, 75).create
    created = _reconcile(job, shrunk.status, {}, 80).create
    assert [(c.index, c.workers, c.shape) for c in created] == [(1, 2, BatchShape(3, 2))]


def test_the_operator_shrinks_at_once_after_losing_a_node() -> None:
    job = spec()
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    pods = _pods(
        PodView("p0", 0, "Failed", False, exit_code=143),
        PodView("p1", 1, "Failed", False, exit_code=143),
        PodView("p2", 2, "Failed", False, platform_reason="NodeLost"),
    )
    ended = _reconcile(job, plan.status, pods, 30)
    assert ended.status.attempts[0].reason == "ScaledDown" and ended.status.attempts[0].charged is False
    assert [(c.workers, c.shape) for c in ended.create] == [(2, BatchShape(3, 2))]
    plain = spec(elastic=None)
    lost = _reconcile(plain, _reconcile(plain, MixedPrecisionJobStatus(), {}, 0).status, pods, 30)
    assert lost.status.attempts[0].reason == "NodeLost" and lost.create[0].workers is None


def test_a_pod_the_scheduler_finds_no_node_for_reads_as_unschedulable_since_then() -> None:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pod = {
        "metadata": {"name": "p", "annotations": {COMPLETION_INDEX: "2"}},
        "status": {"phase": "Pending", "conditions": [{**condition, "lastTransitionTime": "2026-11-28T12:00:05Z"}]},
    }
    assert pod_view(pod).unschedulable_since == "2026-11-28T12:00:05Z"
    pod["status"]["conditions"] = [{**condition, "status": "True", "reason": ""}]
    assert pod_view(pod).unschedulable_since is None


def test_the_operator_shrinks_at_once_when_a_running_attempt_loses_a_node() -> None:
    job = spec()
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    pods = _pods(
        PodView("p0", 0, "Running", True),
        PodView("p1", 1, "Running", True),
        PodView("p2", 2, "Running", True, platform_reason="DeletionByTaintManager", deleting=True),
    )
    shrunk = _reconcile(job, plan.status, pods, 30)
    assert shrunk.delete == [0] and not shrunk.create  # the peers stop first
    first, second = shrunk.status.attempts
    assert (first.reason, first.charged, second.world_size) == ("ScaledDown", False, 2)
    assert "a node was lost" in (first.message or "")


def test_an_attempt_no_smaller_size_can_take_says_why_it_waits_once() -> None:
    """12 workers of 1 sample, minWorkers 5: with 5 placed past waitSeconds, no size from 5 up to the
    5 that fit keeps 12 samples a step, so the job waits at its size; the status says why (a
    condition) and a Warning Event says it once, not at every reconcile; placed, it no longer waits."""
    job = spec(workers=12, training={"batchSize": 1}, elastic={"minWorkers": 5, "waitSeconds": 60})
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    since = "2026-11-28T12:00:05Z"
    placed = [PodView(f"p{i}", i, "Running", True) for i in range(5)]
    pending = [PodView(f"p{i}", i, "Pending", True, unschedulable_since=since) for i in range(5, 12)]
    first = _reconcile(job, plan.status, _pods(*placed, *pending), 70)
    assert not first.delete and not first.create and len(first.status.attempts) == 1
    waits = [c for c in first.status.conditions if c.type == "AwaitingWorkers"]
    assert [(c.status, c.reason) for c in waits] == [("True", "NoSmallerSize")]
    assert "no size from elastic.minWorkers=5 up keeps the global batch of 12 samples" in waits[0].message
    assert [(e.type, e.reason, e.message) for e in first.events] == [("Warning", "NoSmallerSize", waits[0].message)]
    again = _reconcile(job, first.status, _pods(*placed, *pending), 80)
    assert again.events == [] and again.status.conditions == first.status.conditions
    running = [PodView(f"p{i}", i, "Running", True) for i in range(12)]
    fits = _reconcile(job, again.status, _pods(*running), 90)
    assert [(c.status, c.reason) for c in fits.status.conditions if c.type == "AwaitingWorkers"] == [
        ("False", "WorkersPlaced")
    ]


@pytest.mark.parametrize(
    ("edit", "phase"),
    [({"runPolicy": {"suspend": True}}, "Suspended"), ({"runPolicy": {"activeDeadlineSeconds": 60}}, "Failed")],
    ids=["suspended", "past-its-deadline"],
)
def test_a_job_that_stops_while_it_waits_for_workers_no_longer_says_it_waits(edit: dict, phase: str) -> None:
    job = spec(workers=12, training={"batchSize": 1}, elastic={"minWorkers": 5, "waitSeconds": 60})
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    since = "2026-11-28T12:00:05Z"
    placed = [PodView(f"p{i}", i, "Running", True) for i in range(5)]
    pending = [PodView(f"p{i}", i, "Pending", True, unschedulable_since=since) for i in range(5, 12)]
    waiting = _reconcile(job, plan.status, _pods(*placed, *pending), 70).status
    edited = spec(workers=12, training={"batchSize": 1}, elastic={"minWorkers": 5, "waitSeconds": 60}, **edit)
    stopped = _reconcile(edited, waiting, _pods(*placed, *pending), 80)
    assert stopped.status.phase == phase
    (waits,) = [c for c in stopped.status.conditions if c.type == "AwaitingWorkers"]
    assert (waits.status, waits.reason) == ("False", phase), waits
    assert waits.message.endswith(f"no longer waits for workers: the job is {phase}")
