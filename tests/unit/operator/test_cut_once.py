"""An attempt's ranks cut (a rank crashed beside live peers) are cut once: a reconcile that comes
before the watch shows their deletion (another pod's event, the Job controller failing the Job,
a tick) neither deletes them again nor says nor counts them cut a second time; a cut the API
server did not take is asked again."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from mpjob.controller.reconciler import Reconciler
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_cache import job, pod

pytestmark = pytest.mark.unit

KEY = ("ns", "j")


class Cutting(FakeCluster):
    """Records the pods cut; `refuse` cuts answer 500 first (the pod stays as it was)."""

    def __init__(self, refuse: int = 0) -> None:
        super().__init__()
        self.body["spec"]["workers"] = 2
        self.cuts: list[tuple[str, str, int]] = []
        self.refuse = refuse

    def cut_pod(self, namespace: str, name: str, *, uid: str, grace: int) -> bool:
        if self.refuse:
            self.refuse -= 1
            return False  # logged, not raised: the pod keeps its own grace
        self.cuts.append((name, uid, grace))
        return True


def ours(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"]["ownerReferences"][0]["uid"] = "job-uid"  # the Job the FakeCluster made
    return body


def crashed(cluster: Cutting) -> tuple[Reconciler, dict[str, Any]]:
    """Attempt 0 made, its rank 1 crashed while rank 0 runs on; rank 0's pod as the watch showed it."""
    made = reconciler(cluster)
    made.handle(KEY, False)
    made.cache.apply("jobs", "ADDED", job(0, uid="job-uid"))
    alive = ours(pod(0, rank=0))
    made.cache.apply("pods", "ADDED", alive)
    made.cache.apply("pods", "ADDED", ours(pod(0, "Failed", rank=1, exitCode=1)))
    return made, alive


def cut_count() -> float:
    return REGISTRY.get_sample_value("mpjob_operator_pods_cut_total") or 0.0


def test_ranks_cut_are_not_cut_said_or_counted_again_before_the_watch_shows_them_going(events: list) -> None:  # noqa: F811
    cluster = Cutting()
    made, alive = crashed(cluster)
    before = cut_count()
    made.handle(KEY, False)  # rank 0 cut
    made.handle(KEY, True)  # a tick before the watch shows its deletion
    made.cache.apply("pods", "MODIFIED", alive)  # an event from before the deletion, read after it
    made.handle(KEY, False)
    assert cluster.cuts == [("j-a0-0-x", "pod-0", 10)]
    assert [reason for reason, _ in events].count("RanksCut") == 1 and cut_count() - before == 1


def test_a_cut_the_api_server_did_not_take_is_asked_again(events: list) -> None:  # noqa: F811
    cluster = Cutting(refuse=1)
    made, _ = crashed(cluster)
    made.handle(KEY, False)  # refused: the pod runs on, nothing said
    assert cluster.cuts == [] and "RanksCut" not in [reason for reason, _ in events]
    made.handle(KEY, True)
    assert cluster.cuts == [("j-a0-0-x", "pod-0", 10)] and [r for r, _ in events].count("RanksCut") == 1
