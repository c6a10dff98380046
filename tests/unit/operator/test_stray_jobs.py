"""A Job made for an attempt the status has ended (an operator that stalled between writing
"attempt N starts" and making its Job, and woke once another had gone past it) is deleted by the
next reconcile, once, with its UID as a precondition and a Warning Event naming it; a Job of the
current attempt whose uid is not recorded yet is the attempt's own (recorded, never deleted). Of
an ended attempt whose entry records no Job (a status written before jobUid, or an attempt ended
before any Job of it was made), the Job's own creationTimestamp decides: made after the entry's
finishTime, a stray (deleted, never in the lineage); made no later (in the same second too), the
attempt's own (recorded). A Job this MixedPrecisionJob does not control is never touched.
Nothing creates a Job for an attempt the status written has ended."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.controller.actions import Actions
from mpjob.controller.cache import NOTHING_SEEN, ChildCache
from mpjob.controller.config import OperatorConfig
from mpjob.planning import history
from mpjob.planning.history import HeldJob
from mpjob.planning.plan import Plan
from mpjob.planning.planner import StartAttempt
from mpjob.planning.status import stamp
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.launch import LAUNCH_ENV, AttemptLaunch
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_cache import job, owner, pod

pytestmark = pytest.mark.unit

KEY = ("ns", "j")


def at(minutes: int, seconds: int = 0) -> str:
    """The moment `minutes` (and `seconds`) ago, as the status and Kubernetes write it."""
    return stamp(datetime.now(UTC) - timedelta(minutes=minutes, seconds=seconds))


def moved_on(*, current_uid: str | None = "job-1", ended_uid: str | None = "job-0") -> dict[str, Any]:
    """Attempt 0 ended (its Job `ended_uid`), attempt 1 runs in its Job `current_uid`."""
    first = {"index": 0, "precision": "fp32", "startTime": at(9), "finishTime": at(5), "reason": "Preempted"}
    current = {"index": 1, "precision": "fp32", "startTime": at(5)}
    if ended_uid:
        first["jobUid"] = ended_uid
    if current_uid:
        current["jobUid"] = current_uid
    return {"phase": "Running", "precision": "fp32", "attempt": 1, "startTime": at(9), "attempts": [first, current]}


def cluster_at(status: dict[str, Any]) -> FakeCluster:
    cluster = FakeCluster()
    cluster.body["status"] = status

    def delete_job(namespace: str, name: str, *, index: int, uid: str) -> bool:
        cluster.deleted.append((f"{name}-a{index}", uid))
        return True

    cluster.delete_job = delete_job  # type: ignore[method-assign]
    return cluster


def told(posted: list[tuple[str, str]], reason: str) -> list[str]:
    return [message for r, message in posted if r == reason]


@pytest.mark.parametrize("running", [False, True], ids=["no-pods-yet", "its-pod-runs"])
def test_a_job_made_for_an_ended_attempt_is_deleted_once_by_uid_and_said(events: list, running: bool) -> None:  # noqa: F811
    cluster = cluster_at(moved_on())
    made = reconciler(cluster)
    made.cache.relist("jobs", None, [job(1), job(0, uid="stray")])  # a stalled operator's Job for attempt 0
    stray_pod = pod(0)
    stray_pod["metadata"]["ownerReferences"] = owner("Job", "j-a0", "stray")
    if running:
        made.cache.relist("pods", None, [pod(1), stray_pod])
    made.handle(KEY, False)
    made.handle(KEY, True)  # before the watch shows it gone: not deleted (nor said) again
    assert cluster.deleted == [("j-a0", "stray")]
    (said,) = told(events, "StrayJobDeleted")
    assert "j-a0" in said and "stray" in said and "attempt 0" in said
    assert [a.get("jobUid") for a in cluster.body["status"]["attempts"]] == ["job-0", "job-1"], "never recorded"
    if running:  # its pods go with it (the garbage collector)
        made.cache.apply("pods", "DELETED", stray_pod)
    made.cache.apply("jobs", "DELETED", job(0, uid="stray"))
    made.handle(KEY, True)
    assert cluster.deleted == [("j-a0", "stray")] and len(told(events, "StrayJobDeleted")) == 1


def test_a_job_made_for_an_attempt_that_ended_before_any_job_of_it_is_a_stray(events: list) -> None:  # noqa: F811
    status = moved_on(ended_uid=None)  # attempt 0 ended before any Job of it was made
    cluster = cluster_at(status)
    made = reconciler(cluster)
    late = job(0, uid="late", created=at(4))  # made a minute after attempt 0 ended (at(5)), by a stalled operator
    made.cache.relist("jobs", None, [job(1, created=at(5)), late])
    made.handle(KEY, False)
    made.handle(KEY, True)
    assert cluster.deleted == [("j-a0", "late")] and len(told(events, "StrayJobDeleted")) == 1
    assert [a.get("jobUid") for a in cluster.body["status"]["attempts"]] == [None, "job-1"], "a stray never recorded"
    written = MixedPrecisionJobStatus.model_validate(cluster.body["status"])
    assert history.lineage(written, 2) == {0: [], 1: ["job-1"]}, "the next attempt would resume from the stray's"


@pytest.mark.parametrize("seconds", [0, 30], ids=["in-the-second-it-ended", "before-it-ended"])
def test_a_job_made_no_later_than_its_attempt_ended_is_its_own(events: list, seconds: int) -> None:  # noqa: F811
    cluster = cluster_at(moved_on(ended_uid=None))
    ended = cluster.body["status"]["attempts"][0]["finishTime"]
    made = reconciler(cluster)
    kept = job(0, created=at(5, seconds) if seconds else ended)  # whole seconds both: the tie is not a stray
    made.cache.relist("jobs", None, [kept, job(1)])
    made.handle(KEY, False)
    assert cluster.deleted == [] and told(events, "StrayJobDeleted") == []
    assert [a.get("jobUid") for a in cluster.body["status"]["attempts"]] == ["job-0", "job-1"]


def test_the_next_attempts_launch_names_no_late_job_of_an_ended_attempt(events: list) -> None:  # noqa: F811
    cluster = cluster_at(moved_on(current_uid=None, ended_uid=None))  # attempt 1 begun, its Job not made yet
    launched: list[dict[str, Any]] = []

    def create_job(made: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        launched.append(made)
        return {**made, "metadata": {**made["metadata"], "uid": "job-1", "ownerReferences": []}}

    cluster.create_job = create_job  # type: ignore[method-assign]
    made = reconciler(cluster)
    made.cache.relist("jobs", None, [job(0, uid="late", created=at(4))])
    made.handle(KEY, False)
    assert cluster.deleted == [("j-a0", "late")]
    (attempt_1,) = launched
    env = {e["name"]: e for e in attempt_1["spec"]["template"]["spec"]["containers"][0]["env"]}
    launch = AttemptLaunch.model_validate_json(env[LAUNCH_ENV]["value"])
    assert launch.attempt == 1 and launch.lineage == {0: []}, "the late Job's checkpoints would be resumed from"


def test_the_kept_jobs_of_a_status_written_before_job_uids_are_the_jobs_own(events: list) -> None:  # noqa: F811
    cluster = cluster_at(moved_on(current_uid=None, ended_uid=None))  # an older operator's status: no jobUid
    made = reconciler(cluster)
    failed = [{"type": "Failed", "status": "True"}]
    kept = job(0, created=at(9), conditions=failed)  # attempt 0's Job, made as it began, kept after it ended
    made.cache.relist("jobs", None, [kept, job(1)])
    made.cache.relist("pods", None, [pod(1)])
    made.handle(KEY, False)  # the upgraded operator's first reconcile
    made.handle(KEY, True)
    assert cluster.deleted == [] and told(events, "StrayJobDeleted") == [], "an unknown jobUid taken as evidence"
    assert [a.get("jobUid") for a in cluster.body["status"]["attempts"]] == ["job-0", "job-1"], "recorded as its own"


@pytest.mark.parametrize("recorded", [None, "its-first-job"], ids=["none-yet", "made-again"])
def test_the_current_attempts_job_whose_uid_is_not_recorded_yet_is_kept_and_recorded(
    events: list,  # noqa: F811
    recorded: str | None,
) -> None:
    cluster = cluster_at(moved_on(current_uid=recorded))
    made = reconciler(cluster)
    made.cache.relist("jobs", None, [job(0), job(1, uid="made-now")])
    made.handle(KEY, False)
    made.handle(KEY, True)
    assert cluster.deleted == [] and told(events, "StrayJobDeleted") == []
    assert [a.get("jobUid") for a in cluster.body["status"]["attempts"]] == ["job-0", "made-now"]


def test_a_job_this_mixed_precision_job_does_not_control_is_never_touched(events: list) -> None:  # noqa: F811
    cluster = cluster_at(moved_on())
    made = reconciler(cluster)
    former = job(0, uid="former")  # of a job of this name deleted and created again
    former["metadata"]["ownerReferences"] = owner("MixedPrecisionJob", "j", "an-older-uid")
    loose = job(0, uid="loose", namespace="ns")  # no controller at all: made by somebody else
    loose["metadata"]["ownerReferences"] = []
    made.cache.relist("jobs", None, [job(1), former])
    made.handle(KEY, False)
    made.cache.relist("jobs", None, [job(1), loose])
    made.handle(KEY, True)
    assert cluster.deleted == [] and told(events, "StrayJobDeleted") == []


def test_the_stray_rule_spares_the_running_chain_and_the_recorded_jobs() -> None:
    status = MixedPrecisionJobStatus.model_validate(moved_on())
    assert history.strays(status, {0: HeldJob("job-0"), 1: HeldJob("job-1")}) == {}
    others = {0: HeldJob("other"), 1: HeldJob("other")}
    assert history.strays(status, others) == {0: "other"}  # attempt 1 runs: its Job is its own
    status.attempts[1].in_place = True  # attempt 1 begun in place in attempt 0's Job
    assert history.strays(status, {0: HeldJob("job-0")}) == {}
    status.attempts[0].job_uid = None  # an entry that records no Job (a status written before jobUid)
    assert history.strays(status, {0: HeldJob("any"), 1: HeldJob("other")}) == {}


def test_an_ended_entry_without_a_job_is_judged_by_the_jobs_creation_to_the_second() -> None:
    status = MixedPrecisionJobStatus.model_validate(moved_on(ended_uid=None))
    status.attempts[0].finish_time = "2026-12-02T10:00:00Z"
    same, before, after = "2026-12-02T10:00:00Z", "2026-12-02T09:59:59Z", "2026-12-02T10:00:01Z"
    jobs = {0: HeldJob("late", after), 1: HeldJob("job-1")}
    assert history.strays(status, jobs) == {0: "late"} and history.own(status, jobs) == {1: "job-1"}
    for created in (same, before, "2026-12-02T10:00:00.900000+00:00"):  # the same second: not late
        assert history.strays(status, {0: HeldJob("j", created)}) == {}
        assert history.own(status, {0: HeldJob("j", created)}) == {0: "j"}
    for unknown in (None, "yesterday"):  # no evidence either way: neither deleted nor recorded
        assert (
            history.strays(status, {0: HeldJob("j", unknown)}) == {} == history.own(status, {0: HeldJob("j", unknown)})
        )
    status.attempts[0].job_uid = "late"  # recorded: the Job's creation no longer matters
    assert history.strays(status, jobs) == {} and history.own(status, jobs) == {0: "late", 1: "job-1"}


def test_no_job_is_made_for_an_attempt_the_status_written_has_ended() -> None:
    cluster = FakeCluster()
    spec = MixedPrecisionJobSpec.model_validate(cluster.body["spec"])
    status = MixedPrecisionJobStatus.model_validate(moved_on())
    actions = Actions(OperatorConfig(), cluster, ChildCache(lambda key: None))  # type: ignore[arg-type]
    plan = Plan(status=copy.deepcopy(status), create=[StartAttempt(0, "fp32", None, 0)])
    assert actions.apply(cluster.body, spec, plan, seen=NOTHING_SEEN) is None
    assert cluster.creates == 0
    plan = Plan(status=copy.deepcopy(status), create=[StartAttempt(1, "fp32", None, 0)])  # the current one
    actions.apply(cluster.body, spec, plan, seen=NOTHING_SEEN)
    assert cluster.creates == 1
