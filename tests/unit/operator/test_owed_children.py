"""An attempt's Service and NetworkPolicy exist whenever its Job does: a reconcile that made the
Job and then could not make one of them (a 503, a timeout) leaves them owed, and the job's next
reconcile makes them, once; nothing is asked of the API server per tick for them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import kopf
import pytest

from mpjob.builders.network_policy import MetricsReaders
from mpjob.controller.cluster import Refused
from mpjob.controller.config import OperatorConfig
from mpjob.controller.workqueue import Retry
from mpjob.planning.classify import NAME_CONFLICT
from tests.unit.operator.test_api_errors import FakeCluster, api_error, events, reconciler  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit

KEY = ("ns", "j")
CONFIG = OperatorConfig(retry_seconds=1.0, retry_max_seconds=8.0)
WITH_POLICY = replace(CONFIG, network_policy=MetricsReaders(operator_namespace="mpjob", operator_labels={"a": "b"}))


class Children(FakeCluster):
    """Keeps the Services and NetworkPolicies made, by name (a second create of one is the
    API server's 409, which the real client leaves as is); `failing[kind]` creates of a kind
    fail with `error` first."""

    def __init__(self, failing: dict[str, int], error: Exception | None = None) -> None:
        super().__init__()
        self.failing, self.error = failing, error or api_error(503, "etcd leader changed")
        self.made: dict[str, dict[str, Any]] = {"Service": {}, "NetworkPolicy": {}}
        self.asked = {"Service": 0, "NetworkPolicy": 0}

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        kopf.adopt(job, owner=cast(kopf.Body, owner))  # as the real client: controlled by the job
        self.creates += 1
        self.made_job = {**job, "metadata": {**job["metadata"], "uid": "job-uid"}}
        return self.made_job

    def create_service(self, service: dict[str, Any], *, job: dict[str, Any], owner: dict[str, Any]) -> None:
        self._create("Service", service, job)

    def create_network_policy(self, policy: dict[str, Any], *, job: dict[str, Any]) -> None:
        self._create("NetworkPolicy", policy, job)

    def _create(self, kind: str, body: dict[str, Any], job: dict[str, Any]) -> None:
        self.asked[kind] += 1
        if self.failing.get(kind, 0) > 0:
            self.failing[kind] -= 1
            raise self.error
        assert job["metadata"]["uid"] == "job-uid"  # owned by the Job made
        self.made[kind].setdefault(body["metadata"]["name"], body)


def test_a_service_that_failed_after_its_job_was_made_is_made_by_the_next_reconcile(events: list) -> None:  # noqa: F811
    cluster = Children({"Service": 1})
    made = reconciler(cluster, CONFIG)
    with pytest.raises(Retry):
        made.handle(KEY, False)
    assert cluster.creates == 1 and cluster.made["Service"] == {}
    made.handle(KEY, False)  # the retry: the Job is there, its Service is made
    assert cluster.creates == 1 and list(cluster.made["Service"]) == ["j-a0"]
    assert cluster.made["NetworkPolicy"] == {} and cluster.asked["NetworkPolicy"] == 0  # none configured
    for _ in range(3):
        made.handle(KEY, True)  # ticks: nothing owed, nothing asked
    assert cluster.asked["Service"] == 2 and cluster.creates == 1


def test_a_network_policy_that_failed_after_its_job_was_made_is_made_by_the_next_reconcile(events: list) -> None:  # noqa: F811
    cluster = Children({"NetworkPolicy": 1})
    made = reconciler(cluster, WITH_POLICY)
    with pytest.raises(Retry):
        made.handle(KEY, False)
    assert list(cluster.made["Service"]) == ["j-a0"] and cluster.made["NetworkPolicy"] == {}
    made.handle(KEY, False)
    assert cluster.creates == 1
    assert list(cluster.made["Service"]) == ["j-a0"] and list(cluster.made["NetworkPolicy"]) == ["j-a0"]
    made.handle(KEY, True)
    assert cluster.asked == {"Service": 2, "NetworkPolicy": 2}


def test_owed_children_keep_being_tried_while_the_api_server_fails(events: list) -> None:  # noqa: F811
    cluster = Children({"Service": 3})
    made = reconciler(cluster, CONFIG)
    for _ in range(3):
        with pytest.raises(Retry):
            made.handle(KEY, False)  # the Job made once, its Service refused three times
    assert cluster.creates == 1 and cluster.made["Service"] == {}
    made.handle(KEY, False)
    assert list(cluster.made["Service"]) == ["j-a0"] and cluster.creates == 1


def test_an_owed_child_whose_name_another_object_holds_fails_the_attempt(events: list) -> None:  # noqa: F811
    cluster = Children({"Service": 1})
    made = reconciler(cluster, CONFIG)
    with pytest.raises(Retry):
        made.handle(KEY, False)
    message = "Service j-a0 already exists and was not created by mpjob for this job"
    cluster.failing, cluster.error = {"Service": 1}, Refused(NAME_CONFLICT, message)
    made.handle(KEY, False)
    status = cluster.body["status"]
    assert status["phase"] == "Failed" and status["message"] == message
    assert cluster.deleted == [("j-a0", "job-uid")]  # what was made of the attempt goes
    made.handle(KEY, False)
    assert cluster.asked["Service"] == 2 and cluster.made["Service"] == {}  # nothing owed any more


def test_nothing_is_owed_to_a_job_that_finished_meanwhile(events: list) -> None:  # noqa: F811
    cluster = Children({"Service": 1})
    made = reconciler(cluster, CONFIG)
    with pytest.raises(Retry):
        made.handle(KEY, False)
    job = cluster.made_job
    done = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}
    made.cache.apply("jobs", "MODIFIED", {**job, "status": {"conditions": [done]}})
    made.handle(KEY, False)
    assert cluster.asked["Service"] == 1 and cluster.made["Service"] == {}
    assert made.actions.owed == {}
