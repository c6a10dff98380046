"""The attempt after a failure retried as it was waits its backoff (mpjob.planning.backoff), and
its Job is made when the wait ends: the plan asks the work queue to reconcile the job again
then (`Plan.requeue_after`), not at whichever tick comes after (up to tick_seconds late)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.controller.workqueue import WorkQueue
from mpjob.planning import status as st
from mpjob.planning.backoff import RetryBackoff
from tests.helpers import wait_for
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_backoff import NO_STORE
from tests.unit.operator.test_cache import job, pod

pytestmark = pytest.mark.unit

KEY = ("ns", "j")
#: The first wait: the attempt's finishTime is kept to the second, so 1 to 2 s are left of it.
WAIT = 2.0


class MadeJobs(FakeCluster):
    """Creates Jobs as the API server does, each with its own UID (`job-<attempt>`), and says when."""

    def __init__(self) -> None:
        super().__init__()
        self.body["spec"]["precision"] = {"mode": "bf16"}  # as the trainer reports it: retried as it was
        self.made: list[tuple[str, datetime]] = []

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        self.made.append((job["metadata"]["name"], datetime.now(UTC)))
        created = super().create_job(job, owner=owner)
        attempt = job["metadata"]["name"].rsplit("-a", 1)[1]
        return {**created, "metadata": {**created["metadata"], "uid": f"job-{attempt}"}}


@pytest.mark.usefixtures("events")
def test_the_attempt_after_an_infra_error_is_made_when_its_wait_ends_without_a_tick() -> None:
    cluster = MadeJobs()
    made = reconciler(cluster)
    made.retries = RetryBackoff(base=WAIT)
    assert made.handle(KEY, False) is None  # attempt 0's Job, at once: nothing to come back for
    # Attempt 0 fails as an outage of the checkpoint store fails it (InfraError: retried as it was).
    made.cache.apply("jobs", "MODIFIED", job(0, conditions=[{"type": "Failed", "status": "True"}]))
    made.cache.apply("pods", "MODIFIED", pod(0, "Failed", exitCode=1, message=NO_STORE))
    queue = WorkQueue(made.handle, workers=1)  # type: ignore[arg-type]  # keys: (namespace, name)
    try:
        queue.add(KEY)  # the pod's exit, as the cache queues it; no ticker runs
        wait_for(lambda: len(cluster.made) == 2, WAIT + 5, 0.01, "attempt 1's Job made once its wait ended")
    finally:
        queue.close()
    attempts = cluster.body["status"]["attempts"]
    assert [a.get("reason") for a in attempts] == ["InfraError", None]
    until = st.read_stamp(attempts[0]["finishTime"]) + timedelta(seconds=WAIT)
    name, at = cluster.made[1]
    assert name == "j-a1" and until <= at < until + timedelta(seconds=1)  # not a tick (5 s) late
