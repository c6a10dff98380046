"""Pods an attempt's Job left behind when it was deleted with --cascade=orphan (the garbage
collector removes their ownerReference, the Job controller's labels stay): the cache keeps
following them as that Job's, the operator stops the ones whose Job it held, and never one
whose Job was not one of this job's."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.controller.cache import ChildCache
from tests.unit.operator.test_cache import MPJ_UID, job, pod

pytestmark = pytest.mark.unit


def orphaned(attempt: int, phase: str = "Running", *, job_uid: str = "", **terminated: Any) -> dict[str, Any]:
    """Attempt `attempt`'s rank-0 pod once its Job was deleted leaving it: no ownerReference,
    the Job controller's labels naming the Job (`job_uid`: another Job's UID)."""
    made = pod(attempt, phase, **terminated)
    del made["metadata"]["ownerReferences"]
    made["metadata"]["labels"] |= {
        "batch.kubernetes.io/controller-uid": job_uid or f"job-{attempt}",
        "batch.kubernetes.io/job-name": f"j-a{attempt}",
    }
    return made


def left_behind(c: ChildCache) -> None:
    """Attempt 0 runs; its Job is deleted with --cascade=orphan while its pod runs."""
    c.apply("jobs", "ADDED", job(0))
    c.apply("pods", "ADDED", pod(0))
    c.apply("pods", "MODIFIED", orphaned(0))  # the garbage collector takes the ownerReference off
    c.apply("jobs", "DELETED", job(0))


def test_a_pod_its_deleted_job_left_running_makes_the_attempt_wait_and_is_to_be_stopped() -> None:
    changed: list[tuple[str, str]] = []
    c = ChildCache(changed.append)
    left_behind(c)
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.lingering == {0} and not seen.jobs and not seen.stopped
    assert {a: [(p.name, p.uid) for p in pods] for a, pods in seen.orphans.items()} == {0: [("j-a0-0-x", "pod-0")]}
    # Deleted (by the operator): it stops with its own grace, and is asked for no second time.
    going = orphaned(0)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    c.apply("pods", "MODIFIED", going)
    assert c.observe("ns", "j", MPJ_UID).orphans == {}
    changed.clear()
    c.apply("pods", "MODIFIED", orphaned(0, "Failed", exitCode=143, message="{}"))
    assert changed == [("ns", "j")]  # its stop is news: the attempt goes on
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.lingering == frozenset() and list(seen.stopped) == [0]
    (stopped,) = seen.stopped[0].pods
    assert (stopped.alive, stopped.exit_code) == (False, 143)


def test_a_pod_its_deleted_job_left_that_stops_by_itself_ends_the_wait() -> None:
    c = ChildCache(lambda key: None)
    left_behind(c)
    c.apply("pods", "MODIFIED", orphaned(0, "Succeeded", exitCode=0, message="{}"))
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.lingering == frozenset() and list(seen.stopped) == [0]
    assert [p.name for p in seen.orphans[0]] == ["j-a0-0-x"]  # still there: deleted, so nothing is left


def test_a_pod_whose_labels_name_another_job_is_never_stopped() -> None:
    c = ChildCache(lambda key: None)
    c.apply("jobs", "ADDED", job(0))
    c.apply("jobs", "DELETED", job(0))
    c.apply("pods", "ADDED", orphaned(0, job_uid="somebody-elses"))  # same name, another UID
    c.apply("pods", "ADDED", {**pod(1), "metadata": {**pod(1)["metadata"], "ownerReferences": []}})  # no labels
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.orphans == {}
    # Of an attempt's name, a pod whose Job is not held only ever makes an attempt wait.
    assert seen.lingering == {0}


def test_a_pod_with_another_controller_is_not_read_by_its_labels() -> None:
    c = ChildCache(lambda key: None)
    c.apply("jobs", "ADDED", job(0))
    theirs = orphaned(0)
    theirs["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}
    ]
    c.apply("pods", "ADDED", theirs)
    c.apply("jobs", "DELETED", job(0))
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.orphans == {} and seen.lingering == frozenset()


def test_an_operator_that_restarts_waits_for_pods_a_deleted_job_left_and_stops_none() -> None:
    c = ChildCache(lambda key: None)
    c.relist("jobs", "ns", [])
    c.relist("pods", "ns", [orphaned(0)])  # their Job's UID is no longer known to be ours
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.lingering == {0} and seen.orphans == {}


def test_a_watch_relisted_keeps_a_pod_its_deleted_job_left() -> None:
    c = ChildCache(lambda key: None)
    left_behind(c)
    c.relist("pods", "ns", [orphaned(0)])  # the watch fell behind: the listing still has it
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.lingering == {0} and [p.uid for p in seen.orphans[0]] == ["pod-0"]


def test_an_operator_that_restarts_stops_the_pods_a_job_its_status_records_left_and_counts_them() -> None:
    changed: list[tuple[str, str]] = []
    c = ChildCache(changed.append)
    c.relist("jobs", "ns", [])
    c.relist("pods", "ns", [orphaned(0)])  # left by attempt 0's Job, deleted while the operator was away
    seen = c.observe("ns", "j", MPJ_UID, recorded={0: "job-0"})
    assert seen.lingering == {0} and not seen.jobs
    assert {a: [p.uid for p in pods] for a, pods in seen.orphans.items()} == {0: ["pod-0"]}
    c.apply("pods", "MODIFIED", orphaned(0, "Failed", exitCode=143, message="{}"))
    assert changed == [("ns", "j")]  # its stop is news: the attempt goes on
    seen = c.observe("ns", "j", MPJ_UID, recorded={0: "job-0"})
    assert seen.lingering == frozenset() and [p.exit_code for p in seen.stopped[0].pods] == [143]  # counted


def test_a_restarted_operator_stops_no_pod_whose_job_uid_its_status_does_not_record() -> None:
    c = ChildCache(lambda key: None)
    c.relist("jobs", "ns", [])
    copied = orphaned(1, job_uid="copied-labels")  # attempt 1's name and labels, another Job's UID
    c.relist("pods", "ns", [orphaned(0), copied])
    seen = c.observe("ns", "j", MPJ_UID, recorded={0: "another-job", 1: "job-1"})
    assert seen.orphans == {} and seen.lingering == {0, 1} and not seen.stopped


def test_pods_asked_to_stop_are_not_stopped_again_before_the_watch_shows_them_going() -> None:
    c = ChildCache(lambda key: None)
    left_behind(c)
    c.stopping(c.observe("ns", "j", MPJ_UID).orphans[0])
    assert c.observe("ns", "j", MPJ_UID).orphans == {}
    c.apply("pods", "MODIFIED", orphaned(0))  # an event from before the deletion, late
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.orphans == {} and seen.lingering == {0}  # still waited for until it stops
