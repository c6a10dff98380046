"""The ticker leaves settled jobs alone: a job at rest (finished, or suspended as asked) whose
children are gone costs no tick."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mpjob.controller.ticker import at_rest, due, has_work
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_finished_bodies import listed, memo  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit

KEY = ("ns", "j")


def test_finished_jobs_whose_children_are_gone_are_not_ticked() -> None:
    ttl = {"runPolicy": {"ttlSecondsAfterFinished": 60}}
    index = {
        ("ns", "running"): [has_work({"phase": "Running"}, {})],
        ("ns", "ttl-pending"): [has_work({"phase": "Succeeded"}, ttl)],
        ("ns", "ttl-done"): [has_work({"phase": "Failed"}, ttl)],
        ("ns", "no-ttl"): [has_work({"phase": "Succeeded"}, {})],
    }
    assert due(index, settled=set()) == [("ns", "running"), ("ns", "ttl-done"), ("ns", "ttl-pending")]
    assert due(index, settled={("ns", "ttl-done")}) == [("ns", "running"), ("ns", "ttl-pending")]


@pytest.mark.parametrize(
    ("phase", "suspend", "children", "requeue_after", "rests"),
    [
        ("Suspended", True, False, None, True),  # suspended as asked, nothing left: only an edit wakes it
        ("Succeeded", False, False, None, True),
        ("Suspended", True, True, None, False),  # its pods still stop: their events and ticks follow them
        ("Suspended", False, False, None, False),  # asked to resume: it has work
        ("Suspended", True, False, 3.0, False),  # a wait of its own
        ("Pending", False, False, None, False),  # may start any moment (capacity, backoff)
        ("Running", False, False, None, False),  # its progress is read every tick
        (None, True, False, None, False),
    ],
)
def test_a_job_at_rest_is_finished_or_suspended_as_asked_with_nothing_left(
    phase: str | None, suspend: bool, children: bool, requeue_after: float | None, rests: bool
) -> None:
    assert at_rest(phase, suspend=suspend, children=children, requeue_after=requeue_after) is rests


def reconciles() -> float:
    return REGISTRY.get_sample_value("mpjob_operator_reconcile_duration_seconds_count") or 0.0


@pytest.mark.usefixtures("events")
def test_a_tick_queued_before_its_job_settled_does_no_work() -> None:
    """The ticker queues a round of ticks, then publishes the phases: a job whose reconcile settled
    it while its tick waited in the queue was reconciled once more by that tick."""
    cluster = FakeCluster()
    cluster.body["spec"]["runPolicy"] = {"suspend": True}
    made = reconciler(cluster)
    made.handle(KEY, False)  # the job's creation: suspended as its spec asks, nothing left
    assert cluster.body["status"]["phase"] == "Suspended" and KEY in made.settled
    before = reconciles()
    assert made.handle(KEY, True) is None  # the tick queued before it settled
    assert reconciles() == before, "a settled job reconciled by a tick"
    made.handle(KEY, False)  # a change to it still does
    assert reconciles() == before + 1


@pytest.mark.usefixtures("events")
def test_kopfs_listing_of_a_job_settled_since_queues_nothing_until_it_changes(memo: dict[str, Any]) -> None:  # noqa: F811
    """kopf lists every job again each time its watch reconnects (a 410, a broken stream, a pause):
    a suspended job left alone until edited was reconciled by each of those listings."""
    controller = memo["controller"]
    cluster = controller.reconciler.cluster
    cluster.body["spec"]["runPolicy"] = {"suspend": True}
    controller.reconciler.handle(KEY, False)
    assert cluster.body["status"]["phase"] == "Suspended" and KEY in controller.reconciler.settled
    listed(memo, copy.deepcopy(cluster.body))  # a reconnect's listing of the job as it settled
    assert len(controller.queue) == 0, "a job at rest, unchanged, queued by kopf's listing"
    listed(memo, cluster.edited())  # changed while the watch was away (its status, by another)
    assert len(controller.queue) == 1
