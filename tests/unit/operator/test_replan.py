"""An attempt whose pods never started, edited as its PodsScheduled condition says: before, the
edit was read and the attempt's Job kept asking for what no node has; now the Job made from the
older spec is deleted and made again, in the same attempt, from the edited one."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.builders.attempt import SPEC_GENERATION, attempt_job
from mpjob.controller.records import job_record
from mpjob.planning.planner import StartAttempt
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_cache import job, pod
from tests.unit.operator.test_lost_nodes import Core

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SINCE = "2026-11-22T12:00:01Z"
NO_GPUS = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
KEY = ("ns", "j")


def spec(gpus: int) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16"}, "resources": {"gpusPerWorker": gpus}}
    )


def held(generation: int | None, **pod: Any) -> dict[int, JobView]:
    view = PodView("j-a0-0-x", 0, "Pending", alive=True, **pod)
    return {0: JobView(0, pods=(view,), generation=generation)}


def unschedulable(generation: int | None) -> dict[int, JobView]:
    return held(generation, unschedulable_since=SINCE, unschedulable_message=NO_GPUS)


def started() -> MixedPrecisionJobStatus:
    return reconcile(spec(16), MixedPrecisionJobStatus(), 1, {}, T0).status


@pytest.mark.parametrize(
    "jobs",
    [
        unschedulable(1),
        held(1, config_error='secret "keys" not found'),
        held(1, image_error='failed to pull and unpack image "team/trainer:9": not found'),
    ],
    ids=["unschedulable", "config-error", "image-pull"],
)
def test_a_held_attempt_s_job_made_from_an_older_spec_is_made_again_from_the_edited_one(
    jobs: dict[int, JobView],
) -> None:
    status = reconcile(spec(16), started(), 1, jobs, T0).status
    plan = reconcile(spec(1), status, 2, jobs, T0 + timedelta(seconds=5))
    assert plan.delete == [0] and plan.create == []
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "JobRecreated")]
    assert "(generation 1 -> 2)" in plan.events[0].message
    (attempt,) = plan.status.attempts
    assert attempt.finish_time is None and plan.status.phase == "Pending"  # the same attempt, not ended
    again = reconcile(spec(1), plan.status, 2, {}, T0 + timedelta(seconds=6))
    assert [s.index for s in again.create] == [0] and again.delete == []
    assert len(again.status.attempts) == 1 and again.status.attempt_counts.charged == 0


def test_an_attempt_made_again_with_fewer_processes_records_them_and_is_judged_by_them() -> None:
    """An edit of resources.gpusPerWorker (as the PodsScheduled condition asks) changes the processes
    of each worker: the Job made again runs that many. Before, the attempt kept the world size of
    its first Job (16 processes where 1 runs), and the operator, waiting for 16 pods to start, never
    judged it Stalled however long its step stood still."""
    edited = spec(1).model_copy(
        update={"run_policy": spec(1).run_policy.model_copy(update={"progress_deadline_seconds": 60})}
    )
    status = reconcile(spec(16), started(), 1, unschedulable(1), T0).status
    status = reconcile(edited, status, 2, unschedulable(1), T0 + timedelta(seconds=5)).status
    again = reconcile(edited, status, 2, {}, T0 + timedelta(seconds=6))
    (attempt,) = again.status.attempts
    assert (attempt.world_size, again.status.workers) == (1, 1)
    attempt.progress_time = "2026-11-22T12:00:10Z"
    runs = PodView("j-a0-0-y", 0, "Running", alive=True, started_at="2026-11-22T12:00:10Z")
    stood = reconcile(edited, again.status, 2, {0: JobView(0, pods=(runs,), generation=2)}, T0 + timedelta(seconds=200))
    assert stood.status.attempts[0].reason == "Stalled", stood.status.attempts[0]


@pytest.mark.parametrize(
    ("generation", "jobs"),
    [
        (1, unschedulable(1)),  # the spec it was made from: it waits for a node
        (2, unschedulable(None)),  # a Job of an older operator names no generation
        (2, held(1, unschedulable_since=SINCE, started_at=SINCE)),  # a trainer ran: not never started
        (2, {0: JobView(0, pods=(PodView("j-a0-0-x", 0, "Pending", alive=True),), generation=1)}),  # not held
    ],
    ids=["same-spec", "unnamed", "started", "not-held"],
)
def test_a_job_is_kept_unless_held_unstarted_and_made_from_an_older_spec(
    generation: int, jobs: dict[int, JobView]
) -> None:
    status = reconcile(spec(16), started(), 1, jobs, T0).status
    plan = reconcile(spec(1), status, generation, jobs, T0 + timedelta(seconds=5))
    assert plan.delete == [] and "JobRecreated" not in [e.reason for e in plan.events]


def test_the_job_names_the_generation_it_was_made_from_and_the_cache_reads_it_checked() -> None:
    start = StartAttempt(index=0, precision="fp16", resume_from=None, start_step=0)
    made = attempt_job(job="j", namespace="ns", uid="u", spec=spec(1), start=start, image="t:1", generation=3)
    assert made["metadata"]["annotations"] == {SPEC_GENERATION: "3"}
    for said, read in (("3", 3), ("-1", None), ("\uff13", None), ("x", None), ("9" * 30, None)):
        body = job(0)
        body["metadata"]["annotations"] = {SPEC_GENERATION: said}
        record = job_record(body)
        assert record is not None and record.generation == read, said
    record = job_record(job(0))
    assert record is not None and record.generation is None


class Deletes(FakeCluster):
    """The API server with the attempt Jobs it made (`job-<attempt>`), deletes that succeed and Nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.core = Core()  # a Job gone with its pod still there has the Nodes read

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        created = super().create_job(job, owner=owner)
        attempt = job["metadata"]["name"].rsplit("-a", 1)[1]
        return {**created, "metadata": {**created["metadata"], "uid": f"job-{attempt}"}}

    def delete_job(self, namespace: str, job: str, *, index: int, uid: str) -> bool:
        super().delete_job(namespace, job, index=index, uid=uid)
        return True


