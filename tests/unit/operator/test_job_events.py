"""Which attempt-Job events are worth a reconcile: only changes the planner can see."""

from __future__ import annotations

import copy

import pytest

from mpjob.controller.records import TERMINAL_CONDITIONS, job_record

pytestmark = pytest.mark.unit

RUNNING = {
    "metadata": {
        "name": "j-a0",
        "namespace": "ns",
        "uid": "job-uid",
        "resourceVersion": "10",
        "managedFields": [],
        "ownerReferences": [
            {
                "apiVersion": "mpjob.dev/v1alpha1",
                "kind": "MixedPrecisionJob",
                "name": "j",
                "uid": "mpj-uid",
                "controller": True,
            }
        ],
    },
    "spec": {"suspend": False, "parallelism": 2},
    "status": {"active": 2, "ready": 1, "startTime": "2026-11-22T10:00:00Z"},
}


def changed(**status: object) -> dict:
    body = copy.deepcopy(RUNNING)
    body["status"].update(status)
    return body


def test_bookkeeping_writes_are_not_worth_a_reconcile() -> None:
    noise = copy.deepcopy(RUNNING)
    noise["metadata"]["resourceVersion"] = "11"
    noise["status"]["uncountedTerminatedPods"] = {}
    noise["status"]["ready"] = 2  # readiness is not the planner's business
    noise["status"].update(active=1, failed=1)  # nor are the counts: the pods' events tell that
    assert job_record(RUNNING) is not None
    assert job_record(noise) == job_record(RUNNING)


@pytest.mark.parametrize(
    "body",
    [
        changed(conditions=[{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}]),
        changed(conditions=[{"type": "Complete", "status": "True"}]),
        {**RUNNING, "spec": {"suspend": True, "parallelism": 2}},
    ],
    ids=["failure-target", "complete", "suspended"],
)
def test_what_the_planner_reads_is(body: dict) -> None:
    assert job_record(body) != job_record(RUNNING)


def test_the_job_controllers_early_verdicts_end_an_attempt() -> None:
    assert TERMINAL_CONDITIONS["FailureTarget"] == "Failed"
    assert TERMINAL_CONDITIONS["SuccessCriteriaMet"] == "Complete"
    assert "Suspended" not in TERMINAL_CONDITIONS


@pytest.mark.parametrize(("completions", "workers"), [(2, 2), (0, None), ("2", None), (True, None), (None, None)])
def test_the_jobs_own_worker_count_is_read_where_it_is_one(completions: object, workers: int | None) -> None:
    body = {**RUNNING, "spec": {**RUNNING["spec"], "completions": completions}}  # type: ignore[dict-item]
    record = job_record(body)
    assert record is not None and record.workers == workers
