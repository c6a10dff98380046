"""The operator holds no body of a finished job at rest: a job's body is dropped once nothing
more is owed for it (finished, its children gone), and kopf's listing of finished jobs, or a
write to one, holds none either; a later reconcile of one (a spec edit) reads it anew and works.
An operator over thousands of finished jobs holds bodies only of those with work."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mpjob.controller.config import OperatorConfig
from mpjob.controller.handlers import Controller, finished_jobs, on_job_event
from mpjob.controller.handlers import finished as finished_phase
from mpjob.controller.liveness import Liveness
from mpjob.controller.ticker import publish_phases
from mpjob.controller.workqueue import WorkQueue
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_stray_jobs import at

pytestmark = pytest.mark.unit

KEY = ("ns", "j")


def finished(phase: str = "Succeeded") -> dict[str, Any]:
    entry = {
        "index": 0,
        "precision": "fp32",
        "startTime": at(9),
        "finishTime": at(5),
        "reason": phase,
        "jobUid": "job-0",
    }
    return {"phase": phase, "precision": "fp32", "attempt": 0, "startTime": at(9), "attempts": [entry],
            "observedGeneration": 1}  # fmt: skip


@pytest.mark.usefixtures("events")
@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_job_at_rest_holds_no_body_and_reads_it_again_when_asked(phase: str) -> None:
    cluster = FakeCluster()
    cluster.body["status"] = finished(phase)
    made = reconciler(cluster)
    made.handle(KEY, False)
    assert len(made.bodies) == 0, "a finished job's body held after nothing is owed"
    assert KEY not in made.settled, "held as settled, though the ticker's index says it has no work"
    cluster.body["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 60}  # a user's edit: its reconcile reads
    cluster.body["metadata"]["generation"] = 2
    made.handle(KEY, False)
    assert cluster.reads == 2 and cluster.body["status"]["observedGeneration"] == 2
    assert cluster.body["status"]["phase"] == phase and len(made.bodies) == 0


@pytest.fixture
def memo() -> Iterator[dict[str, Any]]:
    """kopf's memo with the running parts; its work queue keeps the keys queued (no worker)."""
    made = reconciler(FakeCluster())
    queue = WorkQueue(made.handle, workers=0)
    yield {"controller": Controller(
        config=OperatorConfig(), cluster=made.cluster, cache=made.cache, queue=queue, reconciler=made,
        liveness=Liveness("mpjs", list),
    )}  # fmt: skip
    queue.close()


def listed(memo: dict[str, Any], body: dict[str, Any], kind: str | None = None) -> None:
    meta = body["metadata"]
    event = {"type": kind, "object": body}
    asyncio.run(
        on_job_event(type=kind, body=body, event=event, namespace=meta["namespace"], name=meta["name"], memo=memo)
    )


def test_kopfs_listing_of_finished_jobs_holds_no_body(memo: dict[str, Any]) -> None:
    cluster = FakeCluster()
    for i in range(500):
        body = copy.deepcopy(cluster.body)
        body["metadata"].update(name=f"done-{i}", uid=f"u{i}")
        body["status"] = finished()
        listed(memo, body)
    running = copy.deepcopy(cluster.body)  # one with work: queued, its body held for its reconcile
    listed(memo, running)
    made = memo["controller"]
    assert len(made.reconciler.bodies) == 1 and len(made.queue) == 1
    finished_now = copy.deepcopy(running)
    finished_now["metadata"]["resourceVersion"] = "7"
    finished_now["status"] = finished()
    listed(memo, finished_now, "MODIFIED")  # a write to a job held: the newer body replaces it
    listed(memo, {**finished_now, "metadata": {**finished_now["metadata"], "name": "done-3"}}, "MODIFIED")
    assert len(made.reconciler.bodies) == 1
    assert (made.reconciler.bodies.body(KEY, dict) or {})["status"]["phase"] == "Succeeded"


@pytest.mark.usefixtures("events")
@pytest.mark.parametrize("ttl", [None, 60], ids=["no-ttl", "ttl"])
def test_finished_jobs_at_rest_leave_nothing_per_job_held(ttl: int | None) -> None:
    """N jobs finished and at rest: no body, no phase, nothing acting owed or rebuilt is held of
    any; settled only where the ticker's index still says it has work (a TTL), else nothing."""
    cluster, jobs = FakeCluster(), 200
    if ttl is not None:
        cluster.body["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": ttl}
    made = reconciler(cluster)
    for i in range(jobs):
        cluster.body["metadata"].update(name=f"done-{i}", uid=f"u{i}")
        cluster.body["status"] = finished("Failed" if i % 2 else "Succeeded")
        made.handle(("ns", f"done-{i}"), False)
    held = (len(made.bodies), len(made.phases), len(made.actions.rebuilt), len(made.actions.owed))
    assert held == (0, 0, 0, 0), held
    assert len(made.settled) == (jobs if ttl is not None else 0)
    for i in range(jobs):  # deleted: nothing left at all
        made.forget(f"u{i}", ("ns", f"done-{i}"))
    assert (len(made.settled), len(made.phases), len(made.actions.rebuilt)) == (0, 0, 0)


@pytest.mark.usefixtures("events")
def test_a_job_that_finishes_leaves_the_phases_held_and_the_gauge_counts_it_from_kopfs_index() -> None:
    cluster = FakeCluster()
    made = reconciler(cluster)
    made.handle(KEY, False)  # a new job: its first attempt made, its phase held
    assert set(made.phases) == {"mpj-uid"} and made.phases["mpj-uid"].phase not in ("Succeeded", "Failed")
    cluster.body["status"] = finished()
    made.bodies.forget(KEY)  # its next reconcile reads the finished job
    made.handle(KEY, False)
    assert made.phases == {} and len(made.bodies) == 0
    publish_phases(made.phases, {"Succeeded": [True] * 3, "Failed": [True]})
    gauge = [REGISTRY.get_sample_value("mpjob_operator_jobs", {"phase": p}) for p in ("Succeeded", "Failed", "Running")]
    assert gauge == [3, 1, 0]
    assert finished_phase(status=finished()) and finished_jobs(status=finished()) == {"Succeeded": True}
    assert not finished_phase(status={"phase": "Running"}) and not finished_phase(status={})
