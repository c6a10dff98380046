"""The operator's cache of attempt Jobs, pods and FailedCreate Events, fed watch events as plain
dicts: what it keeps, and which events queue a reconcile."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpjob.controller.cache import ChildCache
from mpjob.planning.endings import outcome_of
from tests.unit.operator.test_api_errors import FakeCluster, reconciler

pytestmark = pytest.mark.unit

MPJ_UID = "mpj-uid"


def owner(kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": True}]


def job(
    attempt: int, uid: str = "", namespace: str = "ns", created: str | None = None, **status: Any
) -> dict[str, Any]:
    """The attempt Job `j-a<attempt>` (`created`: its creationTimestamp, if any) with `status`."""
    return {
        "metadata": {
            "name": f"j-a{attempt}",
            "namespace": namespace,
            "uid": uid or f"job-{attempt}",
            "labels": {"mpjob.dev/job": "j", "mpjob.dev/attempt": str(attempt)},
            "ownerReferences": owner("MixedPrecisionJob", "j", MPJ_UID),
        }
        | ({"creationTimestamp": created} if created else {}),
        "spec": {"suspend": False},
        "status": status,
    }


def pod(
    attempt: int,
    phase: str = "Running",
    ip: str = "10.0.0.5",
    *,
    rank: int = 0,
    node: str | None = None,
    **terminated: Any,
) -> dict[str, Any]:
    state = {"terminated": terminated} if terminated else {"running": {}}
    return {
        "metadata": {
            "name": f"j-a{attempt}-{rank}-x",
            "namespace": "ns",
            "uid": f"pod-{attempt}" if rank == 0 else f"pod-{attempt}-{rank}",
            "labels": {"mpjob.dev/job": "j", "mpjob.dev/attempt": str(attempt)},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
            "ownerReferences": owner("Job", f"j-a{attempt}", f"job-{attempt}"),
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "podIP": ip, "containerStatuses": [{"name": "trainer", "state": state}]},
    }


@pytest.fixture
def cache() -> tuple[ChildCache, list[tuple[str, str]]]:
    changed: list[tuple[str, str]] = []
    return ChildCache(changed.append), changed


def test_a_pods_start_and_exit_queue_a_reconcile_and_its_creation_does_not(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    changed.clear()
    c.apply("pods", "ADDED", pod(0, "Pending", ip=""))
    assert changed == []  # a pending pod changes no decision
    c.apply("pods", "MODIFIED", pod(0))
    assert changed == [("ns", "j")]  # a trainer runs: the phase becomes Running
    c.apply("pods", "MODIFIED", pod(0, ip="10.0.0.6"))
    assert changed == [("ns", "j")]  # a new address is no news
    c.apply("pods", "MODIFIED", pod(0, "Failed", exitCode=42, message="{}"))
    assert changed == [("ns", "j")] * 2
    c.apply("pods", "DELETED", pod(0, "Failed", exitCode=42))
    assert changed == [("ns", "j")] * 3


def test_only_job_changes_the_planner_reads_queue_a_reconcile(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.record_job(job(0))  # created by the operator itself: its ADDED event is no news
    c.apply("jobs", "ADDED", job(0))
    c.apply("jobs", "MODIFIED", job(0, ready=1))
    c.apply("jobs", "MODIFIED", job(0, active=1))  # counts: the pods' own events tell that
    assert changed == []
    c.apply("jobs", "MODIFIED", job(0, active=1, conditions=[{"type": "FailureTarget", "status": "True"}]))
    assert changed == [("ns", "j")]
    assert c.observe("ns", "j", MPJ_UID).jobs[0].finished == "Failed"


def test_a_created_job_never_replaces_what_the_watch_brought(cache: tuple[ChildCache, list]) -> None:
    c, _ = cache
    done = job(0, conditions=[{"type": "Complete", "status": "True"}])
    c.apply("jobs", "ADDED", done)
    c.record_job(job(0))  # an older copy (the create response, read late)
    assert c.observe("ns", "j", MPJ_UID).jobs[0].finished == "Complete"


def test_observe_groups_pods_by_attempt_with_rank0s_address_and_lingering_pods(cache: tuple[ChildCache, list]) -> None:
    c, _ = cache
    c.apply("jobs", "ADDED", job(0))
    c.apply("jobs", "ADDED", job(1))
    c.apply("pods", "ADDED", pod(1))
    lingering = pod(0)
    lingering["metadata"]["deletionTimestamp"] = "2026-11-22T00:00:00Z"
    c.apply("pods", "ADDED", lingering)
    c.apply("jobs", "DELETED", job(0))  # attempt 0's Job is gone, its pod still stops
    seen = c.observe("ns", "j", MPJ_UID)
    assert set(seen.jobs) == {1} and [p.alive for p in seen.jobs[1].pods] == [True]
    assert seen.rank0_ip == {1: "10.0.0.5"} and seen.uids == {1: "job-1"}
    assert seen.lingering == frozenset({0})
    c.apply("pods", "DELETED", lingering)
    assert c.observe("ns", "j", MPJ_UID).lingering == frozenset()
    assert c._children.held("jobs").keys() == {"job-1"}  # the deleted Job is forgotten with its last pod
    assert c.observe("ns", "other", MPJ_UID).jobs == {}


def test_a_relisting_replaces_one_namespace_and_reports_what_changed(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    other = copy.deepcopy(job(0, uid="o", namespace="other"))
    c.apply("jobs", "ADDED", other)
    changed.clear()
    c.relist("jobs", "ns", [job(1)])
    assert changed == [("ns", "j")]
    assert set(c.observe("ns", "j", MPJ_UID).jobs) == {1}
    assert set(c.observe("other", "j", MPJ_UID).jobs) == {0}  # another namespace's watch owns that
    changed.clear()
    c.relist("jobs", "ns", [job(1)])
    assert changed == []  # nothing new


def test_a_failed_create_shows_on_its_job_and_queues_a_reconcile(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    changed.clear()
    event = {
        "metadata": {"name": "j-a0.1", "namespace": "ns", "uid": "ev-1"},
        "involvedObject": {"kind": "Job", "name": "j-a0", "namespace": "ns", "uid": "job-0"},
        "reason": "FailedCreate",
        "message": 'Error creating: pods "j-a0-0-x" is forbidden: violates PodSecurity',
    }
    c.apply("events", "ADDED", event)
    assert changed == [("ns", "j")]
    assert "violates PodSecurity" in (c.observe("ns", "j", MPJ_UID).jobs[0].create_error or "")
    c.apply("events", "MODIFIED", {**event, "count": 2})
    assert changed == [("ns", "j")]  # the same message again is no news
    c.apply("events", "DELETED", event)
    assert c.observe("ns", "j", MPJ_UID).jobs[0].create_error is None


def evicted(attempt: int, *, rank: int = 0) -> dict[str, Any]:
    """Attempt `attempt`'s pod as the Eviction API leaves it: DisruptionTarget, being deleted,
    and its launcher's exit (44, Preempted) reported."""
    gone = pod(attempt, "Failed", rank=rank, exitCode=44, message="")
    gone["metadata"]["deletionTimestamp"] = "2026-11-30T12:41:43Z"
    condition = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    gone["status"]["conditions"] = [condition]
    return gone