def made_from(generation: int) -> dict[str, Any]:
    """Attempt 0's Job as the watch brings it, made from the spec's `generation`."""
    body = job(0)
    body["metadata"]["annotations"] = {SPEC_GENERATION: str(generation)}
    return body


def test_a_reconcile_before_the_watch_shows_the_job_gone_neither_deletes_it_nor_says_so_again(events: list) -> None:  # noqa: F811
    """The edited job's status write queues a reconcile that can run before the Job's DELETED event
    arrives: it read the same Job, made from the older spec, and deleted and said it again."""
    cluster = Deletes()
    cluster.body["spec"]["resources"]["gpusPerWorker"] = 16
    made = reconciler(cluster)
    made.handle(KEY, False)  # attempt 0's Job, made from generation 1
    made.cache.apply("jobs", "ADDED", made_from(1))
    held = pod(0, "Pending", ip="")
    held["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    made.cache.apply("pods", "ADDED", held)
    cluster.body["spec"]["resources"]["gpusPerWorker"] = 0
    cluster.body["metadata"]["generation"] = 2
    made.bodies.offer(KEY, cluster.edited())  # the watch shows the edit
    made.handle(KEY, False)
    assert cluster.deleted == [("j-a0", "job-0")]
    going = copy.deepcopy(held)
    going["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:09Z"
    made.cache.apply("pods", "MODIFIED", going)  # the pods' watch shows its deletion before the Jobs' does
    made.handle(KEY, False)
    made.cache.apply("jobs", "MODIFIED", made_from(1))  # an event from before the deletion, read after it
    made.handle(KEY, False)
    assert cluster.deleted == [("j-a0", "job-0")] and cluster.creates == 1  # its pod still goes
    assert [reason for reason, _ in events].count("JobRecreated") == 1, events
    made.cache.apply("jobs", "DELETED", made_from(1))
    made.cache.apply("pods", "DELETED", held)
    made.handle(KEY, False)
    assert cluster.creates == 2 and [reason for reason, _ in events].count("JobRecreated") == 1
