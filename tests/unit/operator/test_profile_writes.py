"""status.profiles is written as every status write is: only at the resourceVersion the
reconcile holds. One refused (another writer changed the job since its read) is planned again by
the next reconcile from a new read, never written over the newer status, its Events told then,
and rank 0's answer it took kept for it; the reconcile goes on (no retry storm)."""

from __future__ import annotations

import copy

import pytest

from mpjob.controller.cache import NOTHING_SEEN
from mpjob.controller.profiles import ProfileRequests
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.tracking import PROFILE_ANNOTATION, ProfileAnswer
from tests.unit.operator.test_api_errors import FakeCluster, events  # noqa: F401 (a fixture)
from tests.unit.operator.test_quiet_reads import KEY, started

pytestmark = pytest.mark.unit

RUNNING = MixedPrecisionJobStatus(phase="Running", attempt=0, attempts=[AttemptStatus(index=0, precision="bf16")])


def test_a_profiles_write_from_an_older_read_is_refused_and_planned_again(events: list) -> None:  # noqa: F811
    cluster = FakeCluster()
    cluster.body["metadata"]["annotations"] = {PROFILE_ANNOTATION: "5"}
    cluster.body["status"] = RUNNING.to_api()
    spec = MixedPrecisionJobSpec.model_validate(cluster.body["spec"])
    requests = ProfileRequests(cluster, 2.0, b"k" * 32)  # type: ignore[arg-type]
    read = cluster.read_job("ns", "j")
    cluster.patch_status("ns", "j", {"message": "another writer"})  # after that read
    requests._answers["mpj-uid"] = answer = ProfileAnswer(id=9, state="Captured")  # rank 0's, taken by it
    requests.reconcile(read, spec, RUNNING.model_copy(deep=True), NOTHING_SEEN)  # no exception: left for later
    assert not cluster.body["status"].get("profiles") and cluster.body["status"]["message"] == "another writer"
    assert events == [] and requests._answers["mpj-uid"] == answer
    fresh = cluster.read_job("ns", "j")
    requests.reconcile(
        fresh, spec, MixedPrecisionJobStatus.model_validate(copy.deepcopy(fresh["status"])), NOTHING_SEEN
    )
    assert [p["request"] for p in cluster.body["status"]["profiles"]] == ["5"]
    assert cluster.body["status"]["message"] == "another writer"
    assert [reason for reason, _ in events] == ["ProfileRequested"]
    assert fresh["metadata"]["resourceVersion"] == cluster.body["metadata"]["resourceVersion"], (
        "its write's version kept"
    )


@pytest.mark.usefixtures("events")
def test_a_refused_profiles_write_makes_the_next_reconcile_read_the_job_anew() -> None:
    cluster, made = started()
    cluster.body["metadata"]["annotations"] = {PROFILE_ANNOTATION: "many"}  # refused in any phase: a write
    made.bodies.offer(KEY, cluster.edited())  # the watch shows the user's annotation
    cluster.patch_status("ns", "j", {"message": "another writer"})  # a write the watch has not shown yet
    made.handle(KEY, False)  # its profiles write at the annotation's version: 409, the reconcile goes on
    assert not cluster.body["status"].get("profiles") and made.backoff.failures(KEY) == 0
    made.handle(KEY, False)  # the held body is behind the job: read anew, not refused again
    assert cluster.reads == 2, "the body a 409 showed stale was planned from again"
    assert [(p["request"], p["state"]) for p in cluster.body["status"]["profiles"]] == [("many", "Refused")]
    assert cluster.body["status"]["message"] == "another writer"