def test_a_pod_removed_before_a_reconcile_read_it_still_tells_how_it_ended(cache: tuple[ChildCache, list]) -> None:
    """An evicted pod is gone a second after its eviction; a busy operator's reconcile comes
    after that, beside a Job that says only BackoffLimitExceeded. The pod stays as last seen."""
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    c.apply("pods", "ADDED", pod(0))
    changed.clear()
    c.apply("pods", "DELETED", evicted(0))  # its last MODIFIED events never reached a reconcile
    c.apply("jobs", "MODIFIED", job(0, failed=1, conditions=[{"type": "Failed", "status": "True"}]))
    assert changed == [("ns", "j")] * 2
    seen = c.observe("ns", "j", MPJ_UID)
    (kept,) = seen.jobs[0].pods
    ended = (kept.alive, kept.deleting, kept.exit_code, kept.platform_reason)
    assert ended == (False, True, 44, "EvictionByEvictionAPI")
    assert seen.rank0_ip == {} and seen.lingering == frozenset()
    assert outcome_of(seen.jobs[0]).platform_reason == "EvictionByEvictionAPI"  # Evicted: uncharged


def test_a_pod_removed_while_running_is_kept_as_stopped(cache: tuple[ChildCache, list]) -> None:
    """Deleted at once (grace 0, or its node's kubelet gone): its last state says Running, but it
    runs no more, so no reconcile waits for it to stop."""
    c, _ = cache
    c.apply("jobs", "ADDED", job(0))
    c.apply("pods", "ADDED", pod(0))
    c.apply("pods", "DELETED", pod(0))
    (kept,) = c.observe("ns", "j", MPJ_UID).jobs[0].pods
    assert (kept.alive, kept.deleting, kept.exit_code) == (False, True, None)


