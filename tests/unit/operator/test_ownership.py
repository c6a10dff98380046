"""Only what it owns: children are known by their controller ownerReferences (never by label
alone), an object of a child's name that mpjob did not create is never claimed, and an object
that cannot be read is skipped (once in the log) without breaking the watch that brought it."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from mpjob.controller.cache import ChildCache
from mpjob.controller.cluster import Cluster, NameInUse, Refused
from mpjob.controller.create_failures import create_failure
from mpjob.controller.ownership import Claim, ObjectRef, claim
from mpjob.controller.records import job_record, pod_record
from mpjob.controller.watch import ListWatch, Source
from tests.unit.operator.test_cache import MPJ_UID, job, owner, pod

pytestmark = pytest.mark.unit

JOB_RULES = {MPJ_UID: ("MixedPrecisionJob", "j")}
SERVICE_RULES = {"job-0": ("Job", "j-a0"), MPJ_UID: ("MixedPrecisionJob", "j")}


@pytest.mark.parametrize(
    ("refs", "owners", "whose"),
    [
        (owner("MixedPrecisionJob", "j", MPJ_UID), JOB_RULES, Claim.OURS),
        (owner("MixedPrecisionJob", "j", "earlier-uid"), JOB_RULES, Claim.STALE),  # deleted and created again
        (owner("MixedPrecisionJob", "other", "x"), JOB_RULES, Claim.FOREIGN),
        (owner("CronJob", "j", MPJ_UID), JOB_RULES, Claim.FOREIGN),  # our UID, another kind: forged
        ([], JOB_RULES, Claim.FOREIGN),  # made by hand
        ([{"kind": "MixedPrecisionJob", "name": "j", "uid": MPJ_UID}], JOB_RULES, Claim.FOREIGN),  # not controller
        ("not a list", JOB_RULES, Claim.FOREIGN),
        (owner("Job", "j-a0", "job-0"), SERVICE_RULES, Claim.OURS),
        (owner("MixedPrecisionJob", "j", MPJ_UID), SERVICE_RULES, Claim.OURS),  # an older operator's Service
        (owner("Job", "j-a0", "old-job"), SERVICE_RULES, Claim.STALE),
        (owner("Job", "j", "job-0"), SERVICE_RULES, Claim.FOREIGN),  # our Job's UID, the wrong name
    ],
)
def test_whose_an_existing_object_is(refs: Any, owners: dict[str, tuple[str, str]], whose: Claim) -> None:
    assert claim({"metadata": {"ownerReferences": refs}}, owners=owners) is whose


@pytest.fixture
def cache() -> tuple[ChildCache, list[tuple[str, str]]]:
    changed: list[tuple[str, str]] = []
    made = ChildCache(changed.append)
    made.apply("jobs", "ADDED", job(0))
    made.apply("pods", "ADDED", pod(0))
    changed.clear()
    return made, changed


def forged(**meta: Any) -> dict[str, Any]:
    """A pod with the labels of attempt 0 of job j, exiting 42 with a numeric fault report."""
    body = pod(0, "Failed", exitCode=42, message='{"reason": "NumericFault", "step": 5}')
    body["metadata"].update(name="forged", uid="forged-uid", **meta)
    return body


def test_a_pod_with_a_jobs_labels_but_no_owner_is_not_its_child(cache: tuple[ChildCache, list]) -> None:
    c, changed = cache
    c.apply("pods", "ADDED", forged(ownerReferences=[]))
    c.apply("pods", "ADDED", forged(ownerReferences=owner("Job", "j-a0", "another-jobs-uid")))
    assert changed == []
    assert [p.name for p in c.observe("ns", "j", MPJ_UID).jobs[0].pods] == ["j-a0-0-x"]


def test_a_child_names_its_controller_in_its_own_namespace() -> None:
    elsewhere = pod(0)
    elsewhere["metadata"]["namespace"] = "attacker"
    assert pod_record(elsewhere).owner == ObjectRef("attacker", "Job", "j-a0", "job-0")  # type: ignore[union-attr]
    record = job_record(job(0))
    assert record is not None and record.ref == ObjectRef("ns", "Job", "j-a0", "job-0")
    assert record.owner == ObjectRef("ns", "MixedPrecisionJob", "j", MPJ_UID)
    event = failed_create("attacker", involved_namespace="ns")
    assert create_failure(event) is None  # about an object of another namespace: not a FailedCreate of ours
    assert create_failure(failed_create("ns")).owner == ObjectRef("ns", "Job", "j-a0", "job-0")  # type: ignore[union-attr]


def test_a_pod_elsewhere_naming_our_jobs_name_and_uid_is_not_its_child() -> None:
    changed: list[tuple[str, str]] = []
    c = ChildCache(changed.append)
    c.apply("jobs", "ADDED", job(0))
    changed.clear()
    for namespace, name in (("attacker", "j-a0"), ("ns", "not-j-a0")):  # another namespace; the UID alone
        body = pod(0, ip="10.9.9.9")
        body["metadata"].update(namespace=namespace, uid=f"forged-{namespace}")
        body["metadata"]["ownerReferences"] = owner("Job", name, "job-0")
        c.apply("pods", "ADDED", body)
        c.apply("pods", "MODIFIED", forged_exit(body))
    assert changed == []
    seen = c.observe("ns", "j", MPJ_UID)
    assert seen.jobs[0].pods == () and seen.rank0_ip == {}  # no progress read from it, no ending taken
    c.apply("pods", "ADDED", pod(0))  # the real pod still joins
    assert c.observe("ns", "j", MPJ_UID).rank0_ip == {0: "10.0.0.5"}


def forged_exit(body: dict[str, Any]) -> dict[str, Any]:
    ended = pod(0, "Failed", exitCode=45, message='{"reason": "NonFiniteInFp32", "step": 5}')
    ended["metadata"] = body["metadata"]
    return ended


def failed_create(namespace: str, *, involved_namespace: str | None = None, name: str = "j-a0") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{name}.1", "namespace": namespace, "uid": f"ev-{namespace}-{name}"},
        "involvedObject": {"kind": "Job", "name": name, "namespace": involved_namespace or namespace, "uid": "job-0"},
        "reason": "FailedCreate",
        "message": "forged: pods are forbidden",
    }


def test_a_failed_create_elsewhere_or_of_another_name_is_not_our_jobs() -> None:
    changed: list[tuple[str, str]] = []
    c = ChildCache(changed.append)
    c.apply("jobs", "ADDED", job(0))
    changed.clear()
    elsewhere, about_ours, another_name = (
        failed_create("attacker"),
        failed_create("attacker", involved_namespace="ns"),
        failed_create("ns", name="x"),
    )
    for event in (elsewhere, about_ours, another_name):
        c.apply("events", "ADDED", event)
    assert changed == [] and c.observe("ns", "j", MPJ_UID).jobs[0].create_error is None


def test_a_job_elsewhere_naming_our_jobs_name_and_uid_is_not_its_attempt() -> None:
    c = ChildCache(lambda key: None)
    c.apply("jobs", "ADDED", job(0, uid="forged", namespace="attacker"))
    assert c.observe("ns", "j", MPJ_UID).jobs == {}


def test_a_malformed_object_is_skipped_and_logged_once(
    cache: tuple[ChildCache, list], caplog: pytest.LogCaptureFixture
) -> None:
    c, changed = cache
    bad = pod(0, "Failed", exitCode=42)
    bad["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = "not-a-number"
    with caplog.at_level(logging.WARNING, "mpjob.operator.cache"):
        for _ in range(3):
            c.apply("pods", "MODIFIED", bad)
    assert len([r for r in caplog.records if "skipping pod ns/j-a0-0-x" in r.getMessage()]) == 1
    assert changed == [] and c.observe("ns", "j", MPJ_UID).jobs[0].pods[0].alive  # the last good reading stays
    bad["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = "0"  # the Job controller's label
    c.apply("pods", "MODIFIED", bad)
    assert changed == [("ns", "j")] and not c.observe("ns", "j", MPJ_UID).jobs[0].pods[0].alive


def test_a_job_not_named_as_an_attempt_or_of_an_earlier_job_is_not_observed(cache: tuple[ChildCache, list]) -> None:
    c, _ = cache
    misnamed = job(1, uid="misnamed")
    misnamed["metadata"]["name"] = "j-attempt-1"
    c.apply("jobs", "ADDED", misnamed)
    earlier = job(2, uid="earlier")
    earlier["metadata"]["ownerReferences"] = owner("MixedPrecisionJob", "j", "earlier-uid")
    c.apply("jobs", "ADDED", earlier)
    assert set(c.observe("ns", "j", MPJ_UID).jobs) == {0}
    assert set(c.observe("ns", "j", "earlier-uid").jobs) == {2}


class FakeWatchClient:
    """A list call whose watch streams the given lines once, then blocks until stopped."""

    def __init__(self, items: list[dict[str, Any]], lines: list[str], stop: threading.Event) -> None:
        self.items, self.lines, self.stop = items, lines, stop
        self.lists = 0
        self.streamed = threading.Event()

    def __call__(self, *args: Any, watch: bool = False, **kwargs: Any) -> Any:
        if not watch:
            self.lists += 1
            return _Response(json.dumps({"metadata": {"resourceVersion": "1"}, "items": self.items}).encode())
        return _Stream(self.lines, self.streamed, self.stop)


class _Response:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def release_conn(self) -> None:
        pass


class _Stream(_Response):
    def __init__(self, lines: list[str], streamed: threading.Event, stop: threading.Event) -> None:
        super().__init__(b"")
        self.lines, self.streamed, self.stop = lines, streamed, stop

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        for line in self.lines:
            yield (line + "\n").encode()
        self.streamed.set()
        self.stop.wait(60)  # until the test is done with the watch (it sets stop), however slow


def test_garbage_and_malformed_objects_never_break_a_watch(cache: tuple[ChildCache, list]) -> None:
    c, _ = cache
    stop = threading.Event()
    bad = forged(ownerReferences=owner("Job", "j-a0", "job-0"))
    bad["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": "x"}
    good = pod(0, "Failed", exitCode=42)
    lines = [
        "not json at all",
        json.dumps({"type": "ADDED", "object": "not an object"}),
        json.dumps({"type": "ADDED", "object": bad}),
        json.dumps({"type": "ADDED", "object": {"metadata": {"name": "no-uid"}}}),
        json.dumps({"type": "MODIFIED", "object": good}),
    ]
    client = FakeWatchClient([pod(0)], lines, stop)
    synced = threading.Event()
    watch = ListWatch(Source("pods", "ns", client), cache=c, synced=synced, stop=stop)
    watch.start()
    try:
        assert client.streamed.wait(60)
        assert synced.is_set() and client.lists == 1  # listed once: the watch went on
        pods = c.observe("ns", "j", MPJ_UID).jobs[0].pods
        assert [(p.name, p.exit_code) for p in pods] == [("j-a0-0-x", 42)]
    finally:
        stop.set()
        watch.join(5)


class FakeBatch:
    """The batch API of a cluster where a Job of the attempt's name exists already."""

    def __init__(self, existing: dict[str, Any] | None = None, delete_status: int | None = None) -> None:
        self.existing, self.delete_status = existing, delete_status
        self.deletes: list[dict[str, Any]] = []

    def create_namespaced_job(self, namespace: str, body: dict[str, Any], **_: Any) -> Any:
        raise ApiException(status=409, reason="AlreadyExists")

    def read_namespaced_job(self, name: str, namespace: str, **_: Any) -> Any:
        return _Response(json.dumps(self.existing).encode())

    def delete_namespaced_job(self, name: str, namespace: str, *, body: dict[str, Any], **_: Any) -> None:
        self.deletes.append({"name": name, **body})
        if self.delete_status is not None:
            raise ApiException(status=self.delete_status, reason="Conflict")


