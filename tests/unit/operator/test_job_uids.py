"""The UID of each attempt's Job is in the job's status (attempts[].jobUid) before any child of
that Job is made: an operator that restarts knows by it which leftovers of a Job deleted with
--cascade=orphan are its own (controller/children.py `adopt`)."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.planning import status as st
from mpjob_contract.api import MixedPrecisionJobStatus
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit


class Recording(FakeCluster):
    """Records what the status said when the Service was made."""

    def __init__(self) -> None:
        super().__init__()
        self.when_service: dict[str, Any] = {}

    def create_service(self, service: dict[str, Any], *, job: dict[str, Any], owner: dict[str, Any]) -> None:
        self.when_service = dict(self.body.get("status") or {})


def test_the_jobs_uid_is_recorded_before_its_service_is_made(events: list) -> None:  # noqa: F811
    cluster = Recording()
    reconciler(cluster).handle(("ns", "j"), False)
    assert [a.get("jobUid") for a in cluster.when_service["attempts"]] == ["job-uid"]
    assert st.job_uids(MixedPrecisionJobStatus.model_validate(cluster.body["status"])) == {0: "job-uid"}


def test_a_job_made_again_or_held_unrecorded_is_recorded_by_its_attempt() -> None:
    status = MixedPrecisionJobStatus.model_validate(
        {"attempts": [{"index": 0, "precision": "fp16", "jobUid": "old"}, {"index": 1, "precision": "bf16"}]}
    )
    assert st.record_job_uids(status, {0: "new", 1: "first", 2: "no-entry"})
    assert st.job_uids(status) == {0: "new", 1: "first"}
    assert not st.record_job_uids(status, {0: "new"})  # nothing to write