def test_a_removed_pod_is_kept_until_its_index_runs_again_or_its_job_goes(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    c.apply("pods", "ADDED", pod(0, rank=0))
    c.apply("pods", "ADDED", pod(0, rank=1))
    c.apply("pods", "DELETED", evicted(0, rank=0))
    c.apply("pods", "DELETED", evicted(0, rank=1))
    changed.clear()
    c.relist("pods", "ns", [])  # a relisting lacks them, as it should: they stay as last seen
    assert changed == [] and len(c.observe("ns", "j", MPJ_UID).jobs[0].pods) == 2
    # Its queue admitted the Job again: index 0 runs anew in a new pod, which replaces the old one.
    again = pod(0, rank=0)
    again["metadata"].update(uid="pod-0-again", name="j-a0-0-y")
    c.apply("pods", "ADDED", again)
    pods = c.observe("ns", "j", MPJ_UID).jobs[0].pods
    assert sorted((p.index, p.alive) for p in pods) == [(0, True), (1, False)]
    c.apply("pods", "DELETED", again)
    c.apply("jobs", "DELETED", job(0))  # the Job goes: what was kept of its pods goes with it
    assert c.observe("ns", "j", MPJ_UID).jobs == {}
    c.apply("jobs", "ADDED", job(0))  # the same Job seen again (a stale listing): nothing of it was kept
    assert c.observe("ns", "j", MPJ_UID).jobs[0].pods == ()


def stopping(attempt: int, **terminated: Any) -> dict[str, Any]:
    """Attempt `attempt`'s pod being deleted (its Job was): running, or once stopped as `terminated`."""
    going = pod(attempt, "Failed", **terminated) if terminated else pod(attempt)
    going["metadata"]["deletionTimestamp"] = "2026-12-01T12:00:00Z"
    return going


def test_a_job_removed_while_its_pod_ran_is_kept_with_what_the_pod_said_until_a_later_job(
    cache: tuple[ChildCache, list],
) -> None:
    """Suspended: the Job goes first, its pod checkpoints on SIGTERM, says so and is removed, all
    before the reconcile its stop queued runs. That reconcile still reads what the pod said."""
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    c.apply("pods", "ADDED", stopping(0))
    c.apply("jobs", "DELETED", job(0))
    assert (c.observe("ns", "j", MPJ_UID).lingering, c.observe("ns", "j", MPJ_UID).stopped) == (frozenset({0}), {})
    said = stopping(0, exitCode=44, message='{"reason": "Preempted"}')
    c.apply("pods", "MODIFIED", said)
    changed.clear()
    c.apply("pods", "DELETED", said)
    c.relist("pods", "ns", [])  # a relisting lacks it, as it should: it stays as last seen
    seen = c.observe("ns", "j", MPJ_UID)
    assert changed == [("ns", "j")] and (seen.jobs, seen.lingering) == ({}, frozenset())
    (kept,) = seen.stopped[0].pods
    assert (kept.alive, kept.exit_code, kept.termination_message) == (False, 44, '{"reason": "Preempted"}')
    c.apply("jobs", "ADDED", job(1))  # the next attempt: the operator went on
    assert c.observe("ns", "j", MPJ_UID).stopped == {} and set(c.observe("ns", "j", MPJ_UID).jobs) == {1}


def test_a_kept_job_goes_once_its_mixed_precision_job_is_found_gone(cache: tuple[ChildCache, list]) -> None:
    c, _ = cache
    c.apply("jobs", "ADDED", job(0))
    c.apply("pods", "ADDED", stopping(0))
    c.apply("jobs", "DELETED", job(0))
    c.forget_gone("ns", "j")  # its pod still runs: it is still lingering
    assert c.observe("ns", "j", MPJ_UID).lingering == frozenset({0})
    c.apply("pods", "DELETED", stopping(0, exitCode=143))
    assert set(c.observe("ns", "j", MPJ_UID).stopped) == {0}
    c.forget_gone("ns", "j")
    seen = c.observe("ns", "j", MPJ_UID)
    assert (seen.stopped, seen.lingering, seen.jobs) == ({}, frozenset(), {})


def test_a_deleted_mixed_precision_job_takes_what_was_kept_of_its_removed_jobs_with_it() -> None:
    """A finished job whose Jobs its TTL removed has nothing left that would queue a reconcile:
    its deletion itself forgets what the cache kept of them."""
    made = reconciler(FakeCluster())
    made.cache.apply("jobs", "ADDED", job(0))
    made.cache.apply("pods", "ADDED", pod(0, "Succeeded", exitCode=0))
    made.cache.apply("jobs", "DELETED", job(0))
    made.cache.apply("pods", "DELETED", pod(0, "Succeeded", exitCode=0))
    assert set(made.cache.observe("ns", "j", MPJ_UID).stopped) == {0}
    made.forget(MPJ_UID, ("ns", "j"))  # kopf saw the MixedPrecisionJob deleted
    assert made.cache.observe("ns", "j", MPJ_UID).stopped == {}


def test_a_restarted_operator_waits_for_the_pods_of_a_job_removed_before_it_listed(
    cache: tuple[ChildCache, list],
) -> None:
    """Suspended, then the operator restarted while the pod checkpointed on SIGTERM: its first
    listing has the pod but not its Job. The pod still runs: the next attempt waits for it."""
    c, _ = cache
    elsewhere = stopping(0)
    elsewhere["metadata"].update(namespace="other", uid="pod-elsewhere")
    somebody_else = stopping(0)
    somebody_else["metadata"].update(uid="pod-other-job", ownerReferences=owner("Job", "jo-a0", "job-x"))
    c.relist("jobs", None, [job(1)])
    c.relist("pods", None, [stopping(0), elsewhere, somebody_else])
    seen = c.observe("ns", "j", MPJ_UID)
    assert (seen.lingering, set(seen.jobs), seen.stopped) == (frozenset({0}), {1}, {})
    c.apply("pods", "DELETED", stopping(0, exitCode=44))
    assert c.observe("ns", "j", MPJ_UID).lingering == frozenset()


def test_a_job_the_operator_deleted_is_held_as_removed_before_the_watch_says_so(cache: tuple[ChildCache, list]) -> None:
    """Its pod still going makes its attempt lingering at once; an event or a listing from before
    the deletion, read after it, brings it back to no reconcile; the deletion's own event queues one."""
    c, changed = cache
    c.apply("jobs", "ADDED", job(0))
    c.apply("pods", "ADDED", pod(0, "Pending", ip=""))
    c.removing("job-0")
    seen = c.observe("ns", "j", MPJ_UID)
    assert (seen.jobs, seen.lingering) == ({}, frozenset({0}))
    changed.clear()
    c.apply("jobs", "MODIFIED", job(0, active=1))
    c.relist("jobs", "ns", [job(0, active=1)])
    seen = c.observe("ns", "j", MPJ_UID)
    assert (seen.jobs, seen.lingering, changed) == ({}, frozenset({0}), [])
    c.apply("jobs", "DELETED", job(0))
    assert changed == [("ns", "j")]  # its job looks again all the same
    c.apply("pods", "DELETED", pod(0, "Pending", ip=""))
    assert set(c.observe("ns", "j", MPJ_UID).stopped) == {0}
