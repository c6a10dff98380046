"""An operator that stopped between making an attempt's Job and its Service or NetworkPolicy (a
crash, a rollout) owes them still: what is owed lives in memory, so the restarted operator's
first reconcile of each job rebuilds it from the running Jobs the job's status records as ours
(`attempts[].jobUid`) and makes what is missing, once (one of ours already there is left as
is). Nothing is asked after that first reconcile."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpjob.controller.config import OperatorConfig, Peering
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.reconciler import Reconciler
from mpjob.controller.ticker import due
from tests.unit.operator.test_api_errors import events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_owed_children import CONFIG, KEY, WITH_POLICY, Children

pytestmark = pytest.mark.unit


class Crash(BaseException):
    """The operator stopped right there (not an error it handles)."""


class Stops(Children):
    """The operator stops right after the API server made the Job (`at` "Job": before the write
    of its uid) or as it asks for the Job's Service (`at` "Service")."""

    at: str | None = None

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        made = super().create_job(job, owner=owner)
        if self.at == "Job":
            raise Crash
        return made

    def create_service(self, service: dict[str, Any], *, job: dict[str, Any], owner: dict[str, Any]) -> None:
        if self.at == "Service":
            raise Crash
        super().create_service(service, job=job, owner=owner)


def restarted_after(at: str, config: OperatorConfig = CONFIG) -> tuple[Stops, Reconciler]:
    """The API server, and a second operator process over it whose first stopped `at` the job's
    first attempt; the new one's cache has listed the Job made."""
    cluster = Stops({})
    cluster.at = at
    with pytest.raises(Crash):
        reconciler(cluster, config).handle(KEY, False)
    assert cluster.made["Service"] == {} and cluster.creates == 1
    cluster.at = None
    restarted = reconciler(cluster, config)
    restarted.cache.apply("jobs", "ADDED", cluster.made_job)  # its first listing: ours, controlled by the job
    return cluster, restarted


def test_a_restarted_operator_makes_the_service_its_predecessor_owed_once(events: list) -> None:  # noqa: F811
    cluster, restarted = restarted_after("Service")
    restarted.handle(KEY, False)
    assert list(cluster.made["Service"]) == ["j-a0"] and cluster.asked["Service"] == 1
    for tick in (True, True, False):
        restarted.handle(KEY, tick)  # nothing owed now: nothing asked
    assert cluster.asked == {"Service": 1, "NetworkPolicy": 0} and cluster.creates == 1


def test_a_restarted_operator_makes_the_network_policy_too(events: list) -> None:  # noqa: F811
    cluster, restarted = restarted_after("Service", WITH_POLICY)
    restarted.handle(KEY, False)
    restarted.handle(KEY, True)
    assert list(cluster.made["Service"]) == ["j-a0"] and list(cluster.made["NetworkPolicy"]) == ["j-a0"]
    assert cluster.asked == {"Service": 1, "NetworkPolicy": 1}


def test_children_already_made_cost_one_create_each_at_restart_and_nothing_after(events: list) -> None:  # noqa: F811
    cluster = Children({})
    first = reconciler(cluster, CONFIG)
    first.handle(KEY, False)
    assert list(cluster.made["Service"]) == ["j-a0"]
    restarted = reconciler(cluster, CONFIG)
    restarted.cache.apply("jobs", "ADDED", cluster.made_job)
    for tick in (False, True, True):
        restarted.handle(KEY, tick)
    assert cluster.asked["Service"] == 2 and cluster.creates == 1  # the restart's create answered 409: ours


def test_nothing_is_owed_after_a_restart_to_a_job_that_finished(events: list) -> None:  # noqa: F811
    cluster, restarted = restarted_after("Service")
    done = {"type": "Complete", "status": "True"}
    restarted.cache.apply("jobs", "MODIFIED", {**cluster.made_job, "status": {"conditions": [done]}})
    restarted.handle(KEY, False)
    assert cluster.asked["Service"] == 0 and restarted.actions.owed == {}


def test_a_job_made_before_its_uid_was_written_is_owed_its_service_after_a_restart(events: list) -> None:  # noqa: F811
    cluster, restarted = restarted_after("Job")
    assert "jobUid" not in cluster.body["status"]["attempts"][0]
    restarted.handle(KEY, False)  # records its uid, then makes what it is owed
    restarted.handle(KEY, True)
    assert cluster.body["status"]["attempts"][0]["jobUid"] == "job-uid"
    assert list(cluster.made["Service"]) == ["j-a0"] and cluster.asked["Service"] == 1 and cluster.creates == 1


class Peered(Children):
    """Children with kopf's peering object, where a peer of higher priority is alive or not."""

    outranked = False

    def read_peering(self, name: str, namespace: str | None) -> dict[str, Any]:
        now = datetime.now(UTC).isoformat()
        return {"status": {"other": {"priority": 9, "lastseen": now, "lifetime": 60}} if self.outranked else {}}


def test_an_operator_that_stood_by_rebuilds_what_is_owed_when_it_acts_again(events: list) -> None:  # noqa: F811
    cluster = Peered({})
    made = reconciler(cluster, CONFIG)
    made.peering = PeeringCheck(peering=Peering("mpjob", "me", 1, True), cluster=cluster, trust_seconds=0)  # type: ignore[arg-type]
    made.handle(KEY, False)
    cluster.outranked = True
    made.handle(KEY, True)  # a standby: the other operator acts
    cluster.made["Service"].clear()  # meanwhile the other operator acted: the Service is missing
    cluster.outranked = False
    made.handle(KEY, True)
    made.handle(KEY, True)
    assert list(cluster.made["Service"]) == ["j-a0"] and cluster.asked["Service"] == 2


def test_a_job_at_rest_when_the_operator_stood_by_is_ticked_again_when_it_acts_again(events: list) -> None:  # noqa: F811
    """A job settled (suspended, no children) stayed settled through a standby: if the other
    operator resumed it meanwhile and the reconcile kopf's listing queued as this one acted again
    came while its peering check still read standby, the ticker skipped the job for good (no
    progress read, no deadline, no stall seen) until some change to it came."""
    cluster = Peered({})
    cluster.body["spec"]["runPolicy"] = {"suspend": True}
    made = reconciler(cluster, CONFIG)
    made.peering = PeeringCheck(peering=Peering("mpjob", "me", 1, True), cluster=cluster, trust_seconds=0)  # type: ignore[arg-type]
    made.handle(KEY, False)
    assert cluster.body["status"]["phase"] == "Suspended" and due({KEY: [True]}, made.settled) == []  # at rest
    cluster.outranked = True
    made.handle(KEY, False)  # a standby: what it held of the job is let go
    assert due({KEY: [True]}, made.settled) == [KEY]  # the ticker comes back to it
