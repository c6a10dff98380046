"""spec.elastic in a Kueue queue: the ClusterQueue's free `nvidia.com/gpu` quota sizes the job.
A Job held suspended for want of quota past elastic.waitSeconds ends ScaledDown, uncharged, and
the next attempt runs with the workers the free quota holds; a raised quota grows it back."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes.client.rest import ApiException

from mpjob.controller.queue import QueueReader, free_gpus, queue_workers, quota_short
from mpjob.controller.records import job_record
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.lifecycle import Plan
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

pytestmark = pytest.mark.unit

GPU = "nvidia.com/gpu"


def spec(**over: Any) -> MixedPrecisionJobSpec:
    doc: dict[str, Any] = {
        "workers": 3,
        "task": {"builtin": "mlp"},
        "training": {"batchSize": 4},
        "elastic": {"minWorkers": 1, "waitSeconds": 30},
        "resources": {"gpusPerWorker": 1},
        "runPolicy": {"queueName": "team-a"},
    }
    return MixedPrecisionJobSpec.model_validate({**doc, **over})


def cluster_queue(quota: int, reserved: int | None = None, *, usage_only: bool = False) -> dict[str, Any]:
    resources = [{"name": "cpu", "nominalQuota": 64}, {"name": GPU, "nominalQuota": quota}]
    doc: dict[str, Any] = {"spec": {"resourceGroups": [{"flavors": [{"name": "f", "resources": resources}]}]}}
    if reserved is not None:
        taken = [{"name": "f", "resources": [{"name": "cpu", "total": "8"}, {"name": GPU, "total": str(reserved)}]}]
        doc["status"] = {"flavorsUsage" if usage_only else "flavorsReservation": taken}
    return doc


TABLE: list[tuple[str, dict[str, Any], int, int | None]] = [
    ("empty-queue", cluster_queue(2), 0, 2),
    ("others-reserve", cluster_queue(4, 3), 0, 1),
    ("own-admitted-workers-count-as-its", cluster_queue(3, 2), 2, 3),
    ("over-reserved", cluster_queue(2, 5), 0, 0),
    ("usage-when-no-reservation", cluster_queue(4, 1, usage_only=True), 0, 3),
]


@pytest.mark.parametrize(("queue", "own", "fit"), [r[1:] for r in TABLE], ids=[r[0] for r in TABLE])
def test_workers_the_free_quota_holds(queue: dict[str, Any], own: int, fit: int | None) -> None:
    assert queue_workers(spec(), queue, own) == fit


def test_two_gpus_a_worker_and_cpu_jobs() -> None:
    two = spec(resources={"gpusPerWorker": 2})
    assert queue_workers(two, cluster_queue(5, 0), 0) == 2
    assert queue_workers(spec(resources={"gpusPerWorker": 0}), cluster_queue(5), 0) is None
    groups = [{"flavors": [{"resources": [{"name": GPU, "nominalQuota": "2"}]}]}] * 2
    assert free_gpus({"spec": {"resourceGroups": groups}}) == 4  # every group and flavor


def test_quota_short_reads_kueues_quota_verdict() -> None:
    pending = {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "insufficient quota"}
    assert quota_short({"status": {"conditions": [pending]}})
    assert not quota_short({"status": {"conditions": [{**pending, "status": "True"}]}})
    assert not quota_short({})


T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _at(job: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, jobs: dict, at: int, **kw: Any) -> Plan:
    return reconcile(job, status, 1, jobs, T0 + timedelta(seconds=at), **kw)


def held(index: int, *, short: bool = True, since: str | None = None) -> dict[int, JobView]:
    words = "insufficient quota"
    return {index: JobView(index, suspended=True, queue_message=words, quota_short=short, suspended_since=since)}


def test_a_job_held_for_quota_past_wait_seconds_shrinks_to_the_free_quota_and_grows_when_it_is_raised() -> None:
    job = spec()
    status = _at(job, MixedPrecisionJobStatus(), {}, 0).status
    assert not _at(job, status, held(0), 20, fits=2).delete  # within elastic.waitSeconds
    assert not _at(job, status, held(0, short=False), 40, fits=2).delete  # the queue does not say quota
    assert not _at(job, status, held(0), 40, fits=None).delete  # the quota unread: wait on
    assert not _at(job, status, held(0), 40, fits=0).delete  # below minWorkers: wait on
    assert not _at(job, status, held(0, since="2026-11-28T12:00:20Z"), 40, fits=2).delete  # suspended 20s only
    shrunk = _at(job, status, held(0), 40, fits=2)
    assert shrunk.delete == [0] and not shrunk.create
    first, second = shrunk.status.attempts
    assert (first.reason, first.charged, first.world_size, second.world_size) == ("ScaledDown", False, 3, 2)
    assert "its Job waited for its queue's quota for 40s" in (first.message or "")
    assert "the queue's free quota holds 2 worker(s): 3 -> 2" in (first.message or "")
    created = _at(job, shrunk.status, {}, 41).create
    assert [c.workers for c in created] == [2]
    status = shrunk.status
    status.step = 20
    running = {1: JobView(1, pods=(PodView("q0", 0, "Running", True), PodView("q1", 1, "Running", True)))}
    assert _at(job, status, running, 50, fits=2).status.grow_after_step is None  # its own 2, no more
    noticed = _at(job, status, running, 60, fits=3)
    assert noticed.status.grow_after_step == 20


class Response:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc).encode()

    def release_conn(self) -> None:
        pass


class Custom:
    """Kueue's objects as the API serves them; `denied`: the kinds a chart without the rule refuses."""

    def __init__(self, cluster_queue: dict[str, Any], denied: frozenset[str] = frozenset()) -> None:
        self.cluster_queue, self.denied, self.reads = cluster_queue, denied, []

    def _answer(self, plural: str, name: str, doc: dict[str, Any]) -> Response:
        self.reads.append((plural, name))
        if plural in self.denied:
            raise ApiException(status=403)
        return Response(doc)

    def get_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str, **_: Any) -> Any:
        return self._answer(plural, name, {"spec": {"clusterQueue": "cq"}})

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **_: Any) -> Any:
        return self._answer(plural, name, self.cluster_queue)


