"""The API server's refusals of an attempt's children: which end the job (with the server's
message) and which are retried, with a per-job exponential backoff that a tick cannot hurry."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY

from mpjob.controller import reconciler as rc
from mpjob.controller.cache import ChildCache
from mpjob.controller.cluster import Refused, server_message
from mpjob.controller.config import OperatorConfig
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.reconciler import Reconciler
from mpjob.controller.workqueue import Backoff, Retry
from mpjob.planning.classify import NAME_CONFLICT, ApiAction, backoff_seconds, classify_api_error

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("status", "action", "reason"),
    [
        (400, ApiAction.FAIL, "InvalidPodTemplate"),
        (403, ApiAction.FAIL, "Forbidden"),
        (404, ApiAction.FAIL, "NamespaceNotFound"),
        (422, ApiAction.FAIL, "InvalidPodTemplate"),
        (409, ApiAction.RETRY, "Conflict"),
        (429, ApiAction.RETRY, "TooManyRequests"),
        (500, ApiAction.RETRY, "Unavailable"),
        (503, ApiAction.RETRY, "Unavailable"),
        (504, ApiAction.RETRY, "Unavailable"),
        (401, ApiAction.RETRY, "Unavailable"),  # an expired token is renewed: try again
        (None, ApiAction.RETRY, "Unavailable"),  # a timeout or a lost connection
    ],
)
def test_the_api_error_policy(status: int | None, action: ApiAction, reason: str) -> None:
    rule = classify_api_error(status)
    assert (rule.action, rule.reason) == (action, reason)


def test_a_name_held_by_an_object_mpjob_did_not_create_is_final() -> None:
    assert (NAME_CONFLICT.action, NAME_CONFLICT.reason) == (ApiAction.FAIL, "NameConflict")


def test_backoff_doubles_per_failure_up_to_the_cap() -> None:
    delays = [backoff_seconds(n, base=1.0, cap=60.0) for n in range(1, 10)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff_seconds(10_000, base=1.0, cap=60.0) == 60  # no overflow however long it fails
    assert backoff_seconds(0, base=1.0, cap=60.0) == 0


def test_backoff_is_per_key_and_forgotten_on_success() -> None:
    backoff = Backoff(base=10.0, cap=100.0, jitter=0.0)
    assert backoff.failed("a") == 10 and backoff.failed("a") == 20
    assert backoff.waiting("a") and not backoff.waiting("b")
    backoff.forget("a")
    assert not backoff.waiting("a") and backoff.failed("a") == 10


def test_jitter_only_shortens_the_wait() -> None:
    backoff = Backoff(base=10.0, cap=100.0, jitter=0.5)
    assert all(5 <= backoff.failed(f"k{i}") <= 10 for i in range(50))


def test_the_servers_message_is_read_from_its_status() -> None:
    body = json.dumps({"kind": "Status", "message": 'Job.batch "j-a0" is invalid: spec.template...: Invalid value'})
    exc = ApiException(status=422, reason="Unprocessable Entity")
    exc.body = body
    assert server_message(exc).startswith('Job.batch "j-a0" is invalid')
    exc.body = "<html>not json</html>"
    assert server_message(exc) == "Unprocessable Entity"


# ------------------------------------------------------------------ the reconciler with a fake API server


def api_error(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="Refused")
    exc.body = json.dumps({"kind": "Status", "code": status, "message": message})
    return exc


class FakeCluster:
    """The API server as the reconciler sees it, with creates that fail as told."""

    def __init__(self, create_error: Exception | None = None) -> None:
        self.body: dict[str, Any] = {
            "apiVersion": "mpjob.dev/v1alpha1",
            "kind": "MixedPrecisionJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "mpj-uid", "generation": 1, "resourceVersion": "1"},
            "spec": {"task": {"builtin": "gpt"}, "resources": {"gpusPerWorker": 0}},
        }
        self.create_error = create_error
        self.creates = self.reads = 0
        self.deleted: list[tuple[str, str]] = []

    def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        return copy.deepcopy(self.body)

    def edited(self) -> dict[str, Any]:
        """The job after a change made to `body` (its resourceVersion moved on), as the watch delivers it."""
        meta = self.body["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        meta = self.body["metadata"]
        if resource_version is not None and resource_version != meta["resourceVersion"]:
            raise api_error(409, "the object has been modified")
        merged = {**(self.body.get("status") or {}), **status}
        self.body["status"] = {k: v for k, v in merged.items() if v is not None}
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.body)

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        self.creates += 1
        if self.create_error is not None:
            raise self.create_error
        return {**job, "metadata": {**job["metadata"], "uid": "job-uid", "ownerReferences": []}}

    def create_service(self, service: dict[str, Any], *, job: dict[str, Any], owner: dict[str, Any]) -> None:
        pass

    def create_secret(self, secret: dict[str, Any], *, owner: dict[str, Any]) -> None:
        pass

    def delete_job(self, namespace: str, job: str, *, index: int, uid: str) -> None:
        self.deleted.append((f"{job}-a{index}", uid))


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(rc.kopf, "event", lambda body, *, type, reason, message: posted.append((reason, message)))
    return posted


def reconciler(cluster: FakeCluster, config: OperatorConfig | None = None) -> Reconciler:
    config = config or OperatorConfig(retry_seconds=1.0, retry_max_seconds=8.0)
    peering = PeeringCheck(peering=None, cluster=cluster, trust_seconds=1)  # type: ignore[arg-type]
    made = Reconciler(config=config, cluster=cluster, cache=ChildCache(lambda key: None), peering=peering)  # type: ignore[arg-type]
    made.backoff.jitter = 0.0
    made.context.capture()
    return made


def created_attempts() -> float:
    """mpjob_operator_attempts_started_total for first attempts (reason Created)."""
    return REGISTRY.get_sample_value("mpjob_operator_attempts_started_total", {"reason": "Created"}) or 0.0


def test_a_child_the_server_rejects_fails_the_job_with_its_message_at_once(events: list) -> None:
    message = 'Job.batch "j-a0" is invalid: spec.template.spec.nodeSelector: Invalid value: "bad key!"'
    cluster = FakeCluster(Refused(classify_api_error(422), message))
    made, before = reconciler(cluster), created_attempts()
    made.handle(("ns", "j"), False)  # no Retry: nothing to try again
    # its Job never made: the attempt is neither said nor counted started
    assert [m for r, m in events if r == "AttemptStarted"] == [] and created_attempts() == before
    status = cluster.body["status"]
    assert status["phase"] == "Failed" and status["message"] == message
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidPodTemplate")
    assert status["attempts"][0]["reason"] == "InvalidPodTemplate"
    assert ("Failed", message) in events
    assert len(events) == len(set(events)), f"each Event once: {events}"
    made.handle(("ns", "j"), True)  # a later tick: finished, nothing created again
    assert cluster.creates == 1


def test_transient_errors_back_off_per_job_and_ticks_do_not_hurry_them(events: list) -> None:
    cluster = FakeCluster(api_error(503, "etcd leader changed"))
    made = reconciler(cluster)
    delays = []
    for _ in range(5):
        with pytest.raises(Retry) as retry:
            made.handle(("ns", "j"), False)  # a change (or the retry itself) always runs
        delays.append(retry.value.delay)
    assert delays == [1, 2, 4, 8, 8]
    made.handle(("ns", "j"), True)  # a tick while the retry is not due: skipped
    assert cluster.creates == 5
    assert cluster.body["status"]["phase"] == "Pending"  # still waiting, not Failed
    cluster.create_error = None
    made.handle(("ns", "j"), False)
    assert cluster.creates == 6 and made.backoff.failures(("ns", "j")) == 0


def test_an_attempt_whose_job_is_made_after_a_transient_error_is_said_and_counted_started_once(events: list) -> None:
    cluster = FakeCluster(api_error(503, "etcd leader changed"))
    made, before = reconciler(cluster), created_attempts()
    with pytest.raises(Retry):
        made.handle(("ns", "j"), False)  # recorded, its Job refused for now
    assert [m for r, m in events if r == "AttemptStarted"] == [] and created_attempts() == before
    cluster.create_error = None
    made.handle(("ns", "j"), False)  # the retry makes it
    assert cluster.creates == 2 and cluster.body["status"]["attempts"][0]["jobUid"] == "job-uid"
    assert [m for r, m in events if r == "AttemptStarted"] == ["attempt 0 in auto"]
    assert created_attempts() == before + 1


def counting_creates(cluster: FakeCluster) -> Callable[..., dict[str, Any]]:
    """A create_job that makes every Job it is asked for, owned by the job, counted in `cluster.creates`."""

    def create_job(job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        cluster.creates += 1
        return owned(job, owner)

    return create_job


def owned(job: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """`job` as the API server answers its create: with its uid, owned by the job `owner`."""
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": "j", "uid": "mpj-uid", "controller": True}
    return {**job, "metadata": {**job["metadata"], "uid": "job-uid", "ownerReferences": [ref]}}


def test_an_attempt_whose_job_is_made_before_its_service_fails_is_said_and_counted_started_once(events: list) -> None:
    cluster, failing = FakeCluster(), [api_error(503, "etcd leader changed")]

    def create_service(service: dict[str, Any], *, job: dict[str, Any], owner: dict[str, Any]) -> None:
        if failing:
            raise failing.pop()

    cluster.create_service, cluster.create_job = create_service, counting_creates(cluster)  # type: ignore[method-assign]
    made, before = reconciler(cluster), created_attempts()
    with pytest.raises(Retry):
        made.handle(("ns", "j"), False)  # its Job made and recorded, its Service refused for now
    assert cluster.body["status"]["attempts"][0]["jobUid"] == "job-uid"
    made.handle(("ns", "j"), False)  # the retry finds the Job made
    assert cluster.creates == 1
    assert [m for r, m in events if r == "AttemptStarted"] == ["attempt 0 in auto"]
    assert created_attempts() == before + 1


def test_an_attempt_whose_job_another_operator_recorded_first_is_not_said_started_by_this_one(events: list) -> None:
    """Two operators make the same attempt: the one whose write of the Job's uid holds says it
    started; the other's write is refused (409) and it says nothing (it told it a second time)."""
    cluster = FakeCluster()

    def create_job(job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        cluster.creates += 1  # the other operator made this Job first, and its write recording it lands now
        attempts = copy.deepcopy(cluster.body["status"]["attempts"])
        attempts[0]["jobUid"] = "job-uid"
        cluster.patch_status("ns", "j", {"attempts": attempts})
        return owned(job, owner)

    cluster.create_job = create_job  # type: ignore[method-assign]
    made, before = reconciler(cluster), created_attempts()
    with pytest.raises(Retry):
        made.handle(("ns", "j"), False)  # its write of the uid planned from the older read: 409
    made.handle(("ns", "j"), False)  # the new read has the Job recorded
    assert [m for r, m in events if r == "AttemptStarted"] == []
    assert created_attempts() == before


def test_an_attempt_whose_uid_write_lost_to_another_write_is_said_started_by_the_write_that_records_it(
    events: list,
) -> None:
    """The write recording the Job's uid refused (409) for a write of something else in between:
    the next reconcile finds the Job in the cache with no uid recorded, records it, and says the
    attempt started then, once (it was never said: lost)."""
    cluster = FakeCluster()

    def create_job(job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        cluster.creates += 1
        if cluster.creates == 1:  # a write of something else between this reconcile's read and write
            cluster.patch_status("ns", "j", {"message": "another writer"})
        return owned(job, owner)

    cluster.create_job = create_job  # type: ignore[method-assign]
    made, before = reconciler(cluster), created_attempts()
    with pytest.raises(Retry):
        made.handle(("ns", "j"), False)
    assert [m for r, m in events if r == "AttemptStarted"] == []
    made.handle(("ns", "j"), False)  # the Job is in the cache; this write records its uid
    made.handle(("ns", "j"), False)  # and nothing more is said
    assert cluster.creates == 1 and cluster.body["status"]["attempts"][0]["jobUid"] == "job-uid"
    assert [m for r, m in events if r == "AttemptStarted"] == ["attempt 0 in auto"]
    assert created_attempts() == before + 1


def test_an_attempt_whose_uid_write_failed_for_now_is_said_and_counted_started_once(events: list) -> None:
    """The write recording the Job's uid fails for now (a 500, the API server's etcd timing out):
    it did not hold, so that reconcile says nothing; the next one finds the Job in the cache with
    no uid recorded, records it and says the attempt started, once."""
    cluster, writes, failing = FakeCluster(), [0], [api_error(500, "etcdserver: request timed out")]
    patch_status = cluster.patch_status

    def flaky_patch_status(namespace: str, name: str, status: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        writes[0] += 1
        if writes[0] == 2 and failing:  # the reconcile's own write holds; the uid's does not
            raise failing.pop()
        return patch_status(namespace, name, status, **kwargs)

    cluster.patch_status, cluster.create_job = flaky_patch_status, counting_creates(cluster)  # type: ignore[method-assign]
    made, before = reconciler(cluster), created_attempts()
    with pytest.raises(Retry):
        made.handle(("ns", "j"), False)
    made.handle(("ns", "j"), False)  # the Job is in the cache; this write records its uid
    made.handle(("ns", "j"), False)  # and nothing more is said
    assert cluster.creates == 1 and cluster.body["status"]["attempts"][0]["jobUid"] == "job-uid"
    assert [m for r, m in events if r == "AttemptStarted"] == ["attempt 0 in auto"]
    assert created_attempts() == before + 1
