"""Pods of a Job deleted as usual (a suspension, a resize, a deadline: the pods go with their
grace, checkpointing on SIGTERM) that still stop when the operator restarts: its first listing
has them but not their Job. The job's status records that Job's UID (`attempts[].jobUid`), so
they are that Job's: the attempt waits for them, and once they stop what they said is read and
the GPU-seconds they ran are charged to their attempt, as if the operator had never restarted."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpjob.controller.cache import ChildCache
from mpjob.planning import cost
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_cache import MPJ_UID, job
from tests.unit.operator.test_cache import stopping as going

pytestmark = pytest.mark.unit
START, DELETED, STOPPED = "2026-12-01T11:00:00Z", "2026-12-01T12:00:00Z", "2026-12-01T12:10:00Z"


def stopping(**terminated: Any) -> dict[str, Any]:
    """Attempt 0's rank-0 pod, its Job deleted at DELETED: running since START, or stopped as `terminated`."""
    made = going(0, **terminated)
    state = made["status"]["containerStatuses"][0]["state"]
    (state.get("terminated") or state["running"])["startedAt"] = START
    return made


def test_a_restarted_operator_waits_for_and_then_charges_the_pods_of_a_job_its_status_records() -> None:
    c = ChildCache(lambda key: None)
    c.relist("jobs", "ns", [])  # attempt 0's Job was deleted while the operator was away
    c.relist("pods", "ns", [stopping()])
    seen = c.observe("ns", "j", MPJ_UID, recorded={0: "job-0"})
    assert (seen.lingering, seen.jobs, seen.stopped, seen.orphans) == (frozenset({0}), {}, {}, {})  # none to stop
    said = stopping(exitCode=44, message='{"reason": "Preempted"}', finishedAt=STOPPED)
    c.apply("pods", "MODIFIED", said)
    c.apply("pods", "DELETED", said)
    seen = c.observe("ns", "j", MPJ_UID, recorded={0: "job-0"})
    assert seen.lingering == frozenset()
    (kept,) = seen.stopped[0].pods  # what it said on SIGTERM is read: its checkpoint, its seconds
    assert (kept.exit_code, kept.termination_message, kept.finished_at) == (44, '{"reason": "Preempted"}', STOPPED)

    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, "resources": {"gpusPerWorker": 2}})
    at_deletion = 2 * 3600.0  # charged when the attempt ended, as its Job was seen then: 1 h x 2 GPUs
    status = MixedPrecisionJobStatus.model_validate(
        {
            "attempts": [
                {"index": 0, "precision": "fp16", "jobUid": "job-0", "reason": "Suspended", "startTime": START}
                | {"finishTime": DELETED, "gpuSeconds": at_deletion}
            ],
            "cost": {"gpuSeconds": at_deletion},
        }
    )
    now = datetime(2026, 12, 1, 12, 30, tzinfo=UTC)
    cost.account(status, spec, cost.seen_usage(status, {}, spec, now, seen.stopped))
    assert status.attempts[0].gpu_seconds == 2 * 4200.0  # to the pod's stop: 70 min x 2 GPUs
    assert status.cost is not None and status.cost.gpu_seconds == 2 * 4200.0


def test_a_pod_of_a_job_the_status_does_not_record_only_makes_the_attempt_wait() -> None:
    c = ChildCache(lambda key: None)
    c.relist("jobs", "ns", [job(1)])
    c.relist("pods", "ns", [stopping()])
    seen = c.observe("ns", "j", MPJ_UID, recorded={0: "another-job"})
    assert seen.lingering == frozenset({0}) and not seen.stopped
    c.apply("pods", "DELETED", stopping(exitCode=143, finishedAt=STOPPED))
    assert c.observe("ns", "j", MPJ_UID, recorded={0: "another-job"}).stopped == {}  # whose: unknown
