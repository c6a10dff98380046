"""The operator's cache of attempt Jobs and pods, fed watch events as plain dicts: what it keeps,
and which events queue a reconcile."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpjob.controller.cache import ChildCache, job_record

pytestmark = pytest.mark.unit


def job(attempt: int, uid: str = "", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"j-a{attempt}",
            "namespace": "ns",
            "uid": uid or f"job-{attempt}",
            "labels": {"mpjob.dev/job": "j", "mpjob.dev/attempt": str(attempt)},
        },
        "spec": {"suspend": False},
        "status": status,
    }


def pod(attempt: int, phase: str = "Running", ip: str = "10.0.0.5", **terminated: Any) -> dict[str, Any]:
    state = {"terminated": terminated} if terminated else {"running": {}}
    return {
        "metadata": {
            "name": f"j-a{attempt}-0-x",
            "namespace": "ns",
            "uid": f"pod-{attempt}",
            "labels": {"mpjob.dev/job": "j", "mpjob.dev/attempt": str(attempt)},
            "annotations": {"batch.kubernetes.io/job-completion-index": "0"},
        },
        "status": {"phase": phase, "podIP": ip, "containerStatuses": [{"name": "trainer", "state": state}]},
    }


@pytest.fixture
def cache() -> tuple[ChildCache, list[tuple[str, str]]]:
    changed: list[tuple[str, str]] = []
    return ChildCache(changed.append), changed


def test_a_pods_exit_queues_a_reconcile_and_its_start_does_not(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.apply("pods", "ADDED", pod(0, "Pending", ip=""))
    c.apply("pods", "MODIFIED", pod(0))
    assert changed == []  # a starting pod changes no decision
    c.apply("pods", "MODIFIED", pod(0, "Failed", exitCode=42, message="{}"))
    assert changed == [("ns", "j")]
    c.apply("pods", "DELETED", pod(0, "Failed", exitCode=42))
    assert changed == [("ns", "j")] * 2


def test_only_job_changes_the_planner_reads_queue_a_reconcile(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.record_job(job(0))  # created by the operator itself: its ADDED event is no news
    c.apply("jobs", "ADDED", job(0))
    c.apply("jobs", "MODIFIED", job(0, ready=1))
    c.apply("jobs", "MODIFIED", job(0, active=1))  # counts: the pods' own events tell that
    assert changed == []
    c.apply("jobs", "MODIFIED", job(0, active=1, conditions=[{"type": "FailureTarget", "status": "True"}]))
    assert changed == [("ns", "j")]
    assert c.observe("ns", "j").jobs[0].finished == "Failed"


def test_a_created_job_never_replaces_what_the_watch_brought(cache: tuple[ChildCache, list]) -> None:
    c, _ = cache
    done = job(0, conditions=[{"type": "Complete", "status": "True"}])
    c.apply("jobs", "ADDED", done)
    c.record_job(job(0))  # an older copy (the create response, read late)
    assert c.observe("ns", "j").jobs[0].finished == "Complete"


def test_observe_groups_pods_by_attempt_with_rank0s_address_and_lingering_pods(cache: tuple[ChildCache, list]) -> None:
    c, _ = cache
    c.apply("jobs", "ADDED", job(1))
    c.apply("pods", "ADDED", pod(1))
    lingering = pod(0)
    lingering["metadata"]["deletionTimestamp"] = "2026-11-22T00:00:00Z"
    c.apply("pods", "ADDED", lingering)  # attempt 0's Job is gone, its pod still stops
    seen = c.observe("ns", "j")
    assert set(seen.jobs) == {1} and [p.alive for p in seen.jobs[1].pods] == [True]
    assert seen.rank0_ip[1] == "10.0.0.5"
    assert seen.lingering == frozenset({0})
    assert c.observe("ns", "other").jobs == {}


def test_a_relisting_replaces_one_namespace_and_reports_what_changed(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    other = copy.deepcopy(job(0, uid="o"))
    other["metadata"]["namespace"] = "other"
    c.apply("jobs", "ADDED", other)
    changed.clear()
    fresh = {("ns", "j"): {"job-1": job_record(job(1))}}
    assert c._replace(c._jobs, "ns", fresh) == {("ns", "j")}
    assert set(c.observe("ns", "j").jobs) == {1}
    assert set(c.observe("other", "j").jobs) == {0}  # another namespace's watch owns that