def reader(custom: Custom) -> QueueReader:
    return QueueReader(cast(Any, SimpleNamespace(custom=custom)))


def test_the_reader_asks_the_queue_only_for_a_waiting_or_small_attempt_and_stops_after_a_403() -> None:
    job = spec()
    status = _at(job, MixedPrecisionJobStatus(), {}, 0).status
    custom = Custom(cluster_queue(2))
    assert reader(custom).room("ml", job, status, held(0)) == 2
    assert custom.reads == [("localqueues", "team-a"), ("clusterqueues", "cq")]
    full = {0: JobView(0, pods=(PodView("p0", 0, "Running", True),))}
    assert reader(custom).room("ml", job, status, full) is None  # runs at its full size: no read
    assert reader(custom).room("ml", spec(elastic=None), status, held(0)) is None
    denied = Custom(cluster_queue(2), denied=frozenset({"clusterqueues"}))
    quiet = reader(denied)
    assert quiet.room("ml", job, status, held(0)) is None
    assert quiet.room("ml", job, status, held(0)) is None
    assert denied.reads.count(("clusterqueues", "cq")) == 1  # quiet after the 403


def test_a_jobs_wait_counts_from_its_suspended_condition_else_its_creation() -> None:
    owner = {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "name": "j",
        "uid": "u",
        "controller": True,
    }
    meta = {"name": "j-a0", "namespace": "ml", "uid": "v", "creationTimestamp": "T0", "ownerReferences": [owner]}
    suspended = {"type": "Suspended", "status": "True", "lastTransitionTime": "T1"}
    record = job_record({"metadata": meta, "spec": {"suspend": True}, "status": {"conditions": [suspended]}})
    assert record is not None and record.suspended_since == "T1"
    record = job_record({"metadata": meta, "spec": {"suspend": True}})
    assert record is not None and record.suspended_since == "T0"
