"""A quiet job costs the API server no GET per tick: the reconcile plans from the newest body
the operator was shown (kopf's watch, its own status writes' answers), newest by
resourceVersion, and GETs the job only when none is held or its last reconcile failed (a write
refused with 409 among others); every status write is still made at the version it planned from."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpjob.controller.bodies import Bodies, adopt
from mpjob.controller.progress import ProgressReader, Target
from mpjob.controller.workqueue import Retry
from tests.unit.operator.test_api_errors import FakeCluster, events, owned, reconciler  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit

KEY = ("ns", "j")


def body(version: str, uid: str = "u", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "ns", "uid": uid, "resourceVersion": version}, "status": status}


class Made(FakeCluster):
    """The API server, whose creates answer the Job owned by the job (so the cache holds it)."""

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        self.creates += 1
        return owned(job, owner)

    def create_network_policy(self, policy: dict[str, Any], *, job: dict[str, Any]) -> None:
        pass


def started() -> tuple[Made, Any]:
    """A job whose first attempt's Job is made and recorded: its first reconcile's one GET."""
    cluster = Made()
    made = reconciler(cluster)
    made.handle(KEY, False)
    assert cluster.creates == 1 and cluster.body["status"]["attempts"][0]["jobUid"] == "job-uid"
    assert cluster.reads == 1
    return cluster, made


@pytest.mark.usefixtures("events")
def test_ticks_of_a_quiet_job_read_nothing_after_its_first_reconcile() -> None:
    cluster, made = started()
    version = cluster.body["metadata"]["resourceVersion"]
    for _ in range(10):
        made.handle(KEY, True)
    assert cluster.reads == 1, "a GET per tick"
    assert cluster.body["metadata"]["resourceVersion"] == version, "a quiet tick writes nothing"
    assert made.backoff.failures(KEY) == 0, "no write refused: the held body is the job as written"


@pytest.mark.usefixtures("events")
def test_a_newer_body_from_the_watch_is_planned_from() -> None:
    cluster, made = started()
    cluster.body["spec"]["runPolicy"] = {"suspend": True}  # a user's edit: the watch delivers it
    cluster.body["metadata"]["generation"] = 2
    made.bodies.offer(KEY, cluster.edited())
    made.handle(KEY, False)
    assert cluster.body["status"]["phase"] == "Suspended" and cluster.deleted == [("j-a0", "job-uid")]
    assert cluster.reads == 1 and made.backoff.failures(KEY) == 0


@pytest.mark.usefixtures("events")
def test_an_older_body_from_the_watch_is_ignored() -> None:
    cluster, made = started()
    late = copy.deepcopy(cluster.body)  # an event older than the job's writes, with a suspend in it
    late["metadata"]["resourceVersion"] = "1"
    late["spec"]["runPolicy"] = {"suspend": True}
    late.pop("status")
    made.bodies.offer(KEY, late)
    made.handle(KEY, True)
    assert cluster.body["status"]["phase"] != "Suspended" and cluster.deleted == [] and cluster.creates == 1
    assert cluster.reads == 1 and made.backoff.failures(KEY) == 0


@pytest.mark.usefixtures("events")
def test_a_write_refused_with_409_makes_exactly_one_get_on_the_next_reconcile() -> None:
    cluster, made = started()
    cluster.body["spec"]["runPolicy"] = {"suspend": True}  # a user's edit, which the watch shows
    cluster.body["metadata"]["generation"] = 2
    made.bodies.offer(KEY, cluster.edited())
    cluster.patch_status("ns", "j", {"message": "another writer"})  # a write the watch has not shown yet
    with pytest.raises(Retry):
        made.handle(KEY, False)  # its write at the edit's version: 409
    assert cluster.reads == 1 and cluster.deleted == [], "nothing acted on from the refused plan"
    made.bodies.offer(KEY, copy.deepcopy(cluster.body))  # the watch shows it now: the retry reads anyway
    made.handle(KEY, False)  # the retry (after its backoff) reads the job: once
    assert cluster.reads == 2 and cluster.body["status"]["phase"] == "Suspended"
    assert cluster.deleted == [("j-a0", "job-uid")]
    for _ in range(3):
        made.handle(KEY, True)
    assert cluster.reads == 2


def test_the_newest_body_is_kept_by_resource_version() -> None:
    bodies, reads = Bodies(), []

    def read() -> dict[str, Any]:
        reads.append(1)
        return body("9", phase="Read")

    bodies.offer(KEY, body("5", phase="Five"))
    bodies.offer(KEY, body("4", phase="Four"))
    assert bodies.body(KEY, read)["status"]["phase"] == "Five" and reads == []
    bodies.offer(KEY, body("7", phase="Seven"))
    assert bodies.body(KEY, read)["status"]["phase"] == "Seven"
    bodies.refused(KEY)
    bodies.offer(KEY, body("8", phase="Eight"))  # not taken while refused: the next read is newer
    assert bodies.body(KEY, read)["status"]["phase"] == "Read" and reads == [1]
    assert bodies.body(KEY, read)["status"]["phase"] == "Read" and reads == [1]
    bodies.forget(KEY)
    assert len(bodies) == 0
    bodies.offer(KEY, body("1", phase="Recreated"))  # a job made again under the name
    assert bodies.body(KEY, read)["status"]["phase"] == "Recreated"


def test_a_read_overtaken_by_a_forget_is_not_kept() -> None:
    bodies = Bodies()

    def read() -> dict[str, Any]:
        bodies.forget(KEY)  # the job deleted while the GET was under way
        return body("3")

    assert bodies.body(KEY, read) is not None and len(bodies) == 0


def test_a_forget_of_another_job_leaves_a_read_under_way_kept() -> None:
    bodies, reads = Bodies(), []

    def read() -> dict[str, Any]:
        reads.append(1)
        bodies.forget(("ns", "other"))  # another job deleted while this one's GET was under way
        return body("3")

    assert bodies.body(KEY, read) is not None and len(bodies) == 1
    assert bodies.body(KEY, read) is not None and reads == [1], "the job read again on its next reconcile"


def test_a_failed_read_leaves_the_next_one_kept() -> None:
    bodies = Bodies()

    def failing() -> dict[str, Any]:
        raise OSError("connection reset")

    with pytest.raises(OSError):
        bodies.body(KEY, failing)
    assert bodies.body(KEY, lambda: body("3")) is not None and len(bodies) == 1


def test_a_body_taken_is_a_copy_and_a_reconciles_body_is_kept_only_where_one_is_held() -> None:
    bodies = Bodies()
    bodies.offer(KEY, body("2"), only_held=True)
    assert len(bodies) == 0
    bodies.offer(KEY, body("2"))
    taken = bodies.body(KEY, dict)
    assert taken is not None
    taken["status"]["phase"] = "Mine"
    assert "phase" not in (bodies.body(KEY, dict) or {})["status"]


def test_a_writes_answer_is_adopted_only_for_the_same_object() -> None:
    mine = body("2", phase="Before")
    adopt(mine, body("3", uid="other", phase="Another"))
    assert mine["status"]["phase"] == "Before"
    adopt(mine, body("3", phase="Written"))
    assert mine["metadata"]["resourceVersion"] == "3" and mine["status"]["phase"] == "Written"


@pytest.mark.usefixtures("events")
def test_a_deleted_job_leaves_nothing_this_process_held_of_it() -> None:
    _, made = started()
    clock = [100.0]
    made.progress = ProgressReader(concurrency=1, deadline=0.5, max_bytes=1024, clock=lambda: clock[0])
    made.progress.request(KEY, Target(attempt=0, ip="127.0.0.1", precision="auto", port=1))  # nothing listens
    clock[0] = 105.0
    assert made.progress.unseen_for(KEY, 0) == 5.0 and len(made.bodies) == 1
    made.forget("mpj-uid", KEY)  # kopf's DELETED event: no reconcile of the name may follow
    assert made.progress.unseen_for(KEY, 0) == 0.0, "its rank 0's reading kept after the job was deleted"
    assert len(made.bodies) == 0 and KEY not in made.actions.owed and KEY not in made.actions.rebuilt
