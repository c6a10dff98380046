"""A trainer's word is not evidence, and a bad report wedges nothing (on the real control plane):
a command that always exits 44 ends Failed after maxAttempts charged attempts with a small
status; an attempt the cluster evicted (the pod's DisruptionTarget condition, as the Eviction
API and the taint manager write it) is uncharged; a user's suspend and resume use none of
maxAttempts; a termination report with an unknown precision or a 3,000-digit step ends its
attempt as an infrastructure failure naming the field, and the job goes on."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_hostile_children import FOREVER, condition, standin

pytestmark = pytest.mark.integration

#: A Preempted report, then exit 44: what a trainer's own preemption leaves (a bare exit 44, with
#: no report of the session's, is the script's own exit: a script failure, docs/launcher.md).
ALWAYS_44 = [
    sys.executable,
    "-c",
    "import os, sys; open(os.environ['MPJOB_TERMINATION_LOG'], 'w').write("
    '\'{"reason": "Preempted", "step": 0}\'); sys.exit(44)',
]


def cpu_command(command: list[str], **run_policy: Any) -> dict[str, Any]:
    return {
        "task": {"command": command},
        "precision": {"mode": "bf16"},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": run_policy,
    }


def test_a_command_that_always_exits_44_fails_after_max_attempts_with_a_small_status(
    operator: Operator, jobs: Jobs
) -> None:
    jobs.create("always44", cpu_command(ALWAYS_44, maxAttempts=3))
    status = jobs.wait_phase("always44", ("Failed", "Succeeded"), 180)
    assert status["phase"] == "Failed" and "runPolicy.maxAttempts=3" in status["message"], status
    assert condition(status, "Failed")["reason"] == "AttemptsExhausted"
    assert [(a["reason"], a["exitCode"], a["charged"]) for a in status["attempts"]] == [("Preempted", 44, True)] * 3
    assert status["attemptCounts"]["charged"] == 3 and status["attemptCounts"]["started"] == 3
    assert len(json.dumps(jobs.get("always44"))) < 64 * 1024
    # Only the newest two attempts keep their Job (with its pods and Service) for their logs.
    wait_for(lambda: jobs.attempt_jobs("always44") == ["always44-a1", "always44-a2"], 60, message="a0 deleted")
    selector = "mpjob.dev/job=always44,mpjob.dev/attempt=0"
    wait_for(lambda: not jobs.core.list_namespaced_pod(jobs.namespace, label_selector=selector).items, 60)
    wait_for(lambda: not jobs.core.list_namespaced_service(jobs.namespace, label_selector=selector).items, 60)


def running_pod(jobs: Jobs, name: str, attempt: int) -> str:
    selector = f"mpjob.dev/job={name},mpjob.dev/attempt={attempt}"

    def running() -> str | None:
        pods = jobs.core.list_namespaced_pod(jobs.namespace, label_selector=selector).items
        return next((p.metadata.name for p in pods if p.status.phase == "Running"), None)

    return wait_for(running, 120, message=f"attempt {attempt}'s pod running")


def test_an_evicted_attempt_is_uncharged(operator: Operator, jobs: Jobs) -> None:
    jobs.create("evicted", standin(FOREVER, runPolicy={"maxAttempts": 1}))
    for attempt in range(2):  # two evictions with maxAttempts 1: neither uses it
        pod = running_pod(jobs, "evicted", attempt)
        # Now, as the Eviction API stamps it: the disruption controller resets a DisruptionTarget
        # older than two minutes on a pod that is not being deleted.
        disruption = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        jobs.core.patch_namespaced_pod_status(pod, jobs.namespace, {"status": {"conditions": [disruption]}})
        jobs.core.delete_namespaced_pod(pod, jobs.namespace)
        status = wait_for(
            lambda a=attempt: len((s := jobs.status("evicted")).get("attempts", [])) == a + 2 and s,
            120,
            message=f"attempt {attempt + 1} after the eviction",
        )
        ended = status["attempts"][attempt]
        assert (ended["reason"], ended["charged"]) == ("Evicted", False), ended
    assert jobs.status("evicted")["attemptCounts"]["charged"] == 0
    running_pod(jobs, "evicted", 2)
    jobs.patch_spec("evicted", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("evicted", "Suspended", 60)


def test_suspend_and_resume_use_none_of_max_attempts(operator: Operator, jobs: Jobs) -> None:
    jobs.create("paused", standin(FOREVER, runPolicy={"maxAttempts": 1}))
    for attempt in range(2):
        running_pod(jobs, "paused", attempt)
        jobs.patch_spec("paused", {"runPolicy": {"suspend": True}})
        jobs.wait_phase("paused", "Suspended", 60)
        jobs.patch_spec("paused", {"runPolicy": {"suspend": False}})
    running_pod(jobs, "paused", 2)
    status = jobs.wait_phase("paused", ("Running", "Failed"), 60)
    assert status["phase"] == "Running" and status["attempt"] == 2, status
    assert [(a["reason"], a["charged"]) for a in status["attempts"][:2]] == [("Suspended", False)] * 2
    jobs.patch_spec("paused", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("paused", "Suspended", 60)


#: Attempt 0 writes a report that fails the model and exits 44; attempt 1 succeeds.
BAD_THEN_GOOD = """
import json, os, sys
attempt = json.loads(os.environ["MPJOB_LAUNCH"])["attempt"]
path = os.environ["MPJOB_TERMINATION_LOG"]
if attempt == 0:
    open(path, "w").write(sys.argv[1])
    sys.exit(44)
open(path, "w").write(json.dumps({"reason": "Succeeded", "step": 3, "precision": "bf16"}))
"""


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ('{"reason": "Preempted", "precision": "float16", "step": 2}', "precision"),
        ('{"reason": "Preempted", "step": ' + "7" * 3000 + "}", "step"),
    ],
    ids=["precision-float16", "step-3000-digits"],
)
def test_an_invalid_report_ends_its_attempt_naming_the_field_and_the_job_goes_on(
    operator: Operator, jobs: Jobs, bad: str, field: str
) -> None:
    jobs.create("badreport", cpu_command([sys.executable, "-c", BAD_THEN_GOOD, bad], maxAttempts=2))
    status = jobs.wait_phase("badreport", ("Failed", "Succeeded"), 180)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["reason"], first["charged"], first["precision"]) == ("InfraError", True, "bf16"), first
    assert f"invalid termination report: {field}" in first["message"], first["message"]
    assert len(first["message"]) <= 1024
    assert (second["reason"], second["precision"], status["step"]) == ("Succeeded", "bf16", 3)