MPJ = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "j", "namespace": "ns", "uid": MPJ_UID},
}


@pytest.mark.parametrize(
    ("refs", "outcome"),
    [
        (owner("MixedPrecisionJob", "j", MPJ_UID), "ours"),
        (owner("MixedPrecisionJob", "j", "earlier-uid"), NameInUse),
        ([], Refused),
    ],
    ids=["ours", "an-earlier-jobs", "made-by-hand"],
)
def test_an_existing_job_of_the_attempts_name_is_taken_only_when_ours(refs: Any, outcome: Any) -> None:
    existing = {**job(0), "metadata": {**job(0)["metadata"], "ownerReferences": refs}}
    cluster = Cluster(custom=None, batch=FakeBatch(existing), core=None)
    wanted = {"metadata": {"name": "j-a0", "namespace": "ns"}}
    if outcome == "ours":
        assert cluster.create_job(wanted, owner=MPJ)["metadata"]["uid"] == "job-0"
        return
    with pytest.raises(outcome) as raised:
        cluster.create_job(wanted, owner=MPJ)
    if outcome is Refused:
        assert raised.value.rule.reason == "NameConflict" and "Job j-a0 already exists" in raised.value.message


@pytest.mark.parametrize("status", [None, 404, 409])
def test_a_job_is_deleted_only_while_it_is_the_one_seen(status: int | None) -> None:
    batch = FakeBatch(delete_status=status)  # 409: the name now holds another object; 404: gone
    Cluster(custom=None, batch=batch, core=None).delete_job("ns", "j", index=0, uid="job-0")
    assert batch.deletes == [{"name": "j-a0", "preconditions": {"uid": "job-0"}, "propagationPolicy": "Background"}]
